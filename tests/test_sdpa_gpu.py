"""GPU: te_cudnn.scaled_dot_product_attention as a drop-in for torch's.

Seeded random configurations (fp16/bf16; b 1-3; h 1-8 with GQA; s_q, s_kv 1..300, cross
attention included; d 64/128; contiguous ``[b, h, s, d]`` tensors and ``[b, s, h, d]`` ones
viewed through ``transpose(1, 2)``; no mask, ``is_causal``, boolean and float masks of every
broadcast shape, float masks that require grad; a custom ``scale``) run forward and, in
training, backward. Each result (out, dq, dk, dv, and the float mask's gradient) must be as close
to torch's SDPA in fp32 (math backend) as the tolerances in ``te_cudnn.testing.TOLERANCES`` allow:
at most ``factor`` (2) times the error of the same attention computed by plain torch ops in the
inputs' precision, plus a small floor. Every mask row allows at least one key here; rows that
allow none are tested on their own (zeros, as torch's math backend gives). Dropout: applied,
reproducible under ``torch.manual_seed``, and unbiased.

The seed comes from ``TE_CUDNN_TEST_SEED`` (else a random one); it is printed and in every
failure message (not in the test ids, which parallel workers must collect alike). Replay with ``TE_CUDNN_TEST_SEED=<seed> pytest tests/test_sdpa_gpu.py``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import te_cudnn as tc
from te_cudnn.sdpa import mask_to_bias
from te_cudnn.testing import TOLERANCES, check_close, rel_error

from _random_cases import seed_from_env, seeded_draws

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
SEED = seed_from_env()
N_CASES = 48
HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    b: int
    h: int
    hk: int
    sq: int
    skv: int
    d: int
    layout: str  # "bhsd": contiguous [b, h, s, d]; "bshd": contiguous [b, s, h, d] seen as transpose(1, 2)
    mask: str  # none | causal | bool | float | float32 | float_grad
    mask_shape: Optional[tuple[int, ...]]
    scale: Optional[float]
    training: bool
    enable_gqa: bool

    def __str__(self) -> str:
        return (f"{str(self.dtype).removeprefix('torch.')} b{self.b} h{self.h}/{self.hk} sq{self.sq} skv{self.skv} "
                f"d{self.d} {self.layout} {self.mask}{list(self.mask_shape) if self.mask_shape else ''} "
                f"scale={self.scale} {'train' if self.training else 'infer'}")  # fmt: skip


def _mask_shapes(b: int, h: int, sq: int, skv: int) -> list[tuple[int, ...]]:
    return [(sq, skv), (1, skv), (skv,), (b, 1, sq, skv), (1, h, sq, skv), (b, h, sq, skv), (b, 1, 1, skv),
            (1, 1, sq, skv), (h, sq, skv)]  # fmt: skip


def _draw(rng: random.Random) -> Case:
    dtype = rng.choice(HALF)
    b = rng.randint(1, 3)
    h = rng.randint(1, 8)
    hk = rng.choice([n for n in range(1, h + 1) if h % n == 0])
    sq = rng.choice([rng.randint(1, 300), rng.choice([1, 2, 16, 64, 128, 257, 300])])
    skv = sq if rng.random() < 0.4 else rng.randint(1, 300)
    mask = rng.choice(["none", "causal", "bool", "bool", "float", "float32", "float_grad"])
    training = mask == "float_grad" or rng.random() < 0.6
    if training and sq == 1 and skv == 1:  # cuDNN has no backward for sq = skv = 1 (te_cudnn declines it)
        skv = rng.randint(2, 300)
    shape = rng.choice(_mask_shapes(b, h, sq, skv)) if mask not in ("none", "causal") else None
    return Case(dtype=dtype, b=b, h=h, hk=hk, sq=sq, skv=skv, d=rng.choice([64, 128]), layout=rng.choice(["bhsd", "bshd"]),
                mask=mask, mask_shape=shape, scale=rng.choice([None, None, 0.05, 0.3]), training=training,
                enable_gqa=hk != h or rng.random() < 0.2)  # fmt: skip


CASES = seeded_draws(_draw, N_CASES, SEED)


def _leaf(shape_bhsd: tuple[int, ...], layout: str, dtype, gen, requires_grad: bool):
    """(leaf, [b, h, s, d] view of it): the leaf is laid out as ``layout`` says."""
    b, h, s, d = shape_bhsd
    if layout == "bshd":
        leaf = torch.randn(b, s, h, d, generator=gen, device=DEVICE).to(dtype).requires_grad_(requires_grad)
        return leaf, leaf.transpose(1, 2)
    leaf = torch.randn(b, h, s, d, generator=gen, device=DEVICE).to(dtype).requires_grad_(requires_grad)
    return leaf, leaf


def _make_mask(case: Case, gen) -> Optional[torch.Tensor]:
    if case.mask in ("none", "causal"):
        return None
    shape = case.mask_shape
    if case.mask == "bool":
        m = torch.rand(shape, generator=gen, device=DEVICE) > 0.5
        keep = torch.randint(0, case.skv, shape[:-1], generator=gen, device=DEVICE)  # every row allows >= 1 key
        return m.scatter(-1, keep.unsqueeze(-1), True)
    dtype = torch.float32 if case.mask == "float32" else case.dtype
    m = (torch.randn(shape, generator=gen, device=DEVICE) * 2).to(dtype)
    return m.requires_grad_(case.mask == "float_grad")


def lowp_attention(q, k, v, mask, is_causal, scale, dtype):
    """torch's SDPA written out in plain ops, all in ``dtype`` (the same-precision yardstick)."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(dtype)
    return torch.softmax(s, dim=-1) @ v


def _check(name, case, actual, expected, same_precision, roundings=0, unavoidable=0.0):
    if float(expected.detach().double().norm()) < 1e-6:  # a gradient that is exactly zero (one key: the
        # softmax is constant), where a relative error is meaningless: both low-precision results are rounding
        # noise around 0, so bound te_cudnn's by torch's own plus a per-element floor
        err, torch_err = (float(t.detach().double().norm()) for t in (actual, same_precision))
        bound = 2 * torch_err + 1e-3 * actual.numel() ** 0.5
        assert err <= bound, f"seed={SEED} case [{case}]: {name}: |actual| {err:.3e} > {bound:.3e} around a zero gradient"
        return err
    try:
        return check_close(name, actual, expected, same_precision, case.dtype, roundings, unavoidable)
    except AssertionError as e:
        raise AssertionError(f"seed={SEED} case [{case}]: {e}") from None


@pytest.mark.parametrize("index", range(N_CASES), ids=[f"case{i}" for i in range(N_CASES)])
def test_matches_torch_sdpa(index):
    case = CASES[index]
    print(f"seed={SEED} case {index}: {case}")
    gen = torch.Generator(device=DEVICE).manual_seed(SEED * 1000 + index)
    tr = case.training
    q_leaf, q = _leaf((case.b, case.h, case.sq, case.d), case.layout, case.dtype, gen, tr)
    k_leaf, k = _leaf((case.b, case.hk, case.skv, case.d), case.layout, case.dtype, gen, tr)
    v_leaf, v = _leaf((case.b, case.hk, case.skv, case.d), case.layout, case.dtype, gen, tr)
    mask = _make_mask(case, gen)
    causal = case.mask == "causal"
    if case.mask == "float_grad" and case.b == case.h == case.sq == 1:
        # declared: cuDNN writes no dBias for a [1, 1, 1, S] bias, so a mask that needs a gradient is
        # declined with that reason, never run without its gradient (seed 1964936041 drew it)
        with pytest.raises(tc.UnsupportedConfigError, match="produces no dBias for a \\[1, 1, 1, S\\] bias"):
            tc.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case.scale, enable_gqa=case.enable_gqa)
        return

    with torch.set_grad_enabled(tr):
        out = tc.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=case.scale,
                                              enable_gqa=case.enable_gqa)  # fmt: skip
    assert out.shape == (case.b, case.h, case.sq, case.d) and out.dtype == case.dtype

    # fp32 reference: torch's SDPA, math backend
    ref_in = [t.detach().float().requires_grad_(tr) for t in (q, k, v)]
    ref_mask = None if mask is None else (mask if mask.dtype == torch.bool else mask.detach().float().requires_grad_(mask.requires_grad))
    # a mask that needs a gradient enters the reference at full [b, h, L, S], so that the exact
    # gradient of every score is known (its sum over the broadcast dims is the mask's gradient)
    full_mask = None
    if ref_mask is not None and ref_mask.requires_grad:
        full_mask = ref_mask.detach().expand(case.b, case.h, case.sq, case.skv).clone().requires_grad_()
    with torch.set_grad_enabled(tr), sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(*ref_in, attn_mask=ref_mask if full_mask is None else full_mask,
                                             is_causal=causal, scale=case.scale, enable_gqa=case.enable_gqa)  # fmt: skip
    # same precision: plain torch ops in the inputs' dtype
    lp_in = [t.detach().clone().requires_grad_(tr) for t in (q, k, v)]
    lp_mask = None if mask is None else (mask if mask.dtype == torch.bool else mask.detach().clone().requires_grad_(mask.requires_grad))
    with torch.set_grad_enabled(tr):
        lp = lowp_attention(*lp_in, lp_mask, causal, case.scale, case.dtype)

    _check("out", case, out, ref, lp)
    if not tr:
        return
    d_out = torch.randn(out.shape, generator=gen, device=DEVICE).to(case.dtype)
    out.backward(d_out)
    ref.backward(d_out.float())
    lp.backward(d_out)
    for name, leaf, r, low in (("dq", q_leaf, ref_in[0], lp_in[0]), ("dk", k_leaf, ref_in[1], lp_in[1]), ("dv", v_leaf, ref_in[2], lp_in[2])):
        grad = leaf.grad.transpose(1, 2) if case.layout == "bshd" else leaf.grad
        _check(name, case, grad, r.grad, low.grad)
    if mask is not None and mask.requires_grad:
        assert mask.grad is not None and mask.grad.shape == mask.shape, f"seed={SEED} case [{case}]: no mask gradient"
        exact = full_mask.grad.sum_to_size(mask.shape)
        broadcast = mask.numel() < full_mask.numel()
        unavoidable = _dbias_rounding_error(full_mask.grad, mask, case) if broadcast else 0.0
        _check("d_mask", case, mask.grad, exact, lp_mask.grad, roundings=2 if broadcast else 0, unavoidable=unavoidable)


def _dbias_rounding_error(score_grad: torch.Tensor, mask: torch.Tensor, case: Case) -> float:
    """The relative error a broadcast mask's gradient carries from cuDNN's dBias alone.

    cuDNN writes dBias in the bias dtype at the shape of the bias te_cudnn binds (full L and S,
    see ``mask_to_bias``); autograd then sums it over the mask's broadcast dims. Each summand is
    rounded before the sum, so where the gradients of a key's scores cancel (a softmax row's
    gradients sum to zero) the sum is off by up to u * sum|x| / |sum x|, far more than one
    rounding of the result. Computed here from the exact (fp32) score gradients."""
    with torch.enable_grad():
        bias, _ = mask_to_bias(mask.detach().requires_grad_(), (case.b, case.h, case.sq, case.skv), case.dtype)
    per_bias = score_grad.sum_to_size(bias.shape)
    return rel_error(per_bias.to(case.dtype).float().sum_to_size(mask.shape), per_bias.sum_to_size(mask.shape))


@pytest.mark.parametrize("dtype", HALF)
def test_fully_masked_rows_are_zero_as_in_torch_math(dtype):
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    q, k, v = (torch.randn(2, 4, n, 64, generator=gen, device=DEVICE).to(dtype).requires_grad_() for n in (40, 70, 70))
    mask = torch.rand(2, 1, 40, 70, generator=gen, device=DEVICE) > 0.3
    mask[0, 0, :5] = False  # queries 0..4 of batch 0 see no key (left padding in a causal LM looks like this)
    mask[1, 0, 17] = False
    out = tc.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(*ref_in, attn_mask=mask)
    assert (out[0, :, :5] == 0).all() and (out[1, :, 17] == 0).all()
    assert (ref[0, :, :5] == 0).all()  # torch's math backend: zeros too
    tol = TOLERANCES[dtype]
    assert rel_error(out, ref) <= tol.ceiling
    d_out = torch.randn(out.shape, generator=gen, device=DEVICE).to(dtype)
    out.backward(d_out)
    ref.backward(d_out.float())
    for name, t, r in zip("qkv", (q, k, v), ref_in):
        assert torch.isfinite(t.grad).all(), name
        assert rel_error(t.grad, r.grad) <= tol.ceiling, (name, rel_error(t.grad, r.grad))
    assert (q.grad[0, :, :5] == 0).all()  # no gradient through rows that attend nothing


def test_output_layout_and_zero_copy():
    """The result is a transposed view of a contiguous [b, s, h, d] tensor (as torch's fused
    backends give); inputs of any readable strides are not copied."""
    q, k, v = (torch.randn(2, 64, 8, 64, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    out = tc.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.shape == (2, 8, 64, 64) and out.transpose(1, 2).is_contiguous()
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert rel_error(out, ref) <= TOLERANCES[torch.bfloat16].ceiling


def test_unsupported_configuration_raises():
    q = torch.randn(1, 2, 16, 64, device=DEVICE, dtype=torch.float32)
    with pytest.raises(tc.UnsupportedConfigError, match="float16 or bfloat16"):
        tc.scaled_dot_product_attention(q, q, q)
    q = torch.randn(1, 2, 16, 512, device=DEVICE, dtype=torch.bfloat16)  # head dim beyond cuDNN's 256
    with pytest.raises(tc.UnsupportedConfigError, match="head dim"):
        tc.scaled_dot_product_attention(q, q, q)


# ------------------------------------------------------------------ dropout


def _dropout_inputs(dtype=torch.bfloat16):
    """q = 0: every key gets weight 1/S, so out is the mean of the kept values, scaled by 1/(1-p)."""
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    b, h, sq, skv, d = 2, 4, 64, 2048, 64
    q = torch.zeros(b, h, sq, d, device=DEVICE, dtype=dtype)
    k = torch.randn(b, h, skv, d, generator=gen, device=DEVICE).to(dtype)
    v = torch.randn(b, h, skv, d, generator=gen, device=DEVICE).to(dtype)
    return q, k, v


def test_dropout_applied_reproducible_and_unbiased():
    print(f"seed={SEED}")
    q, k, v = _dropout_inputs()
    p = 0.2
    plain = tc.scaled_dot_product_attention(q, k, v).float()
    torch.manual_seed(SEED)
    a = tc.scaled_dot_product_attention(q, k, v, dropout_p=p).float()
    nxt = tc.scaled_dot_product_attention(q, k, v, dropout_p=p).float()
    torch.manual_seed(SEED)
    again = tc.scaled_dot_product_attention(q, k, v, dropout_p=p).float()
    assert torch.equal(a, again), f"seed={SEED}: the same seed gave another dropout mask"
    assert not torch.equal(a, nxt), f"seed={SEED}: two draws gave the same dropout mask"
    assert not torch.allclose(a, plain), f"seed={SEED}: no dropout applied"
    # each output is the mean of ~(1-p)*S values over S, rescaled: unbiased, spread sqrt(p/(1-p)/S) * std(v)
    spread = (p / (1 - p) / k.shape[2]) ** 0.5
    diff = a - plain
    assert abs(diff.mean().item()) < 0.1 * spread, f"seed={SEED}: biased ({diff.mean().item():.2e})"
    assert 0.5 * spread < diff.std().item() < 1.5 * spread, f"seed={SEED}: spread {diff.std().item():.3e} vs {spread:.3e}"
    many = torch.stack([tc.scaled_dot_product_attention(q, k, v, dropout_p=p).float() for _ in range(16)]).mean(0)
    assert (many - plain).std().item() < 0.5 * diff.std().item()  # averaging draws converges to no dropout
    with torch.no_grad():  # torch applies dropout whenever dropout_p > 0
        assert not torch.allclose(tc.scaled_dot_product_attention(q, k, v, dropout_p=p).float(), plain)


def test_dropout_backward_replays_the_forward_mask():
    q, k, v = _dropout_inputs()
    grads = []
    for seed in (SEED, SEED, SEED + 1):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(seed)
        out = tc.scaled_dot_product_attention(*leaves, dropout_p=0.3)
        out.backward(torch.ones_like(out))
        grads.append([t.grad for t in leaves])
    for name, g1, g2 in zip("qkv", grads[0], grads[1]):  # dQ accumulates atomically: equal up to rounding order
        assert torch.isfinite(g1).all() and rel_error(g1, g2) < 1e-3, (f"seed={SEED}", name, rel_error(g1, g2))
    # another seed, another mask: dV (which counts the kept entries per key) differs by far more than rounding
    assert rel_error(grads[2][2], grads[0][2]) > 0.05, f"seed={SEED}: the backward ignores the dropout mask"
    # d(out)/dv with dO = 1 counts how often each key was kept: (1/S) * kept / (1 - p) summed over queries
    dv = grads[0][2].float()
    sq, skv = q.shape[2], k.shape[2]
    expected = sq / skv  # the mean over keys, dropout being unbiased
    assert abs(dv.mean().item() - expected) < 0.02 * expected
