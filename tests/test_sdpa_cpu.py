"""CPU tests of te_cudnn.scaled_dot_product_attention (the torch SDPA drop-in).

* argument validation: torch's rules, with errors that name the argument;
* the mask -> post-scale bias conversion (``te_cudnn.sdpa.mask_to_bias``) as a unit: attention
  computed in fp32 with the bias matches torch's SDPA (math backend, CPU) for boolean and float
  masks of every broadcast shape, fully masked rows included (zeroed, as torch does);
* what reaches ``fused_attention``: ``te_cudnn.sdpa.attend`` is replaced by a recorder
  that only inspects its arguments (data pointers, strides, options) and returns an
  uninitialized result of the right shape; it computes nothing and stands in for no cuDNN result.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

import te_cudnn as tc
import te_cudnn.sdpa as sdpa_mod
from _attend_recorder import AttendRecorder
from te_cudnn import UnsupportedConfigError
from te_cudnn.sdpa import mask_to_bias, scaled_dot_product_attention

BF16 = torch.bfloat16


def _qkv(b=2, h=4, hk=None, sq=5, skv=7, d=64, dv=None, dtype=BF16, bshd=False):
    hk = h if hk is None else hk
    dv = d if dv is None else dv

    def make(hh, s, dd):
        if bshd:  # the layout of a projection's output viewed as [b, h, s, d] (Hugging Face models)
            return torch.randn(b, s, hh, dd, dtype=dtype).transpose(1, 2)
        return torch.randn(b, hh, s, dd, dtype=dtype)

    return make(h, sq, d), make(hk, skv, d), make(hk, skv, dv)


@pytest.fixture
def recorder(monkeypatch):
    rec = AttendRecorder()
    monkeypatch.setattr(sdpa_mod, "attend", rec)
    return rec


# ------------------------------------------------------------------ validation


def _bad_calls():
    q, k, v = _qkv()
    q3 = q[0]
    yield "not-a-tensor", lambda: scaled_dot_product_attention(q.tolist(), k, v), TypeError, "query must be a torch.Tensor"
    yield "3-D", lambda: scaled_dot_product_attention(q3, k[0], v[0]), ValueError, "query must be 4-D"
    yield "5-D key", lambda: scaled_dot_product_attention(q, k[None], v), ValueError, "key must be 4-D"
    yield "dtype-mix", lambda: scaled_dot_product_attention(q, k.half(), v), TypeError, "one dtype"
    yield "int", lambda: scaled_dot_product_attention(*(t.to(torch.int32) for t in (q, k, v))), TypeError, "floating-point"
    yield "float32", lambda: scaled_dot_product_attention(q.float(), k.float(), v.float()), UnsupportedConfigError, "float16 or bfloat16"
    yield "batch", lambda: scaled_dot_product_attention(q, k[:1], v[:1]), ValueError, "one batch size"
    yield "kv-len", lambda: scaled_dot_product_attention(q, k, v[:, :, :3]), ValueError, "value has 3"
    yield "head-dim", lambda: scaled_dot_product_attention(q, k[..., :32], v), ValueError, "head dim 64 differs"
    qg, kg, vg = _qkv(h=8, hk=2)
    yield "gqa-off", lambda: scaled_dot_product_attention(qg, kg, vg), ValueError, "enable_gqa=True"
    q6, k4, v4 = _qkv(h=6, hk=4)
    yield "gqa-divide", lambda: scaled_dot_product_attention(q6, k4, v4, enable_gqa=True), ValueError, "divide"
    yield "gqa-type", lambda: scaled_dot_product_attention(q, k, v, enable_gqa=1), TypeError, "enable_gqa must be a bool"
    _, _, v1 = _qkv(h=8, hk=1)
    yield "kv-heads", lambda: scaled_dot_product_attention(qg, kg, v1, enable_gqa=True), UnsupportedConfigError, "same number of heads"
    yield "mask-int", lambda: scaled_dot_product_attention(q, k, v, torch.ones(5, 7, dtype=torch.int32)), TypeError, "attn_mask must be bool"
    yield "mask-f64", lambda: scaled_dot_product_attention(q, k, v, torch.zeros(5, 7, dtype=torch.float64)), TypeError, "attn_mask"
    yield "mask-shape", lambda: scaled_dot_product_attention(q, k, v, torch.ones(5, 6, dtype=torch.bool)), ValueError, "does not broadcast"
    yield "mask-heads", lambda: scaled_dot_product_attention(q, k, v, torch.ones(2, 3, 5, 7, dtype=torch.bool)), ValueError, "does not broadcast"
    yield "mask-5d", lambda: scaled_dot_product_attention(q, k, v, torch.ones(1, 2, 4, 5, 7, dtype=torch.bool)), ValueError, "does not broadcast"
    yield "mask-list", lambda: scaled_dot_product_attention(q, k, v, [[True] * 7] * 5), TypeError, "attn_mask must be a torch.Tensor"
    yield "mask-device", lambda: scaled_dot_product_attention(q, k, v, torch.ones(5, 7, dtype=torch.bool, device="meta")), ValueError, "attn_mask is on meta"
    yield "mask+causal", lambda: scaled_dot_product_attention(q, k, v, torch.ones(5, 7, dtype=torch.bool), is_causal=True), ValueError, "is_causal"
    yield "causal-type", lambda: scaled_dot_product_attention(q, k, v, is_causal=1), TypeError, "is_causal must be a bool"
    yield "scale-type", lambda: scaled_dot_product_attention(q, k, v, scale="0.1"), TypeError, "scale must be a float"
    yield "scale-bool", lambda: scaled_dot_product_attention(q, k, v, scale=True), TypeError, "scale must be a float"
    yield "scale-nan", lambda: scaled_dot_product_attention(q, k, v, scale=float("nan")), ValueError, "finite"
    yield "scale-inf", lambda: scaled_dot_product_attention(q, k, v, scale=math.inf), ValueError, "finite"
    yield "dropout-1", lambda: scaled_dot_product_attention(q, k, v, dropout_p=1.0), ValueError, "dropout_p=1.0"
    yield "dropout-neg", lambda: scaled_dot_product_attention(q, k, v, dropout_p=-0.1), ValueError, "dropout_p"
    yield "dropout-str", lambda: scaled_dot_product_attention(q, k, v, dropout_p="0.1"), TypeError, "dropout_p must be a float"


BAD = list(_bad_calls())


@pytest.mark.parametrize("call,error,match", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_malformed_input_raises_naming_the_argument(recorder, call, error, match):
    with pytest.raises(error, match=match):
        call()
    assert not recorder.calls  # rejected before anything reaches fused attention


def test_unsupported_errors_are_not_implemented_errors():
    q, k, v = _qkv(dtype=torch.float32)
    with pytest.raises(NotImplementedError) as info:
        scaled_dot_product_attention(q, k, v)
    assert "te_cudnn.scaled_dot_product_attention declined because" in str(info.value)


def test_scale_and_enable_gqa_are_keyword_only():
    q, k, v = _qkv()
    with pytest.raises(TypeError):
        scaled_dot_product_attention(q, k, v, None, 0.0, False, 0.1)  # torch takes scale by keyword only


def test_cpu_tensors_raise_cuda_only():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="executes on CUDA devices"):
        scaled_dot_product_attention(q, k, v)


def test_exported():
    assert tc.scaled_dot_product_attention is scaled_dot_product_attention
    assert "scaled_dot_product_attention" in tc.__all__


# ------------------------------------------------------------------ mask -> bias


def _attention_with_bias(q, k, v, bias, row_has_key, scale=None):
    """fp32 attention with the post-scale bias, as cuDNN computes it, and the caller's row zeroing."""
    q, k, v = q.float(), k.float(), v.float()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = scale * q @ k.transpose(-2, -1) + bias.float()
    out = torch.softmax(s, dim=-1) @ v
    if row_has_key is not None:
        out = torch.where(row_has_key, out, 0.0)
    return out


B, H, L, S = 2, 3, 5, 7
MASK_SHAPES = [(S,), (L, S), (1, S), (L, 1), (1, 1, L, S), (B, 1, L, S), (1, H, L, S), (B, H, L, S), (B, 1, 1, S),
               (H, L, S), (B, H, 1, S), (1, 1, 1, 1)]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bool_mask_bias_matches_torch(shape, dtype):
    g = torch.Generator().manual_seed(hash(shape) % 1000)
    q, k, v = (torch.randn(B, H, n, 16, generator=g).to(dtype) for n in (L, S, S))
    mask = torch.rand(shape, generator=g) > 0.4
    if len(shape) >= 2 and shape[-2] == L:
        mask[..., 0, :] = False  # a row that allows no key: torch's math backend gives zeros there
    bias, row_has_key = mask_to_bias(mask, (B, H, L, S), dtype)
    m4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(shape))
    assert bias.dtype == dtype
    assert tuple(bias.shape) == (B if m4.shape[0] == B else 1, H if m4.shape[1] == H else 1, L, S)
    assert torch.isfinite(bias).all()  # not -inf: no NaN in bf16 / fp16
    assert set(bias.unique().tolist()) <= {0.0, torch.tensor(sdpa_mod.masked_value(dtype), dtype=dtype).item()}
    assert row_has_key.dtype == torch.bool and row_has_key.shape[-1] == 1
    assert all(e * bias.element_size() % 16 == 0 for n, e in zip(bias.shape[:-1], bias.stride()[:-1]) if n > 1)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m4)  # torch's math wants >= 2-D
    got = _attention_with_bias(q, k, v, bias, row_has_key)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    empty_rows = ~m4.any(-1).expand(B, H, L)
    assert (got[empty_rows] == 0).all()


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float_mask_bias_matches_torch(shape, mask_dtype):
    g = torch.Generator().manual_seed(hash(shape) % 1000 + 1)
    q, k, v = (torch.randn(B, H, n, 16, generator=g).to(BF16) for n in (L, S, S))
    mask = (torch.randn(shape, generator=g) * 3).to(mask_dtype)
    bias, row_has_key = mask_to_bias(mask, (B, H, L, S), BF16)
    assert row_has_key is None and bias.dtype == BF16 and bias.shape[-2:] == (L, S)
    # torch adds the mask as given; te_cudnn's bias is in q's dtype: compare with the rounded mask
    m4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(shape)).to(BF16).float()
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m4, scale=0.3)
    torch.testing.assert_close(_attention_with_bias(q, k, v, bias, None, scale=0.3), want, rtol=1e-5, atol=1e-5)


def test_float_mask_in_q_dtype_is_passed_as_is():
    mask = torch.randn(B, 1, L, 8, dtype=BF16)  # rows of 16 bytes: readable in place
    bias, _ = mask_to_bias(mask, (B, H, L, 8), BF16)
    assert bias is mask


def test_broadcast_masks_are_materialized_with_aligned_rows(caplog):
    caplog.set_level(logging.DEBUG, logger="te_cudnn")
    mask = torch.randn(1, S, dtype=BF16)  # broadcast over the queries: cuDNN needs the full [.., L, S]
    bias, _ = mask_to_bias(mask, (B, H, L, S), BF16)
    assert tuple(bias.shape) == (1, 1, L, S) and bias.stride() == (L * 8, L * 8, 8, 1)
    assert (bias == mask).all()
    assert "materialized" in caplog.text


def test_float_mask_gradient_reaches_the_mask():
    mask = torch.randn(L, S, requires_grad=True)  # float32, broadcast over b and h
    bias, _ = mask_to_bias(mask, (B, H, L, S), BF16)
    assert bias.requires_grad and tuple(bias.shape) == (1, 1, L, S)
    (bias.float() * 2).sum().backward()
    assert torch.equal(mask.grad, torch.full((L, S), 2.0))


def test_float_mask_grad_with_one_query_gets_a_head_dim():
    # cuDNN writes no dBias for a [1, 1, 1, S] bias: give it the heads so that the mask gets its gradient
    mask = torch.randn(S, dtype=BF16, requires_grad=True)
    bias, _ = mask_to_bias(mask, (B, H, 1, S), BF16)
    assert tuple(bias.shape) == (1, H, 1, S)
    bias.float().sum().backward()
    assert torch.equal(mask.grad.float(), torch.full((S,), float(H)))
    with torch.no_grad():
        assert tuple(mask_to_bias(mask, (B, H, 1, S), BF16)[0].shape) == (1, 1, 1, S)
    with pytest.raises(UnsupportedConfigError, match="no dBias"):
        mask_to_bias(mask, (1, 1, 1, S), BF16)


def test_masked_value():
    assert sdpa_mod.masked_value(torch.float16) == torch.finfo(torch.float16).min
    assert sdpa_mod.masked_value(torch.bfloat16) == -1e30  # bf16's own minimum, -3.39e38, is near fp32's limit
    for dtype in (torch.float16, torch.bfloat16):  # representable, and x log2(e) stays finite in fp32
        v = torch.tensor(sdpa_mod.masked_value(dtype), dtype=dtype).float()
        assert torch.isfinite(v) and torch.isfinite(v * 1.4426950408889634 * 2)


def test_fp16_bias_cannot_overflow_to_nan():
    # fully masked rows in fp16: every score is -65504 + s, finite, so the softmax is finite
    q, k = (torch.randn(1, 1, n, 16).half() * 30 for n in (4, 9))
    mask = torch.zeros(4, 9, dtype=torch.bool)
    bias, keep = mask_to_bias(mask, (1, 1, 4, 9), torch.float16)
    s = 0.25 * q.float() @ k.float().transpose(-2, -1) + bias.float()
    assert torch.isfinite(torch.softmax(s, -1)).all()
    assert not keep.any()


# ------------------------------------------------------------------ what reaches fused_attention


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd-contiguous", "bshd-transposed"])
def test_inputs_are_handed_over_as_views(recorder, bshd):
    q, k, v = _qkv(bshd=bshd)
    out = scaled_dot_product_attention(q, k, v)
    (rq, rk, rv), kw = recorder.last
    for name, t, r in (("q", q, rq), ("k", k, rk), ("v", v, rv)):
        assert r.data_ptr() == t.data_ptr(), name  # no copy
        assert r.shape == t.transpose(1, 2).shape and r.stride() == t.transpose(1, 2).stride(), name
    assert kw["qkv_layout"] == "bshd_bshd_bshd"
    assert kw["attn_mask_type"] == "no_mask" and kw["attn_bias"] is None and "attn_bias_type" not in kw
    assert kw["attn_scale"] is None and kw["dropout"] == 0.0
    assert out.shape == (2, 4, 5, 64) and out.data_ptr() == out.transpose(1, 2).contiguous().data_ptr()
    if bshd:
        assert rq.is_contiguous()


def test_unreadable_inputs_are_copied_and_logged(recorder, caplog):
    caplog.set_level(logging.DEBUG, logger="te_cudnn")
    q, k, v = _qkv()
    strided = torch.randn(2, 4, 5, 128, dtype=BF16)[..., ::2]  # head dim stride 2
    flat = torch.randn(k.numel() + 1, dtype=BF16)
    unaligned = flat[1:].view(k.shape)  # starts 2 bytes past a 16-byte boundary
    scaled_dot_product_attention(strided, unaligned, v)
    (rq, rk, rv), _ = recorder.last
    assert rq.is_contiguous() and rq.data_ptr() != strided.data_ptr() and torch.equal(rq, strided.transpose(1, 2))
    assert rk.is_contiguous() and rk.data_ptr() != unaligned.data_ptr() and torch.equal(rk, unaligned.transpose(1, 2))
    assert rv.data_ptr() == v.data_ptr()
    assert "query [2, 4, 5, 64] stride (2560, 640, 128, 2) cannot be read by cuDNN in place" in caplog.text
    assert "key [2, 4, 7, 64]" in caplog.text and "value" not in caplog.text


def test_unaligned_start_of_a_bshd_buffer_is_copied(recorder):
    """A [b, h, s, d] view of [b, s, h, d] memory (a projection's output, as transformers passes
    it) whose start is off 16 bytes: its [b, s, h, d] view is contiguous, and still copied."""
    q, k, v = _qkv()
    flat = torch.randn(q.numel() + 1, dtype=BF16)
    b, h, s, d = q.shape
    unaligned = flat[1:].view(b, s, h, d).transpose(1, 2)
    assert unaligned.transpose(1, 2).is_contiguous() and unaligned.data_ptr() % 16
    scaled_dot_product_attention(unaligned, k, v)
    (rq, _, _), _ = recorder.last
    assert rq.data_ptr() % 16 == 0 and torch.equal(rq, unaligned.transpose(1, 2))


def test_options_reach_fused_attention(recorder):
    q, k, v = _qkv(h=8, hk=2)
    scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125, enable_gqa=True)
    (rq, rk, _), kw = recorder.last
    assert rk.shape[2] == 2 and rq.shape[2] == 8  # GQA natively: key/value are not repeated
    assert kw["attn_mask_type"] == "causal" and kw["attn_scale"] == 0.125
    with torch.no_grad():
        scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert recorder.last[1]["is_training"] is False
    scaled_dot_product_attention(q.requires_grad_(), k, v, enable_gqa=True)
    assert recorder.last[1]["is_training"] is True
    with torch.no_grad():  # torch applies dropout whenever dropout_p > 0
        scaled_dot_product_attention(q, k, v, dropout_p=0.25, enable_gqa=True)
    assert recorder.last[1]["dropout"] == 0.25 and recorder.last[1]["is_training"] is True


def test_masks_reach_fused_attention_as_bias(recorder):
    q, k, v = _qkv()
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[1, 0, 2] = False  # query 2 of batch 1 allows no key
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    kw = recorder.last[1]
    assert kw["attn_bias_type"] == "post_scale_bias" and kw["attn_mask_type"] == "no_mask"
    bias = kw["attn_bias"]
    assert tuple(bias.shape) == (2, 1, 5, 7) and bias.dtype == BF16
    assert (bias[1, 0, 2] == sdpa_mod.masked_value(BF16)).all() and (bias[0] == 0).all()
    # the recorder returns ones: the fully masked row comes back zero, every other row untouched
    assert (out[1, :, 2] == 0).all() and (out[0] == 1).all() and (out[1, :, :2] == 1).all()
    assert out.dtype == BF16 and out.shape == (2, 4, 5, 64)
    fmask = torch.randn(1, 4, 5, 8, dtype=BF16)[..., :7]  # rows padded to 16 bytes: read in place
    scaled_dot_product_attention(q, k, v, attn_mask=fmask)
    assert recorder.last[1]["attn_bias"] is fmask
