"""The benchmark's ratios and targets on sample results: median intervals, ratios paired by round,
late contenders compared within their own rounds, and the target lines against torch SDPA cuDNN,
the hand-built graphs, autotuning and FP8; CPU only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from te_cudnn.benchmark import report


def test_late_contenders_are_compared_within_their_own_rounds():
    """An autotuned row carries the references timed beside it; its ratio uses them, not the
    first phase's times, and the report lists the same-round ratios."""
    from te_cudnn.benchmark.report import flat_rows, to_markdown

    case = {"name": "c", "group": "llama", "training": True, "modes": ["fwd", "bwd", "fwd_bwd"], "description": "c"}
    ok = dict(case="c", status="ok")
    results = {"cases": [case], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, contender="torch SDPA cuDNN", fwd_ms=1.0, bwd_ms=2.0, fwd_bwd_ms=3.0),
        dict(ok, contender="te_cudnn autotuned", fwd_ms=1.0, bwd_ms=2.0, fwd_bwd_ms=3.3,
             same_phase={"torch SDPA cuDNN": {"fwd": 1.0, "bwd": 2.0, "fwd_bwd": 3.3},
                         "cuDNN graph (hand-built)": {"fwd": 1.0, "bwd": 2.0, "fwd_bwd": 3.0}}),
    ]}  # fmt: skip
    rows = {r["contender"]: r for r in flat_rows(results)}
    assert rows["te_cudnn autotuned"]["ratio_vs_sdpa_cudnn"] == 1.0  # 3.3 / 3.3 in the same rounds, not 3.3 / 3.0
    text = to_markdown(results)
    assert "Late contenders beside the others" in text and "cuDNN graph (hand-built) 1.1×" in text


# ----------------------------------------------------------------------------- ratios paired by round
def test_median_interval_uses_binomial_order_statistics():
    """n = 20 at 95 %: x_(6) and x_(15) (P(Bin(20, 1/2) <= 5) = 0.0207, <= 6 is 0.0577); too few
    values for the confidence give the whole range."""
    values = [float(v) for v in range(20, 0, -1)]  # unsorted on purpose
    assert report.median_interval(values) == (6.0, 15.0)
    assert report.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert report.median_interval([5.0]) == (5.0, 5.0)
    assert report.median_interval(list(map(float, range(1, 11)))) == (2.0, 9.0)  # n = 10: P(<= 1) = 0.0107
    with pytest.raises(ValueError):
        report.median_interval([])


@given(st.lists(st.floats(0.5, 2.0), min_size=1, max_size=60), st.sampled_from([0.8, 0.9, 0.95, 0.99]))
@settings(max_examples=200, deadline=None)
def test_median_interval_brackets_the_median(values, confidence):
    import statistics

    low, high = report.median_interval(values, confidence)
    assert min(values) <= low <= statistics.median(values) <= high <= max(values)
    wider = report.median_interval(values, min(0.999, confidence + 0.005))
    assert wider[0] <= low and high <= wider[1]  # more confidence never narrows it


def test_paired_ratio_cancels_drift_between_rounds():
    """Both contenders slow down together round after round (clocks): the per-round ratio is
    exactly 1.02, while the ratio of the two medians mixes different rounds."""
    ref = [1.0 + 0.05 * r for r in range(20)]
    te = [1.02 * t for t in ref]
    med, low, high = report.paired_ratio(te, ref)
    assert med == pytest.approx(1.02) and low == pytest.approx(1.02) and high == pytest.approx(1.02)
    assert report.paired_ratio(te, ref[:-1]) is None  # unpaired lengths
    assert report.paired_ratio(None, ref) is None and report.paired_ratio(te, [0.0] * 20) is None


def test_paired_ratios_reach_rows_targets_and_table():
    """Rows with per-round samples get ratio_paired / ratio_low / ratio_high; the targets list the
    cases above 1.0 with their interval and say whether 1.0 lies inside it."""
    case = {"name": "c", "group": "llama", "training": True, "modes": ["fwd_bwd"], "description": "c"}
    case2 = dict(case, name="d")
    ref = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.0, 1.01, 0.99]
    noisy = [1.01, 0.995, 1.0, 1.012, 1.0, 1.0, 1.018, 0.99, 1.02, 1.0]  # per-round ratios around 1.0
    ok = dict(status="ok")
    results = {"cases": [case, case2], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, case="c", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0, fwd_bwd_samples=ref),
        dict(ok, case="c", contender="te_cudnn", fwd_bwd_ms=1.005, fwd_bwd_samples=[a * b for a, b in zip(ref, noisy)]),
        dict(ok, case="d", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0, fwd_bwd_samples=ref),
        dict(ok, case="d", contender="te_cudnn", fwd_bwd_ms=1.05, fwd_bwd_samples=[1.05 * a for a in ref]),
    ]}  # fmt: skip
    rows = {(r["case"], r["contender"]): r for r in report.flat_rows(results)}
    c = rows[("c", "te_cudnn")]
    assert c["ratio_low"] <= 1.0 <= c["ratio_high"] and c["ratio_low"] <= c["ratio_paired"] <= c["ratio_high"]
    assert rows[("d", "te_cudnn")]["ratio_paired"] == pytest.approx(1.05)
    assert rows[("c", "torch SDPA cuDNN")]["ratio_paired"] == pytest.approx(1.0)
    text = report.to_markdown(results)
    assert "- te_cudnn ≤ 1.0× torch SDPA cuDNN: 0 of 2 cases; above 1.0:" in text
    assert "  - c: 1.005× (paired by round" in text and "1.0 lies inside the interval" in text
    assert "  - d: 1.050× (paired by round 1.050×, 95% interval [1.050, 1.050]; slower beyond the interval)" in text
    assert "## Ratios to torch SDPA cuDNN, paired by round" in text
    assert "| d | te_cudnn | 1.050 | 1.050 | [1.050, 1.050] |" in text
    assert report.read_csv(report.to_csv(results)) == report.flat_rows(results)


def test_late_contenders_pair_with_the_reference_of_their_own_rounds():
    case = {"name": "c", "group": "llama", "training": True, "modes": ["fwd_bwd"], "description": "c"}
    results = {"cases": [case], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(case="c", status="ok", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0, fwd_bwd_samples=[1.0] * 5),
        dict(case="c", status="ok", contender="te_cudnn autotuned", fwd_bwd_ms=1.1, fwd_bwd_samples=[1.1] * 5,
             same_phase={"torch SDPA cuDNN": {"fwd_bwd": 1.1}},
             same_phase_samples={"torch SDPA cuDNN": {"fwd_bwd": [1.1] * 5}}),
    ]}  # fmt: skip
    row = next(r for r in report.flat_rows(results) if r["contender"] == "te_cudnn autotuned")
    assert row["ratio_paired"] == pytest.approx(1.0)


def test_hand_built_target_in_replay_and_eager():
    """The ≤ 1.02× target against the hand-built graphs is reported for CUDA-graph replay and for
    eager back-to-back calls, against both hand-built variants, naming the cases that miss it."""
    case = {"name": "c", "group": "te", "training": True, "modes": ["fwd_bwd"], "description": "c"}
    ok = dict(case="c", status="ok")
    results = {"cases": [case], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, contender="te_cudnn", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.0, fwd_bwd_eager_ms=1.10),
        dict(ok, contender="cuDNN graph (hand-built)", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.0, fwd_bwd_eager_ms=1.0),
        dict(ok, contender="cuDNN graph (hand-built, allocating)", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=0.99,
             fwd_bwd_eager_ms=1.09),
    ]}  # fmt: skip
    text = report.to_markdown(results)
    assert ("- te_cudnn / hand-built graph (results allocated once), CUDA-graph replay: at most 1.000× (c) over 1 "
            "cases (target ≤ 1.02: met)") in text
    assert "(results allocated once), eager back-to-back: at most 1.100× (c) over 1 cases (target ≤ 1.02: missed on c)" in text
    assert "(results allocated per call), eager back-to-back: at most 1.009× (c) over 1 cases (target ≤ 1.02: met)" in text
    assert "(results allocated per call), CUDA-graph replay: at most 1.010×" in text


def test_autotune_and_fp8_targets_are_listed():
    """Autotuning counts a case only where the tuned contender is ≤ 0.97× the reference *and*
    ≤ 0.98× its own heuristic plan; the FP8 target takes each case's fastest FP8 contender."""
    cases = [{"name": n, "group": "te", "training": True, "modes": ["fwd_bwd"], "description": n} for n in "abc"]
    ok = dict(status="ok")
    rows = [
        # a: tuning wins and the tuned plan is under 0.97 of the reference -> counts
        dict(ok, case="a", contender="te_cudnn", fwd_bwd_ms=1.0),
        dict(ok, case="a", contender="te_cudnn autotuned", fwd_bwd_ms=0.9),
        dict(ok, case="a", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0),
        # b: under 0.97 of the reference, but no faster than the heuristic plan -> does not count
        dict(ok, case="b", contender="te_cudnn", fwd_bwd_ms=0.9),
        dict(ok, case="b", contender="te_cudnn autotuned", fwd_bwd_ms=0.9),
        dict(ok, case="b", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0),
        # c: FP8 heuristic 1.1x, FP8 tuned 1.25x over bf16
        dict(ok, case="c", contender="te_cudnn", fwd_bwd_ms=1.0),
        dict(ok, case="c", contender="te_cudnn fp8", fwd_bwd_ms=1.0 / 1.1),
        dict(ok, case="c", contender="te_cudnn fp8 autotuned", fwd_bwd_ms=0.8),
    ]  # fmt: skip
    text = report.to_markdown({"cases": cases, "env": {}, "peaks": {}, "settings": {}, "results": rows})
    assert ("- autotuning: ≤ 0.97× torch SDPA cuDNN and ≤ 0.98× the heuristic plan on 1 of 2 tuned cases "
            "(target: at least 2: missed)") in text
    assert "  - a, te_cudnn autotuned: 0.900× torch SDPA cuDNN, 0.900× its heuristic plan (counts)" in text
    assert "  - b, te_cudnn autotuned: 0.900× torch SDPA cuDNN, 1.000× its heuristic plan\n" in text
    assert ("- FP8 fwd+bwd speed-up over bf16, c: te_cudnn fp8 1.10×, te_cudnn fp8 autotuned 1.25× "
            "(target ≥ 1.2×: met)") in text
    rows[-1]["fwd_bwd_ms"] = 0.9  # the tuned FP8 contender now 1.11x: below the target
    text = report.to_markdown({"cases": cases, "env": {}, "peaks": {}, "settings": {}, "results": rows})
    assert "te_cudnn fp8 autotuned 1.11× (target ≥ 1.2×: missed)" in text
    # timed in the same rounds as a tuned bf16 sibling, the tuned FP8 contender is compared with it
    rows.append(dict(ok, case="c", contender="te_cudnn autotuned", fwd_bwd_ms=1.125))
    text = report.to_markdown({"cases": cases, "env": {}, "peaks": {}, "settings": {}, "results": rows})
    assert "te_cudnn fp8 autotuned over te_cudnn autotuned 1.25× (target ≥ 1.2×: met)" in text


def test_hand_built_misses_carry_their_paired_interval():
    """A case above the 1.02 target against a hand-built graph is listed with its ratio paired
    by round and the interval, which says whether 1.02 lies inside it (noise) or not."""
    case = {"name": "c", "group": "te", "training": True, "modes": ["fwd_bwd"], "description": "c"}
    ok = dict(case="c", status="ok")
    te_eager = [1.10, 1.00, 1.20, 0.95, 1.10, 1.00, 1.05, 1.15, 0.98, 1.12]
    hand_eager = [1.0] * 10
    results = {"cases": [case], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, contender="te_cudnn", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.05, fwd_bwd_eager_ms=1.075,
             fwd_bwd_graph_samples=[1.05] * 10, fwd_bwd_eager_samples=te_eager),
        dict(ok, contender="cuDNN graph (hand-built)", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.0, fwd_bwd_eager_ms=1.0,
             fwd_bwd_graph_samples=[1.0] * 10, fwd_bwd_eager_samples=hand_eager),
    ]}  # fmt: skip
    text = report.to_markdown(results)
    assert "  - c: 1.050× (paired by round 1.050×, 95% interval [1.050, 1.050]; above 1.02 beyond the interval)" in text
    assert "  - c: 1.075× (paired by round 1.075×, 95% interval [0.980, 1.150]; 1.02 lies inside the interval)" in text


def test_hand_built_target_from_adjacent_samples():
    """te_cudnn's row carries the adjacent-sample ratios; the targets list them after the
    ratio of medians, per hand-built variant and kind, with an interval for each case above."""
    cases = [{"name": n, "group": "te", "training": True, "modes": ["fwd_bwd"], "description": n} for n in ("c", "d")]
    ok = dict(status="ok", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.0, fwd_bwd_eager_ms=1.0)
    hand = "cuDNN graph (hand-built)"
    results = {"cases": cases, "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, case="c", contender="te_cudnn", fwd_bwd_adjacent={hand: {"graph": [1.0, 1.01, 0.99, 1.0],
                                                                          "eager": [1.03, 1.05, 1.04, 1.06, 1.03]}}),
        dict(ok, case="c", contender=hand),
        dict(ok, case="d", contender="te_cudnn", fwd_bwd_adjacent={hand: {"graph": [1.005] * 4, "eager": [1.0] * 4}}),
        dict(ok, case="d", contender=hand),
    ]}  # fmt: skip
    text = report.to_markdown(results)
    assert ("- te_cudnn / hand-built graph (results allocated once), CUDA-graph replay, adjacent samples (a, b, b, a): "
            "at most 1.005× (d) over 2 cases (target ≤ 1.02: met)") in text
    assert "eager back-to-back, adjacent samples (a, b, b, a): at most 1.040× (c) over 2 cases (target ≤ 1.02: missed on c)" in text
    assert "  - c: 1.040× over 5 quads, 95% interval [1.030, 1.060]; above 1.02 beyond the interval" in text
    lines = text.splitlines()
    plain = lines.index(next(line for line in lines if line.startswith("- te_cudnn / hand-built graph (results allocated "
                                                                       "once), CUDA-graph replay: at most")))
    assert "adjacent samples" in lines[plain + 1]  # right after the ratio of medians it complements
    assert "allocated per call), CUDA-graph replay, adjacent" not in text  # no adjacent samples against that variant


def test_median_interval_holds_for_thousands_of_values():
    """Exact in integers: lockstep decode pairs over a thousand steps (the binomial terms of a
    float computation overflow from 1032 values)."""
    import random

    for n in (1143, 5000):
        values = [float(i) for i in range(n)]
        random.Random(n).shuffle(values)
        low, high = report.median_interval(values)
        assert low + high == n - 1  # symmetric order statistics
        assert 0.45 * n < low < 0.5 * n  # within about 2 standard deviations (sqrt(n) / 2 each) of the median
