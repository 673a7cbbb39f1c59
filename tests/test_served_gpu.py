"""Calls cuDNN declines in the form they come in, served in another form (te_cudnn.served), on
the GPU against the fp32 reference: head dims that are not a multiple of 8 (forward and
backward, dense and THD, GQA, d_qk != d_v) and bottom-right masks with more queries than keys
(rows that see no key: zeros, -inf stats, zero gradients)."""

from __future__ import annotations

import pytest
import torch

import te_cudnn as tc
from te_cudnn.reference import attention_reference
from te_cudnn.testing import check_close

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def _ref(q, k, v, d_o=None, **kw):
    """fp32 and bf16 references on BHSD tensors; with d_o, also their gradients."""
    outs = []
    for dtype in (torch.float32, BF16):
        leaves = [t.detach().to(dtype).requires_grad_(d_o is not None) for t in (q, k, v)]
        r = attention_reference(*leaves, compute_dtype=dtype, **kw)
        grads = torch.autograd.grad(r.out, leaves, d_o.to(dtype)) if d_o is not None else None
        outs.append((r, grads))
    return outs


@pytest.mark.parametrize("layout", ["bshd_bshd_bshd", "sbhd_sbhd_sbhd"])
@pytest.mark.parametrize("d_qk,d_v,hg,mask", [(59, 59, 4, "causal"), (111, 111, 2, "no_mask"), (59, 37, 4, "causal"),
                                             (72, 20, 8, "padding_causal")])  # fmt: skip
def test_head_dims_not_a_multiple_of_8(layout, d_qk, d_v, hg, mask):
    gen = torch.Generator(device="cuda").manual_seed(d_qk * 7 + d_v)
    b, h, s = 2, 8, 200
    bs = layout.startswith("bshd")

    def make(d, heads):
        shape = (b, s, heads, d) if bs else (s, b, heads, d)
        return torch.randn(*shape, generator=gen, device="cuda").to(BF16)

    q, k, v = make(d_qk, h), make(d_qk, hg), make(d_v, hg)
    lens = torch.tensor([200, 77], dtype=torch.int32, device="cuda")
    cu = torch.cat((torch.zeros(1, dtype=torch.int32, device="cuda"), lens.cumsum(0).int()))
    kw = dict(qkv_layout=layout, attn_mask_type=mask)
    out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, BF16, None, **kw)
    assert out.shape == (*q.shape[:-1], d_v) and out.is_contiguous()
    d_o = torch.randn(out.shape, generator=gen, device="cuda").to(BF16)
    dq, dk, dv, *_ = tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, BF16, aux, None, **kw)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    perm = (0, 2, 1, 3) if bs else (1, 2, 0, 3)
    bhsd = [t.permute(*perm) for t in (q, k, v, d_o)]
    lens_kw = dict(seqlens_q=lens, seqlens_kv=lens) if mask.startswith("padding") else {}
    (r32, g32), (rlp, glp) = _ref(*bhsd[:3], bhsd[3], attn_mask_type=mask, **lens_kw)
    check_close(f"O d={d_qk}/{d_v}", out.permute(*perm), r32.out, rlp.out, BF16)
    if not mask.startswith("padding"):  # the fp32 logsumexp of the real head dims' scores
        torch.testing.assert_close(aux[0], r32.lse, rtol=2e-3, atol=2e-3)
    for name, got, w32, wlp in zip(("dQ", "dK", "dV"), (dq, dk, dv), g32, glp):
        check_close(f"{name} d={d_qk}/{d_v}", got.permute(*perm), w32, wlp, BF16)
    # the same call again runs the cached signature
    again, _ = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, BF16, None, **kw)
    assert torch.equal(again, out)


def test_head_dims_not_a_multiple_of_8_thd_and_autograd():
    gen = torch.Generator(device="cuda").manual_seed(5)
    lens, h, d = [37, 0, 101, 64], 4, 59
    cu = torch.tensor([0, 37, 37, 138, 202], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(202, h, d, generator=gen, device="cuda").to(BF16).requires_grad_() for _ in range(3))
    out = tc.fused_attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, qkv_layout="thd_thd_thd",
                             attn_mask_type="padding_causal")  # fmt: skip
    out.backward(torch.ones_like(out))
    for i, n in enumerate(lens):
        if not n:
            continue
        sl = slice(int(cu[i]), int(cu[i + 1]))
        seg = [t[sl].detach().transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        (r32, g32), (rlp, glp) = _ref(*seg, torch.ones(1, h, n, d, device="cuda"), attn_mask_type="causal")
        check_close(f"O seq {i}", out[sl].transpose(0, 1).unsqueeze(0), r32.out, rlp.out, BF16)
        for name, t, w32, wlp in zip(("dQ", "dK", "dV"), (q, k, v), g32, glp):
            check_close(f"{name} seq {i}", t.grad[sl].transpose(0, 1).unsqueeze(0), w32, wlp, BF16)


@pytest.mark.parametrize("sq,skv,window,d", [(256, 100, (-1, 0), 64), (300, 128, (31, 0), 128), (200, 64, (-1, 0), 59)])
def test_more_queries_than_keys_bottom_right(sq, skv, window, d):
    gen = torch.Generator(device="cuda").manual_seed(sq + skv)
    b, h, hg = 2, 8, 2
    q = torch.randn(b, sq, h, d, generator=gen, device="cuda").to(BF16)
    k, v = (torch.randn(b, skv, hg, d, generator=gen, device="cuda").to(BF16) for _ in range(2))
    mask = "causal_bottom_right"
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type=mask, window_size=window)
    ex = tc.explain(True, BF16, BF16, "bshd_bshd_bshd", "no_bias", mask, "vanilla", 0.0, h, hg, sq, skv, d, d,
                    *window, batch_size=b)  # fmt: skip
    assert ex.backend is tc.FusedAttnBackend.F16_arbitrary_seqlen and ex.served_as, ex
    out, aux = tc.fused_attn_fwd(True, sq, skv, None, None, q, k, v, BF16, None, **kw)
    d_o = torch.randn(out.shape, generator=gen, device="cuda").to(BF16)
    dq, dk, dv, *_ = tc.fused_attn_bwd(sq, skv, None, None, q, k, v, out, d_o, BF16, aux, None, **kw)
    blind = sq - skv  # rows 0 .. sq - skv - 1 see no key
    assert torch.equal(out[:, :blind], torch.zeros_like(out[:, :blind]))
    assert torch.equal(dq[:, :blind], torch.zeros_like(dq[:, :blind]))
    assert torch.isneginf(aux[0][:, :, :blind]).all()
    bhsd = [t.transpose(1, 2) for t in (q, k, v, d_o)]
    (r32, g32), (rlp, glp) = _ref(*bhsd[:3], bhsd[3], attn_mask_type=mask, window_size=window)
    check_close("O", out.transpose(1, 2), r32.out, rlp.out, BF16)
    for name, got, w32, wlp in zip(("dQ", "dK", "dV"), (dq, dk, dv), g32, glp):
        check_close(name, got.transpose(1, 2), w32, wlp, BF16)
