"""GPU suite: dropout in the F16 arbitrary-seqlen sub-backend.

How the keep mask is observed, exactly. With q = 0 every score is 0, so each of the s keys
of a row gets softmax weight exactly 1/s; with v = I (v[j] = e_j, s = d = 64) the output is

    O[i, j] = keep[i, j] / ((1 - p) * s)

so each output element is one mask bit, scaled: O > 0 exactly where cuDNN kept the
probability, 0 where it dropped it, and the kept values show the 1/(1 - p) scale. The
backward shows the mask *it* applies the same way: with the same q, k, v and dO = I
(dO[i] = e_i), dV = P_dropped^T dO gives

    dV[j, i] = keep[i, j] / ((1 - p) * s)

so the backward's mask is read off dV and compared bit for bit with the forward's. One call
gives b * h * s * s = 262144 mask bits (b = 4, h = 16), enough for 4-sigma statistics.
"""

from __future__ import annotations

import math
import sys
import threading
import traceback

import pytest
import torch

import te_cudnn as tc
from te_cudnn.enums import QKVLayout
from te_cudnn.reference import attention_reference
from te_cudnn.testing import check_close, to_bhsd

pytestmark = pytest.mark.gpu

S = D = 64
B, H = 4, 16
LAYOUT = QKVLayout.bshd_bshd_bshd
KW = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
INCREMENT = 16  # Philox offset advance per call (TransformerEngine's BACKEND_F16arb_ELTS_PER_THREADS)


def _cu(b: int, s: int) -> torch.Tensor:
    return torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")


def _identity_rows(b: int = B, h: int = H) -> torch.Tensor:
    """[b, S, h, D] bf16 with row i of every (batch, head) equal to e_i."""
    eye = torch.eye(S, D, device="cuda", dtype=torch.bfloat16)
    return eye.view(1, S, 1, D).expand(b, S, h, D).contiguous()


def _probe_inputs(b: int = B, h: int = H):
    q = torch.zeros(b, S, h, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, S, h, D, generator=torch.Generator(device="cuda").manual_seed(0), device="cuda").to(torch.bfloat16)
    return q, k, _identity_rows(b, h)


def _forward_mask(p: float, rng_gen, b: int = B, h: int = H):
    """(out, aux, keep [b, h, i, j]) of one dropout forward on the probe inputs."""
    q, k, v = _probe_inputs(b, h)
    out, aux = tc.fused_attn_fwd(True, S, S, _cu(b, S), _cu(b, S), q, k, v, q.dtype, None, dropout=p, rng_gen=rng_gen, **KW)
    return out, aux, to_bhsd(out, LAYOUT) > 0


def _backward_mask(p: float, out: torch.Tensor, aux: list, b: int = B, h: int = H) -> torch.Tensor:
    """The keep mask [b, h, i, j] the backward applies, read off dV (dO = I)."""
    q, k, v = _probe_inputs(b, h)
    _, _, dv, _, _ = tc.fused_attn_bwd(S, S, _cu(b, S), _cu(b, S), q, k, v, out, _identity_rows(b, h), q.dtype, aux, None,
                                    dropout=p, **KW)  # fmt: skip
    return dv.permute(0, 2, 3, 1) > 0  # dv[b, j, h, i] -> [b, h, i, j]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _assert_rate(name: str, hits: torch.Tensor, expected: float) -> None:
    """The fraction of True in ``hits`` (independent Bernoulli trials) is within 4 sigma of ``expected``."""
    n = hits.numel()
    rate = hits.float().mean().item()
    sigma = math.sqrt(expected * (1 - expected) / n)
    assert abs(rate - expected) < 4 * sigma, f"{name}: {rate:.5f} over {n} trials, expected {expected:.5f} +- 4 * {sigma:.5f}"


def _assert_independent(name: str, a: torch.Tensor, b: torch.Tensor, p: float) -> None:
    """Two keep masks drawn independently agree where both keep or both drop: p^2 + (1-p)^2."""
    _assert_rate(f"{name} (agreement)", a == b, p * p + (1 - p) * (1 - p))


# ------------------------------------------------------------------ statistics and scale
@pytest.mark.parametrize("p", [0.1, 0.25, 0.5])
def test_kept_fraction_scale_and_independence(p):
    """The kept fraction is within 4 sigma of 1 - p; kept probabilities are scaled by 1/(1 - p);
    the masks of different heads, batches, rows and columns are independent (a Philox stream
    reused across heads or rows would make them agree far more often than p^2 + (1-p)^2)."""
    out, aux, keep = _forward_mask(p, _gen(123))
    _assert_rate(f"kept fraction at p={p}", keep, 1 - p)
    kept = to_bhsd(out, LAYOUT)[keep].float()
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / ((1 - p) * S)), rtol=1e-2, atol=0)
    _assert_independent("even vs odd heads", keep[:, 0::2], keep[:, 1::2], p)
    _assert_independent("even vs odd batches", keep[0::2], keep[1::2], p)
    _assert_independent("even vs odd rows", keep[:, :, 0::2], keep[:, :, 1::2], p)
    _assert_independent("even vs odd columns", keep[..., 0::2], keep[..., 1::2], p)


# ------------------------------------------------------------------ reproducibility
def test_same_state_same_mask_and_other_seeds_or_offsets_independent():
    p = 0.25
    _, aux1, keep1 = _forward_mask(p, _gen(7))
    _, aux2, keep2 = _forward_mask(p, _gen(7))
    _, aux3, keep3 = _forward_mask(p, _gen(8))
    gen = _gen(7)
    _forward_mask(p, gen)
    _, aux4, keep4 = _forward_mask(p, gen)  # the same generator's next call: offset advanced
    assert aux1[1].tolist() == aux2[1].tolist() == [7, 0] and aux3[1].tolist() == [8, 0]
    assert aux4[1].tolist() == [7, INCREMENT]
    assert torch.equal(keep1, keep2), "the same (seed, offset) must give the same mask"
    _assert_independent("seed 7 vs seed 8", keep1, keep3, p)
    _assert_independent("offset 0 vs offset 16", keep1, keep4, p)


def test_backward_replays_the_forwards_mask_from_rng_state():
    """The backward applies exactly the forward's mask, and takes it from aux_ctx_tensors[1]:
    given the state of another call it applies that call's mask instead."""
    p = 0.25
    gen = _gen(99)
    out1, aux1, keep1 = _forward_mask(p, gen)
    out2, aux2, keep2 = _forward_mask(p, gen)
    assert torch.equal(_backward_mask(p, out1, aux1), keep1), "the backward must apply the forward's own mask"
    assert not torch.equal(keep1, keep2)
    swapped = [aux1[0], aux2[1]]  # call 1's stats (identical: q = 0), call 2's Philox state
    assert torch.equal(_backward_mask(p, out1, swapped), keep2), "the backward must take its mask from rng_state"


def test_output_and_gradients_match_the_reference_with_the_recovered_mask():
    """Random data under the same Philox state as a probe: O and dQ/dK/dV match the fp32
    reference that applies the probe's mask (moved here from test_fused_attn_gpu.py)."""
    p, b, h = 0.25, 2, 4
    _, aux_probe, keep = _forward_mask(p, _gen(7), b, h)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(b, S, h, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    kw = dict(KW, dropout=p)
    out, aux = tc.fused_attn_fwd(True, S, S, _cu(b, S), _cu(b, S), q, k, v, q.dtype, None, rng_gen=_gen(7), **kw)
    assert torch.equal(aux[1], aux_probe[1])
    d_o = torch.randn(out.shape, generator=g, device="cuda").to(torch.bfloat16)
    dq, dk, dv, _, _ = tc.fused_attn_bwd(S, S, _cu(b, S), _cu(b, S), q, k, v, out, d_o, q.dtype, aux, None, **kw)
    results = {}
    for compute in (torch.float32, torch.bfloat16):
        leaves = [to_bhsd(t, LAYOUT).to(compute).requires_grad_() for t in (q, k, v)]
        ref = attention_reference(*leaves, dropout_p=p, dropout_keep_mask=keep, compute_dtype=compute)
        results[compute] = (ref.out, torch.autograd.grad(ref.out, leaves, to_bhsd(d_o, LAYOUT).to(compute)))
    (o32, g32), (olp, glp) = results[torch.float32], results[torch.bfloat16]
    check_close("O (dropout)", to_bhsd(out, LAYOUT), o32, olp, torch.bfloat16)
    for name, got, want, lp in zip(("dQ", "dK", "dV"), (dq, dk, dv), g32, glp):
        check_close(f"{name} (dropout)", to_bhsd(got, LAYOUT), want, lp, torch.bfloat16)


# ------------------------------------------------------------------ the generator
def test_generator_advances_by_16_per_call_and_not_without_dropout():
    gen = _gen(3)
    offsets = [_forward_mask(0.1, gen, 1, 1)[1][1].tolist() for _ in range(3)]
    assert offsets == [[3, 0], [3, INCREMENT], [3, 2 * INCREMENT]] and gen.get_offset() == 3 * INCREMENT
    default = torch.cuda.default_generators[torch.cuda.current_device()]
    before = default.get_offset()
    _, aux, _ = _forward_mask(0.1, None, 1, 1)
    seed = default.initial_seed()
    seed = seed - (1 << 64) if seed >= 1 << 63 else seed  # the uint64 seed travels bit-for-bit in an int64 tensor
    assert default.get_offset() - before == INCREMENT and aux[1].tolist() == [seed, before]
    _, aux0, _ = _forward_mask(0.0, gen, 1, 1)
    assert gen.get_offset() == 3 * INCREMENT and aux0[1].tolist() == [0, 0], "a call without dropout draws nothing"


def test_an_empty_batch_advances_the_generator_like_any_call():
    """A zero-size dropout call draws its Philox offsets as a non-empty call would, so that the
    calls after it stay reproducible."""
    gen = _gen(5)
    q = k = v = torch.zeros(0, S, H, D, device="cuda", dtype=torch.bfloat16)
    cu = torch.zeros(1, dtype=torch.int32, device="cuda")
    out, _ = tc.fused_attn_fwd(True, S, S, cu, cu, q, k, v, q.dtype, None, dropout=0.25, rng_gen=gen, **KW)
    assert out.shape == (0, S, H, D)
    assert gen.get_offset() == INCREMENT
    _, aux, _ = _forward_mask(0.25, gen, 1, 1)
    assert aux[1].tolist() == [5, INCREMENT]


def test_concurrent_dropout_calls_draw_distinct_philox_offsets():
    """8 threads x 50 dropout calls on one generator: every call gets its own Philox offset and
    the generator ends exactly 16 x 400 ahead. A read-then-advance that is not atomic lets two
    threads read the same offset (two calls with one mask, and a generator that fell behind);
    a tiny GIL switch interval makes threads switch inside such a window often enough to show it."""
    n_threads, calls = 8, 50
    gen = _gen(11)
    q, k, v = _probe_inputs(1, 1)
    cu = _cu(1, S)
    states: list[torch.Tensor] = []
    errors: list[str] = []

    def worker() -> None:
        try:
            mine = []
            with torch.cuda.stream(torch.cuda.Stream()):
                for _ in range(calls):
                    _, aux = tc.fused_attn_fwd(True, S, S, cu, cu, q, k, v, q.dtype, None, dropout=0.25, rng_gen=gen, **KW)
                    mine.append(aux[1])
                torch.cuda.current_stream().synchronize()
            states.extend(mine)
        except BaseException:  # reported below
            errors.append(traceback.format_exc())

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, "\n".join(errors)
    offsets = sorted(int(s[1]) for s in torch.stack(states).cpu())
    total = n_threads * calls
    duplicates = total - len(set(offsets))
    assert duplicates == 0 and offsets == [INCREMENT * i for i in range(total)], (
        f"{duplicates} calls reused another call's Philox offset; the read-and-advance of the generator is not atomic"
    )
    assert gen.get_offset() == INCREMENT * total
