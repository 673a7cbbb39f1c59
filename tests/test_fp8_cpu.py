"""FP8 on the CPU: graphs through the real frontend, metadata-slot wiring, the delayed-scaling
helper's arithmetic and the errors for missing or misplaced scale tensors."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

import te_cudnn
from te_cudnn.backends import BY_ENUM, Direction, Uid
from te_cudnn.backends.fp8 import BWD_SCALARS, FWD_SCALARS
from te_cudnn.config import describe_shapes
from te_cudnn.enums import META_DO, META_DP, META_DQKV, META_O, META_QKV, META_S, FusedAttnBackend
from te_cudnn.fp8 import Fp8AttentionMeta
from te_cudnn.ops import fp8_bwd_operands, fp8_fwd_operands
from te_cudnn.runtime import HOPPER_CUDNN_919

FP8 = BY_ENUM[FusedAttnBackend.FP8]
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _cfg(layout="bshd_bshd_bshd", mask="causal", d=128, training=True):
    return describe_shapes(is_training=training, dtype=E4M3, qkv_layout=layout, attn_bias_type="no_bias",
                           attn_mask_type=mask, softmax_type="vanilla", dropout=0.0, num_attn_heads=4, num_gqa_groups=4,
                           max_seqlen_q=256, max_seqlen_kv=256, head_dim_qk=d, head_dim_v=d, window_size=(-1, -1),
                           batch_size=2)  # fmt: skip


@pytest.mark.parametrize(
    "layout,mask",
    list(itertools.product(sorted(l.name for l in FP8.caps.layouts), sorted(m.name for m in FP8.caps.masks))),
)
def test_fp8_graphs_validate(layout, mask):
    cfg = _cfg(layout, mask)
    assert FP8.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.BWD) == []
    fwd = FP8.build_fwd(cfg)
    fwd.graph.validate()
    assert fwd.uids[5:13] == (*FWD_SCALARS, Uid.AMAX_S, Uid.AMAX_O)
    bwd = FP8.build_bwd(replace(cfg, do_dtype=E5M2))
    bwd.graph.validate()
    assert bwd.uids[9:25] == (*BWD_SCALARS, Uid.AMAX_DQ, Uid.AMAX_DK, Uid.AMAX_DV, Uid.AMAX_DP)
    assert '"d_o"' in str(bwd.graph) and "FP8_E5M2" in str(bwd.graph)


def test_fp8_rules():
    assert FP8.not_supported_reasons(_cfg(d=64, training=False), HOPPER_CUDNN_919) == []
    assert any("needs d_qk = d_v = 128" in r for r in FP8.not_supported_reasons(_cfg(d=64), HOPPER_CUDNN_919))
    why = FP8.not_supported_reasons(_cfg(mask="causal_bottom_right"), HOPPER_CUDNN_919)
    assert any("attn_mask_type=causal_bottom_right" in r for r in why)


def _tables():
    # distinct values per slot so each operand shows which slot it came from
    fwd = torch.arange(9, dtype=torch.float32) + 100
    bwd = torch.arange(6, dtype=torch.float32) + 200
    return fwd, fwd + 1000, bwd, bwd + 1000  # scale_inv_fwd, scale_fwd, scale_inv_bwd, scale_bwd


def test_forward_operands_follow_te_meta_offsets():
    inv_f, sc_f, _, _ = _tables()
    amax = torch.zeros(9)
    ops = fp8_fwd_operands(inv_f, META_QKV, inv_f, META_S, sc_f, META_S, sc_f, META_O, amax, META_S, amax, META_O)
    values = [float(t.reshape(())) for t in ops]
    assert values[:6] == [102, 102, 102, 108, 1108, 1103]  # descale q/k/v, descale_s, scale_s, scale_o
    assert all(t.shape == (1, 1, 1, 1) for t in ops)
    ops[6].fill_(7.0)  # amax_s writes land in amax[META_S]
    ops[7].fill_(9.0)  # amax_o in amax[META_O]
    assert amax[META_S] == 7 and amax[META_O] == 9 and amax.sum() == 16


def test_backward_operands_follow_te_meta_offsets():
    inv_f, sc_f, inv_b, sc_b = _tables()
    amax3, amax_b = torch.zeros(3, 1, 1, 1), torch.zeros(6)
    ops = fp8_bwd_operands(amax3, inv_f, META_QKV, inv_f, META_O, inv_b, META_DO, inv_f, META_S, inv_b, META_DP, sc_f,
                           META_S, sc_b, META_DQKV, sc_b, META_DP, amax_b, META_DP)  # fmt: skip
    values = [float(t.reshape(())) for t in ops[:12]]
    # descale q/k/v, descale_o, descale_dO, descale_s, descale_dP, scale_s, scale_dQ/dK/dV, scale_dP
    assert values == [102, 102, 102, 103, 203, 108, 205, 1108, 1200, 1200, 1200, 1205]
    ops[15].fill_(3.0)
    assert amax_b[META_DP] == 3 and amax_b.sum() == 3
    assert ops[12].data_ptr() == amax3.data_ptr() and ops[14].data_ptr() == amax3.data_ptr() + 8


def test_meta_helper_delayed_scaling():
    meta = Fp8AttentionMeta(device="cpu", history=3, margin=1)
    x = torch.tensor([[-3.0, 2.0]])
    q8 = meta.quantize(x, "qkv")
    assert q8.dtype == E4M3 and meta.fwd.amax_history[0, META_QKV] == 3.0
    meta.fwd.amax_history[0, META_S] = 0.5  # as the kernel writes amax_s
    meta.fwd.amax_history[0, META_O] = float("inf")  # a bad amax keeps the old scale
    meta.update()
    assert torch.isclose(meta.fwd.scale[META_QKV], torch.tensor(448.0 / 3.0 / 2.0))
    assert torch.isclose(meta.fwd.scale[META_S], torch.tensor(448.0 / 0.5 / 2.0))
    assert meta.fwd.scale[META_O] == 1.0 and meta.fwd.scale[0] == 1.0
    assert torch.allclose(meta.fwd.scale_inv * meta.fwd.scale, torch.ones(9))
    assert meta.fwd.amax_history[0].abs().sum() == 0  # the new current row is empty
    assert meta.fwd.amax_history[-1, META_QKV] == 3.0  # the old current row moved to the end
    # the history maximum holds the scale until it rolls out
    meta.update()
    assert torch.isclose(meta.fwd.scale[META_QKV], torch.tensor(448.0 / 3.0 / 2.0))
    meta.update()
    meta.update()
    assert torch.isclose(meta.fwd.scale[META_QKV], torch.tensor(448.0 / 3.0 / 2.0))  # amax 0 everywhere: scale kept
    dq8 = meta.quantize(torch.tensor([1e6]), "do")  # E5M2 saturates instead of overflowing
    assert dq8.dtype == E5M2 and float(dq8.float()) == 57344.0
    kw = meta.fwd_kwargs()
    assert kw["d_scale_qkv"] is meta.fwd.scale_inv and kw["amax_s"].data_ptr() == meta.fwd.amax_history[0].data_ptr()
    assert set(meta.bwd_kwargs()) == {"d_scale_qkv", "d_scale_s", "d_scale_o", "d_scale_do", "d_scale_dp", "q_scale_s",
                                      "q_scale_dp", "q_scale_dqkv", "amax_dp", "amax_dqkv"}  # fmt: skip


def _fp8_call(**kw):
    q = torch.zeros(2, 256, 4, 128, dtype=E4M3)
    meta = Fp8AttentionMeta(device="cpu")
    args = {**meta.fwd_kwargs(), **kw}
    return te_cudnn.fused_attn_fwd(True, 256, 256, None, None, q, q, q, E4M3, None, qkv_layout="bshd_bshd_bshd",
                                   attn_mask_type="causal", **args)  # fmt: skip


def test_fp8_missing_or_misplaced_scale_tensors():
    with pytest.raises(ValueError, match=r"q_scale_o is required for FP8 attention \(fp32 metadata tensor, slot 3\)"):
        _fp8_call(q_scale_o=None)
    with pytest.raises(ValueError, match=r"d_scale_s is on meta but q is on cpu"):
        _fp8_call(d_scale_s=torch.empty(9, device="meta"))
    with pytest.raises(ValueError, match=r"amax_s_offset=12 is outside amax_s of length 9"):
        _fp8_call(amax_s_offset=12)
    with pytest.raises(ValueError, match=r"d_scale_qkv must be a 1-d float32 tensor"):
        _fp8_call(d_scale_qkv=torch.ones(9, dtype=torch.float16))
    with pytest.raises(ValueError, match="executes on CUDA devices"):  # everything valid: needs the GPU
        _fp8_call()
