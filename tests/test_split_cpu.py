"""Splitting a backward into parts (te_cudnn.plans.split): the choices a configuration allows,
the part configurations and operand views, the record the tuner writes and reads back, and
the measurement's bookkeeping with a fake runner and timer (no GPU)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from te_cudnn.plans.order import order_rng, round_order
from te_cudnn.plans.split import chosen_split, measure_splits, slice_operand, split_choices, split_config
from te_cudnn.plans.tune import CandidateTiming, TuningResult


@dataclass(frozen=True)
class _Cfg:
    b: int
    h: int
    hg: int


def test_split_choices_batch_first_then_head_groups():
    assert split_choices(_Cfg(2, 32, 32)) == [("batch", 2), ("batch_heads", 4), ("batch_heads", 8)]
    assert split_choices(_Cfg(4, 32, 8)) == [("batch", 2), ("batch", 4), ("batch_heads", 8), ("batch_heads", 16)]
    assert split_choices(_Cfg(3, 32, 8)) == [("batch_heads", 6), ("batch_heads", 12)]  # one sequence per part
    assert split_choices(_Cfg(8, 32, 8)) == [("batch", 2), ("batch", 4)]  # more sequences: batch parts only
    assert split_choices(_Cfg(1, 64, 8)) == [("heads", 2), ("heads", 4)]
    assert split_choices(_Cfg(1, 64, 1)) == []  # MQA: one key/value head cannot be split


def test_split_config_and_operand_views_are_zero_copy():
    from te_cudnn.config import describe_shapes

    cfg = describe_shapes(is_training=True, dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias",
                          attn_mask_type="causal", softmax_type="vanilla", dropout=0.0, num_attn_heads=32,
                          num_gqa_groups=8, max_seqlen_q=1024, max_seqlen_kv=1024, head_dim_qk=128, head_dim_v=128,
                          window_size=(-1, 0), batch_size=2)
    part = split_config(cfg, "batch", 2)
    assert part.b == 1 and part.q_stride == cfg.q_stride
    part = split_config(replace(cfg, b=1), "heads", 4)
    assert (part.h, part.hg) == (8, 2)
    q = torch.zeros(2, 32, 64, 16)  # BHSD operands as a graph declares them
    k = torch.zeros(2, 8, 64, 16)
    scalar = torch.zeros(1, 1, 1, 1)
    sizes = (2, 32, 8)
    halves = [slice_operand(q, "batch", i, 2, sizes, (0, 1)) for i in range(2)]
    assert all(h.shape == (1, 32, 64, 16) and h.data_ptr() == q[i:].data_ptr() for i, h in enumerate(halves))
    assert slice_operand(k, "heads", 1, 4, sizes, (0, 1)).shape == (2, 2, 64, 16)
    assert slice_operand(scalar, "batch", 1, 2, sizes, (0, 1)) is scalar
    # batch_heads, 4 parts of b=2 (2 head groups each): part 3 is sequence 1, second head group
    part = slice_operand(q, "batch_heads", 3, 4, sizes, (0, 1))
    assert part.shape == (1, 16, 64, 16) and part.data_ptr() == q[1, 16:].data_ptr()
    assert slice_operand(k, "batch_heads", 3, 4, sizes, (0, 1)).data_ptr() == k[1, 4:].data_ptr()
    stats = torch.zeros(2, 32, 64, 1)
    assert slice_operand(stats, "batch_heads", 2, 4, sizes, (0, 1)).is_contiguous()
    assert split_config(replace(cfg, b=2), "batch_heads", 4) == replace(cfg, b=1, h=16, hg=4)


def test_measure_splits_records_times_and_keeps_the_whole_call_unless_faster():
    class Key:
        config = _Cfg(4, 8, 8)

    out_uid, in_uid = 10, 1
    ops = {in_uid: torch.arange(4.0).view(4, 1, 1, 1), out_uid: torch.zeros(4, 1, 1, 1)}
    want = {out_uid: 2 * ops[in_uid].clone()}
    runs = []

    def run(plan, part):
        runs.append(plan)
        part[out_uid].copy_(2 * part[in_uid])

    def agree(uid, got, ref):
        return None if torch.equal(got, ref) else "differs"

    def timer(ms_by_part: dict):  # a split's time by its part's (b, h), whatever the order of the rounds
        def time_ms(fn):
            fn()
            return ms_by_part[runs[-1][1:]]

        return time_ms

    build = lambda cfg: ("plan", cfg.b, cfg.h)  # noqa: E731
    # batch/2 (b=2), batch/4 (b=1), batch_heads/8 (one sequence, h/2), batch_heads/16 (h/4)
    rec = measure_splits(Key, 4.0, ops, want, build, run, agree, timer({(2, 8): 3.0, (1, 8): 5.0, (1, 4): 6.0, (1, 2): 7.0}),
                         1.01)  # fmt: skip
    assert rec["chosen"] == ["batch", 2] and rec["whole_ms"] == 4.0
    assert [c["parts"] for c in rec["candidates"]] == [2, 4, 8, 16] and rec["candidates"][0]["median_ms"] == 3.0
    assert [c["median_ms"] for c in rec["candidates"]] == [3.0, 5.0, 6.0, 7.0]
    assert ("plan", 2, 8) in runs and ("plan", 1, 8) in runs
    slow = timer({(2, 8): 4.5, (1, 8): 5.0, (1, 4): 4.2, (1, 2): 6.0})
    assert measure_splits(Key, 4.0, ops, want, build, run, agree, slow, 1.01)["chosen"] is None


def test_measure_splits_refuses_parts_that_disagree():
    class Key:
        config = _Cfg(2, 8, 8)

    ops = {1: torch.ones(2, 1, 1, 1), 10: torch.zeros(2, 1, 1, 1)}

    def wrong(plan, part):
        part[10].fill_(7.0)

    rec = measure_splits(Key, 4.0, ops, {10: torch.ones(2, 1, 1, 1)}, lambda c: None, wrong,
                         lambda uid, g, w: None if torch.equal(g, w) else "differs", lambda fn: 1.0, 1.01)
    assert rec["chosen"] is None and "disagree" in rec["candidates"][0]["error"]


def test_record_round_trip_keeps_the_split():
    t = CandidateTiming(0, "eng6_k24=26", 1 << 20, 9.3, 9.2, 10)
    split = {"whole_ms": 9.3, "candidates": [{"dim": "batch", "parts": 2, "median_ms": 4.8}], "chosen": ["batch", 2]}
    record = TuningResult([t], t, t, split=split).to_record()
    assert chosen_split(record) == ("batch", 2)
    assert TuningResult.from_record(record).split == split
    assert chosen_split({"version": 1}) is None and chosen_split(None) is None
    assert chosen_split(TuningResult([t], t, t).to_record()) is None


def test_measure_splits_times_the_whole_call_beside_the_splits_in_shuffled_rounds():
    """With ``whole``, the whole call is timed again in the same rounds as the splits; every
    round visits each contender once, in the seeded order of :mod:`te_cudnn.plans.order`, and
    each contender's time is its median over the rounds."""

    class Key:
        config = _Cfg(2, 3, 3)  # one choice: batch halves

    ops = {1: torch.arange(2.0).view(2, 1, 1, 1), 10: torch.zeros(2, 1, 1, 1)}
    want = {10: ops[1].clone()}

    def run(plan, part):
        part[10].copy_(part[1])

    order: list[str] = []
    whole_times = iter([9.0, 5.0, 5.5])  # the whole call drifts: only the same-round medians count
    split_times = {("batch", 2): iter([4.0, 6.0, 5.2])}

    def whole():
        order.append("whole")

    def time_ms(fn):
        if fn is whole:
            fn()
            return next(whole_times)
        order.append("split")
        return next(split_times[("batch", 2)])

    rec = measure_splits(Key, 1.0, ops, want, lambda cfg: None, run, lambda uid, g, w: None if torch.equal(g, w) else "x",
                         time_ms, 1.01, whole=whole, rounds=3)  # fmt: skip
    rng = order_rng()
    expected = [["whole", "split"][i] for _ in range(3) for i in round_order(range(2), rng)]
    assert order == expected
    assert all(sorted(order[2 * r: 2 * r + 2]) == ["split", "whole"] for r in range(3))  # each once per round
    assert rec["rounds"] == 3 and rec["whole_ms"] == 5.5 and rec["candidates"][0]["median_ms"] == 5.2
    assert rec["chosen"] == ["batch", 2]  # 5.2 * 1.01 <= 5.5 (the stale whole_ms=1.0 passed in is not used)


def test_splittable_excludes_dropout_and_sinks():
    from te_cudnn.config import describe_shapes
    from te_cudnn.enums import FusedAttnBackend
    from te_cudnn.plans.key import Direction, make_key
    from te_cudnn.plans.split import splittable

    def key(**kw):
        cfg = describe_shapes(is_training=True, dtype=torch.float8_e4m3fn, qkv_layout="bshd_bshd_bshd",
                              attn_bias_type="no_bias", attn_mask_type="causal", num_attn_heads=32, num_gqa_groups=32,
                              max_seqlen_q=1024, max_seqlen_kv=1024, head_dim_qk=128, head_dim_v=128,
                              window_size=(-1, 0), batch_size=2, **kw)  # fmt: skip
        return make_key(FusedAttnBackend.FP8, Direction.BWD, cfg, 91900, "1.32.0")

    assert splittable(key(dropout=0.0, softmax_type="vanilla"))
    assert not splittable(key(dropout=0.1, softmax_type="vanilla"))
    assert not splittable(key(dropout=0.0, softmax_type="learnable"))


def test_split_backward_binds_each_parts_views_in_the_graphs_order_and_combines_the_amaxes(monkeypatch):
    """launchers._split_bwd with the plan and the launch stood in (no GPU): each part binds views of the
    full q, k, v, O, stats, dO and gradients (no copies) in the FP8 backward graph's order, then the
    shared scales and its own amax row; the caller's slots get the maximum over the parts."""
    from types import SimpleNamespace

    from te_cudnn import launchers
    from te_cudnn.config import describe_shapes
    from te_cudnn.fp8_operands import fp8_bwd_scales
    from te_cudnn.enums import META_DP, META_DQKV

    b, s, h, hg, d = 2, 8, 4, 2, 16
    cfg = describe_shapes(is_training=True, dtype=torch.float8_e4m3fn, qkv_layout="bshd_bshd_bshd",
                          attn_bias_type="no_bias", attn_mask_type="causal", num_attn_heads=h, num_gqa_groups=hg,
                          max_seqlen_q=s, max_seqlen_kv=s, head_dim_qk=d, head_dim_v=d, window_size=(-1, 0),
                          batch_size=b, softmax_type="vanilla", dropout=0.0)  # fmt: skip
    fp8 = torch.float8_e4m3fn
    q, o, d_o = (torch.zeros(b, s, h, d, dtype=fp8) for _ in range(3))
    k, v = (torch.zeros(b, s, hg, d, dtype=fp8) for _ in range(2))
    stats = torch.zeros(b, h, s, 1)
    table = torch.arange(6, dtype=torch.float32)
    scales = fp8_bwd_scales(*[x for i in range(8) for x in (table, i % 6)])
    amax_dp, amax_dqkv = torch.zeros(6), torch.zeros(6)
    bound: list[list[torch.Tensor]] = []

    def launch(plan, views, device):  # a part "writes" its amaxes: dQ 1+i, dK 10+i, dV 5, dP 7-i
        i = len(bound)
        bound.append(views)
        for view, value in zip(views[21:25], (1 + i, 10 + i, 5, 7 - i)):
            view.fill_(value)

    monkeypatch.setattr(launchers, "_part_plan", lambda prep, split: "plan")
    monkeypatch.setattr(launchers, "_execute", launch)
    prep = SimpleNamespace(cfg=cfg, device=torch.device("cpu"), varlen=False)
    dq, dk, dv, dbias, d_sink = launchers._split_bwd(prep, ("batch", 2), [q, k, v, o, stats, d_o], scales, [],
                                               amax_dp.narrow(0, META_DP, 1), amax_dqkv.narrow(0, META_DQKV, 1))
    assert (dq.shape, dk.shape, dv.shape, dbias, d_sink) == (q.shape, k.shape, v.shape, None, None)
    assert len(bound) == 2
    for i, views in enumerate(bound):
        assert len(views) == 9 + 12 + 4  # q k v o stats dO dQ dK dV, the scales, the amaxes (no lengths)
        for view, full in zip(views[:9], (q, k, v, o, stats, d_o, dq, dk, dv)):
            assert view.shape[0] == 1 and view.data_ptr() == full[i].data_ptr()  # sequence i, in place
        assert all(x is y for x, y in zip(views[9:21], scales))  # the scales are shared, not sliced
        assert all(a.shape == (1, 1, 1, 1) for a in views[21:25])
    assert amax_dqkv.tolist() == [0.0] * META_DQKV + [11.0] + [0.0] * (5 - META_DQKV)
    assert amax_dp.tolist() == [0.0] * META_DP + [7.0] + [0.0] * (5 - META_DP)
