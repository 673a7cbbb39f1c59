"""GPU suite for the FP8 sub-backend (delayed scaling, E4M3 forward / E5M2 backward).

Error measure (TransformerEngine's FP8 rule): RMSE of the difference over the value range of
the reference, ``rmse(a - b) / (max(b) - min(b))``; the bounds are the constants below.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import te_cudnn as tc
from te_cudnn.enums import META_DO, META_DP, META_DQKV, META_O, META_QKV, META_S, QKVLayout
from te_cudnn.fp8 import Fp8AttentionMeta
from te_cudnn.layouts import layout_info, packed_qkv_views
from te_cudnn.reference import attention_reference, attention_reference_fp8
from te_cudnn.testing import make_qkv, to_bhsd

pytestmark = [pytest.mark.gpu, pytest.mark.fp8]

RMSE_VS_EMULATION = 0.01  # O against the FP8 emulation (same scales, same quantization points)
RMSE_VS_FP32 = 0.05  # O against fp32 attention of the dequantized inputs
RMSE_GRAD_VS_FP32 = 0.10  # dQ/dK/dV against fp32 gradients of the dequantized inputs (TE: 0.11-0.15)
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def rmse_range(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).pow(2).mean().sqrt() / (b.max() - b.min()).clamp_min(1e-12))


def _setup(layout, mask, b=2, h=4, s=256, d=128, seed=0, meta=None):
    layout = QKVLayout.coerce(layout)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = make_qkv(layout, b, h, h, s, s, d, dtype=torch.bfloat16, generator=gen)
    meta = meta or Fp8AttentionMeta(device="cuda")
    # one calibration step so the scales fit the data (delayed scaling)
    for t in (q, k, v):
        meta.quantize(t, "qkv")
    meta.fwd.amax_history[0, META_S] = 1.0  # softmax values are at most 1
    meta.fwd.amax_history[0, META_O] = v.abs().max()  # |O| is at most max |v|
    meta.bwd.amax_history[0, :] = 1.0
    meta.update()
    q8, k8, v8 = (meta.quantize(t, "qkv") for t in (q, k, v))
    if layout_info(layout).packs_qkv or layout_info(layout).packs_kv:  # keep the packing: quantize the buffer
        base = q._base if layout_info(layout).packs_qkv else k._base
        buf8 = meta.quantize(base, "qkv")
        group = layout_info(layout).group
        if layout_info(layout).packs_qkv:
            q8, k8, v8 = packed_qkv_views(buf8, group)
        else:
            k8, v8 = packed_qkv_views(buf8, group)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    return layout, meta, (q, k, v), (q8, k8, v8), cu


@pytest.mark.parametrize(
    "layout,mask",
    list(itertools.product(["bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bs3hd", "sbh3d", "bshd_bs2hd"],
                           ["no_mask", "causal", "padding", "padding_causal"])),
)  # fmt: skip
def test_fp8_forward_backward(layout, mask):
    layout, meta, _, (q8, k8, v8), cu = _setup(layout, mask)
    s = 256
    kw = dict(qkv_layout=layout.name, attn_mask_type=mask)
    out8, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q8, k8, v8, E4M3, None, **kw, **meta.fwd_kwargs())
    assert out8.dtype == E4M3
    f = meta.fwd
    qb, kb, vb = (to_bhsd(t, layout) for t in (q8, k8, v8))
    lens = dict(seqlens_q=cu.diff(), seqlens_kv=cu.diff()) if "padding" in mask else {}  # full-length sequences
    emu = attention_reference_fp8(qb, kb, vb, descale_qkv=f.scale_inv[META_QKV], scale_s=f.scale[META_S],
                                  descale_s=f.scale_inv[META_S], scale_o=f.scale[META_O], attn_mask_type=mask,
                                  **lens)  # fmt: skip
    out = to_bhsd(out8, layout).float() * f.scale_inv[META_O]
    assert rmse_range(out, emu.out) < RMSE_VS_EMULATION
    deq = [t.float() * f.scale_inv[META_QKV] for t in (qb, kb, vb)]
    leaves = [t.clone().requires_grad_() for t in deq]
    ref = attention_reference(*leaves, attn_mask_type=mask, **lens)
    assert rmse_range(out, ref.out) < RMSE_VS_FP32
    # amaxes written by the kernel: softmax max and |O| max before quantization
    torch.testing.assert_close(f.amax_history[0, META_S], emu.amax_s, rtol=0.02, atol=0)
    torch.testing.assert_close(f.amax_history[0, META_O], emu.amax_o, rtol=0.05, atol=0)

    d_o = torch.randn(out8.shape, device="cuda") * 0.1
    d_o8 = meta.quantize(d_o, "do")
    dq8, dk8, dv8, dbias, _ = tc.fused_attn_bwd(s, s, cu, cu, q8, k8, v8, out8, d_o8, E4M3, aux, None, **kw,
                                             **meta.bwd_kwargs())  # fmt: skip
    assert dbias is None and dq8.dtype == E5M2 and dq8.shape == q8.shape
    bw = meta.bwd
    # the reference: fp32 gradients of the dequantized inputs and the dequantized dO
    grads = torch.autograd.grad(ref.out, leaves, to_bhsd(d_o8, layout).float() * bw.scale_inv[META_DO])
    for name, got, want in zip(("dQ", "dK", "dV"), (dq8, dk8, dv8), grads):
        err = rmse_range(to_bhsd(got, layout).float() * bw.scale_inv[META_DQKV], want)
        assert err < RMSE_GRAD_VS_FP32, f"{name}: {err:.4f}"
    assert bw.amax_history[0, META_DQKV] > 0 and bw.amax_history[0, META_DP] > 0


def test_non_reciprocal_scales_are_used_as_given():
    """Every scale and inverse scale is read from its own slot: a descale that is not 1/scale
    changes the result exactly as the emulation predicts."""
    layout, meta, _, (q8, k8, v8), cu = _setup("bshd_bshd_bshd", "causal", seed=3)
    f = meta.fwd
    f.scale_inv[META_S] = 2.0 / f.scale[META_S]  # twice the reciprocal
    f.scale_inv[META_QKV] *= 0.5
    s = 256
    out8, _ = tc.fused_attn_fwd(True, s, s, cu, cu, q8, k8, v8, E4M3, None, qkv_layout="bshd_bshd_bshd",
                                attn_mask_type="causal", **meta.fwd_kwargs())  # fmt: skip
    qb, kb, vb = (to_bhsd(t, layout) for t in (q8, k8, v8))
    emu = attention_reference_fp8(qb, kb, vb, descale_qkv=f.scale_inv[META_QKV], scale_s=f.scale[META_S],
                                  descale_s=f.scale_inv[META_S], scale_o=f.scale[META_O], attn_mask_type="causal")  # fmt: skip
    assert rmse_range(to_bhsd(out8, layout).float() / f.scale[META_O], emu.out) < RMSE_VS_EMULATION


def test_fp8_training_loop_tracks_bf16():
    """200 steps of a toy attention model learning a teacher of the same shape (plus noise, so
    the loss plateaus at the noise level instead of at zero): the FP8 loss curve tracks bf16."""
    b, s, h, d, dm = 4, 128, 4, 128, 256
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")

    def model(seed):
        torch.manual_seed(seed)
        return torch.nn.Linear(dm, 3 * h * d).cuda(), torch.nn.Linear(h * d, dm).cuda()

    def forward(proj, out_proj, x, attend):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            qkv = proj(x).view(b, s, 3, h, d)
        q, k, v = (t.to(torch.bfloat16) for t in qkv.unbind(2))
        return out_proj(attend(q, k, v).reshape(b, s, h * d).float())

    torch.manual_seed(0)
    x = torch.randn(b, s, dm, device="cuda")
    with torch.no_grad():
        teacher = model(7)
        target = forward(*teacher, x, lambda q, k, v: tc.fused_attention(q, k, v, **kw)) * 4
        target += 0.3 * torch.randn_like(target)

    def run(fp8: bool) -> list[float]:
        proj, out_proj = model(1)
        opt = torch.optim.Adam(list(proj.parameters()) + list(out_proj.parameters()), lr=3e-4)
        meta = Fp8AttentionMeta(device="cuda")
        attend = (lambda q, k, v: tc.fp8_attention(q, k, v, meta, **kw)) if fp8 else (
            lambda q, k, v: tc.fused_attention(q, k, v, **kw))
        losses = []
        for _ in range(200):
            loss = torch.nn.functional.mse_loss(forward(proj, out_proj, x, attend), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if fp8:
                meta.update()
            losses.append(float(loss))
        return losses

    bf16, fp8 = run(False), run(True)
    assert bf16[-1] < 0.7 * bf16[0], "the bf16 loop must learn"
    late = [abs(a - b_) / b_ for a, b_ in zip(fp8[-50:], bf16[-50:])]
    print(f"\nloss bf16 {bf16[0]:.4f} -> {bf16[-1]:.4f}, fp8 {fp8[0]:.4f} -> {fp8[-1]:.4f}, "
          f"max relative gap over the last 50 steps {max(late):.4f}")  # fmt: skip
    assert max(late) < 0.10, f"FP8 loss strays from bf16 by {max(late):.3f}"  # measured 0.046 on an H100
