"""The operands autotuning (``te_cudnn.plans.tune``) allocates for real frontend graphs (shapes,
strides and valid runtime data, given lengths and token offsets, reproducible draws), the
numerics guard that compares a candidate's results with the heuristic plan's, and tuning a graph
the frontend cannot plan; without a GPU (the real frontend validates on CPU).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch

from te_cudnn.backends import BY_ENUM, Direction, Uid
from te_cudnn.config import describe_fwd
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.errors import GraphBuildError
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans import make_key
from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.tune import FP8_AGREEMENT, agreement_tolerance, make_operands
from te_cudnn.testing import TOLERANCES

from _autotune_cpu import no_autotune_env  # noqa: F401 - autouse: TE_CUDNN_AUTOTUNE unset, warnings reset
from _plan_helpers import sizes_config, sizes_key

F16 = FusedAttnBackend.F16_arbitrary_seqlen
FP8 = torch.float8_e4m3fn


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
