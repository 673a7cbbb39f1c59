"""The in-process plan cache: bounded LRU of built cuDNN plans, safe under threads.

A miss builds the graph outside the cache lock (cuDNN planning takes 0.05-1 s); a second
thread asking for the same key meanwhile waits for that build instead of starting its own.
Statistics (hits, misses, builds, build seconds, evictions, per-plan hits and workspace) are
readable from Python with :meth:`PlanCache.stats` and :meth:`PlanCache.snapshot`. Each build
or load from the plan store is logged on the ``"te_cudnn"`` logger (INFO, with its time; plan
name, workspace and stages at DEBUG); hits are not logged.

Autotuning (``te_cudnn.plans.tune``; off unless ``TE_CUDNN_AUTOTUNE`` or ``autotuning()`` turns it
on): a plan carries its tuning record (``CompiledPlan.tuning``). The cache holds one plan per key;
while autotuning is on, a lookup that finds an untuned plan treats it as a miss, and the tuned
plan replaces it (the old one is marked evicted, so its holders look up again). While it is off,
any plan serves, and nothing about lookups, builds or loads changes.
"""

from __future__ import annotations

import contextvars
import errno
import itertools
import logging
import os
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from .._version import __version__
from ..backends import BY_ENUM
from ..errors import GraphBuildError
from ..runtime import cudnn_module, current_env, frontend_version
from . import handles
from .key import PlanKey
from .store import PLAN_FORMAT_VERSION, UntrustedStoreError, env_number

__all__ = ["CompiledPlan", "PlanCache", "CacheStats", "build_plan", "plan_cache", "run_apart", "forget_stores"]

_log = logging.getLogger("te_cudnn")

#: ``TE_CUDNN_PLAN_CACHE_SIZE`` (plans kept in memory); a malformed value warns once and gives 512.
DEFAULT_MAXSIZE = int(env_number("TE_CUDNN_PLAN_CACHE_SIZE", 512, integer=True,
                                 what="a positive whole number of plans"))


@dataclass(eq=False)
class CompiledPlan:
    """A built cuDNN graph ready to execute, and what is known about it."""

    key: PlanKey
    graph: Any
    uids: tuple[int, ...]
    workspace_size: int
    plan_name: str
    build_seconds: float
    hits: int = 0
    last_used: int = 0  # recency stamp (a process-wide counter), for least-recently-used eviction
    created: float = field(default_factory=time.time)
    evicted: bool = False  # set when the cache drops it; holders then look it up again
    launch: Any = None  # PlanLauncher: launch(buffers, workspace, handle)
    source: str = "built"  # "built" here, or "store" (deserialized from the plan store)
    stages: dict = field(default_factory=dict)  # seconds per build or load stage, for inspection
    tuning: Optional[dict] = None  # the autotuning record (te_cudnn.plans.tune) when the plan is tuned
    tuning_error: Optional[str] = None  # why tuning this plan's key failed (the heuristic plan serves)
    tune_checked: bool = False  # landed while autotuning was on: not tuned again in this process

    def __post_init__(self) -> None:
        if self.launch is None:
            from .execute import PlanLauncher

            self.launch = PlanLauncher(self.graph, self.uids)

    def info(self) -> dict[str, Any]:
        return {
            "key": self.key.describe(),
            "plan_name": self.plan_name,
            "workspace_bytes": self.workspace_size,
            "build_ms": round(self.build_seconds * 1e3, 3),
            "stages_ms": {name: round(sec * 1e3, 3) for name, sec in self.stages.items()},
            "source": self.source,
            "hits": self.hits,
            "direct_launch": bool(getattr(self.launch, "direct", False)),
            "launch": getattr(self.launch, "mode", "custom"),
            "tuned": self.tuning is not None,
            **({"tuning": _tuning_summary(self.tuning)} if self.tuning is not None else {}),
            **({"tuning_error": self.tuning_error} if self.tuning_error else {}),
        }


def _tuning_summary(record: dict) -> dict[str, Any]:
    """What ``CompiledPlan.info()`` shows of a tuning record: the choice and every candidate."""
    keys = ("chosen", "heuristic", "speedup", "rule", "candidates", "timestamp")
    return {k: record.get(k) for k in keys}


@dataclass(frozen=True)
class CacheStats:
    entries: int
    maxsize: int
    hits: int
    misses: int
    builds: int
    loads: int  # plans deserialized from the plan store instead of built
    build_failures: int
    build_seconds: float
    evictions: int

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def _heuristics(cudnn) -> list:
    return [cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK]


def build_plan(key: PlanKey, make_spec: Callable[[], Any]) -> CompiledPlan:
    """Build a graph spec into an executable plan, timing it; cuDNN errors -> GraphBuildError."""

    cudnn = cudnn_module()
    start = time.perf_counter()
    spec = make_spec()
    g = spec.graph
    steps = (
        ("validate", "validate", g.validate),
        ("operation_graph", "build the operation graph of", g.build_operation_graph),
        ("heuristics", "create execution plans for", lambda: g.create_execution_plans(_heuristics(cudnn))),
        ("check_support", "check support of", g.check_support),
        ("build_plans", "build plans for", g.build_plans),
    )
    stages = {"graph": time.perf_counter() - start}
    for name, stage, step in steps:
        t0 = time.perf_counter()
        try:
            step()
        except Exception as exc:  # cudnnGraphNotSupportedError, RuntimeError from the backend, ...
            raise GraphBuildError(key, stage, exc) from exc
        stages[name] = time.perf_counter() - t0
    workspace = int(g.get_workspace_size())
    try:
        plan_name = str(g.get_plan_name_at_index(int(getattr(g, "_plan_index", 0))))
    except Exception:  # naming is informational only
        plan_name = "unknown"
    return CompiledPlan(key, g, spec.uids, workspace, plan_name, time.perf_counter() - start, stages=stages)


def _machine_facts(device: int) -> dict[str, Any]:
    """Everything a serialized plan depends on besides its key (the store's fingerprint)."""
    import torch  # noqa: PLC0415

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
            from .store import default_store  # noqa: PLC0415

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


def build_or_load_plan(key: PlanKey, make_spec: Callable[[], Any]) -> CompiledPlan:
    """Deserialize the plan from the plan store when it holds it, else build it and store it.

    The store is an optimisation: nothing it does (absent, off, untrusted, damaged, full,
    read-only, a plan cuDNN cannot load) fails the call; each kind of problem is warned once.
    Its key is the plan key without the GPU ordinal (:meth:`PlanKey.describe`), so the ranks
    of one node share one file per plan.

    With autotuning on (:func:`te_cudnn.plans.tune.tuning_wanted`), only a stored plan with a
    tuning record is loaded; otherwise the key is tuned (:func:`~te_cudnn.plans.tune.tune_plan`)
    and the tuned plan, with its record, replaces the stored one. A stored tuned plan is loaded
    with autotuning off too: tuning is paid once per store fingerprint (GPU model, versions)."""
    if not BY_ENUM[key.backend].caps.persistable:  # plans whose deserialized form cannot run: build
        return build_plan(key, make_spec)
    tuner = _tuner[0]
    tune = tuner is not None and tuner.tuning_wanted(key)
    builder = tuner.tune_plan if tune else build_plan
    start = time.perf_counter()
    store = store_for(key.config.device)
    if store is None:
        return builder(key, make_spec)
    desc = key.describe(device=False)
    plan = _load_stored(store, key, desc, start, need_tuning=tune)
    if plan is not None:
        return plan
    plan = builder(key, make_spec)
    _save_built(store, key, desc, plan)
    return plan


def _log_landed(plan: CompiledPlan) -> None:
    """INFO: a plan was built or loaded from the plan store, and in how long; DEBUG: its details."""
    ms = plan.build_seconds * 1e3
    tuned = ""
    if plan.tuning is not None:
        sp = plan.tuning.get("speedup")
        tuned = f" (tuned: {plan.plan_name}" + (f", {sp:.3f}x the heuristic plan)" if isinstance(sp, (int, float))
                                                 else ")")  # fmt: skip
    if plan.source == "store":
        _log.info("loaded plan for %s from the plan store in %.1f ms%s", plan.key, ms, tuned)
    else:
        _log.info("built plan for %s in %.1f ms%s", plan.key, ms, tuned)
    if _log.isEnabledFor(logging.DEBUG):
        stages = ", ".join(f"{name} {sec * 1e3:.1f} ms" for name, sec in plan.stages.items()) or "n/a"
        _log.debug("  plan name %s, workspace %d bytes, stages: %s", plan.plan_name, plan.workspace_size, stages)


def log_plan_outcome(key: PlanKey, cache: Optional["PlanCache"] = None) -> None:
    """DEBUG, once per new call signature (``first_call._prepare_*``): whether the plan for ``key`` is
    already cached (a hit) or is built or loaded at the first launch (then logged at INFO)."""
    if not _log.isEnabledFor(logging.DEBUG):
        return
    plan = (plan_cache if cache is None else cache).find(key)
    if plan is None:
        _log.debug("plan for %s: not cached yet; built or loaded from the plan store at the first launch", key)
    else:
        _log.debug("plan for %s: already cached (hit; %s, plan name %s, workspace %d bytes, %d hits so far)", key,
                   "loaded from the plan store" if plan.source == "store" else "built", plan.plan_name,
                   plan.workspace_size, plan.hits)  # fmt: skip


#: the plan cache's clock: ``last_used`` stamps for LRU eviction (also stamped inline by
#: te_cudnn.ops' cached paths); atomic under the GIL (one C call)
next_tick = itertools.count(1).__next__


class Tuner(Protocol):
    """What the cache asks of the autotuner: ``te_cudnn.plans.tune``, which builds on this
    module and hands itself over with :func:`use_tuner` when it is imported (its functions are
    looked up on every call, so replacing one, as tests do, takes effect)."""

    def autotune_enabled(self) -> bool: ...  # autotuning switched on at all (read on every lookup)

    def tuning_wanted(self, key: PlanKey) -> bool: ...  # this key wants a tuned plan

    def tune_plan(self, key: PlanKey, make_spec: Callable[[], Any]) -> "CompiledPlan": ...  # with its record

    def valid_record(self, record: Any) -> bool: ...  # a stored tuning record this version can use


_tuner: list = [None]  # the Tuner in use (a list: read on every lookup, set once)


def use_tuner(tuner: Optional[Tuner]) -> None:
    """Make ``tuner`` the one lookups ask (None: plans are never tuned)."""
    _tuner[0] = tuner


def _tuning_wanted(key: PlanKey) -> bool:
    """Whether a lookup of ``key`` wants a tuned plan (the tuner's ``tuning_wanted``); with autotuning
    off, a context-variable read and an environment lookup."""
    tuner = _tuner[0]
    return tuner is not None and tuner.autotune_enabled() and tuner.tuning_wanted(key)


def _recency(plan: CompiledPlan) -> int:
    return plan.last_used


#: Build plans in a thread of their own (:func:`run_apart`); on by default,
#: ``TE_CUDNN_BUILD_APART=0`` builds them in the calling thread (and brings back the
#: frontend's reference cycle through the caller's frames, see :func:`run_apart`).
BUILD_APART = os.environ.get("TE_CUDNN_BUILD_APART", "1").strip().lower() not in ("0", "false", "off", "no")


def run_apart(build: Callable[..., Any], key: PlanKey, *args: Any) -> Any:
    """``build(key, *args)`` in a short-lived thread of its own (with the caller's context
    variables and, where CUDA is up, ``key``'s device current); its result, or its exception
    raised here.

    Why: cudnn-frontend 1.32's Python planner (``create_execution_plans``) catches
    ``cudnnGraphNotSupportedError`` for engine configurations it cannot use and keeps the
    exception in a local variable: exception -> traceback -> frame -> exception, a reference
    cycle. Every frame holds its caller (``f_back``), so that cycle held the whole calling
    stack, te_cudnn's frames and the user's, with their locals (the call's results, a training
    step's activations) until the next full garbage collection: one extra set of results on a
    long-sequence first call. Built in a thread of its own, the planner's frames
    reach only that thread's stack. Costs a thread start per build (tens of microseconds against
    builds of 50 ms and more); the cached path never comes here."""
    box: dict[str, Any] = {}
    context = contextvars.copy_context()  # autotuning() and backend_policy() are context variables
    device = getattr(getattr(key, "config", None), "device", None)

    def work() -> None:
        try:
            if isinstance(device, int) and device >= 0:
                import torch  # noqa: PLC0415 - the planner's device, as in the caller (a no-op without CUDA)

                if torch.cuda.is_initialized():
                    torch.cuda.set_device(device)
            box["plan"] = context.run(build, key, *args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            box["error"] = exc

    worker = threading.Thread(target=work, name="te_cudnn plan build", daemon=True)
    worker.start()
    worker.join()
    error = box.pop("error", None)
    if error is not None:
        try:
            raise error
        finally:
            del error  # no cycle through this frame
    return box.pop("plan")


class PlanCache:
    """Bounded LRU ``PlanKey -> CompiledPlan``; one per process, shared by all threads."""

    def __init__(self, maxsize: int = DEFAULT_MAXSIZE, builder: Callable[[PlanKey, Callable[[], Any]], CompiledPlan] = build_plan):
        """``builder(key, make_spec)`` turns a graph spec into a plan (default: cuDNN's
        validate -> plan -> build pipeline, :func:`build_plan`)."""
        if maxsize < 1:
            raise ValueError(f"maxsize={maxsize} must be >= 1")
        self.maxsize = maxsize
        self._builder = builder
        self._entries: "OrderedDict[PlanKey, CompiledPlan]" = OrderedDict()
        self._building: dict[PlanKey, threading.Event] = {}
        self._lock = threading.Lock()
        self._retired_hits = self._misses = self._builds = self._failures = self._evictions = self._loads = 0
        self._build_seconds = 0.0

    # ----------------------------------------------------------------- lookups
    def get(self, key: PlanKey) -> Optional[CompiledPlan]:
        """The cached plan for ``key`` (counted as a hit), or None (not counted)."""
        with self._lock:
            plan = self._entries.get(key)
            if plan is not None:
                self._touch(plan)
            return plan

    @staticmethod
    def _touch(plan: CompiledPlan) -> None:
        """Record a hit: the plan's count and its recency (for least-recently-used eviction)."""
        plan.hits += 1
        plan.last_used = next_tick()

    def hit(self, plan: CompiledPlan) -> bool:
        """Count a hit on a plan the caller already holds; False if it was evicted.

        The per-call path: no lock. ``hits += 1`` and the recency stamp are single
        attribute updates with no switch point in between under CPython's GIL, and
        eviction reads them only under the lock (a stale stamp evicts a plan that was
        just used, which its holder then rebuilds or reloads)."""
        if plan.evicted:
            return False
        plan.hits += 1
        plan.last_used = next_tick()
        return True

    def get_or_build(self, key: PlanKey, make_spec: Callable[[], Any]) -> CompiledPlan:
        """The plan for ``key``, building it (once, even under concurrent callers) on a miss.

        While autotuning is on (``te_cudnn.plans.tune``) and ``key`` can be tuned, a cached plan
        that is not tuned counts as a miss: the builder tunes, and the tuned plan replaces it. A
        plan that landed while autotuning was on (tuned, or tuning tried and failed) is final."""
        tune = _tuning_wanted(key)
        while True:
            with self._lock:
                plan = self._entries.get(key)
                if plan is not None and not (tune and plan.tuning is None and not plan.tune_checked):
                    self._touch(plan)
                    return plan
                pending = self._building.get(key)
                if pending is None:
                    self._misses += 1
                    pending = self._building[key] = threading.Event()
                    owner = True
                else:
                    owner = False
            if not owner:
                pending.wait()
                continue  # the owner's build landed (or failed: then this thread tries itself)
            try:
                plan = run_apart(self._builder, key, make_spec) if BUILD_APART else self._builder(key, make_spec)
            except BaseException:
                with self._lock:
                    self._failures += 1
                    del self._building[key]
                pending.set()
                raise
            with self._lock:
                if plan.source == "store":
                    self._loads += 1
                else:
                    self._builds += 1
                    self._build_seconds += plan.build_seconds
                if tune:
                    plan.tune_checked = True
                self._replace(plan)
                del self._building[key]
            pending.set()
            if _log.isEnabledFor(logging.INFO):  # once per build or load, never per call
                _log_landed(plan)
            return plan

    def _replace(self, plan: CompiledPlan) -> None:
        """Insert ``plan`` (the caller holds the lock); a different plan of its key is retired."""
        old = self._entries.get(plan.key)
        if old is not None and old is not plan:
            self._retire_locked(old)
        plan.last_used = next_tick()
        plan.evicted = False
        self._entries[plan.key] = plan
        self._evict_to(self.maxsize)

    def _retire_locked(self, plan: CompiledPlan) -> None:
        del self._entries[plan.key]
        plan.evicted = True  # holders look the key up again
        self._retired_hits += plan.hits

    def put(self, plan: CompiledPlan) -> None:
        """Insert ``plan`` (a tuned plan, from ``te_cudnn.plans.tune.tune_key``), replacing the
        cached plan of its key, whose holders then look up again. Not counted as a build."""
        with self._lock:
            self._replace(plan)

    def retire(self, predicate: Callable[[CompiledPlan], bool]) -> int:
        """Drop the cached plans for which ``predicate`` is true (marked evicted, so that their
        holders look up again; not counted as evictions); returns how many."""
        with self._lock:
            victims = [p for p in self._entries.values() if predicate(p)]
            for p in victims:
                self._retire_locked(p)
            return len(victims)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # ----------------------------------------------------------------- management
    def clear(self) -> None:
        """Drop every plan and reset the statistics."""
        with self._lock:
            self._evict_to(0)
            self._retired_hits = self._misses = self._builds = self._failures = self._evictions = self._loads = 0
            self._build_seconds = 0.0

    def resize(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize={maxsize} must be >= 1")
        with self._lock:
            self.maxsize = maxsize
            self._evict_to(maxsize)

    def _evict_to(self, size: int) -> None:
        """Drop least-recently-used plans until ``size`` remain (the caller holds the lock)."""
        excess = len(self._entries) - size
        if excess <= 0:
            return
        for plan in sorted(self._entries.values(), key=_recency)[:excess]:
            del self._entries[plan.key]
            plan.evicted = True
            self._retired_hits += plan.hits
            self._evictions += 1

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                entries=len(self._entries),
                maxsize=self.maxsize,
                hits=self._retired_hits + sum(p.hits for p in self._entries.values()),
                misses=self._misses,
                builds=self._builds,
                loads=self._loads,
                build_failures=self._failures,
                build_seconds=self._build_seconds,
                evictions=self._evictions,
            )

    def plans(self) -> list[CompiledPlan]:
        """The cached plans, least recently used first."""
        with self._lock:
            return sorted(self._entries.values(), key=_recency)

    def find(self, key: PlanKey) -> Optional[CompiledPlan]:
        """The plan for ``key`` if cached, without counting a hit or touching recency."""
        with self._lock:
            return self._entries.get(key)

    def dump(self, path: str) -> None:
        """Write the statistics and every plan's description as JSON (``te-cudnn plans list --dump``)."""
        import json  # noqa: PLC0415

        payload = {"pid": os.getpid(), "time": time.time(), "stats": self.stats().as_dict(), "plans": self.snapshot()}
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(payload, f, indent=1)
        os.replace(tmp, path)

    def snapshot(self) -> list[dict[str, Any]]:
        """Per-plan information, least recently used first (JSON-friendly)."""
        with self._lock:
            plans = sorted(self._entries.values(), key=_recency)
        return [p.info() for p in plans]


#: The process-wide cache used by ``fused_attn_fwd`` / ``fused_attn_bwd``; it loads from and
#: saves to the plan store (``TE_CUDNN_PLAN_STORE``).
plan_cache = PlanCache(builder=build_or_load_plan)


def _dump_at_exit() -> None:
    path = os.environ.get("TE_CUDNN_PLAN_DUMP")
    if path:
        try:
            plan_cache.dump(path)
        except OSError:
            pass


import atexit  # noqa: E402

atexit.register(_dump_at_exit)
