"""Attention sinks (``softmax_type`` / ``softmax_offset``) in the unfused reference and the FP8
emulation, against a direct formula written out here (CPU only)."""

from __future__ import annotations

import math

import pytest
import torch

from te_cudnn.enums import SoftmaxType
from te_cudnn.reference import allowed_mask, attention_reference, attention_reference_fp8

F64 = torch.float64
E4M3 = torch.float8_e4m3fn
RMSE_VS_FP32 = 0.05  # FP8 O against fp32 attention of the dequantized inputs (as in test_fp8_gpu.py)


def _rand(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=dtype)


def rmse_range(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).pow(2).mean().sqrt() / (b.max() - b.min()).clamp_min(1e-12))


def _sink_formula(q, k, v, alpha, allowed, scale):
    """out_i = sum_j exp(s_ij) v_j / (exp(alpha_h) + sum_j exp(s_ij)) and
    lse_i = log(exp(alpha_h) + sum_j exp(s_ij)), sums over allowed keys, written with
    explicit per-head loops and einsum (GQA: query head i reads kv head i // (h // hg))."""
    b, h, sq, _ = q.shape
    hg, skv, d_v = k.shape[1], k.shape[2], v.shape[3]
    allowed = allowed.expand(b, h, sq, skv)
    out = torch.zeros(b, h, sq, d_v, dtype=F64)
    lse = torch.zeros(b, h, sq, 1, dtype=F64)
    for head in range(h):
        g = head // (h // hg)
        s = scale * torch.einsum("bid,bjd->bij", q[:, head], k[:, g])
        e = torch.where(allowed[:, head], s.exp(), torch.zeros((), dtype=F64))  # exp(s_ij), 0 if masked
        den = math.exp(float(alpha[head])) + e.sum(-1, keepdim=True)
        out[:, head] = torch.einsum("bij,bjd->bid", e / den, v[:, g])
        lse[:, head] = den.log()
    return out, lse


def _qkv(sq: int, skv: int, h: int = 4, hg: int = 2, b: int = 2, d: int = 8, dtype: torch.dtype = F64):
    return _rand(b, h, sq, d, seed=0, dtype=dtype), _rand(b, hg, skv, d, seed=1, dtype=dtype), \
        _rand(b, hg, skv, 6, seed=2, dtype=dtype)  # fmt: skip


@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "causal_bottom_right"])
@pytest.mark.parametrize("sq,skv", [(5, 5), (3, 7), (7, 3)], ids=["self", "sq<skv", "sq>skv"])
def test_sink_matches_direct_formula(softmax_type: str, mask: str, sq: int, skv: int) -> None:
    q, k, v = _qkv(sq, skv)  # GQA: h = 4, hg = 2
    alpha = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64) if softmax_type == "learnable" else torch.zeros(4, dtype=F64)
    offset = alpha.clone() if softmax_type == "learnable" else None
    res = attention_reference(q, k, v, attn_mask_type=mask, attn_scale=0.4, compute_dtype=F64,
                              softmax_type=softmax_type, softmax_offset=offset)  # fmt: skip
    allowed = allowed_mask(sq, skv, attn_mask_type=mask)
    out, lse = _sink_formula(q, k, v, alpha, allowed, 0.4)
    assert res.out.dtype == F64 and res.lse.dtype == F64
    torch.testing.assert_close(res.out, out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.lse, lse, rtol=1e-12, atol=1e-12)
    # "causal" with sq > skv leaves no row empty; "causal_bottom_right" does: those rows give
    # out = 0 and lse = alpha, never NaN
    assert res.out.isfinite().all() and res.lse.isfinite().all()


def test_sink_with_post_scale_bias_is_not_scaled_or_biased() -> None:
    q, k, v = _qkv(4, 5)
    bias = _rand(1, 4, 4, 5, seed=3, dtype=F64)
    alpha = torch.tensor([0.3, 1.0, -0.5, 0.2], dtype=F64)
    res = attention_reference(q, k, v, attn_scale=0.25, attn_bias_type="post_scale_bias", attn_bias=bias,
                              compute_dtype=F64, softmax_type="learnable", softmax_offset=alpha)  # fmt: skip
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    e = (0.25 * q @ kr.transpose(-1, -2) + bias).exp()
    den = alpha.exp().view(1, 4, 1, 1) + e.sum(-1, keepdim=True)
    torch.testing.assert_close(res.out, e / den @ vr, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.lse, den.log(), rtol=1e-12, atol=1e-12)


def test_dropout_acts_after_the_sink_softmax() -> None:
    q, k, v = _qkv(4, 5)
    alpha = torch.tensor([0.3, 1.0, -0.5, 0.2], dtype=F64)
    keep = _rand(2, 4, 4, 5, seed=4) > -0.5
    res = attention_reference(q, k, v, attn_mask_type="causal", compute_dtype=F64, softmax_type="learnable",
                              softmax_offset=alpha, dropout_p=0.2, dropout_keep_mask=keep)  # fmt: skip
    allowed = allowed_mask(4, 5, attn_mask_type="causal")
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    e = (q @ kr.transpose(-1, -2) / math.sqrt(8)).exp() * allowed
    den = alpha.exp().view(1, 4, 1, 1) + e.sum(-1, keepdim=True)
    torch.testing.assert_close(res.out, (e / den) * keep / 0.8 @ vr, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.lse, den.log(), rtol=1e-12, atol=1e-12)  # lse before dropout


@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding_causal"])
def test_vanilla_is_unchanged(mask: str) -> None:
    q, k, v = _qkv(4, 6, dtype=torch.float32)
    lens = dict(seqlens_q=torch.tensor([4, 2]), seqlens_kv=torch.tensor([5, 0])) if "padding" in mask else {}
    base = attention_reference(q, k, v, attn_mask_type=mask, **lens)
    for softmax_type in ("vanilla", SoftmaxType.vanilla, 0, "VANILLA"):
        res = attention_reference(q, k, v, attn_mask_type=mask, softmax_type=softmax_type, softmax_offset=None, **lens)
        assert torch.equal(res.out, base.out) and torch.equal(res.lse, base.lse)


def test_enum_and_int_softmax_types() -> None:
    q, k, v = _qkv(3, 4)
    alpha = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    want = attention_reference(q, k, v, compute_dtype=F64, softmax_type="learnable", softmax_offset=alpha)
    for softmax_type in (SoftmaxType.learnable, 2, "Learnable"):
        got = attention_reference(q, k, v, compute_dtype=F64, softmax_type=softmax_type, softmax_offset=alpha)
        assert torch.equal(got.out, want.out) and torch.equal(got.lse, want.lse)


def test_offset_shapes_h_and_1h11_agree() -> None:
    q, k, v = _qkv(3, 4)
    alpha = torch.tensor([0.1, -0.2, 0.3, 1.4])
    flat = attention_reference(q, k, v, compute_dtype=F64, softmax_type="learnable", softmax_offset=alpha)
    full = attention_reference(q, k, v, compute_dtype=F64, softmax_type="learnable",
                               softmax_offset=alpha.view(1, 4, 1, 1))  # fmt: skip
    assert torch.equal(flat.out, full.out) and torch.equal(flat.lse, full.lse)


def test_off_by_one_without_offset_equals_learnable_zeros() -> None:
    q, k, v = _qkv(5, 4)
    off = attention_reference(q, k, v, attn_mask_type="causal", compute_dtype=F64, softmax_type="off_by_one")
    zeros = torch.zeros(1, 4, 1, 1, dtype=torch.float32)
    learn = attention_reference(q, k, v, attn_mask_type="causal", compute_dtype=F64, softmax_type="learnable",
                                softmax_offset=zeros)  # fmt: skip
    assert torch.equal(off.out, learn.out) and torch.equal(off.lse, learn.lse)
    # and it is 1 + sum exp, not the vanilla softmax
    vanilla = attention_reference(q, k, v, attn_mask_type="causal", compute_dtype=F64)
    torch.testing.assert_close(off.lse, torch.log1p(vanilla.lse.exp()), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(off.out, vanilla.out)


@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
def test_fully_masked_rows_give_zero_out_and_lse_alpha(softmax_type: str) -> None:
    # batch 0: a zero-length kv sequence (every row empty); batch 1: a padded query row
    q, k, v = _qkv(3, 4)
    alpha = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64)
    if softmax_type == "off_by_one":
        alpha = torch.zeros(4, dtype=F64)
    offset = alpha.clone().requires_grad_() if softmax_type == "learnable" else None
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    lens = dict(seqlens_q=torch.tensor([3, 2]), seqlens_kv=torch.tensor([0, 3]))
    res = attention_reference(q, k, v, attn_mask_type="padding", compute_dtype=F64, softmax_type=softmax_type,
                              softmax_offset=offset, **lens)  # fmt: skip
    empty = ~allowed_mask(3, 4, attn_mask_type="padding", **lens).expand(2, 4, 3, 4).any(-1)
    assert int(empty.sum()) == 4 * 3 + 4 * 1
    assert torch.equal(res.out[empty], torch.zeros(int(empty.sum()), 6, dtype=F64))
    assert res.lse.isfinite().all()
    torch.testing.assert_close(res.lse[..., 0][empty], alpha.view(1, 4, 1).expand(2, 4, 3)[empty], rtol=0, atol=0)
    # the other rows still follow the formula
    out, lse = _sink_formula(q.detach(), k.detach(), v.detach(), alpha,
                             allowed_mask(3, 4, attn_mask_type="padding", **lens), 1 / math.sqrt(8))  # fmt: skip
    torch.testing.assert_close(res.out, out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.lse, lse, rtol=1e-12, atol=1e-12)
    # finite gradients everywhere (through empty rows too), zero dq on empty rows
    leaves = (q, k, v) + ((offset,) if offset is not None else ())
    grads = torch.autograd.grad(res.out.square().sum() + res.lse.sum(), leaves)
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[0][empty], torch.zeros(int(empty.sum()), 8, dtype=F64))


def test_window_that_excludes_every_key() -> None:
    # causal_bottom_right with sq > skv empties the first sq - skv rows
    q, k, v = _qkv(5, 2)
    alpha = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64)
    res = attention_reference(q, k, v, attn_mask_type="causal_bottom_right", compute_dtype=F64,
                              softmax_type="learnable", softmax_offset=alpha)  # fmt: skip
    assert torch.equal(res.out[:, :, :3], torch.zeros(2, 4, 3, 6, dtype=F64))
    assert torch.equal(res.lse[:, :, :3, 0], alpha.view(1, 4, 1).expand(2, 4, 3))


@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding_causal"])
def test_offset_gradient_matches_finite_differences(mask: str) -> None:
    q, k, v = _qkv(4, 5)
    lens = dict(seqlens_q=torch.tensor([4, 3]), seqlens_kv=torch.tensor([5, 0])) if "padding" in mask else {}
    w_out, w_lse = _rand(2, 4, 4, 6, seed=7, dtype=F64), _rand(2, 4, 4, 1, seed=8, dtype=F64)
    dropout = dict(dropout_p=0.25, dropout_keep_mask=_rand(2, 4, 4, 5, seed=9) > -0.7)

    def loss(alpha: torch.Tensor) -> torch.Tensor:
        res = attention_reference(q, k, v, attn_mask_type=mask, compute_dtype=F64, softmax_type="learnable",
                                  softmax_offset=alpha, **lens, **dropout)  # fmt: skip
        return (res.out * w_out).sum() + (res.lse * w_lse).sum()

    alpha = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64, requires_grad=True)
    (grad,) = torch.autograd.grad(loss(alpha), alpha)
    eps = 1e-6
    fd = torch.zeros(4, dtype=F64)
    with torch.no_grad():
        for head in range(4):
            plus, minus = alpha.detach().clone(), alpha.detach().clone()
            plus[head] += eps
            minus[head] -= eps
            fd[head] = (loss(plus) - loss(minus)) / (2 * eps)
    assert grad.shape == (4,) and (grad != 0).all()
    torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-8)
    assert torch.autograd.gradcheck(loss, (alpha,))


def test_offset_gradient_shape_follows_offset() -> None:
    q, k, v = _qkv(3, 4, dtype=torch.float32)
    alpha = torch.zeros(1, 4, 1, 1, requires_grad=True)
    res = attention_reference(q, k, v, softmax_type="learnable", softmax_offset=alpha)
    (g,) = torch.autograd.grad(res.out.sum(), alpha)
    assert g.shape == (1, 4, 1, 1) and g.dtype == torch.float32 and torch.isfinite(g).all()


@pytest.mark.parametrize("fn", ["reference", "emulation"])
def test_errors(fn: str) -> None:
    q, k, v = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8)
    if fn == "emulation":
        q, k, v = (t.to(E4M3) for t in (q, k, v))

        def call(**kw):
            return attention_reference_fp8(q, k, v, descale_qkv=1.0, scale_s=1.0, descale_s=1.0, scale_o=1.0, **kw)
    else:

        def call(**kw):
            return attention_reference(q, k, v, **kw)

    with pytest.raises(ValueError, match="softmax_offset is required when softmax_type='learnable'"):
        call(softmax_type="learnable")
    with pytest.raises(ValueError, match=r"softmax_offset must hold one logit per query head.*got shape \(3,\)"):
        call(softmax_type="learnable", softmax_offset=torch.zeros(3))
    with pytest.raises(ValueError, match=r"softmax_offset must hold one logit per query head.*\(1, 2, 1, 1\)"):
        call(softmax_type="off_by_one", softmax_offset=torch.zeros(1, 2, 1, 1))
    with pytest.raises(ValueError, match=r"softmax_offset .*got shape \(4, 1\)"):
        call(softmax_type="learnable", softmax_offset=torch.zeros(4, 1))
    with pytest.raises(ValueError, match="softmax_offset must be a floating-point tensor"):
        call(softmax_type="learnable", softmax_offset=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="softmax_offset must be a floating-point tensor"):
        call(softmax_type="learnable", softmax_offset=[0.0] * 4)
    with pytest.raises(ValueError, match="softmax_offset must be None when softmax_type='vanilla'"):
        call(softmax_offset=torch.zeros(4))
    with pytest.raises(ValueError, match="softmax_type='sparse' is not a valid SoftmaxType"):
        call(softmax_type="sparse")
    with pytest.raises(ValueError, match="softmax_type=7 is not a valid SoftmaxType"):
        call(softmax_type=7)
    with pytest.raises(TypeError, match="softmax_type must be a SoftmaxType"):
        call(softmax_type=1.0)


def _fp8_inputs(b=2, h=4, hg=2, sq=64, skv=32, d=64):
    """q, k, v quantized to E4M3 with one shared scale (delayed scaling fitted to the data),
    and the S / O scales the FP8 tests use (amax_S = 1, amax_O = max |v|). q and k are shifted
    apart (scores about -2 on average) so that even the off_by_one sink, ``1 + sum exp``, moves
    O well beyond the FP8 error."""
    q, k, v = _rand(b, h, sq, d, seed=0) + 0.5, _rand(b, hg, skv, d, seed=1) - 0.5, _rand(b, hg, skv, d, seed=2)
    scale_qkv = 448.0 / max(float(t.abs().max()) for t in (q, k, v))
    q8, k8, v8 = ((t * scale_qkv).to(E4M3) for t in (q, k, v))
    scale_s, scale_o = 448.0 / 1.0, 448.0 / float(v.abs().max())
    scales = dict(descale_qkv=1.0 / scale_qkv, scale_s=scale_s, descale_s=1.0 / scale_s, scale_o=scale_o)
    deq = [t.float() / scale_qkv for t in (q8, k8, v8)]
    return (q8, k8, v8), deq, scales


@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding_causal"])
def test_fp8_emulation_with_sinks(softmax_type: str, mask: str) -> None:
    (q8, k8, v8), deq, scales = _fp8_inputs()
    lens = dict(seqlens_q=torch.tensor([64, 40]), seqlens_kv=torch.tensor([32, 0])) if "padding" in mask else {}
    offset = torch.tensor([1.0, 3.0, -0.5, 2.5]) if softmax_type == "learnable" else None
    sinks = dict(softmax_type=softmax_type, softmax_offset=offset)
    emu = attention_reference_fp8(q8, k8, v8, attn_mask_type=mask, **scales, **lens, **sinks)
    ref = attention_reference(*deq, attn_mask_type=mask, **lens, **sinks)
    vanilla = attention_reference_fp8(q8, k8, v8, attn_mask_type=mask, **scales, **lens)
    assert emu.out.isfinite().all() and emu.out8.dtype == E4M3
    err = rmse_range(emu.out, ref.out)
    assert err < RMSE_VS_FP32, f"FP8 emulation O vs fp32 reference: RMSE/range {err:.4f} >= {RMSE_VS_FP32}"
    away = rmse_range(vanilla.out, ref.out)
    assert away > 3 * err, f"the sink barely moves O: vanilla {away:.4f}, sink emulation {err:.4f} from the reference"
    # amax_s is the max probability of a real key: below 1 with a sink (the sink takes a share)
    assert 0.0 < float(emu.amax_s) < 1.0
    if "padding" in mask:  # batch 1 has no keys: O = 0 with a sink
        assert torch.equal(emu.out[1], torch.zeros_like(emu.out[1]))


def test_fp8_emulation_vanilla_is_unchanged() -> None:
    (q8, k8, v8), _, scales = _fp8_inputs()
    base = attention_reference_fp8(q8, k8, v8, attn_mask_type="causal", **scales)
    same = attention_reference_fp8(q8, k8, v8, attn_mask_type="causal", softmax_type="vanilla", softmax_offset=None,
                                   **scales)  # fmt: skip
    assert all(torch.equal(a.float(), b.float()) for a, b in zip(base, same))


def test_fp8_emulation_off_by_one_equals_learnable_zeros() -> None:
    (q8, k8, v8), _, scales = _fp8_inputs()
    off = attention_reference_fp8(q8, k8, v8, attn_mask_type="causal", softmax_type="off_by_one", **scales)
    zeros = attention_reference_fp8(q8, k8, v8, attn_mask_type="causal", softmax_type="learnable",
                                    softmax_offset=torch.zeros(1, 4, 1, 1), **scales)  # fmt: skip
    assert all(torch.equal(a.float(), b.float()) for a, b in zip(off, zeros))
