"""The round orders of every side-by-side timing loop (tuner, FP8 splits, benchmark)."""

from __future__ import annotations

import pytest
import torch

from te_cudnn import timing
from te_cudnn.plans import tune_run
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
    monkeypatch.setattr(timing, "spin_rate", lambda device: None)
    monkeypatch.setattr(timing, "warm", lambda run, warmup: (0.0, 10.0))  # one launch per sample, no warm-up calls
    monkeypatch.setattr(tune_run, "SETTLE_MS", 0.0)  # one settling launch
    visits: list[int] = []

    def make(i: int, ms: float, fails_on_call: int = -1):
        def run() -> None:
            if visits.count(i) == fails_on_call:
                raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED")
            visits.append(i)
            _Event.clock += ms

        return run

    res = tune_run.interleaved_event_timer([make(0, 1.0), make(1, 2.0), make(2, 3.0, fails_on_call=2)], warmup=1, reps=5,
                                       seed=3)  # fmt: skip
    rng, live, expected = order_rng(3), [0, 1, 2], [0]  # the settling launch of run 0
    for r in range(5):
        expected += [i for i in round_order(live, rng) if not (i == 2 and r >= 2)]  # run 2 raises on its 3rd call
        if r == 2:
            live = [0, 1]
    assert visits == expected
    assert res[0] == pytest.approx([1.0] * 5) and res[1] == pytest.approx([2.0] * 5)
    assert isinstance(res[2], RuntimeError)


class _Spun:
    """The event recorded after a spin: ``query()`` says whether the spin was over."""

    def __init__(self, over: bool) -> None:
        self.over = over

    def query(self) -> bool:
        return self.over


def test_tuner_timer_retakes_samples_whose_spin_ended_too_soon(monkeypatch) -> None:
    """A sample whose spin was over before the host had queued its launches (the GPU may have
    waited for the host) is dropped and taken again after a spin twice as long; after
    ``SPIN_RETRIES`` such samples a run's samples count as they are."""
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(timing, "spin_rate", lambda device: 1000.0)
    monkeypatch.setattr(timing, "warm", lambda run, warmup: (1.0, 1.0))  # host-bound: spins before each sample
    monkeypatch.setattr(tune_run, "SETTLE_MS", 0.0)
    monkeypatch.setattr(tune_run, "GROUP_SAMPLE_MS", 1.0)  # one launch per sample
    spins: dict[int, list[float]] = {0: [], 1: []}
    late = {0: [True, True], 1: [True] * 20}  # run 0: two spins too short; run 1: always too short
    order: list[int] = []  # the runs in the order the rounds visit them (each spin precedes one)
    real_round_order = tune_run.round_order

    def round_order(items, rng):
        visit = real_round_order(items, rng)
        order.extend(visit)
        return visit

    def spin(ms: float, rate: float) -> _Spun:
        i = order.pop(0)
        spins[i].append(ms)
        return _Spun(late[i].pop(0) if late[i] else False)

    monkeypatch.setattr(tune_run, "round_order", round_order)
    monkeypatch.setattr(timing, "spin", spin)

    def make(ms: float):
        def run() -> None:
            _Event.clock += ms

        return run

    res = tune_run.interleaved_event_timer([make(1.0), make(2.0)], warmup=1, reps=3, seed=1)
    assert res[0] == pytest.approx([1.0] * 3) and res[1] == pytest.approx([2.0] * 3)
    ahead = 1.0 * 1 * 1.25 + 0.05  # host ms x launches x 1.25 + 0.05
    assert spins[0] == pytest.approx([ahead, 2 * ahead, 4 * ahead, 4 * ahead, 4 * ahead])
    # run 1: SPIN_RETRIES retakes, each spin twice the last, then its samples count as they are
    assert len(spins[1]) == timing.SPIN_RETRIES + 3
    assert spins[1][: timing.SPIN_RETRIES + 1] == pytest.approx([ahead * 2**k for k in range(timing.SPIN_RETRIES + 1)])


def test_spin_rate_is_the_fastest_of_three_calibrations(monkeypatch) -> None:
    """An idle GPU runs the first calibration spin at a low clock; the rate comes from the
    fastest of three, so the tuner's spins last at least as long as meant."""
    times = iter([2.9, 0.6, 0.5])  # ms per calibration spin: the clock ramps up

    class Ev:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, other: "Ev") -> float:
            return next(times)

    monkeypatch.setattr(torch.cuda, "Event", Ev)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None, raising=False)
    monkeypatch.setattr(timing, "_cycles_per_ms", {})
    assert timing.spin_rate(0) == pytest.approx(timing.SPIN_CALIBRATION_CYCLES / 0.5)
    assert timing.spin_rate(0) == pytest.approx(timing.SPIN_CALIBRATION_CYCLES / 0.5)  # measured once per device


def test_single_run_timer_takes_its_samples_again_after_a_short_spin(monkeypatch) -> None:
    """``cuda_event_timer`` (the FP8 split timings): when the spin before the samples was over
    before the host had queued them, all samples are taken again after a spin twice as long."""
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(timing, "spin_rate", lambda device: 1000.0)
    monkeypatch.setattr(timing, "warm", lambda run, warmup: (1.0, 1.0))  # host-bound: one spin before the samples
    monkeypatch.setattr(tune_run, "MIN_SAMPLE_MS", 1.0)  # one launch per sample
    spins: list[float] = []
    late = [True]

    def spin(ms: float, rate: float) -> _Spun:
        spins.append(ms)
        return _Spun(late.pop(0) if late else False)

    monkeypatch.setattr(timing, "spin", spin)
    calls = []

    def run() -> None:
        calls.append(1)
        _Event.clock += 1.5

    samples = tune_run.cuda_event_timer(run, warmup=1, reps=4)
    assert samples == pytest.approx([1.5] * 4)
    ahead = 1.0 * 1 * 4 * 1.25 + 0.5  # host ms x launches x samples x 1.25 + 0.5
    assert spins == pytest.approx([ahead, 2 * ahead]) and len(calls) == 8  # the samples taken twice
