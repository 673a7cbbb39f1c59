"""GPU: forwards without softmax stats give the answers of the forwards with them, and the
doors' calls that record no gradient run them."""

from __future__ import annotations

import pytest
import torch

import te_cudnn as tc
from te_cudnn.prepared import _fwd_memo, forget_prepared

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def _qkv(b=2, s=256, h=8, hg=2, d=64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=g, device="cuda", dtype=BF16)
    k, v = (torch.randn(b, s, hg, d, generator=g, device="cuda", dtype=BF16) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("mask", ["no_mask", "causal", "causal_bottom_right"])
def test_same_output_without_stats(mask: str) -> None:
    q, k, v = _qkv()
    s = q.shape[1]
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type=mask)
    out, aux = tc.fused_attn_fwd(False, s, s, None, None, q, k, v, BF16, **kw)
    bare, bare_aux = tc.fused_attn_fwd(False, s, s, None, None, q, k, v, BF16, softmax_stats=False, **kw)
    assert aux[0] is not None and bare_aux[0] is None and bare_aux[1] is aux[1]  # the shared zero rng_state
    torch.testing.assert_close(bare, out, atol=2e-3, rtol=0)


def test_dropout_without_stats_uses_the_given_rng_state() -> None:
    q, k, v = _qkv(seed=1)
    s = q.shape[1]
    rng = torch.tensor([1234, 0], dtype=torch.int64, device="cuda")
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", dropout=0.2, rng_state=rng)
    out, _ = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, BF16, **kw)
    bare, aux = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, BF16, softmax_stats=False, **kw)
    assert aux[0] is None and aux[1] is rng
    torch.testing.assert_close(bare, out, atol=2e-3, rtol=0)  # the same Philox mask


def test_doors_without_gradient_write_no_stats() -> None:
    q, k, v = (t.transpose(1, 2) for t in _qkv(seed=2))  # [b, h, s, d] views, as models pass them
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(4, 1),
                                                           v.float().repeat_interleave(4, 1), is_causal=True)  # fmt: skip
    forget_prepared()  # the doors' remembered calls too: the next call prepares again
    with torch.no_grad():
        out = tc.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)
    assert [p.cfg.writes_stats for p in _fwd_memo.values()] == [False]
    forget_prepared()  # the doors' remembered calls too: the next call prepares again
    q.requires_grad_()
    out = tc.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # recorded: stats for the backward
    out.sum().backward()
    assert all(p.cfg.writes_stats for p in _fwd_memo.values()) and q.grad is not None
