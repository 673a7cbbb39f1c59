"""All-to-all ("a2a") context parallelism that keeps only the sequence-sharded tensors.

The composition in :mod:`~te_cudnn.parallel.ulysses` leaves autograd to keep the head-sharded
q, k, v and O (the attention's saved tensors) from the forward to the backward, beside the
caller's sequence-sharded ones: two copies of the layer's activations. :class:`GroupedA2A`
keeps the caller's tensors and the softmax stats only, and its backward exchanges q, k, v, O
and dO again (five all-to-alls instead of one; the bytes are O(S), the attention O(S^2)).

``head_groups = G`` runs the exchange and the attention for ``h / G`` heads at a time, one
group after another, in both directions: a rank then holds the head-sharded tensors, the
kernel's gradients and cuDNN's backward workspace of one group only, so the memory a rank needs
beyond single-GPU attention over its share drops about ``G``-fold, for ``G`` times the
collectives and smaller kernels. The gradients of the caller's q, k, v are then allocated once
and each group's part is copied into its heads (``G = 1``: the received tensors are the
gradients, no copy).

Heads: group ``g`` holds query heads ``[g h / G, (g + 1) h / G)`` and the key/value heads they
use (GQA keeps its ratio), and the all-to-all gives rank ``r`` the ``r``-th ``1 / cp`` of each
group's heads. A bias or sink sliced by heads follows the same order; their gradients are this
rank's heads only (the caller sums them over the group, as for the composition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..autograd import AttnOptions, _readable_grad
from ..ops import fused_attn_bwd, fused_attn_fwd
from ..varlen import BatchLengths
from .partition import group_heads
from .ulysses import ExchangeAll, heads_to_sequence, sequence_to_heads

__all__ = ["A2aJob", "GroupedA2A"]


@dataclass(frozen=True)
class A2aJob:
    """One a2a call of the listed ranks (one on a process group, all ``cp`` in a simulation)."""

    ranks: tuple[int, ...]
    cp: int
    fmt: str
    head_groups: int
    cu: tuple[Optional[torch.Tensor], ...]  # cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded
    max_seqlen: tuple[int, int]
    options: AttnOptions
    rng_gen: Optional[torch.Generator]
    exchange: ExchangeAll


def _rank_heads(t: Optional[torch.Tensor], g: int, rank: int, job: A2aJob, heads: int) -> Optional[torch.Tensor]:
    """The heads of group ``g`` that rank ``rank`` attends, of a tensor with heads in dim 1
    (a bias ``[1|b, 1|h, S, S]``, sink logits ``[1, h, 1, 1]``); whole when it broadcasts."""
    if t is None or t.shape[1] == 1:
        return t
    n = heads // (job.head_groups * job.cp)
    return t.narrow(1, (g * job.cp + rank) * n, n)


def _attn_kwargs(job: A2aJob) -> dict:
    o, (cu_q, cu_kv, pad_q, pad_kv) = job.options, job.cu
    return dict(attn_scale=o.attn_scale, dropout=o.dropout, qkv_layout=o.qkv_layout, attn_bias_type=o.attn_bias_type,
                attn_mask_type=o.attn_mask_type, softmax_type=o.softmax_type, window_size=o.window_size,
                bottom_right_diagonal=o.bottom_right_diagonal, cu_seqlens_q_padded=pad_q,
                cu_seqlens_kv_padded=pad_kv)  # fmt: skip


def _to_sequence(job: A2aJob, xs: Sequence[torch.Tensor], g: int, padded: Optional[torch.Tensor]) -> list[torch.Tensor]:
    return heads_to_sequence([group_heads(x, g, job.head_groups) for x in xs], job.cp, job.fmt, padded, job.exchange)


def _to_heads(job: A2aJob, outs: list, xs: list, g: int, padded: Optional[torch.Tensor]) -> list:
    """``outs`` (whole sequences, this group's heads) back to the ranks' shares: the results
    themselves with one group, else copied into group ``g``'s heads of ``xs``."""
    back = sequence_to_heads(outs, job.cp, job.fmt, padded, job.exchange)
    if job.head_groups == 1:
        return back
    for x, b in zip(xs, back):
        group_heads(x, g, job.head_groups).copy_(b)
    return xs


def _add_by_heads(full: Optional[torch.Tensor], parts: list, g: int, job: A2aJob, heads: int) -> None:
    """Add each listed rank's gradient of group ``g``'s heads (a bias, sink logits) into ``full``."""
    if full is not None:
        for rank, part in zip(job.ranks, parts):
            if part is not None:
                _rank_heads(full, g, rank, job, heads).add_(part.to(full.dtype))


class GroupedA2A(torch.autograd.Function):
    """``GroupedA2A.apply(job, attn_bias, softmax_offset, *qs, *ks, *vs) -> outs``; differentiable
    in q, k, v, a post-scale bias (where cuDNN gives dBias) and learnable sink logits (this
    rank's heads; the caller sums over the group)."""

    @staticmethod
    def forward(ctx, job: A2aJob, bias: Optional[torch.Tensor], offset: Optional[torch.Tensor], *tensors):
        n, G = len(job.ranks), job.head_groups
        qs, ks, vs = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        h, (cu_q, cu_kv, pad_q, pad_kv) = qs[0].shape[-2], job.cu
        lengths = None if cu_q is None else BatchLengths(cu_q, cu_kv, pad_q, pad_kv)
        kw = _attn_kwargs(job)
        outs = [] if G == 1 else [q.new_empty(*q.shape[:-1], v.shape[-1]) for q, v in zip(qs, vs)]
        auxes = []
        for g in range(G):
            qq, kk, vv = _to_sequence(job, qs, g, pad_q), _to_sequence(job, ks, g, pad_kv), _to_sequence(job, vs, g, pad_kv)
            results = []
            for i, rank in enumerate(job.ranks):
                sink = _rank_heads(offset, g, rank, job, h)
                results.append(fused_attn_fwd(
                    True, *job.max_seqlen, cu_q, cu_kv, qq[i], kk[i], vv[i], qq[i].dtype,
                    job.options.fused_attention_backend, attn_bias=_rank_heads(bias, g, rank, job, h),
                    rng_gen=job.rng_gen, lengths=lengths, softmax_offset=None if sink is None else sink.clone(), **kw,
                ))  # fmt: skip
            del qq, kk, vv
            auxes.append([r[1] for r in results])
            outs = _to_heads(job, [r[0] for r in results], outs, g, pad_q)
            del results  # this group's outputs are the ranks' now: not alive during the next group
        ctx.job, ctx.auxes, ctx.lengths, ctx.heads = job, auxes, lengths, h
        ctx.save_for_backward(*qs, *ks, *vs, *outs, bias, offset)
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *d_outs: Optional[torch.Tensor]):
        job, auxes, h = ctx.job, ctx.auxes, ctx.heads
        n, G = len(job.ranks), job.head_groups
        saved = ctx.saved_tensors
        qs, ks, vs, outs = saved[:n], saved[n : 2 * n], saved[2 * n : 3 * n], saved[3 * n : 4 * n]
        bias, offset = saved[4 * n :]
        d_outs = [torch.zeros_like(o) if d is None else _readable_grad(d) for d, o in zip(d_outs, outs)]
        cu_q, cu_kv, pad_q, pad_kv = job.cu
        kw = _attn_kwargs(job)
        dqs, dks, dvs = ([], [], []) if G == 1 else ([torch.empty_like(x) for x in xs] for xs in (qs, ks, vs))
        dbias = None if bias is None or not ctx.needs_input_grad[1] else torch.zeros_like(bias)
        d_offset = None if offset is None or not ctx.needs_input_grad[2] else torch.zeros_like(offset)
        for g in range(G):
            qq, kk, vv = _to_sequence(job, qs, g, pad_q), _to_sequence(job, ks, g, pad_kv), _to_sequence(job, vs, g, pad_kv)
            oo, dd = _to_sequence(job, outs, g, pad_q), _to_sequence(job, d_outs, g, pad_q)
            grads = [fused_attn_bwd(
                *job.max_seqlen, cu_q, cu_kv, qq[i], kk[i], vv[i], oo[i], dd[i], qq[i].dtype, auxes[g][i],
                job.options.fused_attention_backend, deterministic=job.options.deterministic, lengths=ctx.lengths,
                **kw,
            ) for i in range(n)]  # fmt: skip
            del qq, kk, vv, oo, dd
            _add_by_heads(dbias, [x[3] for x in grads], g, job, h)
            _add_by_heads(d_offset, [x[4] for x in grads], g, job, h)
            dqs = _to_heads(job, [x[0] for x in grads], dqs, g, pad_q)
            dks = _to_heads(job, [x[1] for x in grads], dks, g, pad_kv)
            dvs = _to_heads(job, [x[2] for x in grads], dvs, g, pad_kv)
            del grads  # not alive during the next group
        return (None, dbias, d_offset, *dqs, *dks, *dvs)
