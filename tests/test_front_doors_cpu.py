"""The front-door benchmark's bookkeeping on the CPU: the alternating measure and the report.
(The measurements themselves need a GPU: ``python -m te_cudnn.benchmark.front_doors``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from te_cudnn.benchmark import front_doors, front_doors_report, turns
from te_cudnn.packed_rows import packed_one_row
from te_cudnn.plans.one_row import lean_one_row


@pytest.fixture
def no_sync(monkeypatch):
    monkeypatch.setattr(turns.torch.cuda, "synchronize", lambda: None)


def test_alternating_takes_turns_first_alternating_and_pairs_the_samples(no_sync, monkeypatch):
    calls, clock = [], iter(range(1000))
    monkeypatch.setattr(turns.time, "perf_counter", lambda: float(next(clock)))
    fns = {"sdpa": lambda: calls.append("sdpa"), "te_cudnn": lambda: calls.append("te_cudnn")}
    paired: dict = {}
    medians = turns.alternating(fns, 3, paired)
    assert calls == ["sdpa", "te_cudnn"] + ["sdpa", "te_cudnn", "te_cudnn", "sdpa", "sdpa", "te_cudnn"]
    assert paired == {"sdpa": [1.0] * 3, "te_cudnn": [1.0] * 3}  # one clock tick per timed call
    assert medians == {"sdpa": 1.0, "te_cudnn": 1.0}


def test_alternating_runs_each_prepare_untimed_before_its_function(no_sync, monkeypatch):
    calls, clock = [], iter(range(1000))
    monkeypatch.setattr(turns.time, "perf_counter", lambda: float(next(clock)))
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    prepare = {"a": lambda: calls.append("use a")}  # "b" needs none
    paired: dict = {}
    turns.alternating(fns, 2, paired, prepare)
    assert calls == ["use a", "a", "b"] + ["use a", "a", "b", "b", "use a", "a"]
    assert paired == {"a": [1.0, 1.0], "b": [1.0, 1.0]}  # the clock ticks around the calls only


def test_python_node_control_is_sdpa_plus_one_python_node_per_layer():
    """The training-step control: the same output and gradients as transformers' sdpa, with one
    more autograd node per layer, written in Python."""
    transformers = pytest.importorskip("transformers")
    import torch

    name = front_doors._python_node_sdpa(front_doors._transformers())
    cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=50, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg, attn_implementation="sdpa"))
    ids = torch.randint(0, 50, (2, 7))
    results = {}
    for impl in ("sdpa", name):
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids).loss
        nodes, todo = set(), [loss.grad_fn]
        while todo:
            node = todo.pop()
            if node is not None and node not in nodes:
                nodes.add(node)
                todo += [n for n, _ in node.next_functions]
        loss.backward()
        results[impl] = (loss.detach(), [p.grad.clone() for p in model.parameters()],
                         sum(type(n).__name__ == "_PythonNodeBackward" for n in nodes))  # fmt: skip
    assert torch.equal(results["sdpa"][0], results[name][0])
    assert all(torch.equal(a, b) for a, b in zip(results["sdpa"][1], results[name][1]))
    assert (results["sdpa"][2], results[name][2]) == (0, cfg["num_hidden_layers"])


def test_report_gives_the_paired_ratios_with_their_intervals():
    res = {
        "device": "a GPU",
        "host": {"torch SDPA (default backend)": 10.0, "te_cudnn.fused_attn_fwd": 11.0},
        "fwd_bwd": [{"shape": "b=1", "inputs": "BHSD leaves", "te_cudnn_ms": 1.0, "torch_cudnn_ms": 1.0, "ratio": 0.99,
                     "ratio_low": 0.97, "ratio_high": 1.01}],  # fmt: skip
        "hf": {"model": "m", "sdpa": {"prefill ms": 20.0, "generate error": "x"}, "te_cudnn": {"prefill ms": 19.0},
               "te_cudnn vs sdpa, paired by turn (median, 95 % interval)": {"prefill ms": [0.95, 0.9, 0.99]}},
    }  # fmt: skip
    md = front_doors_report.markdown(res)
    assert "| te_cudnn.fused_attn_fwd | 11.0 | 1.10× |" in md
    assert "| b=1 | BHSD leaves | 1.000 | 1.000 | 0.990 | 0.970–1.010 |  |  |  |" in md
    assert "| prefill ms | 20.0 | 19.0 | 0.950 | 0.950 (0.900–0.990) |" in md
    assert "| generate error | x | None | | |" in md
    assert "Controls" not in md  # none measured


def test_report_lists_the_controls_of_the_switched_measures():
    controls = {"training step ms": {"sdpa, again / sdpa": [1.001, 0.998, 1.004],
                                     "sdpa + one Python autograd node / sdpa": [1.009, 1.005, 1.013]}}  # fmt: skip
    res = {"device": "a GPU", "host": {}, "fwd_bwd": [],
           "hf": {"model": "m", "sdpa": {"training step ms": 70.0}, "te_cudnn": {"training step ms": 70.7},
                  "controls, paired by turn (median, 95 % interval)": controls}}  # fmt: skip
    md = front_doors_report.markdown(res)
    assert "| training step ms | sdpa, again / sdpa |  | 1.001 (0.998–1.004) |" in md  # a report without medians
    assert "| training step ms | sdpa + one Python autograd node / sdpa |  | 1.009 (1.005–1.013) |" in md
    assert "Prefill and the training step run on one model" in md
    measure = "generate b=4 dynamic cache tokens/s (implementations switched step by step)"
    controls[measure] = {"sdpa, again / sdpa": [1.0, 0.999, 1.002, 1.004]}
    res["hf"]["sdpa"][measure], res["hf"]["te_cudnn"][measure] = 300.0, 303.0
    md = front_doors_report.markdown(res)
    assert f"| {measure} | 300.0 | 303.0 | 1.010 |  |" in md
    assert f"| {measure} | sdpa, again / sdpa | 1.004 | 1.000 (0.999–1.002) |" in md
    assert "The switched generate steps, prefill and the training step run on one model" in md


def test_control_pairs_give_the_paired_ratio_and_the_ratio_of_medians():
    """A measure's controls: sdpa against itself (whole generate calls take the sdpa model's call
    twice per turn) and, in training, the Python-node pairs; each with its paired ratio and its
    ratio of medians, only for the contenders that ran."""
    again, node = front_doors._AGAIN, front_doors._NODE
    samples = {"sdpa": [10.0, 20.0, 10.0], "te_cudnn": [11.0, 19.0, 10.0], again: [12.0, 20.0, 11.0]}
    medians = {"sdpa": 10.0, "te_cudnn": 11.0, again: 12.0}
    got = front_doors.control_pairs(samples, medians)
    assert list(got) == [f"{again} / sdpa"]  # no Python-node contender ran
    med, low, high, of_medians = got[f"{again} / sdpa"]
    assert med == pytest.approx(1.1) and low <= med <= high  # turn ratios 1.2, 1.0, 1.1
    assert of_medians == pytest.approx(1.2)
    samples[node], medians[node] = [10.0, 20.0, 10.0], 10.0
    assert list(front_doors.control_pairs(samples, medians)) == [f"{again} / sdpa", f"{node} / sdpa",
                                                                 f"te_cudnn / {node}"]  # fmt: skip


def test_report_gives_the_paced_columns_beside_the_back_to_back_ones():
    row = {"shape": "b=2", "inputs": "BSHD views", "te_cudnn_ms": 0.25, "torch_cudnn_ms": 0.25, "ratio": 1.001,
           "ratio_low": 1.0, "ratio_high": 1.002, "paced_te_cudnn_ms": 0.33, "paced_torch_cudnn_ms": 0.3,
           "paced_ratio": 1.1, "paced_ratio_low": 0.8, "paced_ratio_high": 1.3, "host_te_cudnn_us": 329.6,
           "host_torch_cudnn_us": 301.2}  # fmt: skip
    md = front_doors_report.markdown({"device": "a GPU", "host": {}, "fwd_bwd": [row]})
    assert ("| b=2 | BSHD views | 0.250 | 0.250 | 1.001 | 1.000–1.002 | 0.330 / 0.300 | 1.100 (0.800–1.300) "
            "| 330 / 301 |") in md


def test_queued_ms_times_the_calls_and_the_host_and_spins_only_when_asked(monkeypatch):
    from te_cudnn import timing

    calls, spins = [], []

    class Span:
        def begin(self): calls.append("begin")
        def end(self): calls.append("end")
        def wait(self): pass
        def ms(self): return 2.0

    monkeypatch.setattr(timing, "EventSpan", Span)
    monkeypatch.setattr(timing, "spin", lambda ms, rate: spins.append((ms, rate)) or "spun")
    monkeypatch.setattr(timing, "spin_ended", lambda spun: spun == "spun")
    clock = iter([10.0, 10.5])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    ms, us, late = timing.queued_ms(lambda: calls.append("call"), 4, lead=2)
    assert calls == ["call", "call", "begin", "call", "call", "call", "call", "end"]
    assert (ms, us, late, spins) == (0.5, 0.5 / 4 * 1e6, False, [])
    clock = iter([0.0, 1.0])
    assert timing.queued_ms(lambda: None, 2, ahead_ms=3.0, rate=1e6)[2] is True
    assert spins == [(3.0, 1e6)]
    clock = iter([0.0, 1.0])
    timing.queued_ms(lambda: None, 2, ahead_ms=3.0, rate=None)  # no rate: no spin
    assert spins == [(3.0, 1e6)]


def test_step_clock_keeps_the_median_interval_between_new_tokens(monkeypatch):
    clock = iter([0.0, 5.0, 5.1, 5.3, 5.4, 9.0])  # the prompt, then five tokens (one slow step)
    monkeypatch.setattr(turns.time, "perf_counter", lambda: next(clock))
    steps = turns.StepClock()
    for _ in range(6):
        steps.put(None)
    steps.end()
    assert steps.medians == [pytest.approx(0.15)]  # intervals 0.1, 0.2, 0.1, 3.6: the prefill's 5.0 left out
    steps.end()  # a call that streamed nothing adds nothing
    assert len(steps.medians) == 1 and steps.stamps == []


def test_lockstep_decodes_greedily_in_turns_and_pairs_the_steps():
    """Two tiny Llama models on the CPU: the lockstep loop alternates them step by step (the
    first of a turn alternating), times every step of the timed rounds, and its tokens are
    those of greedy ``generate``."""
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=50, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    models = {name: transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg, attn_implementation="sdpa")).eval()
              for name in ("sdpa", "te_cudnn")}  # fmt: skip
    order = []
    for name, model in models.items():
        model.register_forward_pre_hook(lambda mod, args, name=name: order.append(name))
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        seconds, tokens = turns.decode_in_lockstep(models, ids, steps=4, rounds=2)
        expected = {name: m.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)[:, 6:]
                    for name, m in models.items()}  # fmt: skip
    assert {name: len(s) for name, s in seconds.items()} == {"sdpa": 8, "te_cudnn": 8}
    assert all(s > 0 for secs in seconds.values() for s in secs)
    per_round = ["sdpa", "te_cudnn"] + ["sdpa", "te_cudnn", "te_cudnn", "sdpa"] * 2  # the prompts, then the steps
    assert order[:len(per_round) * 3] == per_round * 3  # the untimed round and two timed ones
    for name in models:
        assert torch.equal(tokens[name], expected[name]), name



def test_switching_steps_hands_the_steps_to_the_contenders_in_a_fixed_cycle(monkeypatch):
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr(turns.time, "perf_counter", lambda: next(clock))
    selected = []
    steps = turns.SwitchingSteps({name: (lambda name=name: selected.append(name)) for name in ("a", "b", "c")})
    assert steps.cycle == ("a", "b", "c")
    for _ in range(9):  # the prompt, then eight tokens: seven steps, two complete turns
        steps.put(None)
    steps.end()
    # the prefill runs on the cycle's last contender (untimed); the steps: a b c | a b c | a (dropped)
    assert selected == ["c", "a", "b", "c", "a", "b", "c", "a", "b"]  # the last token starts a step never timed
    # each put stamps once on arrival and once after switching: every step takes 1 tick
    assert steps.seconds == {"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [1.0, 1.0]}
    selected.clear()
    for _ in range(3):  # the next call starts afresh: its prefill untimed, one incomplete turn
        steps.put(None)
    steps.end()
    assert selected == ["c", "a", "b"] and len(steps.seconds["a"]) == 2


def test_switching_steps_cycle_puts_the_other_implementation_between_a_control_and_its_original(monkeypatch):
    """The benchmark's cycle: te_cudnn between sdpa and sdpa again, every step after a real
    switch; te_cudnn's sample of a turn is the mean of its two steps."""
    ticks = iter([0.0, 0.0, 0.0, 1.0, 1.0, 3.0, 3.0, 4.0, 4.0, 7.0, 7.0])  # the prompt, then steps of 1, 2, 1, 3
    monkeypatch.setattr(turns.time, "perf_counter", lambda: next(ticks))
    selected = []
    names = ("sdpa", "te_cudnn", "sdpa, again")
    steps = turns.SwitchingSteps({n: (lambda n=n: selected.append(n)) for n in names}, front_doors._SWITCH_CYCLE)
    for _ in range(6):  # the prompt and five tokens: one complete turn, the next begun
        steps.put(None)
    assert selected == ["sdpa, again", "te_cudnn", "sdpa", "te_cudnn", "sdpa, again", "te_cudnn"]
    assert steps.seconds == {"sdpa": [2.0], "te_cudnn": [1.0], "sdpa, again": [3.0]}
    implementation = {"sdpa": "sdpa", "sdpa, again": "sdpa", "te_cudnn": "te_cudnn"}
    cycle = [implementation[n] for n in front_doors._SWITCH_CYCLE]
    assert all(a != b for a, b in zip(cycle, cycle[1:] + cycle[:1]))


@pytest.mark.parametrize("cycle", [("a", "b", "b"), ("a", "b", "a"), ("a",), ("a", "x")])
def test_switching_steps_refuses_a_cycle_that_repeats_or_misses_a_contender(cycle):
    with pytest.raises(ValueError, match="cycle must name every contender"):
        turns.SwitchingSteps({"a": lambda: None, "b": lambda: None}, cycle)


def test_turns_rotate_so_that_every_contender_takes_every_place_and_none_follows_itself(no_sync, monkeypatch):
    """Reversing the order of three would keep the middle one always after another contender,
    and let the other two follow themselves every other turn."""
    calls, clock = [], iter(range(1000))
    monkeypatch.setattr(turns.time, "perf_counter", lambda: float(next(clock)))
    names = ("sdpa", "te_cudnn", "sdpa, again")
    fns = {name: (lambda name=name: calls.append(name)) for name in names}
    turns.alternating(fns, 6, {})
    timed = calls[len(names):]
    assert timed[:6] == ["sdpa", "te_cudnn", "sdpa, again", "te_cudnn", "sdpa, again", "sdpa"]
    assert all(x != y for x, y in zip(timed, timed[1:]))
    places = {name: sorted(i % 3 for i, n in enumerate(timed) if n == name) for name in names}
    assert all(p == [0, 0, 1, 1, 2, 2] for p in places.values()), places
    assert turns.next_turn([1, 2, 3]) == [2, 3, 1]


def test_switching_steps_needs_two_contenders():
    with pytest.raises(ValueError, match="two or more contenders"):
        turns.SwitchingSteps({"a": lambda: None})


def test_switching_steps_runs_inside_generate_with_the_implementation_switched():
    """A tiny Llama on the CPU: ``generate`` with the streamer switches the attention
    implementation after every token (eager and sdpa here) and gives the same greedy tokens."""
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=50, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg, attn_implementation="sdpa")).eval()
    seen = []
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda mod, args: seen.append(mod.config._attn_implementation))
    steps = turns.SwitchingSteps({name: (lambda name=name: model.set_attn_implementation(name))
                                  for name in ("sdpa", "eager")})  # fmt: skip
    ids = torch.randint(0, 50, (2, 5))
    kw = dict(max_new_tokens=7, min_new_tokens=7, do_sample=False)
    with torch.no_grad():
        switched = model.generate(ids, streamer=steps, **kw)
        model.set_attn_implementation("sdpa")
        plain = model.generate(ids, **kw)
    assert seen[:7] == ["eager", "sdpa", "eager", "sdpa", "eager", "sdpa", "eager"]  # prefill, then the steps
    assert {name: len(s) for name, s in steps.seconds.items()} == {"sdpa": 3, "eager": 3}
    assert all(s > 0 for secs in steps.seconds.values() for s in secs)
    assert torch.equal(switched, plain)


COMMITTED = Path(__file__).resolve().parents[1] / "benchmarks" / "h200"


def test_report_from_the_committed_json_is_the_committed_report():
    """front_doors.md is drawn from front_doors.json alone: the committed pair agrees."""
    res = json.loads((COMMITTED / "front_doors.json").read_text())
    assert front_doors_report.markdown(res) == (COMMITTED / "front_doors.md").read_text()


def test_speed_ratios_invert_times_and_keep_rates():
    res = {"fwd_bwd": [{"shape": "s", "inputs": "BHSD leaves", "ratio": 1.25, "ratio_low": 1.0, "ratio_high": 2.0},
                       {"shape": "t", "inputs": "BSHD views", "ratio": 1.0}],  # no interval: not drawn
           "hf": {front_doors_report.HF_PAIRED: {"prefill b=1 s=4096 ms": [0.8, 0.5, 1.0],
                                                 "generate b=4 dynamic cache tokens/s": [1.1, 0.9, 1.3]}}}  # fmt: skip
    rows = front_doors_report.speed_ratios(res)
    assert [r[0] for r in rows] == ["drop-in fwd+bwd GPU, s, BHSD leaves", "HF prefill b=1 s=4096",
                                    "HF generate b=4 dynamic cache"]  # fmt: skip
    assert rows[0][1:] == pytest.approx((0.8, 0.5, 1.0))  # time ratio 1.25 (1.0-2.0): speed 0.8 (0.5-1.0)
    assert rows[1][1:] == pytest.approx((1.25, 1.0, 2.0))
    assert rows[2][1:] == (1.1, 0.9, 1.3)
    assert all(low <= med <= high for _, med, low, high in rows)


def test_replot_draws_the_report_again_from_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "front_doors.json").write_text((COMMITTED / "front_doors.json").read_text())
    assert front_doors.main(["--replot", str(tmp_path)]) == 0
    assert (tmp_path / "front_doors.md").read_text() == (COMMITTED / "front_doors.md").read_text()
    assert (tmp_path / "front_doors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"



def test_module_runs_as_a_command_once(tmp_path):
    """``python -m te_cudnn.benchmark.front_doors``: the package imports none of its modules, so
    the command's module is not imported before runpy runs it (no RuntimeWarning, one copy)."""
    import subprocess
    import sys

    (tmp_path / "front_doors.json").write_text((COMMITTED / "front_doors.json").read_text())
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "te_cudnn.benchmark.front_doors",
                           "--replot", str(tmp_path)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr


def test_run_writes_the_report_after_every_section(tmp_path, monkeypatch):
    """A run cut short (here: the fwd+bwd section fails) keeps the sections it measured."""
    monkeypatch.setattr(front_doors, "_device", lambda: "a GPU")
    monkeypatch.setattr(front_doors, "host_doors", lambda: {"torch SDPA (default backend)": 20.0, "te_cudnn x": 18.0})

    def cut_short():
        raise RuntimeError("cut short")

    monkeypatch.setattr(front_doors, "dropin_fwd_bwd", cut_short)
    with pytest.raises(RuntimeError, match="cut short"):
        front_doors.run(tmp_path, hf=False)
    saved = json.loads((tmp_path / "front_doors.json").read_text())
    assert saved["host"] == {"torch SDPA (default backend)": 20.0, "te_cudnn x": 18.0}
    assert "| te_cudnn x | 18.0 | 0.90× |" in (tmp_path / "front_doors.md").read_text()


@pytest.mark.parametrize("switch, setting, field, phrase, flagged", [
    (packed_one_row, False, "packed_one_row", "ran packed", False),
    (packed_one_row, True, "packed_one_row", "ran packed", True),
    (lean_one_row, True, "heuristic_one_row_plans", "heuristic split-KV plans", False),
    (lean_one_row, False, "heuristic_one_row_plans", "heuristic split-KV plans", True),
])  # fmt: skip
def test_the_report_says_how_decode_steps_ran(tmp_path, monkeypatch, switch, setting, field, phrase, flagged):
    """Packed (TE_CUDNN_PACKED_ONE_ROW=1) or on cuDNN's split-KV plans (TE_CUDNN_LEAN_ONE_ROW=0):
    the JSON and the report say so, from the first section on."""
    monkeypatch.setattr(front_doors, "_device", lambda: "a GPU")
    monkeypatch.setattr(front_doors, "host_doors", lambda: {"torch SDPA (default backend)": 20.0})

    def cut_short():
        raise RuntimeError("cut short")

    monkeypatch.setattr(front_doors, "dropin_fwd_bwd", cut_short)
    was = switch(setting)
    try:
        with pytest.raises(RuntimeError, match="cut short"):
            front_doors.run(tmp_path, hf=False)
    finally:
        switch(was)
    saved = json.loads((tmp_path / "front_doors.json").read_text())
    assert saved.get(field, False) is flagged
    assert (phrase in (tmp_path / "front_doors.md").read_text()) is flagged


def test_progress_prints_each_hf_measure_as_it_ends(capsys):
    r = {"sdpa": {"m tokens/s": 300.0}, "te_cudnn": {"m tokens/s": 303.3}}
    front_doors._progress("m tokens/s", r, {"m tokens/s": [1.011, 1.002, 1.02]})
    front_doors._progress("m tokens/s", r, {})
    assert capsys.readouterr().out.splitlines() == [
        "hf m tokens/s: sdpa 300.0, te_cudnn 303.3, paired 1.011 (1.002–1.020)",
        "hf m tokens/s: sdpa 300.0, te_cudnn 303.3"]


def test_hf_section_runs_with_transformers_at_errors_only():
    transformers = pytest.importorskip("transformers")
    before = transformers.logging.get_verbosity()
    with front_doors._transformers_quiet():
        assert transformers.logging.get_verbosity() == transformers.logging.ERROR
    assert transformers.logging.get_verbosity() == before
    with pytest.raises(KeyError), front_doors._transformers_quiet():
        raise KeyError("a failing measure")
    assert transformers.logging.get_verbosity() == before

def test_replot_says_what_is_wrong_in_one_line(tmp_path, capsys):
    assert front_doors.main(["--replot", str(tmp_path)]) == 1  # no front_doors.json
    (tmp_path / "front_doors.json").write_text("{not json")
    assert front_doors.main(["--replot", str(tmp_path)]) == 1
    (tmp_path / "front_doors.json").write_text('{"cases": []}')
    assert front_doors.main(["--replot", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("front-door benchmark: ") for line in err)
    assert "is not JSON" in err[1] and "is not a front-door report" in err[2]
