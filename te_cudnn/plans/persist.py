"""Plans kept in the on-disk plan store (``te_cudnn.plans.store``) for the process: the store
each device uses (:func:`store_for`), a plan loaded from it (deserialized) and a built plan
saved into it. Each kind of problem is warned once; none fails a call.
"""

from __future__ import annotations

import errno
import threading
import time
import warnings
from typing import Any, Optional

import torch

from .._version import __version__
from ..backends import BY_ENUM
from ..runtime import cudnn_module, current_env, frontend_version
from . import handles
from .compiled import CompiledPlan
from .key import PlanKey
from .store import PLAN_FORMAT_VERSION, UntrustedStoreError, default_store
from .tuner import _tuner

__all__ = ["forget_stores", "store_for"]


def _machine_facts(device: int) -> dict[str, Any]:
    """Everything a serialized plan depends on besides its key (the store's fingerprint)."""
    env = current_env(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device >= 0 else None
    return {"gpu": env.device_name, "sm": env.sm, "sm_count": sms, "cudnn": env.cudnn_version,
            "frontend": frontend_version(), "te_cudnn": __version__, "plan_format": PLAN_FORMAT_VERSION}  # fmt: skip


_stores: dict[int, Any] = {}
_stores_lock = threading.Lock()
_warned: set[str] = set()  # causes already reported outside any one store


def _warn_once(cause: str, message: str) -> None:
    if cause not in _warned:
        _warned.add(cause)
        warnings.warn(message, stacklevel=3)


def store_for(device: int):
    """The plan store for a device: None when ``TE_CUDNN_PLAN_STORE=off``, or when it cannot be
    set up (warned once). Devices with the same fingerprint (one GPU model) share one store,
    and with it its once-per-cause warnings."""
    store = _stores.get(device, False)
    if store is not False:
        return store
    with _stores_lock:
        if device in _stores:
            return _stores[device]
        try:
            store = default_store(_machine_facts(device))
            if store is not None:  # one object per (root, fingerprint)
                same = (s for s in _stores.values() if s is not None and (s.root, s.fingerprint) == (store.root, store.fingerprint))
                store = next(same, store)
        except Exception as exc:  # storing is an optimisation: never fail the call for it
            _warn_once("store setup", f"te_cudnn: the plan store is not available ({type(exc).__name__}: {exc}); "
                                      f"plans are built, not loaded or stored")  # fmt: skip
            store = None
        _stores[device] = store
        return store


def forget_stores() -> None:
    """Forget which plan store each device uses: the next lookup reads ``TE_CUDNN_PLAN_STORE``
    again (for a process that points the variable elsewhere after its first call, as
    ``te-cudnn bench`` does for its private store). Plans already in the plan cache stay."""
    with _stores_lock:
        _stores.clear()


def _load_stored(store, key: PlanKey, desc: dict[str, Any], start: float,
                 need_tuning: bool = False) -> Optional[CompiledPlan]:  # fmt: skip
    """The plan deserialized from the store, or None (absent, bad or unloadable: warned once per
    cause). Its operand uids come from the key; a file whose header says otherwise is skipped.
    ``need_tuning``: only a plan with a tuning record (checked before deserializing)."""

    try:
        entry = store.load(desc)
    except Exception as exc:  # the store reports the contents it skips; this is anything else
        store.warn_once(f"load:{type(exc).__name__}", f"te_cudnn: could not read the plan store {store.root} "
                                                       f"({type(exc).__name__}: {exc}); building the plan instead")  # fmt: skip
        return None
    if entry is None:
        return None
    record, tuner = entry.header.get("tuning"), _tuner[0]
    record = record if tuner is not None and tuner.valid_record(record) and \
        record["chosen"]["name"] == entry.header.get("plan_name") else None  # fmt: skip
    if need_tuning and record is None:
        return None
    uids = tuple(BY_ENUM[key.backend].operand_uids(key.config, key.direction))
    if entry.header.get("uids") != list(uids):
        store.warn_once("uids", f"te_cudnn: skipping plan file {entry.path}: its operand uids {entry.header.get('uids')} "
                                f"are not the {list(uids)} that its key gives; the plan will be rebuilt")  # fmt: skip
        return None
    try:
        t_read = time.perf_counter()
        g = cudnn_module().pygraph()
        g.deserialize(handles.handle_for(key.config.device), entry.blob)
        t_deser = time.perf_counter()
        return CompiledPlan(key, g, uids, int(g.get_workspace_size()), str(entry.header.get("plan_name", "unknown")),
                            time.perf_counter() - start, source="store",
                            stages={"read": t_read - start, "deserialize": t_deser - t_read}, tuning=record)  # fmt: skip
    except Exception as exc:  # a plan this cuDNN cannot load: build it again
        store.warn_once("deserialize", f"te_cudnn: could not load stored plan {entry.path}: {exc}; rebuilding")
        return None


def _save_built(store, key: PlanKey, desc: dict[str, Any], plan: CompiledPlan) -> None:
    """Store a built plan; a failure (read-only store, disk full, ...) is warned once per cause."""
    try:
        blob = plan.graph.serialize(as_bytes=True)
        meta = {"uids": list(plan.uids), "plan_name": plan.plan_name, "build_ms": round(plan.build_seconds * 1e3, 3)}
        if plan.tuning is not None:  # the choice and every candidate's time: later processes load it, not tune
            meta["tuning"] = plan.tuning
        store.save(desc, bytes(blob), meta)
    except UntrustedStoreError as exc:
        store.warn_once(exc.cause, str(exc))
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        store.warn_once(f"write:{name}", f"te_cudnn: could not store a plan in {store.dir}: {exc.strerror or exc} "
                                         f"({name}); plans are still built and used, but not kept for later processes")  # fmt: skip
    except Exception as exc:  # storing is an optimisation: never fail the call for it
        name = type(exc).__name__
        store.warn_once(f"save:{name}", f"te_cudnn: could not store plan for {key}: {name}: {exc}")

