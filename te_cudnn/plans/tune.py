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
   (:data:`te_cudnn.testing.TOLERANCES` ceiling; :data:`FP8_AGREEMENT` for FP8) is excluded,
   with the reason, as is one that fails or needs more workspace than the limit. These runs
   (:func:`result_checks`) bind, for padding masks and THD, partial lengths as calls bind them
   (an empty sequence, shorter ones, a full one, THD gaps: ``te_cudnn.padded_rows``), into
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
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import statistics
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional, Sequence

__all__ = [
    "ENV", "KNOBS_ENV", "RECORD_VERSION", "FP8_AGREEMENT", "Candidate", "CandidateTiming", "Planned", "TuningError",
    "TuningResult", "autotune_enabled", "autotuning", "choose", "cuda_event_timer", "dedupe_names",
    "format_record", "interleaved_event_timer", "knob_sweep", "add_knob_variants", "length_operands", "make_operands",
    "measure", "plan_candidates", "result_checks", "run_checks", "check_error", "tunable",
    "tune_key", "tune_plan", "tuning_record", "tuning_wanted", "valid_record",
]  # fmt: skip

from .order import ORDER_SEED, order_rng, round_order
from .split import measure_splits, splittable

_log = logging.getLogger("te_cudnn")

#: The environment variable that turns autotuning on for the process.
ENV = "TE_CUDNN_AUTOTUNE"
#: ``TE_CUDNN_AUTOTUNE_KNOBS=N`` also tries, for each engine the heuristics propose, every other
#: value ``0 .. N-1`` of each of its integer knobs (e.g. the SDPA engines' kernel configuration,
#: ``k24``): plans the heuristics never rank. Off (0) by default: each variant that builds costs
#: a kernel compilation, once per key.
KNOBS_ENV = "TE_CUDNN_AUTOTUNE_KNOBS"
#: The version of the tuning record in a stored plan's header; a record of another version is ignored
#: (the key is tuned again). 3: candidates checked with partial lengths into NaN-prefilled
#: results, those leaving padded rows unwritten excluded (:func:`result_checks`); 2: timed side by
#: side under sustained load (:func:`interleaved_event_timer`); 1: timed one at a time.
RECORD_VERSION = 3
DEFAULT_WARMUP = 3
DEFAULT_REPS = 10
#: The fastest candidate replaces the heuristic plan only when it is at least this much faster.
MIN_SPEEDUP = 1.01
#: Candidates needing more workspace than this (or than the heuristic plan, if more) are not timed.
DEFAULT_MAX_WORKSPACE = 1 << 30
#: The relative (Frobenius) difference from the heuristic plan's results allowed for FP8 graphs:
#: E4M3/E5M2 results carry 2-3 mantissa bits, so this catches a broken engine, not drift (the
#: GPU suite holds every candidate to the FP8 tests' own bounds).
FP8_AGREEMENT = 0.15
#: The FP8 softmax scale of the operands tuning runs with (the E4M3 maximum over amax 1).
FP8_SOFTMAX_SCALE = 448.0
#: Timing: a sample lasts at least this long (several launches per sample for short kernels).
MIN_SAMPLE_MS = 1.0
#: Interleaved rounds in which the whole FP8 backward and its splits are timed side by side.
SPLIT_ROUNDS = 5
MAX_INNER = 50
MAX_SPIN_MS = 200.0
#: A sample whose spin ended before the host had queued it is taken again with twice the spin, at
#: most this many times per run (then it counts as it is).
SPIN_RETRIES = 4
#: The length of the spins that measure ``torch.cuda._sleep``'s rate (0.5 ms at 2 GHz).
SPIN_CALIBRATION_CYCLES = 1_000_000
#: :func:`interleaved_event_timer`: a sample lasts at least this long, and the GPU runs this long
#: under load before the rounds start (the clock under a power limit is what training sees).
GROUP_SAMPLE_MS = 5.0
SETTLE_MS = 300.0
MAX_GROUP_INNER = 2000
MAX_SETTLE_LAUNCHES = 20000

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
    from ..backends import BY_ENUM  # noqa: PLC0415

    return key.config.device >= 0 and BY_ENUM[key.backend].caps.persistable


def _capturing() -> bool:
    try:
        import torch  # noqa: PLC0415

        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # no CUDA: nothing is captured
        return False


def tuning_wanted(key: Any) -> bool:
    """Autotuning is on, ``key`` is tunable and no CUDA graph is being captured on this thread's
    stream (building and timing plans inside a capture would break it)."""
    return autotune_enabled() and tunable(key) and not _capturing()


def _retire_untuned() -> None:
    from .cache import plan_cache  # noqa: PLC0415

    try:
        plan_cache.retire(lambda p: p.tuning is None and not p.tune_checked and tunable(p.key))
    except Exception:  # a cache of foreign plans (tests): never fail a `with` for it
        pass


# ----------------------------------------------------------------------------- bookkeeping (no GPU)
class TuningError(RuntimeError):
    """A key could not be tuned (no candidate ran, the heuristic plan failed, ...)."""


@dataclass(frozen=True)
class Candidate:
    """One engine configuration of a planned graph: its index in the frontend's ranked plan
    list, its name, its workspace bytes, and why it cannot be timed (None: it can)."""

    index: int
    name: str
    workspace: Optional[int]
    error: Optional[str] = None


@dataclass(frozen=True)
class CandidateTiming:
    index: int
    name: str
    workspace: Optional[int]
    median_ms: Optional[float] = None
    min_ms: Optional[float] = None
    samples: int = 0
    error: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        r = lambda x: None if x is None else round(float(x), 6)  # noqa: E731
        return {"index": self.index, "name": self.name, "workspace": self.workspace, "median_ms": r(self.median_ms),
                "min_ms": r(self.min_ms), "samples": self.samples, "error": self.error}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CandidateTiming":
        return cls(int(d["index"]), str(d["name"]), d.get("workspace"), d.get("median_ms"), d.get("min_ms"),
                   int(d.get("samples") or 0), d.get("error"))  # fmt: skip


def _one_line(exc: BaseException) -> str:
    text = "; ".join(p.strip() for p in str(exc).splitlines() if p.strip())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def dedupe_names(names: Sequence[str]) -> tuple[list[int], int]:
    """The indices to time: the first of each distinct plan name (a name seen again is the same
    engine configuration, proposed by another heuristic mode), and how many were dropped."""
    seen: set[str] = set()
    keep = []
    for i, name in enumerate(names):
        if name in seen:
            continue
        seen.add(name)
        keep.append(i)
    return keep, len(names) - len(keep)


#: ``timer(run, candidate, warmup=, reps=) -> [ms per launch, one per sample]``: one candidate at a time.
Timer = Callable[..., Sequence[float]]
#: ``group_timer(runs, warmup=, reps=) -> [samples or the exception, per run]``: every candidate in
#: interleaved rounds (:func:`interleaved_event_timer`, the device's default).
GroupTimer = Callable[..., Sequence[Any]]


def measure(candidates: Sequence[Candidate], run_for: Callable[[Candidate], Callable[[], None]],
            timer: Optional[Timer] = None, *, warmup: int = DEFAULT_WARMUP, reps: int = DEFAULT_REPS,
            group_timer: Optional[GroupTimer] = None) -> list[CandidateTiming]:  # fmt: skip
    """Time each candidate: ``run_for(candidate)`` prepares it (and may refuse it by raising),
    then ``timer`` times each prepared candidate's launches on its own, or ``group_timer`` times
    all of them side by side in interleaved rounds. A candidate that has an error, or whose
    preparation or timing raises, is recorded with the error and excluded from the choice."""
    if (timer is None) == (group_timer is None):
        raise TypeError("measure() takes one of timer= and group_timer=")
    results: dict[int, Any] = {}  # candidate position -> samples, or the error text
    prepared: list[tuple[int, Candidate, Callable[[], None]]] = []
    for pos, c in enumerate(candidates):
        if c.error is not None:
            results[pos] = c.error
            continue
        try:
            run = run_for(c)
        except Exception as exc:  # noqa: BLE001 - a refused candidate is a result, not a failure
            results[pos] = _one_line(exc)
            continue
        prepared.append((pos, c, run))
    if group_timer is not None and prepared:
        got = list(group_timer([run for _, _, run in prepared], warmup=warmup, reps=reps))
        if len(got) != len(prepared):
            raise TuningError(f"the group timer returned {len(got)} results for {len(prepared)} candidates")
        for (pos, _, _), samples in zip(prepared, got):
            results[pos] = _one_line(samples) if isinstance(samples, BaseException) else _valid_samples(samples)
    else:
        for pos, c, run in prepared:
            try:
                results[pos] = _valid_samples(timer(run, c, warmup=warmup, reps=reps))
            except Exception as exc:  # noqa: BLE001 - a failing candidate is a result, not a failure
                results[pos] = _one_line(exc)
    out = []
    for pos, c in enumerate(candidates):
        r = results[pos]
        if isinstance(r, str):
            out.append(CandidateTiming(c.index, c.name, c.workspace, error=r))
        else:
            out.append(CandidateTiming(c.index, c.name, c.workspace, statistics.median(r), min(r), len(r)))
    return out


def _valid_samples(samples: Any) -> Any:
    """The samples as floats; a string (the reason) when there are none or one is not a finite,
    non-negative time."""
    try:
        values = [float(x) for x in samples]
    except Exception as exc:  # noqa: BLE001
        return _one_line(exc)
    if not values or not all(math.isfinite(x) and x >= 0 for x in values):
        return f"ValueError: the timer gave no valid samples ({values[:4]})"
    return values


def choose(timings: Sequence[CandidateTiming], heuristic_index: int,
           min_speedup: float = MIN_SPEEDUP) -> tuple[CandidateTiming, Optional[CandidateTiming], str]:  # fmt: skip
    """``(chosen, heuristic, rule)``: the fastest timed candidate (by median; ties go to the
    lower index), unless the heuristic plan's median is within ``min_speedup`` of it."""
    ok = [t for t in timings if t.error is None and t.median_ms is not None]
    if not ok:
        why = "; ".join(f"[{t.index}] {t.name}: {t.error}" for t in timings[:5]) or "no candidates"
        raise TuningError(f"no candidate could be timed ({why})")
    best = min(ok, key=lambda t: (t.median_ms, t.index))
    heuristic = next((t for t in timings if t.index == heuristic_index), None)
    if heuristic is not None and heuristic.error is None and heuristic is not best:
        if heuristic.median_ms < best.median_ms * min_speedup:
            return heuristic, heuristic, (f"heuristic kept: the fastest, [{best.index}] {best.name}, is less than "
                                          f"{(min_speedup - 1) * 100:g}% faster")  # fmt: skip
    return best, heuristic, "fastest"


@dataclass
class TuningResult:
    """The outcome of tuning one key (also what a stored record reads back as)."""

    candidates: list[CandidateTiming]
    chosen: CandidateTiming
    heuristic: Optional[CandidateTiming]
    rule: str = "fastest"
    modes: list[str] = field(default_factory=list)
    warmup: int = DEFAULT_WARMUP
    reps: int = DEFAULT_REPS
    duplicates: int = 0
    seconds: float = 0.0
    timestamp: float = field(default_factory=time.time)
    key: Any = None  # the PlanKey, when known (not part of the record: the plan file holds it)
    split: Optional[dict] = None  # FP8 backward: the measured splits (te_cudnn.plans.split)

    @property
    def speedup(self) -> Optional[float]:
        """Heuristic median over chosen median (1.0 when the heuristic plan was kept)."""
        h, c = self.heuristic, self.chosen
        if h is None or h.median_ms is None or not c.median_ms:
            return None
        return h.median_ms / c.median_ms

    @property
    def tuned_away(self) -> bool:
        """True when the chosen plan is not the heuristic one."""
        return self.heuristic is None or self.chosen.index != self.heuristic.index

    def to_record(self) -> dict[str, Any]:
        speedup = self.speedup
        return {
            "version": RECORD_VERSION,
            "chosen": {"index": self.chosen.index, "name": self.chosen.name,
                       "median_ms": self.chosen.as_dict()["median_ms"]},
            "heuristic": None if self.heuristic is None else {
                "index": self.heuristic.index, "name": self.heuristic.name,
                "median_ms": self.heuristic.as_dict()["median_ms"]},
            "speedup": None if speedup is None else round(speedup, 4),
            "rule": self.rule,
            "candidates": [t.as_dict() for t in self.candidates],
            "duplicates": self.duplicates,
            "modes": list(self.modes),
            "warmup": self.warmup,
            "reps": self.reps,
            "seconds": round(self.seconds, 3),
            "timestamp": self.timestamp,
            **({} if self.split is None else {"split": self.split}),
        }  # fmt: skip

    @classmethod
    def from_record(cls, record: dict[str, Any], key: Any = None) -> "TuningResult":
        if not valid_record(record):
            raise ValueError("not a te_cudnn tuning record of this version")
        cands = [CandidateTiming.from_dict(c) for c in record["candidates"]]
        by_index = {c.index: c for c in cands}
        chosen = by_index.get(record["chosen"]["index"]) or CandidateTiming(
            int(record["chosen"]["index"]), str(record["chosen"]["name"]), None, record["chosen"].get("median_ms"))
        h = record.get("heuristic")
        heuristic = None if not isinstance(h, dict) else (by_index.get(h.get("index")) or CandidateTiming(
            int(h["index"]), str(h["name"]), None, h.get("median_ms")))  # fmt: skip
        return cls(cands, chosen, heuristic, str(record.get("rule", "fastest")), list(record.get("modes") or []),
                   int(record.get("warmup") or 0), int(record.get("reps") or 0), int(record.get("duplicates") or 0),
                   float(record.get("seconds") or 0.0), float(record.get("timestamp") or 0.0), key,
                   record.get("split") if isinstance(record.get("split"), dict) else None)  # fmt: skip


def valid_record(record: Any) -> bool:
    """A tuning record of this version, as :meth:`TuningResult.to_record` writes it."""
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return False
    chosen, cands = record.get("chosen"), record.get("candidates")
    return (isinstance(chosen, dict) and isinstance(chosen.get("index"), int) and isinstance(chosen.get("name"), str)
            and isinstance(cands, list) and all(isinstance(c, dict) and isinstance(c.get("index"), int)
                                                and isinstance(c.get("name"), str) for c in cands))  # fmt: skip


def _bytes(n: Any) -> str:
    if not isinstance(n, int):
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_record(record: dict[str, Any], indent: str = "") -> str:
    """A tuning record as text: the choice, then one line per candidate (``plans show``/``tune``)."""
    if not valid_record(record):
        return f"{indent}tuning: (a record this te_cudnn cannot read)"
    r = TuningResult.from_record(record)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.timestamp)) if r.timestamp else "?"
    ms = lambda t: "?" if t is None or t.median_ms is None else f"{t.median_ms:.4f} ms"  # noqa: E731
    head = f"{indent}tuned {when}: chosen [{r.chosen.index}] {r.chosen.name} ({ms(r.chosen)})"
    if r.heuristic is not None and r.tuned_away:
        head += f", heuristic [{r.heuristic.index}] {r.heuristic.name} ({ms(r.heuristic)})"
    elif r.heuristic is not None:
        head += " = the heuristic plan"
    if r.speedup is not None:
        head += f", speed-up {r.speedup:.3f}x"
    timed = sum(c.error is None for c in r.candidates)
    head += f"; {len(r.candidates)} candidates, {timed} timed"
    if r.duplicates:
        head += f", {r.duplicates} duplicate(s) skipped"
    if r.modes:
        head += f"; heuristic modes {', '.join(r.modes)}"
    if r.rule != "fastest":
        head += f" ({r.rule})"
    width = max((len(c.name) for c in r.candidates), default=4)
    lines = [head]
    for c in sorted(r.candidates, key=lambda c: (c.median_ms is None, c.median_ms or 0.0, c.index)):
        tags = [t for t, on in (("chosen", c.index == r.chosen.index),
                                ("heuristic", r.heuristic is not None and c.index == r.heuristic.index)) if on]  # fmt: skip
        what = f"{c.median_ms:10.4f} ms (min {c.min_ms:.4f})" if c.median_ms is not None else f"error: {c.error}"
        lines.append(f"{indent}  [{c.index:>3}] {c.name.ljust(width)}  {what}  ws {_bytes(c.workspace)}"
                     + (f"  <- {', '.join(tags)}" if tags else ""))  # fmt: skip
    return "\n".join(lines)


# ----------------------------------------------------------------------------- planning every candidate
@dataclass
class Planned:
    """A graph with every plan built, and what tuning needs to know about it."""

    spec: Any
    graph: Any
    candidates: list[Candidate]
    heuristic_index: int
    modes: list[str]
    duplicates: int
    stages: dict[str, float]


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
    from ..backends import Direction  # noqa: PLC0415
    from ..errors import GraphBuildError  # noqa: PLC0415
    from ..runtime import cudnn_module  # noqa: PLC0415

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
                    build_errors[i] = f"not built: {_one_line(exc)}"
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
                candidates.append(Candidate(i, names[i], None, f"not built: {_one_line(exc)}"))
    return Planned(spec, g, candidates, heuristic, [_mode_name(m) for m in mode_set], duplicates, stages)


# ----------------------------------------------------------------------------- operands
def _torch_dtypes() -> dict[Any, Any]:
    import torch  # noqa: PLC0415

    from ..runtime import torch_dtype_to_cudnn  # noqa: PLC0415

    out = {}
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64,
               getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):  # fmt: skip
        if dt is not None:
            out[torch_dtype_to_cudnn(dt)] = dt
    return out


def _lengths(cfg: Any) -> tuple[list[int], list[int]]:
    """Per-sequence lengths for timing: every sequence full; THD sides fill their token
    capacity (the bucket) with full sequences first, the rest empty."""

    def fill(full: int, ragged: bool, capacity: int) -> list[int]:
        if not ragged:
            return [full] * cfg.b
        out, left = [], capacity
        for _ in range(cfg.b):
            n = min(full, left)
            out.append(n)
            left -= n
        return out

    return fill(cfg.sq, cfg.ragged_q, cfg.max_total_q), fill(cfg.skv, cfg.ragged_kv, cfg.max_total_kv)


def _multipliers(cfg: Any) -> dict[int, int]:
    """Elements per token of each THD tensor, by its ragged-offset uid (``te_cudnn.varlen``'s)."""
    from ..backends.base import Uid  # noqa: PLC0415

    return {Uid.RAGGED_Q: cfg.q_stride[2], Uid.RAGGED_O: cfg.h * cfg.d_v, Uid.RAGGED_STATS: cfg.h,
            Uid.RAGGED_K: cfg.k_stride[2], Uid.RAGGED_V: cfg.v_stride[2]}  # fmt: skip


def length_operands(graph: Any, uids: Sequence[int], cfg: Any, device: Any, *,
                    lengths: Optional[tuple[Sequence[int], Sequence[int]]] = None,
                    cu_tokens: Optional[tuple[Optional[Sequence[int]], Optional[Sequence[int]]]] = None,
                    ) -> dict[int, Any]:  # fmt: skip
    """The operands of ``uids`` that say where sequences are: lengths (``[b, 1, 1, 1]`` int32)
    and THD ragged offsets (``[b + 1, 1, 1, 1]`` int64 elements), in the graph's own dtypes.
    ``lengths``: (q, kv) per-sequence lengths as bound (default: :func:`_lengths`);
    ``cu_tokens``: (q, kv) token offsets ``[b + 1]`` where each side's sequences start, for THD
    sides (None: packed one after another, the cumulative lengths)."""
    import torch  # noqa: PLC0415

    from ..backends.base import Uid  # noqa: PLC0415

    device = torch.device(device)
    dtypes = _torch_dtypes()
    lens_q, lens_kv = _lengths(cfg) if lengths is None else (list(lengths[0]), list(lengths[1]))
    cu_q, cu_kv = (None, None) if cu_tokens is None else cu_tokens
    multipliers = _multipliers(cfg)
    ops: dict[int, Any] = {}
    for uid in uids:
        if uid not in (Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV) and uid not in multipliers:
            continue
        t = graph.find_tensor(uid)
        if t is None:
            raise ValueError(f"the graph has no tensor with uid {uid} ({Uid.NAMES.get(uid, '?')})")
        dtype = dtypes[t.data_type]
        if uid in (Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV):
            values = lens_q if uid == Uid.SEQ_LEN_Q else lens_kv
        else:
            q_side = uid in (Uid.RAGGED_Q, Uid.RAGGED_O, Uid.RAGGED_STATS)
            cum = cu_q if q_side else cu_kv
            if cum is None:
                cum = [0]
                for n in lens_q if q_side else lens_kv:
                    cum.append(cum[-1] + n)
            values = [c * multipliers[uid] for c in cum]
        flat = torch.tensor(list(values), dtype=dtype, device=device)
        dims, strides = [int(x) for x in t.dim], [int(x) for x in t.stride]
        extent = 1 + sum((d - 1) * s for d, s in zip(dims, strides)) if all(dims) else 0
        ops[uid] = flat if flat.numel() != extent else flat.as_strided(dims, strides)
    return ops


def make_operands(graph: Any, uids: Sequence[int], cfg: Any, device: Any, *, seed: int = 0,
                  lengths: Optional[tuple[Sequence[int], Sequence[int]]] = None,
                  cu_tokens: Optional[tuple[Optional[Sequence[int]], Optional[Sequence[int]]]] = None,
                  ) -> dict[int, Any]:  # fmt: skip
    """A buffer for every operand uid of a planned (or validated) graph, with the graph's own
    dims, strides and dtypes: dense tensors as strided views, THD (ragged) tensors as flat
    buffers sized for their token capacity. Inputs are random normal (FP8: cast from bf16);
    outputs are zeros; operands cuDNN reads as data are valid: sequence lengths full (THD:
    as :func:`_lengths`; or ``lengths``), ragged offsets dense (``te_cudnn.ops``' multipliers;
    or starting at ``cu_tokens``: :func:`length_operands`), page tables the
    identity (sequence ``i`` owns pages ``i * n ... i * n + n - 1``, modulo the pool), dropout
    seed 1234 and offset 0, FP8 scales and descales 1 except the softmax's (``scale_s`` = 448,
    the E4M3 maximum, ``descale_s`` = 1/448: probabilities are at most 1, as delayed scaling
    settles them), the backward's softmax stats
    ``log(skv) + 1`` (at least every row's true logsumexp for inputs of this scale, so the
    backward's probabilities stay finite)."""
    import torch  # noqa: PLC0415

    from ..backends.base import Uid  # noqa: PLC0415

    device = torch.device(device)
    dtypes = _torch_dtypes()
    outputs = {t.uid for t in graph.get_outputs()}
    gen = torch.Generator(device=device).manual_seed(seed)
    where = length_operands(graph, uids, cfg, device, lengths=lengths, cu_tokens=cu_tokens)
    q_side = {Uid.Q, Uid.O, Uid.STATS, Uid.DO, Uid.DQ, Uid.MAX}
    scales = set(range(Uid.DESCALE_Q, Uid.SCALE_O + 1)) | {Uid.DESCALE_O, Uid.DESCALE_DO, Uid.DESCALE_DP, Uid.SCALE_DQ,
                                                           Uid.SCALE_DK, Uid.SCALE_DV, Uid.SCALE_DP}  # fmt: skip
    fp8 = {d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d is not None}
    ops: dict[int, Any] = {}
    for uid in uids:
        t = graph.find_tensor(uid)
        if t is None:
            raise ValueError(f"the graph has no tensor with uid {uid} ({Uid.NAMES.get(uid, '?')})")
        dims, strides, dtype = [int(x) for x in t.dim], [int(x) for x in t.stride], dtypes[t.data_type]
        ragged = t.ragged_offset is not None
        if ragged:  # [t, h, d] tokens placed by offsets: capacity x token stride
            tokens = cfg.max_total_q if uid in q_side else cfg.max_total_kv
            extent = max(tokens - 1, 0) * strides[2] + (dims[1] - 1) * strides[1] + (dims[3] - 1) * strides[3] + 1
        else:
            extent = 1 + sum((d - 1) * s for d, s in zip(dims, strides)) if all(dims) else 0
        if uid in where:  # lengths and ragged offsets: already the graph's dims
            ops[uid] = where[uid]
            continue
        if uid in outputs:
            flat = torch.zeros(extent, dtype=dtype, device=device)
        elif uid in (Uid.PAGE_TABLE_K, Uid.PAGE_TABLE_V):
            pages, per_seq = cfg.paged[0], dims[2]
            flat = (torch.arange(dims[0] * per_seq, dtype=torch.int64, device=device) % pages).to(dtype)
        elif uid == Uid.SEED:
            flat = torch.full((extent,), 1234, dtype=dtype, device=device)
        elif uid == Uid.OFFSET:
            flat = torch.zeros(extent, dtype=dtype, device=device)
        elif uid in scales:
            value = {Uid.SCALE_S: FP8_SOFTMAX_SCALE, Uid.DESCALE_S: 1.0 / FP8_SOFTMAX_SCALE}.get(uid, 1.0)
            flat = torch.full((extent,), value, dtype=dtype, device=device)
        elif uid == Uid.STATS:  # the backward's input
            flat = torch.full((extent,), math.log(max(cfg.skv, 1)) + 1.0, dtype=dtype, device=device)
        elif dtype.is_floating_point:
            gen_dtype = torch.bfloat16 if dtype in fp8 else dtype
            flat = torch.randn(extent, generator=gen, dtype=gen_dtype, device=device).to(dtype)
        else:
            raise ValueError(f"no contents defined for operand uid {uid} ({Uid.NAMES.get(uid, '?')}, {dtype})")
        ops[uid] = flat if ragged or flat.numel() != extent else flat.as_strided(dims, strides)
    return ops


def _agreement_error(name: str, actual: Any, reference: Any, tol: float) -> Optional[str]:
    """Why ``actual`` does not match the heuristic plan's ``reference`` (None: it does)."""
    import torch  # noqa: PLC0415

    a, r = actual.detach().float(), reference.detach().float()
    fa, fr = torch.isfinite(a), torch.isfinite(r)
    if not torch.equal(fa, fr):
        return f"{name}: non-finite values where the heuristic plan's are finite (or the reverse)"
    a, r = a[fr].double(), r[fr].double()
    err = float((a - r).norm() / r.norm().clamp_min(1e-30)) if r.numel() else 0.0
    if err > tol:
        return f"{name}: relative difference {err:.3e} from the heuristic plan's result exceeds {tol:.1e}"
    return None


def result_checks(key: Any, graph: Any, uids: Sequence[int], ops: dict[int, Any], device: Any) -> list[Any]:
    """The runs of the agreement check (:class:`te_cudnn.padded_rows.ResultCheck`): for padding
    masks and THD, partial lengths as calls bind them (an empty sequence, shorter ones, a full
    one; :func:`te_cudnn.padded_rows.probe_batches`), sharing ``ops``' inputs and outputs.
    The promised results (O; dQ, dK, dV) are prefilled with NaN, so a row an engine leaves
    unwritten shows; where te_cudnn zero-fills them for this key whatever the engine
    (``te_cudnn.row_fill``'s static rule), the rows past each sequence's end start at zero, as
    the fill leaves them (``fill_padded``)."""
    from ..backends import BY_ENUM, Direction  # noqa: PLC0415
    from ..padded_rows import ResultCheck, probe_batches  # noqa: PLC0415
    from ..row_fill import skips_grads_fill, skips_out_fill  # noqa: PLC0415

    cfg, backend = key.config, BY_ENUM[key.backend]
    skips = (skips_out_fill if key.direction == Direction.FWD else skips_grads_fill)(cfg, backend)
    filled = (cfg.mask.is_padding or cfg.is_ragged) and not skips
    return [ResultCheck(graph, uids, cfg, key.direction, ops, batch, device, fill_padded=filled)
            for batch in probe_batches(cfg, backend)]  # fmt: skip


def run_checks(checks: Sequence[Any], run: Callable[[dict], None]) -> tuple[list[dict], Optional[str]]:
    """Run one plan on each check's operands (``run(ops)``, which returns when the results are
    there) into prefilled results: the outputs to compare (:meth:`ResultCheck.snapshot`, one
    per check) and why the promised rows are wrong (None: they are right)."""
    got, problems = [], []
    for check in checks:
        check.prefill()
        run(check.ops)
        problem = check.problems()
        if problem is not None:
            problems.append(problem)
        got.append(check.snapshot())
    return got, "; ".join(problems) or None


def check_error(got: Sequence[dict], problem: Optional[str], reference: Sequence[dict], outputs: Sequence[int],
                tol: float) -> Optional[str]:  # fmt: skip
    """Why a candidate is excluded (None: it passes): its promised rows are wrong ("padded
    rows: ..."; such an engine is never chosen, whatever its speed), or an output differs from
    the heuristic plan's by more than ``tol`` ("numerics: ..."). ``got`` / ``problem``:
    :func:`run_checks`' answer for the candidate, ``reference``: for the heuristic plan."""
    from ..backends.base import Uid  # noqa: PLC0415

    if problem is not None:
        return f"padded rows: {problem}"
    for mine, ref in zip(got, reference):
        for uid in outputs:
            why = _agreement_error(Uid.NAMES.get(uid, str(uid)), mine[uid], ref[uid], tol)
            if why is not None:
                return f"numerics: {why}"
    return None


def agreement_tolerance(dtype: Any) -> float:
    """How far a candidate's results may be from the heuristic plan's: the dtype's ceiling in
    :data:`te_cudnn.testing.TOLERANCES`; :data:`FP8_AGREEMENT` for FP8."""
    from ..testing import TOLERANCES  # noqa: PLC0415

    tol = TOLERANCES.get(dtype)
    return tol.ceiling if tol is not None else FP8_AGREEMENT


# ----------------------------------------------------------------------------- timing
_cycles_per_ms: dict[int, Optional[float]] = {}


def _spin_rate(device: int) -> Optional[float]:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep``, measured once per device: the
    fastest of three spins in a row. ``_sleep`` counts clock cycles, and a GPU that was idle
    runs the first spin at a low clock; a rate read there made every later spin (at the clock
    under load) a fraction as long as meant, too short to hide the host's launches. The
    highest rate gives spins at least as long as meant. A spin that still ends too soon is
    caught where it is used (:func:`_spin_ended`)."""
    if device in _cycles_per_ms:
        return _cycles_per_ms[device]
    import torch  # noqa: PLC0415

    rate = None
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        try:
            rates = []
            for _ in range(3):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                sleep(SPIN_CALIBRATION_CYCLES)
                e.record()
                e.synchronize()
                ms = s.elapsed_time(e)
                if ms > 0:
                    rates.append(SPIN_CALIBRATION_CYCLES / ms)
            rate = max(rates) if rates else None
        except Exception:  # noqa: BLE001 - spinning is an optimisation of the measurement
            rate = None
    _cycles_per_ms[device] = rate
    return rate


def _spin(ms: float, rate: float) -> Any:
    """Spin the current stream for about ``ms`` and return an event recorded right after it."""
    import torch  # noqa: PLC0415

    torch.cuda._sleep(int(ms * rate))
    spun = torch.cuda.Event()
    spun.record()
    return spun


def _spin_ended(spun: Any) -> bool:
    """True when the spin before a sample was over by the time the host had queued the sample's
    launches: the GPU may have waited for the host, so the sample may include host time."""
    return spun is not None and bool(spun.query())


def _warm(run: Callable[[], None], warmup: int) -> tuple[float, float]:
    """``warmup`` launches of ``run`` (at least one), then one more between CUDA events:
    ``(median host ms per launch, device ms of one launch)`` (the latter at least 1 µs)."""
    import torch  # noqa: PLC0415

    host = []
    for _ in range(max(warmup, 1)):
        t0 = time.perf_counter()
        run()
        host.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    run()
    e.record()
    e.synchronize()
    return statistics.median(host) * 1e3, max(s.elapsed_time(e), 1e-3)


def cuda_event_timer(run: Callable[[], None], candidate: Optional[Candidate] = None, *,
                     warmup: int = DEFAULT_WARMUP, reps: int = DEFAULT_REPS) -> list[float]:  # fmt: skip
    """Milliseconds per launch of ``run`` on the current stream, one value per sample.

    ``warmup`` launches, then ``reps`` samples between CUDA events, each of enough launches to
    last about :data:`MIN_SAMPLE_MS`. Before the samples the stream spins (``torch.cuda._sleep``)
    for as long as the host needs to queue them all, so host launch overhead is not timed: the
    samples measure the GPU's back-to-back execution. When the spin was over before the host had
    queued them, the samples are taken again with twice the spin (at most :data:`SPIN_RETRIES`
    times)."""
    import torch  # noqa: PLC0415

    host_ms, estimate = _warm(run, warmup)
    inner = int(min(max(1, math.ceil(MIN_SAMPLE_MS / estimate)), MAX_INNER))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(max(reps, 1))]
    rate = _spin_rate(torch.cuda.current_device())
    ahead = min(host_ms * inner * len(events) * 1.25 + 0.5, MAX_SPIN_MS)
    spin = bool(rate) and host_ms > estimate * 0.5  # launches would starve the GPU: queue them behind a spin
    for _ in range(SPIN_RETRIES + 1):
        spun = _spin(ahead, rate) if spin else None
        for start, end in events:
            start.record()
            for _ in range(inner):
                run()
            end.record()
        late = _spin_ended(spun)
        torch.cuda.synchronize()
        if not late or ahead >= MAX_SPIN_MS:
            break
        ahead = min(ahead * 2, MAX_SPIN_MS)  # the spin ended before the host was done: longer, again
    return [start.elapsed_time(end) / inner for start, end in events]


def interleaved_event_timer(runs: Sequence[Callable[[], None]], *, warmup: int = DEFAULT_WARMUP,
                            reps: int = DEFAULT_REPS, seed: int = ORDER_SEED) -> list[Any]:  # fmt: skip
    """Milliseconds per launch of each of ``runs``, timed side by side: ``reps`` interleaved
    rounds (each round visits every run, in a fresh order drawn from ``seed``:
    :mod:`te_cudnn.plans.order`), one sample per run per round of enough back-to-back launches
    to last about :data:`GROUP_SAMPLE_MS`; before the rounds the GPU runs the first run for
    about :data:`SETTLE_MS`. Returns one list of samples per run, or the exception a run raised
    (that run is left out of later rounds).

    Why not one candidate at a time: a few milliseconds of work after an idle spell run at the
    GPU's boost clock, while training runs at the clock its power limit allows under sustained
    load, and clock drift during tuning would favour whichever candidate ran in the faster
    spell; side by side, every candidate sees the same conditions (as the benchmark times its
    contenders). H100, cuDNN 9.19, Llama forward (b=2, h=32, hg=8, s=8K, causal): timed alone
    for ~20 ms each (record version 1), eng2_k24=7 (the heuristic plan) and eng2 both took
    1.72 ms, while a full benchmark measured the heuristic plan at 1.9-2.0 ms in sustained runs;
    timed side by side, the tuner kept the heuristic plan on each of the benchmark's Llama
    cases. Launches of a host-bound run are queued behind a spin of the stream so that host
    time is not timed; a sample whose spin was over before the host had queued it is taken
    again in a later round with twice the spin (at most :data:`SPIN_RETRIES` times per run)."""
    import torch  # noqa: PLC0415

    n = len(runs)
    results: list[Any] = [None] * n
    inner, ahead = [1] * n, [0.0] * n
    rate = _spin_rate(torch.cuda.current_device())
    for i, run in enumerate(runs):
        try:
            host_ms, estimate = _warm(run, warmup)
        except Exception as exc:  # noqa: BLE001 - this run's result is its failure
            results[i] = exc
            continue
        inner[i] = int(min(max(1, math.ceil(GROUP_SAMPLE_MS / estimate)), MAX_GROUP_INNER))
        if rate and host_ms > estimate * 0.5:  # launches would starve the GPU: queue them behind a spin
            ahead[i] = min(host_ms * inner[i] * 1.25 + 0.05, MAX_SPIN_MS)
        results[i] = []
    live = [i for i in range(n) if results[i] == []]
    if live:  # settle: bring the GPU to the clock it holds under load
        first = live[0]
        estimate_ms = GROUP_SAMPLE_MS / inner[first]
        for _ in range(int(min(max(1, SETTLE_MS / max(estimate_ms, 1e-3)), MAX_SETTLE_LAUNCHES))):
            runs[first]()
    rng = order_rng(seed)
    late_samples = [0] * n
    for _ in range(max(reps, 1) + SPIN_RETRIES):
        pending = [i for i in live if len(results[i]) < max(reps, 1)]
        if not pending:
            break
        events = []
        for i in round_order(pending, rng):
            spun = _spin(ahead[i], rate) if ahead[i] else None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            try:
                start.record()
                for _ in range(inner[i]):
                    runs[i]()
                end.record()
            except Exception as exc:  # noqa: BLE001
                results[i] = exc
                continue
            events.append((i, start, end, _spin_ended(spun)))
        torch.cuda.synchronize()
        for i, start, end, late in events:
            if not isinstance(results[i], list):
                continue
            if late and ahead[i] < MAX_SPIN_MS and late_samples[i] < SPIN_RETRIES:
                # the spin ended before the host had queued the sample (a GPU clock above the one
                # the spin rate was read at): the sample may hold host time; spin longer, time again
                late_samples[i] += 1
                ahead[i] = min(ahead[i] * 2, MAX_SPIN_MS)
                continue
            results[i].append(start.elapsed_time(end) / inner[i])
        live = [i for i in live if isinstance(results[i], list)]
    return results


def _time_and_choose(key: Any, planned: Planned, *, timer: Optional[Timer], warmup: int, reps: int,
                     min_speedup: float, max_workspace: Optional[int], check_numerics: bool) -> TuningResult:  # fmt: skip
    """Run, check and time every candidate of ``planned`` on the key's device."""
    import torch  # noqa: PLC0415

    with torch.cuda.device(key.config.device):  # events, spins and the handle on the key's device
        return _time_and_choose_here(key, planned, timer=timer, warmup=warmup, reps=reps, min_speedup=min_speedup,
                                     max_workspace=max_workspace, check_numerics=check_numerics)  # fmt: skip


def _time_and_choose_here(key: Any, planned: Planned, *, timer: Optional[Timer], warmup: int, reps: int,
                          min_speedup: float, max_workspace: Optional[int], check_numerics: bool) -> TuningResult:  # fmt: skip
    import torch  # noqa: PLC0415

    from .handles import handle_for  # noqa: PLC0415

    cfg, g, uids = key.config, planned.graph, tuple(planned.spec.uids)
    device = torch.device("cuda", cfg.device)
    start = time.perf_counter()
    heur = next((c for c in planned.candidates if c.index == planned.heuristic_index), None)
    if heur is None or heur.error is not None:
        raise TuningError(f"the heuristic plan [{planned.heuristic_index}] is not available: {heur and heur.error}")
    limit = max(DEFAULT_MAX_WORKSPACE if max_workspace is None else max_workspace, heur.workspace or 0)
    candidates = [c if c.error is not None or (c.workspace or 0) <= limit else
                  Candidate(c.index, c.name, c.workspace,
                            f"needs {c.workspace} bytes of workspace, over the limit {limit}")
                  for c in planned.candidates]  # fmt: skip
    torch.cuda.synchronize(device)  # queued work of the caller would distort the first timings
    handle = handle_for(cfg.device)
    ops = make_operands(g, uids, cfg, device)
    outputs = [uid for uid in uids if uid in {t.uid for t in g.get_outputs()}]
    tol = agreement_tolerance(cfg.dtype)
    checks = result_checks(key, g, uids, ops, device) if check_numerics else []

    # one workspace for every candidate (they run one after another on this stream): the
    # candidates are prepared before they are timed side by side
    shared = torch.empty(max([c.workspace or 0 for c in candidates if c.error is None] + [1]), dtype=torch.uint8,
                         device=device)  # fmt: skip

    def workspace(c: Candidate) -> Any:
        return shared

    def execute(index: int, ws: Any) -> None:
        g.execute_plan_at_index(ops, ws, index=index, handle=handle)

    def run_once(index: int, ws: Any) -> None:
        for uid in outputs:
            ops[uid].zero_()
        execute(index, ws)
        torch.cuda.synchronize(device)

    def run_checked(index: int, ws: Any) -> tuple[list[dict], Optional[str]]:
        def run(check_ops: dict) -> None:
            g.execute_plan_at_index(check_ops, ws, index=index, handle=handle)
            torch.cuda.synchronize(device)

        return run_checks(checks, run)

    reference, heur_problem = None, None
    if check_numerics:
        reference, heur_problem = run_checked(heur.index, workspace(heur))

    def run_for(c: Candidate) -> Callable[[], None]:
        ws = workspace(c)
        if reference is not None:
            got, problem = (reference, heur_problem) if c.index == heur.index else run_checked(c.index, ws)
            why = check_error(got, problem, reference, outputs, tol)
            if why is not None:
                raise TuningError(why)
        return lambda: execute(c.index, ws)

    if timer is None:  # on the device: every candidate side by side, under sustained load
        timings = measure(candidates, run_for, group_timer=interleaved_event_timer, warmup=warmup, reps=reps)
    else:
        timings = measure(candidates, run_for, timer, warmup=warmup, reps=reps)
    chosen, heuristic, rule = choose(timings, heur.index, min_speedup)
    if heuristic is not None and heuristic.error is not None:
        rule = f"{rule}; the heuristic plan was rejected ({heuristic.error})"
    if timer is None and heuristic is not None and heuristic.error is None and chosen.index != heuristic.index:
        # confirm a swap the way calls run in training loops and CUDA graphs: each plan's launches
        # captured in a CUDA graph, the two graphs replayed in alternation (an engine faster
        # back-to-back can be slower than the heuristic one in graph replay)
        spaces = {c.index: workspace(c) for c in candidates if c.index in (chosen.index, heuristic.index)}
        ratio = _graph_replay_ratio(lambda i: execute(i, spaces[i]), chosen.index, heuristic.index, device, cfg.device)
        if ratio is None or ratio * min_speedup > 1.0:
            rule = (f"heuristic kept: [{chosen.index}] {chosen.name} was faster back-to-back but not in CUDA-graph "
                    f"replay beside the heuristic plan (time ratio {'n/a' if ratio is None else f'{ratio:.3f}'})")
            chosen = heuristic
    split = None
    if splittable(key) and chosen.median_ms is not None:  # FP8 backward: does running it in parts pay?
        run_once(chosen.index, workspace(chosen))
        want = {uid: ops[uid].clone() for uid in outputs}

        def build_part(part_cfg: Any) -> Any:
            from ..backends import BY_ENUM  # noqa: PLC0415
            from .cache import build_plan  # noqa: PLC0415

            part_key = replace(key, config=part_cfg)
            return build_plan(part_key, lambda: BY_ENUM[key.backend].build(part_cfg, key.direction, handle))

        def run_part(plan: Any, part_ops: dict) -> None:
            ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device=device)
            plan.graph.execute(part_ops, ws, handle=handle)

        def agree(uid: int, got: Any, ref: Any) -> Optional[str]:
            from ..backends.base import Uid  # noqa: PLC0415

            return _agreement_error(Uid.NAMES.get(uid, str(uid)), got, ref, tol)

        def time_ms(fn: Callable[[], None]) -> float:
            return statistics.median(float(x) for x in (timer or cuda_event_timer)(fn, None, warmup=warmup, reps=reps))

        whole_ws = workspace(chosen)
        split = measure_splits(key, chosen.median_ms, ops, want, build_part, run_part, agree, time_ms, min_speedup,
                               whole=lambda: execute(chosen.index, whole_ws), rounds=SPLIT_ROUNDS)  # fmt: skip
    return TuningResult(timings, chosen, heuristic, rule, planned.modes, warmup, reps, planned.duplicates,
                        time.perf_counter() - start, time.time(), key, split)  # fmt: skip


def _graph_replay_ratio(run: Callable[[int], None], a: int, b: int, device: Any, device_index: int,
                        launches: int = 20, rounds: int = 15) -> Optional[float]:  # fmt: skip
    """Median time of plan ``a`` over plan ``b`` when each one's ``launches`` launches (``run(index)``,
    one workspace per plan) are captured in a CUDA graph and the graphs replay in alternation
    (None if capture fails)."""
    import torch  # noqa: PLC0415

    from .handles import handle_for  # noqa: PLC0415

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    graphs = {}
    try:
        with torch.cuda.stream(side):
            handle_for(device_index)  # binds this thread's handle to the capture stream
            for index in (a, b):
                run(index)  # warm: lazy module loading happens outside the capture
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=side):
                    for _ in range(launches):
                        run(index)
                graphs[index] = graph
    except Exception:  # noqa: BLE001 - no confirmation possible: the caller keeps the heuristic plan
        return None
    finally:
        torch.cuda.current_stream(device).wait_stream(side)
        handle_for(device_index)  # back on the current stream
    times: dict[int, list[float]] = {a: [], b: []}
    for r in range(rounds):
        for index in ((a, b) if r % 2 == 0 else (b, a)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[index].replay()
            end.record()
            end.synchronize()
            times[index].append(start.elapsed_time(end))
    return statistics.median(times[a]) / max(statistics.median(times[b]), 1e-9)


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
    from .cache import CompiledPlan, build_plan  # noqa: PLC0415

    start = time.perf_counter()
    try:
        planned = plan_candidates(key, make_spec)
    except Exception as exc:  # noqa: BLE001 - build the heuristic plan the usual way
        plan = build_plan(key, make_spec)  # raises GraphBuildError when the graph cannot be built at all
        plan.tuning_error = f"planning every candidate failed: {_one_line(exc)}"
        _warn_once(f"plan:{type(exc).__name__}", f"te_cudnn: could not tune {key}: {plan.tuning_error}; using the "
                                                 f"heuristic plan (further keys with this problem are not reported)")  # fmt: skip
        return plan
    g = planned.graph
    stages = dict(planned.stages)
    t0 = time.perf_counter()
    result, error = None, None
    try:
        result = _time_and_choose(key, planned, timer=timer, warmup=warmup, reps=reps, min_speedup=min_speedup,
                                  max_workspace=max_workspace, check_numerics=check_numerics)  # fmt: skip
        g.build_plan_at_index(result.chosen.index)  # selects it: PlanLauncher, execute and serialize() use it
    except Exception as exc:  # noqa: BLE001 - the heuristic plan, still selected, serves
        error = _one_line(exc)
        _warn_once(f"time:{type(exc).__name__}", f"te_cudnn: could not tune {key}: {error}; using the heuristic plan "
                                                 f"(further keys with this problem are not reported)")  # fmt: skip
        result = None
        try:
            if int(getattr(g, "_plan_index", -1)) != planned.heuristic_index:
                g.build_plan_at_index(planned.heuristic_index)
        except Exception:  # noqa: BLE001 - the tuning graph is unusable: build the heuristic plan afresh
            plan = build_plan(key, make_spec)
            plan.tuning_error, plan.tune_checked = error, True
            return plan
    stages["tune"] = time.perf_counter() - t0
    index = int(getattr(g, "_plan_index", 0))
    try:
        name = str(g.get_plan_name_at_index(index))
    except Exception:  # noqa: BLE001 - naming is informational only
        name = "unknown"
    plan = CompiledPlan(key, g, tuple(planned.spec.uids), int(g.get_workspace_size()), name,
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
    import torch  # noqa: PLC0415

    from ..backends import BY_ENUM  # noqa: PLC0415
    from .cache import _save_built, plan_cache, store_for  # noqa: PLC0415
    from .handles import handle_for  # noqa: PLC0415

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
        s = store_for(device)
        if s is not None:
            _save_built(s, key, key.describe(device=False), plan)
    (plan_cache if cache is None else cache).put(plan)
    return TuningResult.from_record(plan.tuning, key=key)


def tuning_record(key: Any, *, cache: Any = None, store: Any = None) -> Optional[dict[str, Any]]:
    """``key``'s tuning record: from its plan in ``cache`` (default: the process's plan cache)
    when that plan is tuned, else from its file in ``store`` (default: the device's plan store),
    read without deserializing the plan; None when it has none."""
    from .cache import plan_cache, store_for  # noqa: PLC0415

    plan = (plan_cache if cache is None else cache).find(key)
    if plan is not None and plan.tuning is not None:
        return plan.tuning
    if store is None:
        if key.config.device < 0:
            return None
        store = store_for(key.config.device)
        if store is None:
            return None
    entry = store.load(key.describe(device=False))
    record = None if entry is None else entry.header.get("tuning")
    return record if valid_record(record) else None
