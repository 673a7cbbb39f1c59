"""The autotuner's bookkeeping, without a GPU: candidates, their timings, the choice, the record.

:func:`measure` turns each candidate's samples (or the reason it could not run) into a
:class:`CandidateTiming`; :func:`choose` picks the fastest unless the heuristic plan is within
:data:`MIN_SPEEDUP` of it; :class:`TuningResult` is the outcome of tuning one key, and
:meth:`TuningResult.to_record` the record a stored plan's header carries (:func:`valid_record`,
:func:`format_record` read it back). :mod:`te_cudnn.plans.tune` re-exports every public name.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

__all__ = [
    "RECORD_VERSION", "DEFAULT_WARMUP", "DEFAULT_REPS", "MIN_SPEEDUP", "Candidate", "CandidateTiming", "GroupTimer",
    "Planned", "Timer", "TuningError", "TuningResult", "choose", "dedupe_names", "format_record", "measure",
    "one_line", "valid_record",
]  # fmt: skip

#: The version of the tuning record in a stored plan's header; a record of another version is ignored
#: (the key is tuned again). 3: candidates checked with partial lengths into NaN-prefilled
#: results, those leaving padded rows unwritten excluded
#: (:func:`~te_cudnn.plans.tune_checks.result_checks`); 2: timed side by side under sustained load
#: (:func:`~te_cudnn.plans.tune_run.interleaved_event_timer`); 1: timed one at a time.
RECORD_VERSION = 3
DEFAULT_WARMUP = 3
DEFAULT_REPS = 10
#: The fastest candidate replaces the heuristic plan only when it is at least this much faster.
MIN_SPEEDUP = 1.01


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


def one_line(exc: BaseException) -> str:
    """An exception as one line of at most 300 characters, its type first (a record's error)."""
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
#: interleaved rounds (:func:`~te_cudnn.plans.tune_run.interleaved_event_timer`, the device's default).
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
            results[pos] = one_line(exc)
            continue
        prepared.append((pos, c, run))
    if group_timer is not None and prepared:
        got = list(group_timer([run for _, _, run in prepared], warmup=warmup, reps=reps))
        if len(got) != len(prepared):
            raise TuningError(f"the group timer returned {len(got)} results for {len(prepared)} candidates")
        for (pos, _, _), samples in zip(prepared, got):
            results[pos] = one_line(samples) if isinstance(samples, BaseException) else _valid_samples(samples)
    else:
        for pos, c, run in prepared:
            try:
                results[pos] = _valid_samples(timer(run, c, warmup=warmup, reps=reps))
            except Exception as exc:  # noqa: BLE001 - a failing candidate is a result, not a failure
                results[pos] = one_line(exc)
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
        return one_line(exc)
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
