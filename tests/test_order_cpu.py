"""The round orders of every side-by-side timing loop (tuner, FP8 splits, benchmark)."""

from __future__ import annotations

import pytest
import torch

from te_cudnn.plans import tune
from te_cudnn.plans.order import order_rng, round_order


def test_round_order_is_a_fresh_permutation_each_round_and_replays() -> None:
    items = ["a", "b", "c", "d"]
    rng = order_rng(7)
    orders = [round_order(items, rng) for _ in range(40)]
    assert items == ["a", "b", "c", "d"]  # the caller's sequence is left alone
    assert all(sorted(o) == items for o in orders)
    rng2 = order_rng(7)
    assert orders == [round_order(items, rng2) for _ in range(40)]  # the same seed, the same orders
    # every item follows more than one predecessor (a rotation would fix each one's neighbour)
    before = {x: {o[i - 1] for o in orders for i in range(1, len(o)) if o[i] == x} for x in items}
    assert all(len(p) >= 2 for p in before.values()), before
    other = order_rng(8)
    assert orders != [round_order(items, other) for _ in range(40)]  # another seed, other orders


class _Event:
    """A CUDA event stand-in for the timer's bookkeeping: elapsed time is 1 ms per call of
    the run between two records (counted by the test's runs)."""

    clock = 0.0

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = _Event.clock

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: "_Event") -> float:
        return other.t - self.t


def test_tuner_timer_visits_every_live_run_once_per_round_in_seeded_orders(monkeypatch) -> None:
    """``interleaved_event_timer``'s rounds on the CPU (CUDA events replaced by a clock the
    runs advance): the first run settles the GPU once, then each round holds every live run
    once, in the order ``round_order`` draws; a run that raises leaves the later rounds."""
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tune, "_spin_rate", lambda device: None)
    monkeypatch.setattr(tune, "_warm", lambda run, warmup: (0.0, 10.0))  # one launch per sample, no warm-up calls
    monkeypatch.setattr(tune, "SETTLE_MS", 0.0)  # one settling launch
    visits: list[int] = []

    def make(i: int, ms: float, fails_on_call: int = -1):
        def run() -> None:
            if visits.count(i) == fails_on_call:
                raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED")
            visits.append(i)
            _Event.clock += ms

        return run

    res = tune.interleaved_event_timer([make(0, 1.0), make(1, 2.0), make(2, 3.0, fails_on_call=2)], warmup=1, reps=5,
                                       seed=3)  # fmt: skip
    rng, live, expected = order_rng(3), [0, 1, 2], [0]  # the settling launch of run 0
    for r in range(5):
        expected += [i for i in round_order(live, rng) if not (i == 2 and r >= 2)]  # run 2 raises on its 3rd call
        if r == 2:
            live = [0, 1]
    assert visits == expected
    assert res[0] == pytest.approx([1.0] * 5) and res[1] == pytest.approx([2.0] * 5)
    assert isinstance(res[2], RuntimeError)
