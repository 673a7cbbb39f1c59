"""Helpers shared by the CPU autotuning tests: the autouse fixture that clears TE_CUDNN_AUTOTUNE
and the once-only warnings, fake candidates with a fake timer (samples, not measurements) and the
tuning result they give, and stand-in compiled plans, untuned and tuned."""

from __future__ import annotations

from typing import Any

import pytest

from te_cudnn.backends import BY_ENUM
from te_cudnn.plans import CompiledPlan, PlanKey
from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.tune import ENV, Candidate, TuningResult, choose, measure


@pytest.fixture(autouse=True)
def no_autotune_env(monkeypatch: pytest.MonkeyPatch):
    """Autotuning off by default and no warning remembered: each test starts from a clean setting."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(tune_mod, "_warned", set())


CANDIDATES = [
    Candidate(0, "eng0_k2=1", 0),  # the heuristic plan
    Candidate(1, "eng4_k3=2", 1 << 20),
    Candidate(2, "eng7_k9=0", 4096),
    Candidate(3, "eng9", None, "not built: cudnnGraphNotSupportedError: no"),
    Candidate(4, "sdpa_fwd_sm90[TILE_M=128]", 0),
]
#: Fake per-launch times in ms (a test timer's samples, not measurements).
FAKE_MS = {"eng0_k2=1": [0.52, 0.50, 0.55], "eng4_k3=2": [0.41, 0.40, 0.90], "eng7_k9=0": [0.45, 0.44, 0.46],
           "sdpa_fwd_sm90[TILE_M=128]": [0.30]}  # fmt: skip


def fake_timer(run, candidate: Candidate, *, warmup: int, reps: int) -> list[float]:
    run()
    if candidate.name.startswith("sdpa_fwd"):
        raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED\nat launch")
    return FAKE_MS[candidate.name]


def fake_result(**over: Any) -> TuningResult:
    timings = measure(CANDIDATES, lambda c: (lambda: None), fake_timer)
    chosen, heuristic, rule = choose(timings, heuristic_index=0)
    kw = dict(rule=rule, modes=["A", "B", "FALLBACK"], warmup=3, reps=10, duplicates=2, seconds=12.5,
              timestamp=1_700_000_000.0)
    kw.update(over)
    return TuningResult(timings, chosen, heuristic, **kw)


class StandInGraph:
    """Stands in for a built graph where only its serialized bytes are asked for (the store is byte-level)."""

    def __init__(self, blob: bytes = b"synthetic serialized plan" * 10):
        self.blob = blob

    def serialize(self, as_bytes: bool = True) -> bytes:
        return self.blob


def stand_in_plan(k: PlanKey, tuning: dict | None = None, name: str = "eng0_k2=1") -> CompiledPlan:
    uids = BY_ENUM[k.backend].operand_uids(k.config, k.direction)
    return CompiledPlan(k, graph=StandInGraph(), uids=uids, workspace_size=0, plan_name=name, build_seconds=0.01,
                        tuning=tuning)  # fmt: skip


def tuned_plan(k: PlanKey) -> CompiledPlan:
    record = fake_result().to_record()
    return stand_in_plan(k, record, record["chosen"]["name"])
