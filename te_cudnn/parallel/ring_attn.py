"""The p2p ring as one autograd function, optionally one head group at a time.

:class:`RingAttn` runs the rank programs of :mod:`~te_cudnn.parallel.ring` through a transport
driver, folds in the attention sink once per row (:mod:`~te_cudnn.parallel.ring_sink`) and
returns the outputs in q's dtype; its backward runs the backward programs from the saved
inputs, outputs and stats.

``head_groups = G`` runs the whole ring for ``h / G`` query heads (and the key/value heads they
use) at a time, forward and backward, on views of the caller's tensors: the fp32 accumulators
(O; dQ and the travelling dK/dV), the key/value blocks in flight, a step's kernel gradients and
cuDNN's workspace are those of one group, so what a rank holds beyond its inputs drops about
``G``-fold, for ``G`` times the ring's messages (each ``1 / G`` the size) and smaller kernels.
The outputs and gradients are allocated once and each group writes its heads. Every head is
computed by the same steps as with one group, so the outputs and the gradients of q, k, v are
the same bit for bit (the learnable sink's gradient sums the same terms in another order).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional

import torch

from ..autograd import _readable_grad
from .partition import group_heads
from .halo import HaloTiles, halo_backward_program, halo_forward_program
from .ring import RingSpec, backward_program, forward_program
from .ring_pair import pair_applies, pair_backward_program, pair_forward_applies, pair_forward_program
from .ring_sink import add_sink, sink_grad, sink_logits

__all__ = ["RingJob", "RingAttn"]


@dataclass(frozen=True)
class RingJob:
    """One ring call of the listed ranks (one on a process group, all ``cp`` in a simulation)."""

    specs: tuple[RingSpec, ...]
    tiles: tuple[Any, ...]
    rng_states: tuple[tuple[Optional[torch.Tensor], ...], ...]  # per head group, per listed rank
    run: Callable[[list], list]
    softmax_type: str = "vanilla"
    head_groups: int = 1


def _group_sink(sink: Optional[torch.Tensor], g: int, groups: int) -> Optional[torch.Tensor]:
    if sink is None or groups == 1:
        return sink
    n = sink.numel() // groups
    return sink[g * n : (g + 1) * n]


def _forward(spec: RingSpec, tiles, sink: Optional[torch.Tensor]):
    """The rank program of ``tiles``: the ring, two ranks' joined calls (te_cudnn.parallel.ring_pair)
    or the halo exchange of short causal windows (which folds the sink in itself, before
    rounding its merged rows)."""
    if isinstance(tiles, HaloTiles):
        return partial(halo_forward_program, sink=sink)
    return pair_forward_program if pair_forward_applies(spec, tiles, sink) else forward_program


def _backward(spec: RingSpec, tiles):
    if isinstance(tiles, HaloTiles):
        return halo_backward_program
    return pair_backward_program if pair_applies(spec, tiles) else backward_program


def _add_sinks(results: list, sink: torch.Tensor, job: RingJob) -> None:
    for (acc, lse, *_), spec in zip(results, job.specs):
        add_sink(acc, lse, sink, spec.fmt)


def _place(parts: list, whole: Optional[list], like, g: int, groups: int) -> list:
    """Each listed rank's result of head group ``g`` (fp32, or already in ``like``'s dtype: the
    halo's) in ``like``'s dtype: the whole tensors with one group, else copied into group
    ``g``'s heads of ``whole``."""
    if groups == 1:
        return [p.to(x.dtype) for p, x in zip(parts, like)]
    for p, w in zip(parts, whole):
        group_heads(w, g, groups).copy_(p)
    return whole


class RingAttn(torch.autograd.Function):
    """``RingAttn.apply(job, softmax_offset, *qs, *ks, *vs) -> outs``; differentiable in q, k, v
    and (``learnable``: summed over the listed ranks) the sink logits."""

    @staticmethod
    def forward(ctx, job: RingJob, offset: Optional[torch.Tensor], *tensors: torch.Tensor):
        n, G = len(job.specs), job.head_groups
        qs, ks, vs = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        sink = sink_logits(job.softmax_type, offset, qs[0].shape[-2], qs[0].device)
        outs = None if G == 1 else [q.new_empty(*q.shape[:-1], v.shape[-1]) for q, v in zip(qs, vs)]
        aux = []  # per group: (lse, rng states, last packet) per rank
        for g in range(G):
            g_sink = _group_sink(sink, g, G)
            results = job.run([_forward(s, t, g_sink)(s, t, group_heads(q, g, G), group_heads(k, g, G), group_heads(v, g, G), r)
                               for s, t, q, k, v, r in zip(job.specs, job.tiles, qs, ks, vs, job.rng_states[g])])  # fmt: skip
            if sink is not None and not isinstance(job.tiles[0], HaloTiles):  # once per row, after every block
                _add_sinks(results, g_sink, job)  # (te_cudnn.parallel.ring_sink)
            outs = _place([r[0] for r in results], outs, qs, g, G)
            aux.append([r[1:] for r in results])
            del results  # this group's fp32 accumulators: not alive during the next group
        ctx.job, ctx.sink, ctx.aux = job, sink, aux
        ctx.save_for_backward(*qs, *ks, *vs, *outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *d_outs: Optional[torch.Tensor]):
        job, n, G, saved = ctx.job, len(ctx.job.specs), ctx.job.head_groups, ctx.saved_tensors
        qs, ks, vs, outs = saved[:n], saved[n : 2 * n], saved[2 * n : 3 * n], saved[3 * n :]
        d_outs = [torch.zeros_like(o) if d is None else _readable_grad(d) for d, o in zip(d_outs, outs)]
        if len(ctx.aux[0][0]) < 3:
            raise RuntimeError("the p2p ring's backward runs once: it frees the forward's last key/value block as it "
                               "goes (retain_graph=True is not supported for cp_comm_type='p2p')")  # fmt: skip
        grads = None if G == 1 else [[torch.empty_like(x) for x in xs] for xs in (qs, ks, vs)]
        want_sink = ctx.needs_input_grad[1] and job.softmax_type == "learnable"
        d_sink = [] if want_sink else None
        for g in range(G):
            aux, ctx.aux[g] = ctx.aux[g], [a[:1] for a in ctx.aux[g]]  # the programs own the last blocks
            views = [[group_heads(x, g, G) for x in xs] for xs in (qs, ks, vs, outs, d_outs)]
            programs = [_backward(s, t)(s, t, *tensors, *a)
                        for s, t, *tensors, a in zip(job.specs, job.tiles, *views, aux)]  # fmt: skip
            del aux
            results = job.run(programs)
            grads = [_place([r[i] for r in results], None if grads is None else grads[i], xs, g, G)
                     for i, xs in enumerate((qs, ks, vs))]  # fmt: skip
            del results  # this group's fp32 gradients: not alive during the next group
            if d_sink is not None:
                sink = _group_sink(ctx.sink, g, G)
                d_sink.append(sum(sink_grad(o, d, a[0], sink, s.fmt)
                                  for o, d, a, s in zip(views[3], views[4], ctx.aux[g], job.specs)))  # fmt: skip
        d_offset = None if d_sink is None else torch.cat(d_sink, 1)
        return (None, d_offset, *grads[0], *grads[1], *grads[2])
