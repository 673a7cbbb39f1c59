"""Tests of the unfused attention reference against hand-written math (CPU only)."""

from __future__ import annotations

import math

import pytest
import torch

from te_cudnn.enums import AttnMaskType
from te_cudnn.reference import ReferenceOutput, alibi_slopes, allowed_mask, attention_reference

E = math.e


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g)


def _mat(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool).view(1, 1, len(rows), len(rows[0]))


def _masked_softmax_ref(scores: torch.Tensor, allowed: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Independent per-row formula: exp(s) over allowed keys, normalised; 0 for empty rows."""
    w = torch.exp(scores - scores.amax(-1, keepdim=True)) * allowed
    den = w.sum(-1, keepdim=True)
    return torch.where(den > 0, w / den.clamp_min(1e-30), 0.0) @ v


def test_hand_computed_2x2() -> None:
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).view(1, 1, 2, 2)
    k = q.clone()
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).view(1, 1, 2, 2)
    res = attention_reference(q, k, v, attn_scale=1.0)
    assert isinstance(res, ReferenceOutput)
    # scores = I, so row 0 weights are [e, 1] / (e + 1) = [0.7310586, 0.2689414].
    expected = torch.tensor([[1.5378828, 2.5378828], [2.4621172, 3.4621172]]).view(1, 1, 2, 2)
    torch.testing.assert_close(res.out, expected)
    torch.testing.assert_close(res.lse, torch.full((1, 1, 2, 1), math.log(1 + E)))
    # default scale 1/sqrt(2): weights [e^a, 1] / (e^a + 1) with a = 1/sqrt(2)
    w = math.exp(2**-0.5) / (math.exp(2**-0.5) + 1)
    res = attention_reference(q, k, v)
    torch.testing.assert_close(res.out[0, 0, 0], torch.tensor([w * 1 + (1 - w) * 3, w * 2 + (1 - w) * 4]))


def test_uniform_attention_when_q_is_zero() -> None:
    v = _rand(2, 3, 5, 4)
    q, k = torch.zeros(2, 3, 5, 8), _rand(2, 3, 5, 8)
    torch.testing.assert_close(attention_reference(q, k, v).out, v.mean(2, keepdim=True).expand(2, 3, 5, 4))
    out = attention_reference(q, k, v, attn_mask_type="causal").out  # row i averages v[:i+1]
    torch.testing.assert_close(out, v.cumsum(2) / torch.arange(1, 6).view(1, 1, 5, 1))
    lse = attention_reference(q, k, v, attn_mask_type="causal").lse
    torch.testing.assert_close(lse, torch.arange(1, 6).log().view(1, 1, 5, 1).expand(2, 3, 5, 1))


def test_causal_masks_top_left_and_bottom_right() -> None:
    assert torch.equal(allowed_mask(2, 4, attn_mask_type="causal"), _mat([[1, 0, 0, 0], [1, 1, 0, 0]]))
    assert torch.equal(
        allowed_mask(2, 4, attn_mask_type=AttnMaskType.causal_bottom_right), _mat([[1, 1, 1, 0], [1, 1, 1, 1]])
    )
    assert torch.equal(allowed_mask(4, 2, attn_mask_type="causal"), _mat([[1, 0], [1, 1], [1, 1], [1, 1]]))
    assert torch.equal(
        allowed_mask(4, 2, attn_mask_type="causal_bottom_right"), _mat([[0, 0], [0, 0], [1, 0], [1, 1]])
    )
    # bottom_right_diagonal overrides the mask type's own alignment
    assert torch.equal(
        allowed_mask(2, 4, attn_mask_type="causal", bottom_right_diagonal=True),
        allowed_mask(2, 4, attn_mask_type="causal_bottom_right"),
    )
    assert torch.equal(allowed_mask(3, 5, attn_mask_type="no_mask"), torch.ones(1, 1, 3, 5, dtype=torch.bool))


def test_sliding_windows() -> None:
    m = allowed_mask(4, 4, attn_mask_type="no_mask", window_size=(2, 0))
    assert torch.equal(m, _mat([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]]))
    m = allowed_mask(4, 4, attn_mask_type="no_mask", window_size=(1, 1))
    assert torch.equal(m, _mat([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]))
    m = allowed_mask(2, 4, attn_mask_type="causal_bottom_right", window_size=(1, -1))
    assert torch.equal(m, _mat([[0, 1, 1, 0], [0, 0, 1, 1]]))
    # causal == window with right = 0
    assert torch.equal(
        allowed_mask(3, 5, attn_mask_type="causal"), allowed_mask(3, 5, attn_mask_type="no_mask", window_size=(-1, 0))
    )


def test_padding_masks() -> None:
    sq_b, skv_b = torch.tensor([2, 3]), torch.tensor([3, 1])
    kw = dict(seqlens_q=sq_b, seqlens_kv=skv_b)
    m = allowed_mask(3, 4, attn_mask_type="padding", **kw)
    expected = torch.cat([_mat([[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]]), _mat([[1, 0, 0, 0]] * 3)])
    assert torch.equal(m, expected)
    m = allowed_mask(3, 4, attn_mask_type="padding_causal", **kw)
    expected = torch.cat([_mat([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]), _mat([[1, 0, 0, 0]] * 3)])
    assert torch.equal(m, expected)
    m = allowed_mask(3, 4, attn_mask_type="padding_causal_bottom_right", **kw)  # offsets 1 and -2
    expected = torch.cat([_mat([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]]), _mat([[0] * 4, [0] * 4, [1, 0, 0, 0]])])
    assert torch.equal(m, expected)

    q, k, v = _rand(2, 2, 3, 8), _rand(2, 2, 4, 8, seed=1), _rand(2, 2, 4, 4, seed=2)
    res = attention_reference(q, k, v, attn_mask_type="padding", **kw)
    assert torch.equal(res.out[0, :, 2], torch.zeros(2, 4))  # padded query row
    assert torch.isneginf(res.lse[0, :, 2]).all() and torch.isfinite(res.lse[1]).all()
    sub = attention_reference(q[:1, :, :2], k[:1, :, :3], v[:1, :, :3])
    torch.testing.assert_close(res.out[:1, :, :2], sub.out)
    torch.testing.assert_close(res.lse[:1, :, :2], sub.lse)
    torch.testing.assert_close(res.out[1], v[1, :, :1].expand(2, 3, 4))  # single key -> copy of v[0]


def test_lse_is_logsumexp_by_hand() -> None:
    q, k, v = _rand(1, 2, 4, 8), _rand(1, 2, 6, 8, seed=1), _rand(1, 2, 6, 8, seed=2)
    res = attention_reference(q, k, v, attn_mask_type="causal_bottom_right", attn_scale=0.3)
    s = 0.3 * q @ k.transpose(-1, -2)
    allowed = allowed_mask(4, 6, attn_mask_type="causal_bottom_right")
    torch.testing.assert_close(res.lse, torch.log((s.exp() * allowed).sum(-1, keepdim=True)))
    torch.testing.assert_close(res.out, _masked_softmax_ref(s, allowed, v))


def test_gqa_equals_repeated_heads() -> None:
    q, k, v = _rand(2, 4, 3, 8), _rand(2, 2, 5, 8, seed=1), _rand(2, 2, 5, 4, seed=2)
    k_rep = torch.stack([k[:, 0], k[:, 0], k[:, 1], k[:, 1]], dim=1)
    v_rep = torch.stack([v[:, 0], v[:, 0], v[:, 1], v[:, 1]], dim=1)
    got = attention_reference(q, k, v, attn_mask_type="causal")
    ref = attention_reference(q, k_rep, v_rep, attn_mask_type="causal")
    torch.testing.assert_close(got.out, ref.out)
    torch.testing.assert_close(got.lse, ref.lse)
    mqa = attention_reference(q, k[:, :1], v[:, :1]).out
    expanded = attention_reference(q, k[:, :1].expand(2, 4, 5, 8), v[:, :1].expand(2, 4, 5, 4)).out
    torch.testing.assert_close(mqa, expanded)


def test_alibi_slopes_and_bias() -> None:
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))
    twelve = [2.0**-i for i in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(twelve), rtol=0, atol=1e-7)
    assert alibi_slopes(12).dtype == torch.float32
    torch.testing.assert_close(alibi_slopes(2), torch.tensor([2.0**-4, 2.0**-8]))

    # q = 0, so the scores are the ALiBi bias alone: slope * (j - i - offset)
    s = 2.0**-4  # head 0 of 2
    zq, k, v = torch.zeros(1, 2, 2, 4), _rand(1, 2, 2, 4), _rand(1, 2, 2, 4, seed=1)
    lse = attention_reference(zq, k, v, attn_bias_type="alibi").lse[0, 0, :, 0]
    torch.testing.assert_close(lse, torch.tensor([math.log(1 + math.exp(s)), math.log(math.exp(-s) + 1)]))
    zq, k, v = torch.zeros(1, 2, 1, 4), _rand(1, 2, 3, 4), _rand(1, 2, 3, 4, seed=1)
    res = attention_reference(zq, k, v, attn_bias_type="alibi", attn_mask_type="causal_bottom_right")
    torch.testing.assert_close(res.lse[0, 0, 0, 0], torch.tensor(math.log(math.exp(-2 * s) + math.exp(-s) + 1)))


@pytest.mark.parametrize("shape", [(1, 3, 4, 5), (1, 1, 4, 5), (2, 1, 4, 5), (2, 3, 4, 5), (1, 1, 1, 5)])
def test_post_scale_bias_broadcasts(shape: tuple[int, ...]) -> None:
    q, k, v = _rand(2, 3, 4, 8), _rand(2, 3, 5, 8, seed=1), _rand(2, 3, 5, 4, seed=2)
    bias = _rand(*shape, seed=3).requires_grad_()
    res = attention_reference(q, k, v, attn_bias_type="post_scale_bias", attn_bias=bias, attn_mask_type="causal")
    s = q @ k.transpose(-1, -2) / math.sqrt(8) + bias.detach()
    torch.testing.assert_close(res.out, _masked_softmax_ref(s, allowed_mask(4, 5, attn_mask_type="causal"), v))
    (g,) = torch.autograd.grad(res.out.sum(), bias)
    assert g.shape == bias.shape and torch.isfinite(g).all()


def test_pre_scale_bias() -> None:
    q, k, v = _rand(1, 2, 3, 4), _rand(1, 2, 3, 4, seed=1), _rand(1, 2, 3, 4, seed=2)
    bias = _rand(1, 2, 3, 3, seed=3)
    res = attention_reference(q, k, v, attn_scale=0.5, attn_bias_type="pre_scale_bias", attn_bias=bias)
    expected = torch.softmax(0.5 * (q @ k.transpose(-1, -2) + bias), -1) @ v
    torch.testing.assert_close(res.out, expected)
    post = attention_reference(q, k, v, attn_scale=0.5, attn_bias_type="post_scale_bias", attn_bias=0.5 * bias)
    torch.testing.assert_close(res.out, post.out)


def test_dropout_with_explicit_keep_mask() -> None:
    q, k = torch.zeros(1, 1, 2, 2), _rand(1, 1, 2, 2)
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).view(1, 1, 2, 2)
    keep = _mat([[1, 0], [1, 1]])
    res = attention_reference(q, k, v, dropout_p=0.5, dropout_keep_mask=keep)
    # probs 0.5 everywhere -> 0.5 * keep / 0.5 = keep
    torch.testing.assert_close(res.out, torch.tensor([[1.0, 2.0], [4.0, 6.0]]).view(1, 1, 2, 2))
    torch.testing.assert_close(res.lse, torch.full((1, 1, 2, 1), math.log(2)))  # before dropout


@pytest.mark.parametrize("mask", ["causal_bottom_right", "padding_causal"])
def test_fully_masked_rows_have_finite_gradients(mask: str) -> None:
    q, k, v = (_rand(2, 2, 4, 8, seed=0), _rand(2, 2, 2, 8, seed=1), _rand(2, 2, 2, 8, seed=2))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    bias = torch.zeros(1, 2, 4, 2, requires_grad=True)
    kw = dict(seqlens_q=torch.tensor([4, 1]), seqlens_kv=torch.tensor([0, 2]))
    res = attention_reference(q, k, v, attn_mask_type=mask, attn_bias_type="post_scale_bias", attn_bias=bias, **kw)
    assert not res.out.isnan().any() and res.lse.isneginf().any()
    loss = res.out.square().sum() + res.lse[res.lse.isfinite()].sum()
    grads = torch.autograd.grad(loss, (q, k, v, bias))
    assert all(torch.isfinite(g).all() for g in grads)
    empty = ~allowed_mask(4, 2, attn_mask_type=mask, **kw).expand(2, 2, 4, 2).any(-1)
    assert torch.equal(res.out[empty], torch.zeros(int(empty.sum()), 8))
    assert torch.equal(grads[0][empty], torch.zeros(int(empty.sum()), 8))


def test_dtypes_and_strides() -> None:
    qb = _rand(2, 5, 3, 8)  # bshd storage, viewed as bhsd
    q, k, v = qb.transpose(1, 2), _rand(2, 3, 5, 8, seed=1), _rand(2, 3, 5, 8, seed=2)
    res = attention_reference(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16))
    assert res.out.dtype == torch.float32 and res.out.shape == (2, 3, 5, 8) and res.lse.shape == (2, 3, 5, 1)
    torch.testing.assert_close(attention_reference(q, k, v).out, attention_reference(q.contiguous(), k, v).out)
    assert attention_reference(q, k, v, compute_dtype=torch.float64).out.dtype == torch.float64


def test_errors() -> None:
    q, k, v = torch.zeros(1, 8, 2, 4), torch.zeros(1, 3, 2, 4), torch.zeros(1, 3, 2, 4)
    with pytest.raises(ValueError, match="k has 3 heads, which does not divide q's 8 heads"):
        attention_reference(q, k, v)
    k, v = torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4)
    with pytest.raises(ValueError, match="seqlens_q is required"):
        attention_reference(q, k, v, attn_mask_type="padding")
    with pytest.raises(ValueError, match="seqlens_kv has 2 entries, expected batch size 1"):
        attention_reference(
            q, k, v, attn_mask_type="padding", seqlens_q=torch.tensor([2]), seqlens_kv=torch.tensor([1, 1])
        )
    with pytest.raises(ValueError, match="arbitrary"):
        allowed_mask(2, 2, attn_mask_type="arbitrary")
    with pytest.raises(ValueError, match="attn_mask_type='bogus'"):
        attention_reference(q, k, v, attn_mask_type="bogus")
    with pytest.raises(ValueError, match="dropout_keep_mask is required"):
        attention_reference(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"attn_bias has shape \(1, 3, 2, 2\), which does not broadcast"):
        attention_reference(q, k, v, attn_bias_type="post_scale_bias", attn_bias=torch.zeros(1, 3, 2, 2))
    with pytest.raises(ValueError, match="attn_bias must be given"):
        attention_reference(q, k, v, attn_bias=torch.zeros(1, 1, 2, 2))
    with pytest.raises(ValueError, match="window_size"):
        allowed_mask(2, 2, attn_mask_type="no_mask", window_size=(-2, 0))
    with pytest.raises(ValueError, match="k has head dim 5, but q has 4"):
        attention_reference(q, torch.zeros(1, 2, 2, 5), v)
