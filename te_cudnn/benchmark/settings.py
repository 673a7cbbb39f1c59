"""How long and how carefully the benchmark times: :class:`Settings`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class Settings:
    """How long and how carefully to time. ``quick()`` is the one-minute run."""

    quick: bool = False
    rounds: int = 20  # at most, per case and mode
    min_rounds: int = 5
    mode_budget_s: float = 1.2  # timing seconds per case and mode; rounds shrink to fit (not below min_rounds)
    sample_ms: float = 2.0  # each sample times at least this much work: reps = sample_ms / call time
    max_reps: int = 50
    graph_max_ms: float = 20.0  # calls longer than this are timed eagerly only (launch gaps are noise there)
    lead_ms: float = 20.0  # untimed work of the same contender before each sample (the GPU's clocks settle to it)
    order_seed: int = 0  # the rounds' orders (measure.interleaved)
    pair_seconds: float = 1.0  # per case, comparison (SAME_ENGINE) and kind: adjacent a, b, b, a samples; 0: none
    graphs: bool = True
    host: bool = True
    host_rounds: int = 15
    host_calls: int = 2000
    host_tuned: bool = True  # the host problem again with its plan autotuned (rounds of its own)
    peaks: bool = True
    deadline_s: float = 600.0  # no case or contender starts after this many seconds
    every_case: bool = False  # FlexAttention and te_cudnn autotuned on every case, not their default subsets
    plan_store: str = "fresh"  # "fresh" (a private empty store for the run), "default", "off" or a directory

    @classmethod
    def for_run(cls, quick: bool, rounds: Optional[int] = None, **over: Any) -> "Settings":
        s = cls(quick=True, rounds=10, min_rounds=3, mode_budget_s=0.4, host_rounds=7, host_calls=1000,
                deadline_s=150.0, pair_seconds=0.3) if quick else cls()  # fmt: skip
        if rounds is not None:
            s.rounds = max(1, rounds)
            s.min_rounds = min(s.min_rounds, s.rounds)
        for k, v in over.items():
            setattr(s, k, v)
        return s
