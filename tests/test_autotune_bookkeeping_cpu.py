"""The bookkeeping of an autotuning (``te_cudnn.plans.tune``) without a GPU: candidate names
de-duplicated, the knob sweep, candidates timed one by one and side by side (refusals and bad
samples kept per candidate), the choice of plan, and the tuning record (round trip, validity,
formatting).

Timings here come from a fake timer and are labelled as such: they test what is done with
times, not cuDNN.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.tune import (
    RECORD_VERSION, Candidate, CandidateTiming, TuningError, TuningResult, choose, dedupe_names, format_record,
    measure, valid_record,
)  # fmt: skip

from _autotune_cpu import CANDIDATES, FAKE_MS, fake_result, fake_timer
from _autotune_cpu import no_autotune_env  # noqa: F401 - autouse: TE_CUDNN_AUTOTUNE unset, warnings reset


def test_dedupe_keeps_the_first_of_each_name() -> None:
    assert dedupe_names(["eng0", "eng4_k2=1", "eng0", "eng7", "eng4_k2=1", "eng4_k2=3"]) == ([0, 1, 3, 5], 2)
    assert dedupe_names([]) == ([], 0)


class _KnobGraph:
    """The part of a frontend graph the knob sweep uses: a ranked list of (engine, knobs)."""

    def __init__(self, plans: list, refuse: set) -> None:
        self.plans, self.refuse = list(plans), refuse

    def get_execution_plan_count(self) -> int:
        return len(self.plans)

    def get_engine_and_knobs_at_index(self, i: int) -> tuple:
        engine, knobs = self.plans[i]
        if engine is None:
            raise RuntimeError("a python plan the frontend cannot describe")
        return engine, dict(knobs)

    def create_execution_plan(self, engine: int, knobs: dict) -> None:
        if (engine, tuple(sorted(knobs.items()))) in self.refuse:
            raise ValueError("knob value out of range")
        self.plans.append((engine, dict(knobs)))


def test_knob_sweep_appends_one_changed_knob_at_a_time() -> None:
    g = _KnobGraph([(8, {"k24": 2, "k9": 0}), (8, {"k24": 0, "k9": 0}), (None, {}), (3, {})],
                   refuse={(8, (("k24", 2), ("k9", 2)))})
    added = tune_mod.add_knob_variants(g, 3)
    new = g.plans[4:]
    assert added == len(new)
    # engine 8, k24 2 -> 0 is already ranked (plan 1) and k24 2 -> 1 is new; k9 -> 1 new, k9 -> 2 refused;
    # from plan 1: k24 -> 1 (already added from plan 0) and 2 (plan 0) are not repeated, k9 -> 1, 2 new;
    # engine 3 has no knobs; the undescribable plan is skipped
    assert new == [(8, {"k24": 1, "k9": 0}), (8, {"k24": 2, "k9": 1}), (8, {"k24": 0, "k9": 1}),
                   (8, {"k24": 0, "k9": 2})]  # fmt: skip
    assert tune_mod.add_knob_variants(_KnobGraph([(8, {"k24": 1})], set()), 0) == 0


@pytest.mark.parametrize(("raw", "n"), [(None, 0), ("", 0), ("0", 0), ("32", 32), (" 4 ", 4)])
def test_knob_sweep_environment(monkeypatch: pytest.MonkeyPatch, raw, n: int) -> None:
    if raw is None:
        monkeypatch.delenv(tune_mod.KNOBS_ENV, raising=False)
    else:
        monkeypatch.setenv(tune_mod.KNOBS_ENV, raw)
    assert tune_mod.knob_sweep() == n


@pytest.mark.parametrize("raw", ["-1", "many", "2.5"])
def test_knob_sweep_bad_value_is_off_with_a_warning(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(tune_mod.KNOBS_ENV, raw)
    monkeypatch.setattr(tune_mod, "_warned", set())
    with pytest.warns(UserWarning, match=tune_mod.KNOBS_ENV):
        assert tune_mod.knob_sweep() == 0


def test_measure_records_medians_errors_and_runs_each_candidate() -> None:
    ran: list[int] = []
    timings = measure(CANDIDATES, lambda c: (lambda: ran.append(c.index)), fake_timer, warmup=2, reps=3)
    assert ran == [0, 1, 2, 4]  # the candidate that was not built is never run
    by = {t.index: t for t in timings}
    assert by[0].median_ms == 0.52 and by[0].min_ms == 0.50 and by[0].samples == 3 and by[0].error is None
    assert by[1].median_ms == 0.41 and by[2].median_ms == 0.45
    assert by[3].error.startswith("not built") and by[3].median_ms is None
    assert by[4].error == "RuntimeError: CUDNN_STATUS_EXECUTION_FAILED; at launch" and by[4].median_ms is None


def test_measure_excludes_candidates_whose_preparation_refuses_them() -> None:
    def run_for(c: Candidate):
        if c.index == 2:
            raise TuningError("numerics: o: relative difference 3.1e-01 from the heuristic plan's result exceeds 2.0e-02")
        return lambda: None

    timings = {t.index: t for t in measure(CANDIDATES[:3], run_for, fake_timer)}
    assert timings[2].error.startswith("TuningError: numerics: o: relative difference")
    chosen, heuristic, rule = choose(list(timings.values()), heuristic_index=0)
    assert chosen.index == 1 and heuristic.index == 0 and rule == "fastest"


def test_measure_rejects_bad_timer_output() -> None:
    (t,) = measure([CANDIDATES[0]], lambda c: (lambda: None), lambda run, c, **kw: [float("nan")])
    assert "no valid samples" in t.error
    (t,) = measure([CANDIDATES[0]], lambda c: (lambda: None), lambda run, c, **kw: [])
    assert "no valid samples" in t.error


def fake_group_timer(runs, *, warmup: int, reps: int) -> list:
    """A fake side-by-side timer: runs each run once per round, in rotating order (a fixed
    order the test can spell out; the device's timer shuffles each round); samples from
    FAKE_MS by the order of first runs (not measurements)."""
    order: list[int] = []
    for r in range(reps):
        for i in list(range(len(runs)))[r % len(runs):] + list(range(len(runs)))[: r % len(runs)]:
            runs[i]()
            order.append(i)
    names = [n for n in FAKE_MS if not n.startswith("sdpa_fwd")]
    return [RuntimeError("CUDNN_STATUS_EXECUTION_FAILED") if i >= len(names) else FAKE_MS[names[i]] * reps
            for i in range(len(runs))]  # fmt: skip


def test_measure_side_by_side_times_every_prepared_candidate_in_rounds() -> None:
    ran: list[int] = []
    timings = measure(CANDIDATES, lambda c: (lambda: ran.append(c.index)), group_timer=fake_group_timer, warmup=2,
                      reps=3)  # fmt: skip
    # the not-built candidate never runs; the others run once per round, the first one rotating
    assert ran == [0, 1, 2, 4, 1, 2, 4, 0, 2, 4, 0, 1]
    by = {t.index: t for t in timings}
    assert [t.index for t in timings] == [c.index for c in CANDIDATES]  # the candidates' order, whatever the rounds
    assert by[0].median_ms == 0.52 and by[0].min_ms == 0.50 and by[0].samples == 9
    assert by[1].median_ms == 0.41 and by[2].median_ms == 0.45
    assert by[3].error.startswith("not built")
    assert by[4].error == "RuntimeError: CUDNN_STATUS_EXECUTION_FAILED" and by[4].median_ms is None


def test_measure_side_by_side_keeps_refusals_and_bad_samples_per_candidate() -> None:
    def run_for(c: Candidate):
        if c.index == 1:
            raise TuningError("numerics: o: relative difference 3.1e-01 from the heuristic plan's result exceeds 2.0e-02")
        return lambda: None

    def group(runs, *, warmup, reps):
        assert len(runs) == 2  # the refused candidate is not timed
        return [[0.5, 0.6], [float("inf")]]

    by = {t.index: t for t in measure(CANDIDATES[:3], run_for, group_timer=group)}
    assert by[0].median_ms == pytest.approx(0.55) and by[0].samples == 2
    assert by[1].error.startswith("TuningError: numerics") and "no valid samples" in by[2].error
    with pytest.raises(TuningError, match="returned 1 results for 2 candidates"):
        measure(CANDIDATES[:3], run_for, group_timer=lambda runs, **kw: [[1.0]])
    with pytest.raises(TypeError, match="one of timer= and group_timer="):
        measure(CANDIDATES, run_for)
    with pytest.raises(TypeError, match="one of timer= and group_timer="):
        measure(CANDIDATES, run_for, fake_timer, group_timer=group)


def test_choose_fastest_keeps_heuristic_within_margin_and_breaks_ties() -> None:
    timings = measure(CANDIDATES, lambda c: (lambda: None), fake_timer)
    chosen, heuristic, rule = choose(timings, heuristic_index=0)
    assert (chosen.index, heuristic.index, rule) == (1, 0, "fastest")
    t = [CandidateTiming(0, "h", 0, 1.000), CandidateTiming(1, "a", 0, 0.995), CandidateTiming(2, "b", 0, 0.995)]
    chosen, heuristic, rule = choose(t, heuristic_index=0)  # 0.5% faster: noise, the heuristic stays
    assert chosen.index == 0 and heuristic.index == 0 and rule.startswith("heuristic kept: the fastest, [1] a")
    chosen, _, rule = choose(t, heuristic_index=0, min_speedup=1.0)
    assert chosen.index == 1 and rule == "fastest"  # ties go to the lower index
    failed = [CandidateTiming(0, "h", 0, 1.0, error=None), CandidateTiming(1, "a", 0, 0.5)]
    failed[0] = CandidateTiming(0, "h", 0, error="boom")
    chosen, heuristic, _ = choose(failed, heuristic_index=0)
    assert chosen.index == 1 and heuristic.error == "boom"
    with pytest.raises(TuningError, match="no candidate could be timed"):
        choose([CandidateTiming(0, "h", 0, error="boom")], heuristic_index=0)


def test_record_round_trip() -> None:
    result = fake_result()
    assert result.speedup == pytest.approx(0.52 / 0.41) and result.tuned_away
    record = json.loads(json.dumps(result.to_record()))  # what a header holds after a round trip
    assert record["version"] == RECORD_VERSION and valid_record(record)
    assert record["chosen"] == {"index": 1, "name": "eng4_k3=2", "median_ms": 0.41}
    assert record["heuristic"] == {"index": 0, "name": "eng0_k2=1", "median_ms": 0.52}
    assert record["speedup"] == round(0.52 / 0.41, 4) and record["modes"] == ["A", "B", "FALLBACK"]
    assert [c["index"] for c in record["candidates"]] == [0, 1, 2, 3, 4]
    assert record["candidates"][3]["error"].startswith("not built") and record["candidates"][1]["workspace"] == 1 << 20
    back = TuningResult.from_record(record)
    assert back.chosen == result.chosen and back.heuristic == result.heuristic and back.candidates == result.candidates
    assert back.to_record() == record


@pytest.mark.parametrize("bad", [None, [], {}, {"version": RECORD_VERSION + 1}, {"version": RECORD_VERSION, "chosen": {}},
                                 {"version": RECORD_VERSION, "chosen": {"index": 1, "name": "x"}, "candidates": [{}]}])  # fmt: skip
def test_invalid_records(bad: Any) -> None:
    assert not valid_record(bad)
    assert "cannot read" in format_record(bad)


def test_format_record_lists_every_candidate() -> None:
    text = format_record(fake_result().to_record(), indent="  ")
    lines = text.splitlines()
    assert lines[0].startswith("  tuned ") and "chosen [1] eng4_k3=2 (0.4100 ms)" in lines[0]
    assert "heuristic [0] eng0_k2=1 (0.5200 ms)" in lines[0] and "speed-up 1.268x" in lines[0]
    assert "5 candidates, 3 timed, 2 duplicate(s) skipped" in lines[0] and "A, B, FALLBACK" in lines[0]
    assert len(lines) == 1 + 5
    assert "[  1] eng4_k3=2" in lines[1] and "0.4100 ms" in lines[1] and lines[1].endswith("<- chosen")  # fastest first
    assert any("eng0_k2=1" in l and l.endswith("<- heuristic") for l in lines)
    assert any("error: RuntimeError: CUDNN_STATUS_EXECUTION_FAILED" in l for l in lines)
    kept = fake_result(rule="heuristic kept")
    kept.chosen = kept.heuristic
    assert "= the heuristic plan" in format_record(kept.to_record())
