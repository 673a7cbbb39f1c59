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

Where the rest lives (each name also importable from here, as before): the plan type
(``plans.compiled``), building (``plans.build``), the tuner interface (``plans.tuner``) and the
process's plan store (``plans.persist``). :func:`build_or_load_plan`, the process cache's builder,
stays here and looks up ``build_plan`` and ``store_for`` in this module on every call, so that
replacing ``te_cudnn.plans.cache.build_plan`` or ``.store_for`` (as tests do) takes effect.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..backends import BY_ENUM
# F401: names that moved out of this module stay importable from here
from .build import _heuristics, build_plan, run_apart  # noqa: F401
from .compiled import CompiledPlan, _tuning_summary  # noqa: F401
from .key import PlanKey
from .persist import (  # noqa: F401
    _load_stored, _machine_facts, _save_built, _stores, _stores_lock, _warn_once, _warned, forget_stores, store_for,
)  # fmt: skip
from .store import PLAN_FORMAT_VERSION, env_number  # noqa: F401
from .tuner import Tuner, _tuner, _tuning_wanted, use_tuner  # noqa: F401

__all__ = ["CompiledPlan", "PlanCache", "CacheStats", "build_plan", "plan_cache", "run_apart", "forget_stores"]

_log = logging.getLogger("te_cudnn")

#: ``TE_CUDNN_PLAN_CACHE_SIZE`` (plans kept in memory); a malformed value warns once and gives 512.
DEFAULT_MAXSIZE = int(env_number("TE_CUDNN_PLAN_CACHE_SIZE", 512, integer=True,
                                 what="a positive whole number of plans"))


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


def _recency(plan: CompiledPlan) -> int:
    return plan.last_used


#: Build plans in a thread of their own (:func:`run_apart`); on by default,
#: ``TE_CUDNN_BUILD_APART=0`` builds them in the calling thread (and brings back the
#: frontend's reference cycle through the caller's frames, see :func:`run_apart`).
BUILD_APART = os.environ.get("TE_CUDNN_BUILD_APART", "1").strip().lower() not in ("0", "false", "off", "no")


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
