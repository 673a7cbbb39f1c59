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

import te_cudnn.parallel.ring as ring_mod
import te_cudnn.parallel.ring_pair as pair_mod
import te_cudnn.parallel.ulysses_groups as groups_mod
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


def measure(comm: str, cp: int, h: int, hg: int, d: int, s_local: int, monkeypatch, rank: int = 0, b: int = 1,
            fmt: str = "bshd", mask: str = "causal", dtype=torch.bfloat16, **options) -> dict[str, float]:  # fmt: skip
    """Live bytes per local token of one rank: the peaks of its forward and backward (``fwd``,
    ``bwd``; inputs and the output gradient counted throughout) and what is live between them
    (``kept``: the inputs, the output gradient, the output and what the backward keeps)."""
    from te_cudnn.parallel import a2a_rank_alone, ring_rank_alone

    mode = LiveBytes()
    fwd, bwd = mode.opaque(math_fwd), mode.opaque(math_bwd)
    for module in (ring_mod, groups_mod, pair_mod):
        monkeypatch.setattr(module, "fused_attn_fwd", fwd)
        if hasattr(module, "fused_attn_bwd"):
            monkeypatch.setattr(module, "fused_attn_bwd", bwd)
    g = torch.Generator().manual_seed(cp * 10 + rank)
    shape = lambda n: (b, s_local, n, d) if fmt == "bshd" else (s_local, b, n, d)  # noqa: E731
    q, k, v = (torch.randn(shape(n), generator=g).to(dtype).requires_grad_() for n in (h, hg, hg))
    d_out = torch.randn(shape(h), generator=g).to(dtype)
    alone = ring_rank_alone if comm == "p2p" else a2a_rank_alone
    with mode:
        mode.track(q, k, v, d_out)
        out = alone(q, k, v, cp, rank, qkv_format=fmt, attn_mask_type=mask, **options)
        peak_fwd, kept = mode.peak, mode.now
        mode.reset_peak()
        out.backward(d_out)
        peak_bwd = mode.peak
    tokens = b * s_local
    return {"fwd": peak_fwd / tokens, "bwd": peak_bwd / tokens, "kept": kept / tokens}


def p2p_derived(h: int, hg: int, d: int, e: int, cp: int, rank: int = 0, causal: bool = True,
                version: str = "now", head_groups: int = 1) -> float:  # fmt: skip
    """Bytes per local token a p2p rank holds at its backward's peak (the guide's "Memory per rank"),
    from the code, step by step; ``version="before"``: before the step's gradients and the
    forward's last block were released early and the ring drivers stopped holding a step's
    buffers (the sent block and fp32 dK/dV) into the next step, before the last step's block,
    the rank's own, stopped travelling, and before two ranks' backwards dropped the fp32
    accumulators."""
    from te_cudnn.parallel.schedule import bwd_origin, section

    def grads(i: int) -> float:  # the kernel's dQ, dK, dV of step i's section
        sect = section(rank, bwd_origin(cp, rank, i), causal)
        stats = 2 * h if sect.q_half else 0  # the upper section's stats, copied contiguous (fp32, half the rows)
        return ((h / 2 if sect.q_half else h) + (hg if sect.kv_half else 2 * hg)) * d * e + stats

    if head_groups > 1:  # one group's ring at a time (its own accumulators, blocks and step gradients)
        inputs = (3 * h + 2 * hg) * d * e + 4 * h  # q, k, v, O, dO; every group's fp32 stats
        whole = (h + 2 * hg) * d * e  # dQ, dK, dV of the caller, written group by group
        later = (head_groups - 1) / head_groups * 2 * hg * d * e if cp > 1 else 0  # the other groups' last blocks
        one = p2p_derived(h, hg, d, e, cp, rank, causal) - (3 * h + 2 * hg) * d * e - 4 * h
        return inputs + whole + later + one / head_groups
    if cp == 2 and version == "now":  # te_cudnn.parallel.ring_pair.pair_applies: no fp32 accumulators
        inputs = (3 * h + 2 * hg) * d * e + 4 * h  # q, k, v, O (saved), dO; the fp32 stats
        block = 2 * hg * d * e
        first = block + grads(0)  # the neighbour's block and its step's gradients
        sect = section(rank, bwd_origin(cp, rank, 0), causal)
        dq_other = (h / 2 if sect.q_half else h) * d * e  # held until the own step's dQ takes it
        own = 2 * block + dq_other + (h + 2 * hg) * d * e  # its dK/dV sent, the own one received, own step's
        return inputs + max(first, own)
    fixed = (3 * h + 2 * hg) * d * e + 4 * h + 4 * h * d  # q, k, v, O (saved), dO; the fp32 stats; fp32 dQ
    peak = 0.0
    for i in range(cp):
        # the block attended (the last step's is the rank's own k, v) and the one arriving
        blocks = 0 if cp == 1 else (i < cp - 1) + (i < cp - 2)
        dkv = (1 if i == 0 else 2) * 2 * hg * d * 4  # the travelling fp32 dK/dV: received and sent
        if version == "before" and cp > 1:  # the own block travelled too; the forward's last block was kept
            blocks += (i == cp - 1) + (i == cp - 2) + (i > 0)
            dkv += (i > 1) * 2 * hg * d * 4  # the dK/dV sent a step earlier, still held by the driver
        held = grads(i) + (grads(i - 1) if version == "before" and i > 0 else 0)
        peak = max(peak, blocks * 2 * hg * d * e + dkv + held)
    return fixed + peak


def a2a_derived(h: int, hg: int, d: int, e: int, cp: int, version: str = "now", head_groups: int = 1) -> float:
    """Bytes per local token an a2a rank holds at its backward's peak, from the code (dense
    formats); ``version="before"``: the autograd composition of the all-to-alls and the
    attention (te_cudnn.parallel.ulysses), whose attention kept the head-sharded q, k, v and O
    from the forward; ``"reorder"``: that composition before the dense dual-chunk reorder of the
    output became one permutation (its backward held the received dO and three full-size partial
    sums). ``head_groups``: the head groups the backward exchanges and attends one at a time."""
    inputs = (3 * h + 2 * hg) * d * e  # q, k, v, O, dO (sequence-sharded, the caller's)
    stats = 4 * h  # the fp32 softmax stats of every head
    head_sharded = (3 * h + 2 * hg) * d * e  # q, k, v, O, dO of the heads the kernel works on
    kernel_grads = (h + 2 * hg) * d * e  # the kernel's dQ, dK, dV
    if version == "reorder" and cp >= 2:  # in the reorder's backward: dO received, 3 full-size partial sums
        return inputs + stats + (2 * h + 2 * hg) * d * e + 4 * h * d * e
    if version in ("before", "now") and head_groups == 1:  # the same peak, whatever is kept in between
        return inputs + stats + head_sharded + kernel_grads
    return inputs + stats + kernel_grads + (head_sharded + kernel_grads) / head_groups  # + the gradients, made whole


def a2a_kept(h: int, hg: int, d: int, e: int, version: str = "now") -> float:
    """Bytes per local token an a2a rank holds between its forward and backward: the inputs, dO,
    the output and the stats; ``"before"``: also the head-sharded q, k, v and O."""
    now = (3 * h + 2 * hg) * d * e + 4 * h  # q, k, v, dO, O; the stats
    return now + ((2 * h + 2 * hg) * d * e if version == "before" else 0)
