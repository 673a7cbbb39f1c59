"""GPU suite for the F16 max512 sub-backend (cuDNN's non-flash engine).

Cases come from the sub-backend's declaration (layouts x masks x bias types x fp16/bf16).
Each runs forward and backward through the public functions with the backend named
explicitly and is checked against the fp32 reference (the bar is the error a
same-precision PyTorch computation makes); the plan names must show cuDNN's specialised
engine 0; a second backward over the same forward must give identical gradients.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import te_cudnn as tc
from te_cudnn.backends import BY_ENUM
from te_cudnn.enums import AttnBiasType, FusedAttnBackend, QKVLayout
from te_cudnn.reference import attention_reference
from te_cudnn.testing import check_close, make_qkv, to_bhsd

pytestmark = pytest.mark.gpu
MAX512 = FusedAttnBackend.F16_max512_seqlen
CAPS = BY_ENUM[MAX512].caps
DTYPES = (torch.float16, torch.bfloat16)


def _cu(b: int, s: int) -> torch.Tensor:
    return torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")


def _cases():
    for layout, mask, bias, dtype in itertools.product(sorted(CAPS.layouts), sorted(CAPS.masks), sorted(CAPS.bias_types), DTYPES):
        yield pytest.param(layout, mask, bias, dtype, id=f"{layout.name}-{mask.name}-{bias.name}-{str(dtype)[6:]}")


def _run(layout: QKVLayout, mask, bias_type, dtype, b=2, h=4, s=128, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = make_qkv(layout, b, h, h, s, s, 64, dtype=dtype, generator=gen)
    bias = None
    if bias_type == AttnBiasType.post_scale_bias:
        bias = torch.randn((1, h, s, s), generator=gen, device="cuda").to(dtype)
    kw = dict(qkv_layout=layout.name, attn_mask_type=mask.name, attn_bias_type=bias_type.name)
    out, aux = tc.fused_attn_fwd(True, s, s, _cu(b, s), _cu(b, s), q, k, v, dtype, MAX512, attn_bias=bias, **kw)
    d_o = (torch.randn(out.shape, generator=gen, device="cuda") * 0.5).to(dtype)
    grads = tc.fused_attn_bwd(s, s, _cu(b, s), _cu(b, s), q, k, v, out, d_o, dtype, aux, MAX512, **kw)
    return q, k, v, bias, out, aux, d_o, grads, kw


@pytest.mark.parametrize("layout,mask,bias_type,dtype", list(_cases()))
def test_max512_matches_reference(layout, mask, bias_type, dtype):
    q, k, v, bias, out, aux, d_o, (dq, dk, dv, dbias, _), kw = _run(layout, mask, bias_type, dtype)
    s = q.shape[0] if layout.name.startswith("sb") else q.shape[1]
    b, h = out.shape[1] if layout.name.startswith("sb") else out.shape[0], q.shape[-2]
    # aux[0] is the saved softmax S in the io dtype (cuDNN's F16x16 tile order), as TE's max512
    assert aux[0].shape == (b, h, s, s) and aux[0].dtype == dtype
    inputs = [to_bhsd(t, layout) for t in (q, k, v)] + ([bias] if bias is not None else [])
    results = {}
    for compute in (torch.float32, dtype):
        leaves = [t.detach().to(compute).requires_grad_() for t in inputs]
        ref = attention_reference(*leaves[:3], attn_bias=leaves[3] if bias is not None else None, attn_mask_type=mask,
                                  attn_bias_type=bias_type, compute_dtype=compute)  # fmt: skip
        results[compute] = (ref.out, torch.autograd.grad(ref.out, leaves, to_bhsd(d_o, layout).to(compute)))
    (o32, g32), (olp, glp) = results[torch.float32], results[dtype]
    check_close("O", to_bhsd(out, layout), o32, olp, dtype)
    check_close("dQ", to_bhsd(dq, layout), g32[0], glp[0], dtype)
    check_close("dK", to_bhsd(dk, layout), g32[1], glp[1], dtype)
    check_close("dV", to_bhsd(dv, layout), g32[2], glp[2], dtype)
    if bias is not None:
        assert dbias is not None and dbias.shape == bias.shape
        check_close("dBias", dbias, g32[3], glp[3], dtype)
    else:
        assert dbias is None


@pytest.mark.parametrize("mask", sorted(CAPS.masks), ids=lambda m: m.name)
def test_max512_runs_on_the_specialised_engine(mask):
    tc.plan_cache.clear()
    _run(QKVLayout.bshd_bshd_bshd, mask, AttnBiasType.post_scale_bias, torch.bfloat16, s=256)
    plans = [p for p in tc.plan_cache.plans() if p.key.backend == MAX512]
    assert {p.key.direction.value for p in plans} == {"fwd", "bwd"}
    for p in plans:  # engine 0 is cuDNN's MHA engine; a generic fallback would name another
        assert p.plan_name.startswith("eng0"), (p.key.direction, p.plan_name)


@pytest.mark.parametrize("mask", sorted(CAPS.masks), ids=lambda m: m.name)
def test_repeated_backward_is_identical_and_keeps_the_softmax(mask):
    layout = QKVLayout.bs3hd
    q, k, v, bias, out, aux, d_o, grads, kw = _run(layout, mask, AttnBiasType.post_scale_bias, torch.float16, b=2, h=2, s=256)
    saved = aux[0].clone()
    s = q.shape[1]
    again = tc.fused_attn_bwd(s, s, _cu(2, s), _cu(2, s), q, k, v, out, d_o, q.dtype, aux, MAX512, **kw)
    torch.cuda.synchronize()
    assert torch.equal(aux[0], saved), "the backward must not overwrite the saved softmax"
    for first, second in zip(grads[:4], again[:4]):
        assert torch.equal(first, second)


def test_backward_follows_the_forwards_sub_backend():
    """A max512 forward's aux holds the softmax S: a backward that chooses (None) serves it with
    max512; naming the flash sub-backend for it is refused with the reason."""
    layout = QKVLayout.bshd_bshd_bshd
    q, k, v, bias, out, aux, d_o, grads, kw = _run(layout, tc.AttnMaskType.causal, AttnBiasType.no_bias, torch.bfloat16)
    s = q.shape[1]
    chosen = tc.fused_attn_bwd(s, s, _cu(2, s), _cu(2, s), q, k, v, out, d_o, q.dtype, aux, None, **kw)
    for a, b in zip(grads[:3], chosen[:3]):
        assert torch.equal(a, b)
    with pytest.raises(tc.UnsupportedConfigError, match="full softmax S"):
        tc.fused_attn_bwd(s, s, _cu(2, s), _cu(2, s), q, k, v, out, d_o, q.dtype, aux, FusedAttnBackend.F16_arbitrary_seqlen, **kw)
