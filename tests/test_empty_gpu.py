"""GPU: zero-size calls return correctly shaped results without any cuDNN call (no plan is
built or loaded), for every layout family and sub-backend; empty sequences inside a non-empty
batch keep working; the generator advances as a non-empty call's would."""

from __future__ import annotations

import pytest
import torch

import te_cudnn as tc
from te_cudnn.enums import QKVLayout
from te_cudnn.testing import make_qkv

pytestmark = pytest.mark.gpu
DENSE = ("bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bs3hd", "sbh3d", "bshd_bs2hd", "sbhd_sbh2d", "bshd_bsh2d")


def _cu(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def _no_plan_work(before):
    after = tc.plan_cache.stats()
    assert (after.misses, after.builds, after.loads) == (before.misses, before.builds, before.loads), (
        "an empty call reached the plan cache"
    )


def _check_fwd_bwd(q, k, v, sq, skv, cu_q, cu_kv, layout, mask, d_v=None, **kw):
    d_v = v.shape[-1] if d_v is None else d_v
    before = tc.plan_cache.stats()
    out, aux = tc.fused_attn_fwd(True, sq, skv, cu_q, cu_kv, q, k, v, q.dtype, None, qkv_layout=layout,
                                 attn_mask_type=mask, **kw)  # fmt: skip
    assert out.shape == (*q.shape[:-1], d_v) and out.dtype == q.dtype and out.device == q.device
    assert not out.any(), "rows with no keys must be zero"
    stats = aux[0]
    assert stats.dtype == torch.float32 and (stats == float("-inf")).all()
    assert aux[1].dtype == torch.int64 and aux[1].shape == (2,)
    d_o = torch.randn_like(out)
    dq, dk, dv, dbias, _ = tc.fused_attn_bwd(sq, skv, cu_q, cu_kv, q, k, v, out, d_o, q.dtype, aux, None,
                                          qkv_layout=layout, attn_mask_type=mask, **kw)  # fmt: skip
    for g, t in ((dq, q), (dk, k), (dv, v)):
        assert g.shape == t.shape and g.dtype == t.dtype and not g.any()
    _no_plan_work(before)
    return out, aux, (dq, dk, dv, dbias)


def _dense_cases():
    sizes = {"b0": (0, 64, 64), "s0": (2, 0, 0), "skv0": (2, 64, 0), "sq0": (2, 0, 64)}
    for layout in DENSE:
        for mask in ("no_mask", "causal", "padding"):
            for name, (b, sq, skv) in sizes.items():
                if layout in ("bs3hd", "sbh3d") and sq != skv:
                    continue  # packed q, k, v share one sequence length
                yield pytest.param(layout, mask, b, sq, skv, id=f"{layout}-{mask}-{name}")


@pytest.mark.parametrize("layout,mask,b,sq,skv", list(_dense_cases()))
def test_dense_zero_size(layout, mask, b, sq, skv):
    q, k, v = make_qkv(QKVLayout[layout], b, 4, 4, sq, skv, 64)
    out, aux, _ = _check_fwd_bwd(q, k, v, sq, skv, _cu([sq] * b), _cu([skv] * b), layout, mask)
    assert aux[0].shape == (b, 4, sq, 1)


def test_padding_batch_of_one_empty_sequence_does_not_kill_the_process():
    """b=1, s=0 with TE's default padding mask: SIGFPE inside cuDNN's heuristics before."""
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 1, 16, 16, 0, 0, 128)
    _check_fwd_bwd(q, k, v, 0, 0, _cu([0]), _cu([0]), "bshd_bshd_bshd", "padding")


@pytest.mark.parametrize("case", ["all-empty", "b0", "max0", "kv-tokens0"])
def test_thd_zero_size(case):
    h, d = 4, 64
    tq, tkv, lens, max_q, max_kv = {"all-empty": (0, 0, [0, 0, 0], 0, 0), "b0": (0, 0, [], 0, 0),
                                    "max0": (32, 32, [0, 0], 0, 0), "kv-tokens0": (16, 0, [8, 8], 8, 0)}[case]  # fmt: skip
    q = torch.randn(tq, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(tkv, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu_q = _cu(lens)
    cu_kv = _cu([0] * len(lens)) if tkv == 0 else cu_q
    out, aux, _ = _check_fwd_bwd(q, k, v, max_q, max_kv, cu_q, cu_kv, "thd_thd_thd", "padding")
    assert aux[0].shape == (tq, h, 1)


def test_paged_zero_size():
    b, h, d, page, pages = 0, 4, 64, 16, 4
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
    pool_k, pool_v = (torch.randn(8, page, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    table = torch.zeros(b, pages, dtype=torch.int32, device="cuda")
    before = tc.plan_cache.stats()
    out, aux = tc.fused_attn_fwd(False, 1, 64, _cu([]), _cu([]), q, pool_k, pool_v, q.dtype, None,
                                 page_table_k=table, page_table_v=table, qkv_layout="paged_kv_bshd_bshd_bshd",
                                 attn_mask_type="padding")  # fmt: skip
    assert out.shape == q.shape and aux[0].shape == (0, h, 1, 1)
    _no_plan_work(before)


def test_individual_empty_sequences_in_a_non_empty_batch():
    """Rows of a zero-length sequence are zero in O, and their gradients are zero (cuDNN path)."""
    b, s, h, d = 3, 64, 4, 64
    q, k, v = (t.requires_grad_(False) for t in make_qkv(QKVLayout.bshd_bshd_bshd, b, h, h, s, s, d))
    cu = _cu([0, 64, 17])
    out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, qkv_layout="bshd_bshd_bshd",
                                 attn_mask_type="padding")  # fmt: skip
    assert not out[0].any() and out[1].abs().sum() > 0 and not out[2, 17:].any()
    dq, dk, dv, _, _ = tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, torch.randn_like(out), q.dtype, aux, None,
                                      qkv_layout="bshd_bshd_bshd", attn_mask_type="padding")  # fmt: skip
    for g in (dq, dk, dv):
        assert not g[0].any() and g[1].abs().sum() > 0 and torch.isfinite(g).all()


def test_empty_call_advances_the_generator_like_a_non_empty_one():
    gen_a = torch.Generator(device="cuda").manual_seed(5)
    gen_b = torch.Generator(device="cuda").manual_seed(5)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask", dropout=0.1)
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 64, 64, 64)
    q0, k0, v0 = make_qkv(QKVLayout.bshd_bshd_bshd, 0, 4, 4, 64, 64, 64)
    _, aux_full = tc.fused_attn_fwd(True, 64, 64, None, None, q, k, v, q.dtype, None, rng_gen=gen_a, **kw)
    _, aux_empty = tc.fused_attn_fwd(True, 64, 64, None, None, q0, k0, v0, q.dtype, None, rng_gen=gen_b, **kw)
    assert gen_a.get_offset() == gen_b.get_offset() > 0
    assert torch.equal(aux_full[1], aux_empty[1])
    out_a, _ = tc.fused_attn_fwd(True, 64, 64, None, None, q, k, v, q.dtype, None, rng_gen=gen_a, **kw)
    out_b, _ = tc.fused_attn_fwd(True, 64, 64, None, None, q, k, v, q.dtype, None, rng_gen=gen_b, **kw)
    assert torch.equal(out_a, out_b), "a later call's dropout mask depends on whether an empty batch came first"


def test_empty_with_bias_gives_zero_dbias_of_the_bias_shape():
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 0, 4, 4, 64, 64, 64)
    bias = torch.randn(1, 4, 64, 64, device="cuda", dtype=torch.bfloat16)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask", attn_bias_type="post_scale_bias")
    out, aux = tc.fused_attn_fwd(True, 64, 64, None, None, q, k, v, q.dtype, None, attn_bias=bias, **kw)
    assert out.shape == q.shape and aux[2] is bias
    dq, dk, dv, dbias, _ = tc.fused_attn_bwd(64, 64, None, None, q, k, v, out, out, q.dtype, aux, None, **kw)
    assert dq.shape == q.shape and dbias is not None and dbias.shape == bias.shape and not dbias.any()


def test_forced_max512_empty():
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 0, 4, 4, 128, 128, 64)
    before = tc.plan_cache.stats()
    out, aux = tc.fused_attn_fwd(True, 128, 128, None, None, q, k, v, q.dtype, tc.FusedAttnBackend.F16_max512_seqlen,
                                 qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")  # fmt: skip
    assert out.shape == q.shape and aux[0].shape == (0, 4, 128, 128) and aux[0].dtype == q.dtype
    grads = tc.fused_attn_bwd(128, 128, None, None, q, k, v, out, out, q.dtype, aux, None,
                              qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")  # fmt: skip
    assert [g.shape for g in grads[:3]] == [q.shape, k.shape, v.shape]
    _no_plan_work(before)


@pytest.mark.fp8
def test_fp8_empty_writes_zero_amaxes():
    e4m3 = torch.float8_e4m3fn
    q, k, v = (torch.randn(0, 128, 4, 128, device="cuda").to(e4m3) for _ in range(3))
    meta = tc.Fp8AttentionMeta(device="cuda")
    fwd_kw = meta.fwd_kwargs()
    fwd_kw["amax_s"].fill_(7.0)
    fwd_kw["amax_o"].fill_(7.0)
    before = tc.plan_cache.stats()
    out, aux = tc.fused_attn_fwd(True, 128, 128, None, None, q, k, v, e4m3, None, qkv_layout="bshd_bshd_bshd",
                                 attn_mask_type="causal", **fwd_kw)  # fmt: skip
    assert out.shape == q.shape and out.dtype == e4m3
    assert fwd_kw["amax_s"][tc.META_S] == 0 and fwd_kw["amax_o"][tc.META_O] == 0
    bwd_kw = meta.bwd_kwargs()
    bwd_kw["amax_dp"].fill_(7.0)
    bwd_kw["amax_dqkv"].fill_(7.0)
    d_o = torch.zeros(out.shape, device="cuda").to(torch.float8_e5m2)
    dq, dk, dv, _, _ = tc.fused_attn_bwd(128, 128, None, None, q, k, v, out, d_o, e4m3, aux, None,
                                      qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", **bwd_kw)  # fmt: skip
    assert dq.shape == q.shape and dq.dtype == torch.float8_e5m2
    assert bwd_kw["amax_dp"][tc.META_DP] == 0 and bwd_kw["amax_dqkv"][tc.META_DQKV] == 0
    _no_plan_work(before)


def test_autograd_empty_batch():
    q, k, v = (t.requires_grad_() for t in make_qkv(QKVLayout.bshd_bshd_bshd, 0, 4, 4, 32, 32, 64))
    y = tc.fused_attention(q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    y.sum().backward()
    assert y.shape == q.shape and q.grad.shape == q.shape and k.grad.shape == k.shape
