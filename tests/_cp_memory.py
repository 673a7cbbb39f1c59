"""Peak live tensor bytes of one simulated rank on the CPU, for the context-parallel memory tests.

:class:`LiveBytes` is a ``TorchDispatchMode``: every op's output storages are counted when they
first appear and uncounted when the storage itself is freed (a weakref on the untyped storage,
whose Python object torch keeps as long as the storage lives, so views keep it counted). In-place
ops and views add nothing. Tensors made before the mode (the rank's inputs, its output gradient)
are counted with :meth:`LiveBytes.track`.

The stand-in kernels are opaque (:meth:`LiveBytes.opaque`): the mode is paused inside them and
only what they return is counted, as a fused kernel's outputs would be. Their own temporaries
(fp64 scores, probabilities) are excluded, and cuDNN's workspace is not modelled: the numbers are
what te_cudnn's orchestration holds, measured the same way for every variant.

One rank is measured alone: p2p through :func:`~te_cudnn.parallel.ring_rank_alone` (the loopback
driver: every received block is a copy of the rank's own, so it allocates exactly what a ring
rank does), a2a through :func:`~te_cudnn.parallel.a2a_rank_alone` (a loopback all-to-all).

:func:`p2p_derived` and :func:`a2a_derived` are the accounting of the context-parallel guide
("Memory per rank"), in bytes per local token, derived from the code.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import te_cudnn.parallel.api as api_mod
import te_cudnn.parallel.ring as ring_mod
from _cp_standin import math_bwd, math_fwd


class LiveBytes(TorchDispatchMode):
    """Live tensor bytes and their peak while active (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0
        self.at_peak: list[int] = []  # the live storages' sizes at the peak (for reading a failure)
        self._paused = 0
        self._refs: dict[int, weakref.ref] = {}

    def track(self, *objs) -> None:
        for t in tree_flatten(objs)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self.live or st.nbytes() == 0:
                continue
            self.live[key] = st.nbytes()
            self.now += st.nbytes()
            if self.now > self.peak:
                self.peak, self.at_peak = self.now, sorted(self.live.values(), reverse=True)
            self._refs[key] = weakref.ref(st, lambda _, key=key: self._free(key))  # kept: its callback fires

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)
        self._refs.pop(key, None)

    def reset_peak(self) -> None:
        self.peak = self.now

    @contextmanager
    def paused(self):
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def opaque(self, fn):
        """``fn`` as one kernel: nothing inside it is counted, its outputs are."""

        def call(*args, **kwargs):
            with self.paused():
                out = fn(*args, **kwargs)
            self.track(out)
            return out

        return call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self._paused:
            self.track(out)
        return out


class StandinAttend(torch.autograd.Function):
    """``te_cudnn.autograd.attend``'s contract for dense no_mask/causal on the CPU, saving what
    :class:`te_cudnn.autograd.FusedAttnFunc` saves (q, k, v, O, the stats) and calling the
    (opaque) stand-in kernels."""

    @staticmethod
    def forward(ctx, q, k, v, opts, fwd, bwd):
        dim = 1 if opts.qkv_layout.startswith("bshd") else 0
        out, aux = fwd(True, q.shape[dim], k.shape[dim], None, None, q, k, v, q.dtype, attn_scale=opts.attn_scale, dropout=0.0,
                       qkv_layout=opts.qkv_layout, attn_mask_type=opts.attn_mask_type)  # fmt: skip
        ctx.save_for_backward(q, k, v, out, aux[0])
        ctx.opts, ctx.bwd, ctx.rng = opts, bwd, aux[1]
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        o = ctx.opts
        dim = 1 if o.qkv_layout.startswith("bshd") else 0
        dq, dk, dv, _, _ = ctx.bwd(q.shape[dim], k.shape[dim], None, None, q, k, v, out, d_out.contiguous(), q.dtype,
                                   [lse, ctx.rng], attn_scale=o.attn_scale, dropout=0.0, qkv_layout=o.qkv_layout,
                                   attn_mask_type=o.attn_mask_type, deterministic=o.deterministic)  # fmt: skip
        return dq, dk, dv, None, None, None


def measure(comm: str, cp: int, h: int, hg: int, d: int, s_local: int, monkeypatch, rank: int = 0, b: int = 1,
            fmt: str = "bshd", mask: str = "causal", dtype=torch.bfloat16) -> dict[str, float]:  # fmt: skip
    """Peak live bytes per local token of one rank's forward and backward (``fwd``, ``bwd``:
    the peak while each ran, inputs and the output gradient counted throughout)."""
    from te_cudnn.parallel import a2a_rank_alone, ring_rank_alone

    mode = LiveBytes()
    fwd, bwd = mode.opaque(math_fwd), mode.opaque(math_bwd)
    monkeypatch.setattr(ring_mod, "fused_attn_fwd", fwd)
    monkeypatch.setattr(ring_mod, "fused_attn_bwd", bwd)

    def attend(q, k, v, bias, cu_q, cu_kv, max_q, max_kv, is_training, rng_gen, opts, *rest, **kwargs):
        return StandinAttend.apply(q, k, v, opts, fwd, bwd)

    monkeypatch.setattr(api_mod, "attend", attend)
    g = torch.Generator().manual_seed(cp * 10 + rank)
    shape = lambda n: (b, s_local, n, d) if fmt == "bshd" else (s_local, b, n, d)  # noqa: E731
    q, k, v = (torch.randn(shape(n), generator=g).to(dtype).requires_grad_() for n in (h, hg, hg))
    d_out = torch.randn(shape(h), generator=g).to(dtype)
    alone = ring_rank_alone if comm == "p2p" else a2a_rank_alone
    with mode:
        mode.track(q, k, v, d_out)
        out = alone(q, k, v, cp, rank, qkv_format=fmt, attn_mask_type=mask)
        peak_fwd = mode.peak
        mode.reset_peak()
        out.backward(d_out)
        peak_bwd = mode.peak
    tokens = b * s_local
    return {"fwd": peak_fwd / tokens, "bwd": peak_bwd / tokens}


def p2p_derived(h: int, hg: int, d: int, e: int, cp: int, rank: int = 0, causal: bool = True,
                version: str = "now") -> float:  # fmt: skip
    """Bytes per local token a p2p rank holds at its backward's peak (the guide's "Memory per rank"),
    from the code, step by step; ``version="before"``: before the step's gradients and the
    forward's last block were released early and the ring drivers stopped holding a step's
    buffers (the sent block and fp32 dK/dV) into the next step."""
    from te_cudnn.parallel.schedule import bwd_origin, section

    def grads(i: int) -> float:  # the kernel's dQ, dK, dV of step i's section
        sect = section(rank, bwd_origin(cp, rank, i), causal)
        stats = 2 * h if sect.q_half else 0  # the upper section's stats, copied contiguous (fp32, half the rows)
        return ((h / 2 if sect.q_half else h) + (hg if sect.kv_half else 2 * hg)) * d * e + stats

    fixed = (3 * h + 2 * hg) * d * e + 4 * h + 4 * h * d  # q, k, v, O (saved), dO; the fp32 stats; fp32 dQ
    peak = 0.0
    for i in range(cp):
        blocks = 0 if cp == 1 else (i < cp - 1) + 1  # the block attended and the one arriving
        dkv = (1 if i == 0 else 2) * 2 * hg * d * 4  # the travelling fp32 dK/dV: received and sent
        if version == "before" and i > 0:
            blocks += 1  # the forward's last block, held by the autograd context
            dkv += (i > 1) * 2 * hg * d * 4  # the dK/dV sent a step earlier, still held by the driver
        held = grads(i) + (grads(i - 1) if version == "before" and i > 0 else 0)
        peak = max(peak, blocks * 2 * hg * d * e + dkv + held)
    return fixed + peak


def a2a_derived(h: int, hg: int, d: int, e: int, cp: int, version: str = "now") -> float:
    """Bytes per local token an a2a rank holds at its backward's peak, from the code (dense
    formats); ``version="before"``: before the dense dual-chunk reorder of the output became one
    permutation (its backward held the received dO and three full-size partial sums)."""
    inputs = (3 * h + 2 * hg) * d * e  # q, k, v, O, dO (sequence-sharded, the caller's)
    saved = (2 * h + 2 * hg) * d * e + 4 * h  # head-sharded q, k, v, O saved by the attention; its stats
    if version == "before" and cp >= 2:  # in the reorder's backward: dO received, 3 full-size partial sums
        return inputs + saved + 4 * h * d * e
    return inputs + saved + h * d * e + (h + 2 * hg) * d * e  # dO head-sharded; the kernel's dQ, dK, dV
