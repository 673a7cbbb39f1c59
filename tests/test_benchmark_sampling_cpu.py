"""How the benchmark takes its samples (``te_cudnn.benchmark.measure``, the runner's adjacent
comparisons): shuffled interleaved rounds, untimed lead calls, and adjacent samples (a, b, b, a)
that cancel a clock drift, on stand-in samplers; CPU only."""

from __future__ import annotations

import pytest


def test_interleaved_rounds_shuffle_the_order_reproducibly():
    """Every round takes every sampler once, in a fresh seeded order: each contender follows
    many different neighbours (a rotation would keep its predecessor fixed), and the same seed
    gives the same orders."""
    from te_cudnn.benchmark.measure import interleaved

    def run(seed):
        calls = []
        samples = interleaved({n: (lambda n=n: calls.append(n) or 1.0) for n in "abcde"}, 20, seed)
        return calls, samples

    calls, samples = run(0)
    assert {n: len(v) for n, v in samples.items()} == {n: 20 for n in "abcde"}
    rounds = [calls[i:i + 5] for i in range(0, 100, 5)]
    assert all(sorted(r) == list("abcde") for r in rounds)
    predecessors = {n: {r[r.index(n) - 1] for r in rounds if r.index(n) > 0} for n in "abcde"}
    assert all(len(p) >= 3 for p in predecessors.values()), predecessors
    assert run(0)[0] == calls and run(1)[0] != calls


def test_samplers_run_their_lead_untimed_first(monkeypatch):
    """The lead: untimed work of the same contender before each sample, sized from lead_ms."""
    from te_cudnn.benchmark import measure

    assert measure.lead_count(20.0, 7.0) == 3 and measure.lead_count(20.0, 30.0) == 1
    assert measure.lead_count(0.0, 7.0, least=1) == 1 and measure.lead_count(20.0, 0.0) == 0
    seen = []
    monkeypatch.setattr(measure, "event_ms", lambda fn, reps=1, lead=0: seen.append((reps, lead)) or 4.0)
    assert measure.eager_sampler(lambda: None, 2, lead=3)() == 4.0
    assert measure.eager_sampler(lambda: None, 2, lead=0)() == 4.0  # never below EAGER_LEAD

    class Graph:
        def replay(self):
            pass

    assert measure.graph_sampler(Graph(), 2, lead=5)() == 2.0  # one replay of 2 calls: 4.0 / 2
    assert seen == [(2, 3), (2, measure.EAGER_LEAD), (1, 5)]


def test_eager_samples_start_behind_an_untimed_call(monkeypatch):
    """A lone timed call would include its launch from an idle GPU (the host latency of the
    contender's Python); each eager sample therefore runs one untimed call first."""
    from te_cudnn.benchmark import measure

    seen = []
    monkeypatch.setattr(measure, "event_ms", lambda fn, reps=1, lead=0: seen.append((reps, lead)) or 1.0)
    assert measure.eager_sampler(lambda: None, 3)() == 1.0
    assert seen == [(3, measure.EAGER_LEAD)] and measure.EAGER_LEAD >= 1


# ----------------------------------------------------------------------------- adjacent samples (a, b, b, a)
def test_adjacent_ratios_cancel_a_linear_clock_drift():
    """The clock slows with every sample taken; a is 2 % slower than b at any clock: each quad's
    ratio is exactly 1.02, in the order a, b, b, a."""
    from te_cudnn.benchmark.measure import adjacent_ratios

    taken = []

    def sampler(name, factor):
        def sample():
            taken.append(name)
            return factor * (1.0 + 0.03 * len(taken))
        return sample

    ratios = adjacent_ratios(sampler("a", 1.02), sampler("b", 1.0), 5)
    assert ratios == pytest.approx([1.02] * 5, rel=1e-12)
    assert "".join(taken) == "abba" * 5


def test_adjacent_comparisons_fill_the_rows_within_their_quad_bounds():
    from te_cudnn.benchmark import runner

    calls = []
    names = [n for pair in runner.SAME_ENGINE for n in pair]
    samplers = {(n, k): (lambda n=n, k=k: calls.append((n, k)) or 1.0) for n in set(names) for k in ("eager", "graph")}
    del samplers[("cuDNN graph (hand-built, allocating)", "graph")]  # a side without replay: eager only
    sample_ms = {key: 10.0 for key in samplers}
    rows = {n: {} for n in set(names)}
    runner._adjacent("fwd_bwd", samplers, sample_ms, rows, runner.Settings(pair_seconds=0.4))  # 400 ms / 40 ms
    adj = rows["te_cudnn"]["fwd_bwd_adjacent"]
    assert sorted(adj) == ["cuDNN graph (hand-built)", "cuDNN graph (hand-built, allocating)"]
    assert sorted(adj["cuDNN graph (hand-built)"]) == ["eager", "graph"]
    assert list(adj["cuDNN graph (hand-built, allocating)"]) == ["eager"]
    assert len(adj["cuDNN graph (hand-built)"]["eager"]) == 10 and len(calls) == 3 * 10 * 4
    rows = {n: {} for n in set(names)}
    runner._adjacent("fwd_bwd", samplers, {k: 1e4 for k in sample_ms}, rows, runner.Settings(pair_seconds=0.4))
    assert len(rows["te_cudnn"]["fwd_bwd_adjacent"]["cuDNN graph (hand-built)"]["eager"]) == runner.PAIR_QUADS[0]
    rows = {n: {} for n in set(names)}
    runner._adjacent("fwd_bwd", samplers, {k: 1e-3 for k in sample_ms}, rows, runner.Settings(pair_seconds=5))
    assert len(rows["te_cudnn"]["fwd_bwd_adjacent"]["cuDNN graph (hand-built)"]["graph"]) == runner.PAIR_QUADS[1]
