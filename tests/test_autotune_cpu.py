"""Autotuning (``te_cudnn.plans.tune``) without a GPU: switching it on, the bookkeeping of a
tuning (timings, choice, record) with a fake timer, the record in a real plan store and its
invalidation under another fingerprint, the plan cache's tuned/untuned rule, the operands
tuning allocates for real frontend graphs, and the ``plans tune`` / ``plans show`` commands.

Timings here come from a fake timer and are labelled as such: they test what is done with
times, not cuDNN. Everything graph-related uses the real frontend (which validates on CPU).
"""

from __future__ import annotations

import json
import math
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from te_cudnn.backends import BY_ENUM, Direction, Uid
from te_cudnn.cli import main
from te_cudnn.config import describe_fwd
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.errors import GraphBuildError
from te_cudnn.plans import CompiledPlan, PlanCache, PlanKey, make_key
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans import handles as handles_mod
from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.store import PlanStore
from te_cudnn.plans.tune import (
    ENV, FP8_AGREEMENT, RECORD_VERSION, Candidate, CandidateTiming, TuningError, TuningResult, agreement_tolerance,
    autotune_enabled, autotuning, choose, dedupe_names, format_record, make_operands, measure, tunable,
    tuning_record, tuning_wanted, valid_record,
)  # fmt: skip
from te_cudnn.testing import TOLERANCES

from _plan_helpers import FACTS, sizes_config, sizes_key

F16 = FusedAttnBackend.F16_arbitrary_seqlen
FP8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(tune_mod, "_warned", set())


# ----------------------------------------------------------------------------- switching it on
@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("ON", True), (" yes ", True), ("0", False),
                                      ("off", False), ("", False), ("False", False), ("no", False)])  # fmt: skip
def test_environment_variable(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    assert autotune_enabled() is False  # unset: off
    monkeypatch.setenv(ENV, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # recognised values never warn
        assert autotune_enabled() is on


def test_unrecognised_value_is_off_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "maybe")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert autotune_enabled() is False and autotune_enabled() is False
    assert len(seen) == 1 and "TE_CUDNN_AUTOTUNE='maybe'" in str(seen[0].message)


def test_context_manager_overrides_the_environment_and_nests(monkeypatch: pytest.MonkeyPatch) -> None:
    with autotuning():
        assert autotune_enabled()
        with autotuning(False):
            assert not autotune_enabled()
            with autotuning(True):
                assert autotune_enabled()
            assert not autotune_enabled()
        assert autotune_enabled()
    assert not autotune_enabled()
    monkeypatch.setenv(ENV, "1")
    assert autotune_enabled()
    with autotuning(False):  # the block wins over the environment, both ways
        assert not autotune_enabled()
    assert autotune_enabled()


def test_context_manager_restores_on_error_and_works_as_decorator() -> None:
    with pytest.raises(RuntimeError):
        with autotuning():
            raise RuntimeError("boom")
    assert not autotune_enabled()

    @autotuning()
    def inside() -> bool:
        return autotune_enabled()

    assert inside() is True and autotune_enabled() is False


def test_the_setting_belongs_to_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, bool] = {}
    with autotuning():
        t = threading.Thread(target=lambda: seen.setdefault("other", autotune_enabled()))
        t.start()
        t.join()
        assert autotune_enabled()
    assert seen == {"other": False}  # a thread started inside follows the environment (unset: off)
    monkeypatch.setenv(ENV, "1")
    with autotuning(False):
        t = threading.Thread(target=lambda: seen.__setitem__("other", autotune_enabled()))
        t.start()
        t.join()
    assert seen == {"other": True}


def test_which_keys_are_tunable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tunable(sizes_key()) and tunable(sizes_key(Direction.BWD))
    assert not tunable(sizes_key(device=-1))  # no CUDA device
    max512 = make_key(FusedAttnBackend.F16_max512_seqlen, Direction.FWD, sizes_config(), 91900, "1.32.0")
    assert not tunable(max512)  # plans that are not stored are never tuned
    assert not tuning_wanted(sizes_key())  # off
    with autotuning():
        assert tuning_wanted(sizes_key()) and not tuning_wanted(max512)
        monkeypatch.setattr(tune_mod, "_capturing", lambda: True)
        assert not tuning_wanted(sizes_key())  # never during CUDA-graph capture


# ----------------------------------------------------------------------------- bookkeeping (fake timer)
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


def fake_result(**over: Any) -> TuningResult:
    timings = measure(CANDIDATES, lambda c: (lambda: None), fake_timer)
    chosen, heuristic, rule = choose(timings, heuristic_index=0)
    kw = dict(rule=rule, modes=["A", "B", "FALLBACK"], warmup=3, reps=10, duplicates=2, seconds=12.5,
              timestamp=1_700_000_000.0)
    kw.update(over)
    return TuningResult(timings, chosen, heuristic, **kw)


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


# ----------------------------------------------------------------------------- numerics guard
def test_agreement_tolerances() -> None:
    assert agreement_tolerance(torch.bfloat16) == TOLERANCES[torch.bfloat16].ceiling
    assert agreement_tolerance(torch.float16) == TOLERANCES[torch.float16].ceiling
    assert agreement_tolerance(FP8) == FP8_AGREEMENT


def test_agreement_error() -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(4, 64, generator=g)
    err = tune_mod.agreement_error
    assert err("o", ref.clone(), ref, 1e-2) is None
    assert err("o", ref + 1e-4 * torch.randn(4, 64, generator=g), ref, 1e-2) is None
    assert "relative difference" in err("o", ref + 0.5 * torch.randn(4, 64, generator=g), ref, 1e-2)
    inf_ref = ref.clone()
    inf_ref[0, 0] = float("-inf")
    assert err("stats", inf_ref.clone(), inf_ref, 1e-2) is None  # the same non-finite positions: compared elsewhere
    assert "non-finite" in err("stats", ref, inf_ref, 1e-2)
    assert err("o", ref.to(torch.bfloat16), ref, TOLERANCES[torch.bfloat16].ceiling) is None


# ----------------------------------------------------------------------------- operands for real graphs
def _planned_graph(backend: FusedAttnBackend, direction: Direction, cfg) -> tuple[Any, Any]:
    spec = BY_ENUM[backend].build(cfg, direction, None)  # the real frontend; deviceless
    spec.graph.validate()
    return spec, spec.graph


def _paged_config():
    b, sq, h, hg, d, page, per_seq, pool = 3, 1, 8, 2, 64, 16, 4, 24
    q = torch.empty(b, sq, h, d, dtype=torch.bfloat16)
    kv = torch.empty(pool, page, hg, d, dtype=torch.bfloat16)
    table = torch.zeros(b, per_seq, dtype=torch.int32)
    return describe_fwd(is_training=False, max_seqlen_q=sq, max_seqlen_kv=page * per_seq,
                        cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32) * sq,
                        cu_seqlens_kv=torch.arange(b + 1, dtype=torch.int32) * 40, q=q, k=kv, v=kv,
                        qkv_dtype=torch.bfloat16, attn_bias=None, attn_scale=None, dropout=0.0,
                        qkv_layout="paged_kv_bshd_bshd_bshd", attn_bias_type="no_bias", attn_mask_type="padding",
                        softmax_type="vanilla", window_size=(-1, -1), bottom_right_diagonal=None, page_table_k=table,
                        page_table_v=table)  # fmt: skip


OPERAND_CASES = {
    "dense_causal_fwd": (F16, Direction.FWD, dict()),
    "gqa_sbhd_bwd": (F16, Direction.BWD, dict(qkv_layout="sbhd_sbhd_sbhd", num_gqa_groups=4)),
    "packed_bs3hd_bwd": (F16, Direction.BWD, dict(qkv_layout="bs3hd")),
    "bias_dropout_bwd": (F16, Direction.BWD, dict(attn_mask_type="no_mask", attn_bias_type="post_scale_bias",
                                                 dropout=0.1, max_seqlen_q=128, max_seqlen_kv=128)),
    "padding_fwd": (F16, Direction.FWD, dict(attn_mask_type="padding_causal", max_seqlen_kv=384)),
    "thd_fwd_sink": (F16, Direction.FWD, dict(qkv_layout="thd_thd_thd", attn_mask_type="padding_causal",
                                              softmax_type="learnable", max_seqlen_q=100, max_seqlen_kv=100,
                                              batch_size=3)),
    "thd_bwd": (F16, Direction.BWD, dict(qkv_layout="thd_t2hd", attn_mask_type="padding", batch_size=40,
                                         max_seqlen_q=200, max_seqlen_kv=200)),
    "fp8_fwd_padding": (FusedAttnBackend.FP8, Direction.FWD, dict(dtype=FP8, head_dim_qk=128, head_dim_v=128,
                                                                  attn_mask_type="padding")),
    "fp8_bwd": (FusedAttnBackend.FP8, Direction.BWD, dict(dtype=FP8, head_dim_qk=128, head_dim_v=128,
                                                          attn_mask_type="causal")),
    "paged_fwd": (F16, Direction.FWD, None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(OPERAND_CASES))
def test_operands_match_the_graph_and_hold_valid_runtime_data(case: str) -> None:
    from te_cudnn.varlen import mult_fields as _mult_fields  # the multipliers the launch path uses

    backend, direction, over = OPERAND_CASES[case]
    cfg = _paged_config() if over is None else make_key(backend, direction, sizes_config(**over), 91900, "1.32.0").config
    spec, g = _planned_graph(backend, direction, cfg)
    ops = make_operands(g, spec.uids, cfg, "cpu", seed=3)
    assert list(ops) == list(spec.uids)
    outputs = {t.uid for t in g.get_outputs()}
    lens_q = lens_kv = None
    for uid in spec.uids:
        t, buf = g.find_tensor(uid), ops[uid]
        assert buf.device.type == "cpu" and buf.data_ptr() % 16 == 0, Uid.NAMES[uid]
        if t.ragged_offset is not None:  # THD: a flat buffer of the token capacity
            tokens = cfg.max_total_q if uid in (Uid.Q, Uid.O, Uid.STATS, Uid.DO, Uid.DQ) else cfg.max_total_kv
            assert buf.dim() == 1 and buf.numel() >= (tokens - 1) * t.stride[2] + 1
        else:  # dense: exactly the graph's dims and strides
            assert list(buf.shape) == list(t.dim) and list(buf.stride()) == list(t.stride), Uid.NAMES[uid]
        if uid in outputs:
            assert not buf.float().abs().sum(), f"{Uid.NAMES[uid]}: outputs start at zero"
        elif uid == Uid.SEQ_LEN_Q:
            lens_q = buf.flatten().tolist()
        elif uid == Uid.SEQ_LEN_KV:
            lens_kv = buf.flatten().tolist()
        elif uid in (Uid.SEED, Uid.OFFSET):
            assert buf.dtype == torch.int64 and buf.item() == (1234 if uid == Uid.SEED else 0)
        elif Uid.DESCALE_Q <= uid <= Uid.SCALE_DP and uid not in (Uid.AMAX_S, Uid.AMAX_O):
            expected = {Uid.SCALE_S: 448.0, Uid.DESCALE_S: 1 / 448.0}.get(uid, 1.0)
            assert buf.dtype == torch.float32 and buf.item() == pytest.approx(expected), Uid.NAMES[uid]
        elif uid == Uid.STATS:
            assert torch.all(buf == math.log(cfg.skv) + 1)
        elif uid in (Uid.PAGE_TABLE_K, Uid.PAGE_TABLE_V):
            pages = buf.view(cfg.b, -1)
            assert pages.dtype == torch.int32 and pages.flatten().tolist() == [i % cfg.paged[0] for i in range(pages.numel())]
        elif buf.dtype.is_floating_point:
            values = buf.float()
            assert torch.isfinite(values).all() and values.abs().mean() > 0.3, Uid.NAMES[uid]
    if cfg.mask.is_padding:
        assert lens_q is not None and lens_kv is not None
        if not cfg.ragged_q:
            assert lens_q == [cfg.sq] * cfg.b
        if not cfg.ragged_kv:
            assert lens_kv == [cfg.skv] * cfg.b
    if cfg.is_ragged:  # THD: full sequences fill the token capacity; dense offsets with the launch's multipliers
        assert all(0 <= n <= cfg.sq for n in lens_q) and sum(lens_q) == min(cfg.max_total_q, cfg.b * cfg.sq)
        assert lens_q == sorted(lens_q, reverse=True)
        mult = _mult_fields(cfg, torch.device("cpu"))
        rows = {Uid.RAGGED_Q: (lens_q, mult["mult_q"][0]), Uid.RAGGED_O: (lens_q, mult["mult_q"][1]),
                Uid.RAGGED_STATS: (lens_q, mult["mult_q"][2]), Uid.RAGGED_K: (lens_kv, mult["mult_kv"][0]),
                Uid.RAGGED_V: (lens_kv, mult["mult_kv"][1])}  # fmt: skip
        for uid, (lens, m) in rows.items():
            cum = torch.cumsum(torch.tensor([0, *lens]), 0) * int(m)
            assert ops[uid].dtype == torch.int64 and ops[uid].flatten().tolist() == cum.tolist(), Uid.NAMES[uid]
            capacity = cfg.max_total_q if uid in (Uid.RAGGED_Q, Uid.RAGGED_O, Uid.RAGGED_STATS) else cfg.max_total_kv
            assert int(cum[-1]) // int(m) == sum(lens) <= capacity  # every token addressed is inside its buffer


def test_operands_bind_given_lengths_and_token_offsets() -> None:
    """The padded-row checks (te_cudnn.plans.padded_rows) bind partial lengths and THD offsets with
    gaps through the same synthesis; everything else is what the default gives."""
    backend, direction, over = OPERAND_CASES["thd_bwd"]
    cfg = make_key(backend, direction, sizes_config(**over), 91900, "1.32.0").config
    spec, g = _planned_graph(backend, direction, cfg)
    lens_q = [3, 0, 7] + [0] * (cfg.b - 3)
    lens_kv = [5, 2, 7] + [0] * (cfg.b - 3)
    cu_q = [0, 4, 4] + [12] * (cfg.b - 2)
    cu_kv = [0, 5, 8] + [16] * (cfg.b - 2)
    given = make_operands(g, spec.uids, cfg, "cpu", seed=3, lengths=(lens_q, lens_kv), cu_tokens=(cu_q, cu_kv))
    default = make_operands(g, spec.uids, cfg, "cpu", seed=3)
    assert given[Uid.SEQ_LEN_Q].flatten().tolist() == lens_q and given[Uid.SEQ_LEN_KV].flatten().tolist() == lens_kv
    assert given[Uid.RAGGED_Q].flatten().tolist() == [c * cfg.q_stride[2] for c in cu_q]
    assert given[Uid.RAGGED_K].flatten().tolist() == [c * cfg.k_stride[2] for c in cu_kv]
    where = (Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV, Uid.RAGGED_Q, Uid.RAGGED_O, Uid.RAGGED_STATS, Uid.RAGGED_K, Uid.RAGGED_V)
    for uid in spec.uids:
        assert given[uid].shape == default[uid].shape and given[uid].stride() == default[uid].stride()
        if uid not in where:
            assert torch.equal(given[uid], default[uid]), Uid.NAMES[uid]
    only = tune_mod.length_operands(g, spec.uids, cfg, "cpu", lengths=(lens_q, lens_kv), cu_tokens=(cu_q, cu_kv))
    assert set(only) == {u for u in spec.uids if u in where}
    assert all(torch.equal(only[u], given[u]) for u in only)


def test_operands_are_reproducible() -> None:
    cfg = sizes_config()
    spec, g = _planned_graph(F16, Direction.FWD, cfg)
    a, b = make_operands(g, spec.uids, cfg, "cpu", seed=1), make_operands(g, spec.uids, cfg, "cpu", seed=1)
    assert all(torch.equal(a[u], b[u]) for u in spec.uids)
    c = make_operands(g, spec.uids, cfg, "cpu", seed=2)
    assert not torch.equal(a[Uid.Q], c[Uid.Q])


def test_tuning_an_unbuildable_graph_raises_as_building_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU the real frontend cannot plan: tune_plan raises the GraphBuildError that
    build_plan raises, with no warning, rather than turning the failure into something else."""
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only behaviour")
    k = sizes_key()
    make = lambda: BY_ENUM[k.backend].build(k.config, k.direction, None)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(GraphBuildError):
            cache_mod.build_plan(k, make)
        with pytest.raises(GraphBuildError):
            tune_mod.tune_plan(k, make)
        with pytest.raises(GraphBuildError, match="create execution plans"):
            tune_mod.plan_candidates(k, make)


# ----------------------------------------------------------------------------- the plan store
class _Graph:
    """Stands in for a built graph where only its serialized bytes are asked for (the store is byte-level)."""

    def __init__(self, blob: bytes = b"synthetic serialized plan" * 10):
        self.blob = blob

    def serialize(self, as_bytes: bool = True) -> bytes:
        return self.blob


def _plan(k: PlanKey, tuning: dict | None = None, name: str = "eng0_k2=1") -> CompiledPlan:
    uids = BY_ENUM[k.backend].operand_uids(k.config, k.direction)
    return CompiledPlan(k, graph=_Graph(), uids=uids, workspace_size=0, plan_name=name, build_seconds=0.01,
                        tuning=tuning)  # fmt: skip


def _tuned_plan(k: PlanKey) -> CompiledPlan:
    record = fake_result().to_record()
    return _plan(k, record, record["chosen"]["name"])


@pytest.mark.parametrize("other", [{"gpu": "NVIDIA H200"}, {"cudnn": 92000}, {"sm_count": 114}, {"frontend": "1.33.0"}])
def test_record_is_stored_read_back_and_invalidated_by_another_fingerprint(tmp_path: Path, other: dict) -> None:
    k = sizes_key()
    store = PlanStore(tmp_path / "plans", FACTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache_mod._save_built(store, k, k.describe(device=False), _tuned_plan(k))
    header = store.load(k.describe(device=False)).header
    assert header["plan_name"] == "eng4_k3=2" == header["tuning"]["chosen"]["name"]
    assert header["tuning"] == json.loads(json.dumps(fake_result().to_record()))
    # a fresh process: an empty cache, the same store
    assert tuning_record(k, cache=PlanCache(builder=lambda *a: None), store=PlanStore(tmp_path / "plans", FACTS)) == header["tuning"]
    # another GPU model or version: another fingerprint, another directory; the record is never seen
    foreign = PlanStore(tmp_path / "plans", {**FACTS, **other})
    assert foreign.fingerprint != store.fingerprint
    assert foreign.load(k.describe(device=False)) is None
    assert tuning_record(k, cache=PlanCache(builder=lambda *a: None), store=foreign) is None
    # an untuned plan of the same key has no record
    cache_mod._save_built(store, k, k.describe(device=False), _plan(k))
    assert tuning_record(k, cache=PlanCache(builder=lambda *a: None), store=store) is None


def test_tuning_record_prefers_the_cached_tuned_plan(tmp_path: Path) -> None:
    k = sizes_key()
    cache = PlanCache(builder=lambda key, make_spec: _tuned_plan(key))
    cache.get_or_build(k, lambda: None)
    assert tuning_record(k, cache=cache, store=PlanStore(tmp_path, FACTS)) == cache.find(k).tuning
    assert tuning_record(sizes_key(device=-1), cache=PlanCache(builder=lambda *a: None)) is None  # no device, no store


@pytest.fixture
def plan_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """build_or_load_plan over a store in tmp_path. The heuristic build and the tuner are
    replaced (no GPU): the fake tuner runs the real bookkeeping with the fake timer."""
    store = PlanStore(tmp_path / "plans", FACTS)
    calls: list[tuple[str, PlanKey]] = []

    def fake_build(k: PlanKey, make_spec) -> CompiledPlan:
        calls.append(("build", k))
        return _plan(k)

    def fake_tune(k: PlanKey, make_spec) -> CompiledPlan:
        calls.append(("tune", k))
        plan = _tuned_plan(k)
        plan.tune_checked = True
        return plan

    deserialized: list[Path] = []

    def no_handle(device: int):  # synthetic bytes never reach cuDNN's deserializer
        deserialized.append(device)
        raise RuntimeError("these tests hand no plan to cuDNN")

    monkeypatch.setattr(cache_mod, "build_plan", fake_build)
    monkeypatch.setattr(tune_mod, "tune_plan", fake_tune)
    monkeypatch.setattr(cache_mod, "store_for", lambda device: store)
    monkeypatch.setattr(handles_mod, "handle_for", no_handle)
    return store, calls, deserialized


def test_off_builds_as_before_and_stores_no_record(plan_env) -> None:
    store, calls, _ = plan_env
    k = sizes_key()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = cache_mod.build_or_load_plan(k, lambda: None)
    assert calls == [("build", k)] and plan.tuning is None
    assert "tuning" not in store.load(k.describe(device=False)).header


def test_on_tunes_and_replaces_an_untuned_stored_plan_without_deserializing_it(plan_env) -> None:
    store, calls, deserialized = plan_env
    k = sizes_key()
    cache_mod._save_built(store, k, k.describe(device=False), _plan(k))  # an untuned plan from an earlier process
    with autotuning():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the untuned file is passed over quietly, before cuDNN sees it
            plan = cache_mod.build_or_load_plan(k, lambda: None)
    assert calls == [("tune", k)] and deserialized == [] and plan.tuning is not None
    header = store.load(k.describe(device=False)).header
    assert header["tuning"]["chosen"]["name"] == header["plan_name"] == "eng4_k3=2"
    # a later process with autotuning on goes for the tuned file (deserializing it needs a GPU here)
    with autotuning(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cache_mod.build_or_load_plan(k, lambda: None)
    assert deserialized == [0] and any("could not load stored plan" in str(w.message) for w in seen)


def test_untunable_keys_are_built_as_before_with_autotuning_on(plan_env) -> None:
    _, calls, _ = plan_env
    k = sizes_key(device=-1)
    with autotuning():
        cache_mod.build_or_load_plan(k, lambda: None)
    assert calls == [("build", k)]


# ----------------------------------------------------------------------------- the plan cache's rule
class Builder:
    """A builder that returns tuned plans while autotuning is on (as build_or_load_plan does)."""

    def __init__(self, tunes: bool = True):
        self.calls: list[tuple[PlanKey, bool]] = []
        self.tunes = tunes

    def __call__(self, k: PlanKey, make_spec) -> CompiledPlan:
        on = tuning_wanted(k)
        self.calls.append((k, on))
        return _tuned_plan(k) if on and self.tunes else _plan(k)


def test_cache_tunes_an_untuned_entry_once_autotuning_is_on() -> None:
    builder = Builder()
    cache = PlanCache(maxsize=4, builder=builder)
    k = sizes_key()
    heuristic = cache.get_or_build(k, lambda: None)
    assert heuristic.tuning is None and cache.get_or_build(k, lambda: None) is heuristic  # off: a hit
    with autotuning():
        tuned = cache.get_or_build(k, lambda: None)  # untuned entry: a miss, tuned, replaced
        assert tuned is not heuristic and tuned.tuning is not None and tuned.tune_checked
        assert heuristic.evicted and cache.hit(heuristic) is False  # holders of the old plan look up again
        assert cache.get_or_build(k, lambda: None) is tuned
    assert cache.get_or_build(k, lambda: None) is tuned  # off again: any plan serves
    assert builder.calls == [(k, False), (k, True)]
    s = cache.stats()
    assert (s.entries, s.misses, s.builds, s.evictions) == (1, 2, 2, 0) and s.hits == 1 + 2
    info = tuned.info()
    assert info["tuned"] is True and info["tuning"]["chosen"]["name"] == "eng4_k3=2"
    assert [c["name"] for c in info["tuning"]["candidates"]][:2] == ["eng0_k2=1", "eng4_k3=2"]
    assert heuristic.info()["tuned"] is False and "tuning" not in heuristic.info()
    json.dumps(cache.snapshot())


def test_cache_does_not_retry_a_key_whose_tuning_failed() -> None:
    builder = Builder(tunes=False)  # tuning impossible or failed: the builder returns the heuristic plan
    cache = PlanCache(maxsize=4, builder=builder)
    k = sizes_key()
    with autotuning():
        first = cache.get_or_build(k, lambda: None)
        assert first.tuning is None and first.tune_checked
        assert cache.get_or_build(k, lambda: None) is first
    assert len(builder.calls) == 1


def test_cache_never_tunes_untunable_keys_or_during_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    builder = Builder()
    cache = PlanCache(maxsize=4, builder=builder)
    k, cpu = sizes_key(), sizes_key(device=-1)
    plain = cache.get_or_build(k, lambda: None)
    cache.get_or_build(cpu, lambda: None)
    with autotuning():
        assert cache.get_or_build(cpu, lambda: None).tuning is None
        monkeypatch.setattr(tune_mod, "_capturing", lambda: True)
        assert cache.get_or_build(k, lambda: None) is plain  # during capture the cached plan serves
    assert [on for _, on in builder.calls] == [False, False]


def test_entering_autotuning_retires_untuned_plans_of_the_process_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = PlanCache(maxsize=8, builder=Builder(tunes=False))
    monkeypatch.setattr(cache_mod, "plan_cache", cache)
    k1, k2, cpu = sizes_key(), sizes_key(max_seqlen_q=1024, max_seqlen_kv=1024), sizes_key(device=-1)
    held = [cache.get_or_build(k, lambda: None) for k in (k1, k2, cpu)]
    cache.put(_tuned_plan(k2))  # k2 already tuned (as tune_key leaves it)
    assert held[1].evicted
    tuned_k2 = cache.find(k2)
    with autotuning():
        assert held[0].evicted and not cache.hit(held[0])  # the untuned plan: its holders look up (and tune)
        assert cache.find(k2) is tuned_k2 and not tuned_k2.evicted  # a tuned plan stays
        assert cache.find(cpu) is held[2] and not held[2].evicted  # an untunable one stays
        tried = cache.get_or_build(k1, lambda: None)  # tuning fails here: checked, kept
    with autotuning():
        assert cache.find(k1) is tried  # not retired again
    assert len(cache) == 3 and cache.stats().evictions == 0


def test_put_replaces_and_respects_maxsize() -> None:
    cache = PlanCache(maxsize=1, builder=Builder())
    k1, k2 = sizes_key(), sizes_key(max_seqlen_q=1024, max_seqlen_kv=1024)
    a = cache.get_or_build(k1, lambda: None)
    b = _tuned_plan(k2)
    cache.put(b)
    assert a.evicted and cache.find(k2) is b and len(cache) == 1 and cache.stats().evictions == 1


# ----------------------------------------------------------------------------- the command line
def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_tune_help(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plans", "tune", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: te-cudnn plans tune")
    for word in ("configs", "--retune", "--store", "--json", "needs a GPU", "plans warm", "plans show"):
        assert word in out, word
    for key in ("b", "h", "hg", "sq", "skv", "d", "d_v", "layout", "mask", "dtype", "training"):
        assert f"\n  {key} " in out, key
    with pytest.raises(SystemExit) as exc:
        main(["plans", "--help"])
    assert exc.value.code == 0 and "tune" in capsys.readouterr().out


def _configs(tmp_path: Path, configs: Any) -> Path:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(configs))
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_tune_needs_cuda(capsys, tmp_path: Path) -> None:
    configs = _configs(tmp_path, [{"b": 1, "h": 4, "sq": 128, "d": 64, "mask": "causal"}])
    rc, out, err = run(capsys, "plans", "tune", str(configs), "--store", str(tmp_path / "s"))
    assert rc == 1 and out == ""
    assert err == (f"te-cudnn: plans tune needs a CUDA device (it times every engine on it); check the file here with "
                   f"`te-cudnn plans warm --check {configs}`\n")  # fmt: skip
    assert not (tmp_path / "s").exists()


def test_tune_rejects_bad_configs_before_any_gpu_work(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("no device check before the file is checked"))
    configs = _configs(tmp_path, [{"b": 1, "h": 4, "sq": 128, "d": 64}, {"b": 1, "h": 4, "sq": 128, "d": 64, "x": 1}])
    rc, _, err = run(capsys, "plans", "tune", str(configs))
    assert rc == 2 and "config 2: unknown key 'x'" in err and "plans warm --check" in err
    rc, _, err = run(capsys, "plans", "tune", str(tmp_path / "missing.json"))
    assert rc == 2 and "cannot read" in err


@pytest.fixture
def tuned_store(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "store"
    s = PlanStore(root, FACTS)
    k, kb = sizes_key(), sizes_key(Direction.BWD)
    cache_mod._save_built(s, k, k.describe(device=False), _tuned_plan(k))
    cache_mod._save_built(s, kb, kb.describe(device=False), _plan(kb))
    return root, s.path_for(k.describe(device=False))


def test_show_lists_the_candidates_times(capsys, tuned_store: tuple[Path, Path]) -> None:
    root, path = tuned_store
    rc, out, err = run(capsys, "plans", "show", path.stem[:10], "--store", str(root))
    assert rc == 0 and err == ""
    assert "plan_name: eng4_k3=2" in out and "direction: fwd" in out
    assert "tuning: {" not in out  # the record is rendered, not dumped
    assert "chosen [1] eng4_k3=2 (0.4100 ms), heuristic [0] eng0_k2=1 (0.5200 ms), speed-up 1.268x" in out
    for name, ms in (("eng0_k2=1", "0.5200 ms"), ("eng4_k3=2", "0.4100 ms"), ("eng7_k9=0", "0.4500 ms")):
        assert any(name in line and ms in line for line in out.splitlines()), name
    assert "error: not built" in out and "error: RuntimeError: CUDNN_STATUS_EXECUTION_FAILED" in out
    rc, out, _ = run(capsys, "plans", "show", path.stem, "--store", str(root), "--json")
    header = json.loads(out)
    assert rc == 0 and header["tuning"]["chosen"]["name"] == "eng4_k3=2" and len(header["tuning"]["candidates"]) == 5


def test_list_marks_tuned_plans(capsys, tuned_store: tuple[Path, Path]) -> None:
    root, path = tuned_store
    rc, out, _ = run(capsys, "plans", "list", "--store", str(root), "--json")
    rows = {r["entry"]: r for r in json.loads(out)["plans"]}
    assert rc == 0 and rows[path.stem]["tuned"] == "1.27x"
    assert sorted(r["tuned"] for r in rows.values()) == ["-", "1.27x"]
    rc, out, _ = run(capsys, "plans", "list", "--store", str(root))
    assert rc == 0 and "tuned" in out.splitlines()[1] and "1.27x" in out
