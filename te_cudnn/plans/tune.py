"""Autotuning: time every engine configuration cuDNN offers for a plan key, keep the fastest.

Off by default. ``TE_CUDNN_AUTOTUNE=1`` (also ``true``, ``on``, ``yes``) turns it on for the
process; :func:`autotuning` turns it on (or off) for a block of code in the current thread or
task, over the environment variable; ``te-cudnn plans tune CONFIGS.json`` tunes ahead of time.

What tuning a key does (:func:`tune_plan`, on the plan cache's miss path):

1. plan the key's graph with every heuristic mode that works (``A``, ``B``, ``FALLBACK``; the
   frontend queries them one at a time and keeps one entry per engine configuration; a graph
   on which mode ``B`` fails is planned again with ``A`` and ``FALLBACK``), build every plan
   (``build_plans(build_plan_policy.ALL)``), and list the candidates: index, name, workspace;
   a name seen twice is one configuration and is timed once. A deterministic backward
   deselects plans with cuDNN's ``NONDETERMINISTIC`` numerical note;
2. allocate the graph's operands with its real shapes, strides and dtypes (:func:`make_operands`:
   random inputs, and valid contents for the operands cuDNN reads as data: full sequence
   lengths, dense ragged offsets, identity page tables, a fixed dropout seed and offset, FP8
   scales of 1);
3. run the heuristic plan once, then every other candidate once and compare its outputs with
   the heuristic plan's: a candidate whose results differ by more than the dtype's tolerance
   (:data:`te_cudnn.tolerances.TOLERANCES` ceiling; :data:`FP8_AGREEMENT` for FP8) is excluded,
   with the reason, as is one that fails or needs more workspace than the limit. These runs
   (:func:`result_checks`) bind, for padding masks and THD, partial lengths as calls bind them
   (an empty sequence, shorter ones, a full one, THD gaps: ``te_cudnn.plans.padded_rows``), into
   results (O; dQ, dK, dV) prefilled with NaN; a candidate, the heuristic plan included, that
   leaves a row past a sequence's end not exactly zero or a row inside one not finite is
   excluded with the rows named ("padded rows: ..."), and is never chosen. Where te_cudnn
   zero-fills a key's results whatever the engine (``te_cudnn.row_fill``), the rows past each
   sequence's end start at zero, as that fill leaves them. Outputs are compared on the rows
   inside the sequences;
4. time the others with CUDA events, side by side (:func:`interleaved_event_timer`: warm-up,
   ~0.3 s of load so the GPU runs at the clock its power limit holds, then ``reps`` interleaved
   rounds with one sample of each candidate; the median) and select the fastest, unless it is
   less than ``min_speedup`` (1 %) faster than the heuristic plan: then the heuristic plan
   stays (timing noise never swaps in a less-tested engine);
5. pin the choice with ``graph.build_plan_at_index(i)``. In frontend 1.32 that selects index
   ``i`` in Python (``graph._plan_index``, which :class:`~te_cudnn.plans.execute.PlanLauncher`
   reads, and which ``graph.execute`` runs) and, for a backend plan, makes it the C++
   graph's ``candidate``, the one plan ``serialize()`` writes (``Graph::serialize`` stores
   ``plans.execution_plans[plans.candidate]``; a python-engine plan serializes the selected
   ``_plan_index``). The plan store therefore holds the chosen plan.

The record (:meth:`TuningResult.to_record`: every candidate's index, name, workspace, median
and minimum time or error; the chosen and the heuristic plan; the speed-up; when; how) goes
into the stored plan's header (``"tuning"``), so a later process on the same GPU model, cuDNN,
frontend and te_cudnn versions loads the tuned plan without tuning again, with autotuning on
or off: tuning is paid once per store fingerprint. Another GPU model or version has another
fingerprint, and never sees the record.

In memory, the plan cache keeps one plan per key, marked tuned or not. While autotuning is on,
a lookup treats a plan that is not tuned as a miss: it tunes and replaces it (a plan whose
tuning was tried and failed, or whose key cannot be tuned, is kept). Entering
``autotuning(True)`` also retires the cache's untuned plans, so that calls that already hold
one (te_cudnn's prepared call signatures) look up, and tune, at their next launch. While
autotuning is off, any plan serves, tuned or not. Never tuned: keys without a CUDA device,
sub-backends whose plans are not stored (F16_max512_seqlen: one engine), and lookups during
CUDA-graph capture.

This module holds the switches and the entry points: turning tuning on, planning every
candidate, building the tuned plan and tuning a key on request. The rest lives by concern in
:mod:`~te_cudnn.plans.tune_results` (candidates, timings, the choice and the record, no GPU),
:mod:`~te_cudnn.plans.tune_operands` (the operands candidates run on),
:mod:`~te_cudnn.plans.tune_checks` (the agreement check) and :mod:`~te_cudnn.plans.tune_run`
(running, checking and timing on the device, with :mod:`te_cudnn.timing`'s timers); their
public names are importable from here too.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import time
import sys
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from ..backends import BY_ENUM, Direction
from ..errors import GraphBuildError
from ..runtime import cudnn_module
from ..timing import MAX_SPIN_MS, SPIN_CALIBRATION_CYCLES, SPIN_RETRIES
from . import cache as _cache  # looked up per call: the process cache (and its builder) can be replaced
from .handles import handle_for
from .one_row import keep_without_workspace
from .tune_checks import FP8_AGREEMENT, agreement_error, agreement_tolerance, check_error, result_checks, run_checks
from .tune_operands import FP8_SOFTMAX_SCALE, length_operands, make_operands
from .tune_results import (DEFAULT_REPS, DEFAULT_WARMUP, MIN_SPEEDUP, RECORD_VERSION, Candidate, CandidateTiming,
                           GroupTimer, Planned, Timer, TuningError, TuningResult, choose, dedupe_names, format_record,
                           measure, one_line, valid_record)  # fmt: skip
from .tune_run import (DEFAULT_MAX_WORKSPACE, GROUP_SAMPLE_MS, MAX_GROUP_INNER, MAX_INNER, MAX_SETTLE_LAUNCHES,
                       MIN_SAMPLE_MS, SETTLE_MS, SPLIT_ROUNDS, cuda_event_timer, interleaved_event_timer,
                       time_and_choose)  # fmt: skip

__all__ = [
    "ENV", "KNOBS_ENV", "RECORD_VERSION", "FP8_AGREEMENT", "Candidate", "CandidateTiming", "Planned", "TuningError",
    "TuningResult", "autotune_enabled", "autotuning", "choose", "cuda_event_timer", "dedupe_names",
    "format_record", "interleaved_event_timer", "knob_sweep", "add_knob_variants", "length_operands", "make_operands",
    "measure", "plan_candidates", "result_checks", "run_checks", "check_error", "tunable",
    "tune_key", "tune_plan", "tuning_record", "tuning_wanted", "valid_record",
    # the policy constants and helpers of the modules above, importable from here as well
    "DEFAULT_WARMUP", "DEFAULT_REPS", "MIN_SPEEDUP", "DEFAULT_MAX_WORKSPACE", "FP8_SOFTMAX_SCALE", "MIN_SAMPLE_MS",
    "MAX_INNER", "SPLIT_ROUNDS", "GROUP_SAMPLE_MS", "SETTLE_MS", "MAX_GROUP_INNER", "MAX_SETTLE_LAUNCHES",
    "MAX_SPIN_MS", "SPIN_RETRIES", "SPIN_CALIBRATION_CYCLES", "Timer", "GroupTimer", "agreement_error",
    "agreement_tolerance",
]  # fmt: skip

_log = logging.getLogger("te_cudnn")

#: The environment variable that turns autotuning on for the process.
ENV = "TE_CUDNN_AUTOTUNE"
#: ``TE_CUDNN_AUTOTUNE_KNOBS=N`` also tries, for each engine the heuristics propose, every other
#: value ``0 .. N-1`` of each of its integer knobs (e.g. the SDPA engines' kernel configuration,
#: ``k24``): plans the heuristics never rank. Off (0) by default: each variant that builds costs
#: a kernel compilation, once per key.
KNOBS_ENV = "TE_CUDNN_AUTOTUNE_KNOBS"

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("", "0", "false", "off", "no")

# ----------------------------------------------------------------------------- switching it on
_override: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar("te_cudnn_autotune", default=None)
_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(cause: str, message: str) -> None:
    with _warn_lock:
        if cause in _warned:
            return
        _warned.add(cause)
    warnings.warn(message, stacklevel=3)


def autotune_enabled() -> bool:
    """Whether autotuning is on here: the innermost :func:`autotuning` block of this thread or
    task, else ``TE_CUDNN_AUTOTUNE`` (``1``/``true``/``on``/``yes``; unset, ``0``, ``false``,
    ``off``, ``no`` are off; anything else is off, with one warning)."""
    value = _override.get()
    if value is not None:
        return value
    raw = os.environ.get(ENV)
    if raw is None:
        return False
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word not in _FALSE:
        _warn_once(f"env:{raw}", f"te_cudnn: {ENV}={raw!r} is not one of 1/true/on/yes or 0/false/off/no; "
                                 "autotuning stays off")
    return False


@contextlib.contextmanager
def autotuning(enabled: bool = True) -> Iterator[None]:
    """Turn autotuning on (or, with ``enabled=False``, off) inside the block, whatever
    ``TE_CUDNN_AUTOTUNE`` says; blocks nest, the innermost wins. The setting belongs to the
    current thread (a ``contextvars`` variable: threads started inside do not inherit it,
    asyncio tasks do). Entering with ``enabled=True`` retires the plan cache's untuned plans,
    so calls that hold one tune at their next launch. Also usable as a decorator."""
    token = _override.set(bool(enabled))
    try:
        if enabled:
            _retire_untuned()
        yield
    finally:
        _override.reset(token)


def tunable(key: Any) -> bool:
    """Whether ``key`` can be tuned at all: a CUDA device and a sub-backend whose plans are
    stored (tuning is paid once per GPU model only through the store)."""
    return key.config.device >= 0 and BY_ENUM[key.backend].caps.persistable


def _capturing() -> bool:
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # no CUDA: nothing is captured
        return False


def tuning_wanted(key: Any) -> bool:
    """Autotuning is on, ``key`` is tunable and no CUDA graph is being captured on this thread's
    stream (building and timing plans inside a capture would break it)."""
    return autotune_enabled() and tunable(key) and not _capturing()


def _retire_untuned() -> None:

    try:
        _cache.plan_cache.retire(lambda p: p.tuning is None and not p.tune_checked and tunable(p.key))
    except Exception:  # a cache of foreign plans (tests): never fail a `with` for it
        pass


# ----------------------------------------------------------------------------- planning every candidate
def knob_sweep() -> int:
    """How many values of each knob :func:`plan_candidates` tries (``TE_CUDNN_AUTOTUNE_KNOBS``;
    0 = none: the heuristics' candidates only). A value that is not a whole number >= 0 is
    treated as 0, with one warning."""
    raw = os.environ.get(KNOBS_ENV, "").strip()
    if not raw:
        return 0
    try:
        n = int(raw)
        if n < 0:
            raise ValueError(raw)
        return n
    except ValueError:
        _warn_once(f"knobs:{raw}", f"te_cudnn: {KNOBS_ENV}={raw!r} is not a whole number >= 0; no knob sweep")
        return 0


def add_knob_variants(g: Any, values: int) -> int:
    """Append to ``g``'s ranked plan list one plan per other value (``0 .. values-1``) of each
    integer knob of each engine configuration already in it (``get_engine_and_knobs_at_index``
    / ``create_execution_plan``): one knob changed at a time. Returns how many were appended;
    a variant the frontend refuses to append is skipped (one that cuDNN cannot build fails at
    build time and is dropped from the candidates)."""
    seen: set[tuple] = set()
    proposed = []
    for i in range(int(g.get_execution_plan_count())):
        try:
            engine, knobs = g.get_engine_and_knobs_at_index(i)
        except Exception:  # noqa: BLE001 - a plan the frontend cannot describe is not varied
            continue
        knobs = dict(knobs or {})
        seen.add((engine, tuple(sorted((str(k), v) for k, v in knobs.items()))))
        proposed.append((engine, knobs))
    added = 0
    for engine, knobs in proposed:
        for knob, value in knobs.items():
            if not isinstance(value, int):
                continue
            for other in range(values):
                variant = {**knobs, knob: other}
                sig = (engine, tuple(sorted((str(k), v) for k, v in variant.items())))
                if sig in seen:
                    continue
                seen.add(sig)
                try:
                    g.create_execution_plan(engine, variant)
                except Exception:  # noqa: BLE001 - the frontend refuses the value: not a candidate
                    continue
                added += 1
    return added


def _mode_name(mode: Any) -> str:
    return getattr(mode, "name", None) or str(mode).rsplit(".", 1)[-1]


def plan_candidates(key: Any, make_spec: Callable[[], Any], modes: Optional[Sequence[Any]] = None) -> Planned:
    """Plan ``key``'s graph with every heuristic mode that works and build every plan. Raises
    :class:`~te_cudnn.errors.GraphBuildError` when no mode set can plan and build it."""
    cudnn = cudnn_module()
    h = cudnn.heur_mode
    mode_sets = [list(modes)] if modes else [[h.A, h.B, h.FALLBACK], [h.A, h.FALLBACK]]
    failure: Optional[tuple[str, BaseException]] = None
    deterministic = key.direction == Direction.BWD and key.config.deterministic
    build_errors: dict[int, str] = {}
    sweep = knob_sweep()
    proposed = [0]  # plans the heuristics ranked; those after them are knob variants

    def build_all(g: Any) -> None:
        """``build_plans(ALL)``; where that raises (a plan failing with an error the frontend does
        not treat as a decline), the heuristic walk, then each other plan on its own: a plan
        that fails is a candidate with an error, not a failed tuning."""
        build_errors.clear()
        try:
            g.build_plans(cudnn.build_plan_policy.ALL)
            return
        except Exception:  # noqa: BLE001
            pass
        g.build_plans()  # the heuristic choice, as build_plan makes it (raises when nothing builds)
        chosen = int(getattr(g, "_plan_index", 0))
        for i in range(int(g.get_execution_plan_count())):
            if i != chosen:
                try:
                    g.build_plan_at_index(i)
                except Exception as exc:  # noqa: BLE001
                    build_errors[i] = f"not built: {one_line(exc)}"
        g.build_plan_at_index(chosen)  # selected again: the heuristic plan

    def _vary(g: Any) -> None:
        """The knob sweep (TE_CUDNN_AUTOTUNE_KNOBS): variants go after the heuristics' plans."""
        proposed[0] = int(g.get_execution_plan_count())
        if sweep and not deterministic:  # a variant carries no numerical notes to filter by
            add_knob_variants(g, sweep)

    for mode_set in mode_sets:
        stages: dict[str, float] = {}
        t0 = time.perf_counter()
        spec = make_spec()  # planning is one-shot: a new graph for each attempt
        g = spec.graph
        stages["graph"] = time.perf_counter() - t0

        def _deselect(g: Any = g) -> None:
            if deterministic:  # never time (or choose) a plan cuDNN marks non-deterministic
                g.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC])

        steps = (
            ("validate", "validate", g.validate),
            ("operation_graph", "build the operation graph of", g.build_operation_graph),
            ("filters", "filter the plans of", _deselect),
            ("heuristics", "create execution plans for", lambda g=g, m=mode_set: g.create_execution_plans(m)),
            ("workspace", "keep the plans without a workspace of", lambda g=g: keep_without_workspace(key, g)),
            ("check_support", "check support of", g.check_support),
            ("knobs", "vary the knobs of the plans of", lambda g=g: _vary(g)),
            ("build_plans", "build every plan of", lambda g=g: build_all(g)),
        )
        try:
            for name, stage, step in steps:
                t0 = time.perf_counter()
                try:
                    step()
                except Exception as exc:
                    failure = (stage, exc)
                    raise
                stages[name] = time.perf_counter() - t0
        except Exception:  # noqa: BLE001 - try the next mode set
            continue
        break
    else:
        assert failure is not None
        raise GraphBuildError(key, failure[0], failure[1]) from failure[1]

    heuristic = int(getattr(g, "_plan_index", 0))  # build_plans(ALL) keeps the walk's choice selected
    names = []
    for i in range(int(g.get_execution_plan_count())):
        try:
            names.append(str(g.get_plan_name_at_index(i)))
        except Exception:  # noqa: BLE001 - an unnamed plan stays distinct
            names.append(f"plan_{i}")
    keep, duplicates = dedupe_names(names)
    if heuristic not in keep and 0 <= heuristic < len(names):  # the selected plan is always a candidate
        keep = sorted({*(i for i in keep if names[i] != names[heuristic]), heuristic})
    candidates = []
    for i in keep:
        if i in build_errors:
            if not sweep or i < proposed[0]:  # a knob variant cuDNN cannot build is no candidate
                candidates.append(Candidate(i, names[i], None, build_errors[i]))
            continue
        try:
            candidates.append(Candidate(i, names[i], int(g.get_workspace_size_plan_at_index(i))))
        except Exception as exc:  # noqa: BLE001 - not built (declined at build time) or excluded
            if not sweep or i < proposed[0]:
                candidates.append(Candidate(i, names[i], None, f"not built: {one_line(exc)}"))
    return Planned(spec, g, candidates, heuristic, [_mode_name(m) for m in mode_set], duplicates, stages)


# ----------------------------------------------------------------------------- the builder
def tune_plan(key: Any, make_spec: Callable[[], Any], *, timer: Optional[Timer] = None, warmup: int = DEFAULT_WARMUP,
              reps: int = DEFAULT_REPS, min_speedup: float = MIN_SPEEDUP, max_workspace: Optional[int] = None,
              check_numerics: bool = True) -> Any:  # fmt: skip
    """Build ``key``'s plan by tuning it: a :class:`~te_cudnn.plans.cache.CompiledPlan` of the
    chosen engine with ``.tuning`` set to the record. Where tuning cannot be done (planning with
    every mode fails, no candidate runs, the heuristic plan fails), the heuristic plan is built
    as usual, with ``.tuning_error`` saying why (warned once per kind of problem); a graph
    cuDNN cannot build at all raises :class:`~te_cudnn.errors.GraphBuildError` as
    :func:`~te_cudnn.plans.cache.build_plan` does. Logged on the ``te_cudnn`` logger at INFO."""

    start = time.perf_counter()
    try:
        planned = plan_candidates(key, make_spec)
    except Exception as exc:  # noqa: BLE001 - build the heuristic plan the usual way
        plan = _cache.build_plan(key, make_spec)  # raises GraphBuildError when the graph cannot be built at all
        plan.tuning_error = f"planning every candidate failed: {one_line(exc)}"
        _warn_once(f"plan:{type(exc).__name__}", f"te_cudnn: could not tune {key}: {plan.tuning_error}; using the "
                                                 f"heuristic plan (further keys with this problem are not reported)")  # fmt: skip
        return plan
    g = planned.graph
    stages = dict(planned.stages)
    t0 = time.perf_counter()
    result, error = None, None
    try:
        result = time_and_choose(key, planned, timer=timer, warmup=warmup, reps=reps, min_speedup=min_speedup,
                                 max_workspace=max_workspace, check_numerics=check_numerics)  # fmt: skip
        g.build_plan_at_index(result.chosen.index)  # selects it: PlanLauncher, execute and serialize() use it
    except Exception as exc:  # noqa: BLE001 - the heuristic plan, still selected, serves
        error = one_line(exc)
        _warn_once(f"time:{type(exc).__name__}", f"te_cudnn: could not tune {key}: {error}; using the heuristic plan "
                                                 f"(further keys with this problem are not reported)")  # fmt: skip
        result = None
        try:
            if int(getattr(g, "_plan_index", -1)) != planned.heuristic_index:
                g.build_plan_at_index(planned.heuristic_index)
        except Exception:  # noqa: BLE001 - the tuning graph is unusable: build the heuristic plan afresh
            plan = _cache.build_plan(key, make_spec)
            plan.tuning_error, plan.tune_checked = error, True
            return plan
    stages["tune"] = time.perf_counter() - t0
    index = int(getattr(g, "_plan_index", 0))
    try:
        name = str(g.get_plan_name_at_index(index))
    except Exception:  # noqa: BLE001 - naming is informational only
        name = "unknown"
    plan = _cache.CompiledPlan(key, g, tuple(planned.spec.uids), int(g.get_workspace_size()), name,
                        time.perf_counter() - start, stages=stages)  # fmt: skip
    if result is not None:
        plan.tuning = result.to_record()
        if _log.isEnabledFor(logging.INFO):
            sp = result.speedup
            h = result.heuristic
            _log.info("autotuned plan for %s in %.1f s: [%d] %s %.4f ms%s (%d candidates, %d timed)", key,
                      plan.build_seconds, result.chosen.index, result.chosen.name, result.chosen.median_ms or 0.0,
                      "" if h is None else (f", heuristic [{h.index}] {h.name} {h.median_ms or 0.0:.4f} ms, "
                                            f"speed-up {sp or 0.0:.3f}x" + ("" if result.tuned_away else " (kept)")),
                      len(result.candidates), sum(t.error is None for t in result.candidates))  # fmt: skip
    else:
        plan.tuning_error = error
    plan.tune_checked = True
    return plan


# ----------------------------------------------------------------------------- public API
def tune_key(key: Any, *, cache: Any = None, store: bool = True, timer: Optional[Timer] = None,
             warmup: int = DEFAULT_WARMUP, reps: int = DEFAULT_REPS, min_speedup: float = MIN_SPEEDUP,
             max_workspace: Optional[int] = None, check_numerics: bool = True) -> TuningResult:  # fmt: skip
    """Tune ``key`` now, whatever ``TE_CUDNN_AUTOTUNE`` says (also a key already tuned): the
    tuned plan replaces the key's plan in ``cache`` (default: the process's plan cache) and, with
    ``store``, in the plan store. Raises :class:`TuningError` when the key cannot be tuned."""

    if not tunable(key):
        raise TuningError(f"{key} cannot be tuned (it needs a CUDA device and a sub-backend whose plans are stored)")
    if _capturing():
        raise TuningError("tuning during CUDA-graph capture is not possible")
    device = key.config.device
    backend = BY_ENUM[key.backend]
    with torch.cuda.device(device):
        plan = tune_plan(key, lambda: backend.build(key.config, key.direction, handle_for(device)), timer=timer,
                         warmup=warmup, reps=reps, min_speedup=min_speedup, max_workspace=max_workspace,
                         check_numerics=check_numerics)  # fmt: skip
    if plan.tuning is None:
        raise TuningError(f"could not tune {key}: {plan.tuning_error}")
    if store:
        s = _cache.store_for(device)
        if s is not None:
            _cache._save_built(s, key, key.describe(device=False), plan)
    (_cache.plan_cache if cache is None else cache).put(plan)
    return TuningResult.from_record(plan.tuning, key=key)


def tuning_record(key: Any, *, cache: Any = None, store: Any = None) -> Optional[dict[str, Any]]:
    """``key``'s tuning record: from its plan in ``cache`` (default: the process's plan cache)
    when that plan is tuned, else from its file in ``store`` (default: the device's plan store),
    read without deserializing the plan; None when it has none."""

    plan = (_cache.plan_cache if cache is None else cache).find(key)
    if plan is not None and plan.tuning is not None:
        return plan.tuning
    if store is None:
        if key.config.device < 0:
            return None
        store = _cache.store_for(key.config.device)
        if store is None:
            return None
    entry = store.load(key.describe(device=False))
    record = None if entry is None else entry.header.get("tuning")
    return record if valid_record(record) else None


_cache.use_tuner(sys.modules[__name__])  # the cache asks this module (te_cudnn.plans.cache.Tuner)
