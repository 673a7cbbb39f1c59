"""All-to-all ("a2a", DeepSpeed-Ulysses) context parallelism.

Each rank starts with its dual-chunk share of the sequence and all ``h`` heads. One
all-to-all per tensor trades that for the *whole* sequence (in natural order) and ``h / cp``
heads; attention then runs as one ordinary te_cudnn call, so every feature of the local
attention works here: masks and sliding windows, post-scale bias (sliced by heads), attention
sinks, dropout, FP8 (through ``fp8_meta``) and THD batches. A last all-to-all brings the output
back to the sequence split. Every step is a differentiable torch operation (the all-to-all's
gradient is the reverse all-to-all), so autograd gives the backward.

Tensors shared by all ranks and sliced by heads here (the bias, the sink logits) get their
gradients summed over the group (:class:`SumGradOverGroup`), so that every rank holds the
full gradient, as for any parameter replicated across the context-parallel group.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from .partition import shard, unshard

__all__ = ["heads_to_ranks", "simulated_exchange", "a2a_attention", "SumGradOverGroup", "head_slice",
           "heads_to_sequence", "sequence_to_heads"]

ExchangeAll = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]


def heads_to_ranks(x: torch.Tensor, cp: int) -> torch.Tensor:
    """``[..., h, d]`` -> ``[cp, ..., h / cp, d]`` (slice ``i``: the head group of rank ``i``), a view."""
    return x.unflatten(-2, (cp, x.shape[-2] // cp)).movedim(-3, 0)


class SumGradOverGroup(torch.autograd.Function):
    """Identity forward; the backward all-reduces (sums) the gradient over the group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def head_slice(t: Optional[torch.Tensor], dim: int, cp: int, rank: int, heads: int) -> Optional[torch.Tensor]:
    """Rank ``rank``'s heads of a tensor with a head dim ``dim`` (left whole when it broadcasts)."""
    if t is None or t.shape[dim] == 1:
        return t
    if t.shape[dim] != heads:
        raise ValueError(f"a tensor sliced by heads has {t.shape[dim]} entries in dim {dim}, expected {heads} or 1")
    return t.narrow(dim, rank * (heads // cp), heads // cp)


def simulated_exchange(sends: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """All-to-all among virtual ranks in one process: ``recv[r][s] = sends[s][r]`` (differentiable)."""
    return [torch.stack([send[r] for send in sends]) for r in range(len(sends))]


def heads_to_sequence(xs: Sequence[torch.Tensor], cp: int, fmt: str, padded: Optional[torch.Tensor],
                      exchange: ExchangeAll) -> list[torch.Tensor]:  # fmt: skip
    """The first all-to-all: every listed rank's dual-chunk share with all ``h`` heads ->
    the whole sequence of its group (natural order) with ``h / cp`` heads. ``padded``: the
    group's THD padded offsets (None for dense formats)."""
    received = exchange([heads_to_ranks(x, cp) for x in xs])  # [cp (source rank), local..., h / cp, d]
    return [unshard(list(r.unbind(0)), fmt, padded) for r in received]


class _Chunks(torch.autograd.Function):
    """``x`` with its ``n`` equal chunks along ``dim`` taken in ``order`` (a permutation), as one
    copy; the backward is the inverse permutation of the gradient (one copy, no zero-filled
    full-size partial gradients per chunk as narrow-and-cat would make)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, order: torch.Tensor) -> torch.Tensor:
        ctx.dim, ctx.inverse = dim, torch.argsort(order)
        return x.unflatten(dim, (order.numel(), -1)).index_select(dim, order).flatten(dim, dim + 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        g = grad.unflatten(ctx.dim, (ctx.inverse.numel(), -1)).index_select(ctx.dim, ctx.inverse)
        return g.flatten(ctx.dim, ctx.dim + 1), None, None


def _dense_shards(o: torch.Tensor, cp: int, fmt: str) -> torch.Tensor:
    """``[cp, ...]``: every rank's dual-chunk share of a dense whole sequence (as stacking
    :func:`~te_cudnn.parallel.partition.shard` of every rank, in one permutation)."""
    dim = 1 if fmt == "bshd" else 0
    order = [c for r in range(cp) for c in (r, 2 * cp - 1 - r)]
    y = _Chunks.apply(o, dim, torch.tensor(order, device=o.device))
    return y.unflatten(dim, (cp, -1)).movedim(dim, 0)


def sequence_to_heads(outs: Sequence[torch.Tensor], cp: int, fmt: str, padded: Optional[torch.Tensor],
                      exchange: ExchangeAll) -> list[torch.Tensor]:  # fmt: skip
    """The inverse all-to-all of :func:`heads_to_sequence`: whole sequences with ``h / cp``
    heads -> every listed rank's dual-chunk share with all ``h`` heads."""
    if fmt == "thd":
        sends = [torch.stack([shard(o, cp, r, fmt, padded) for r in range(cp)]) for o in outs]
    else:
        sends = [_dense_shards(o, cp, fmt) for o in outs]
    return [x.movedim(0, -3).flatten(-3, -2) for x in exchange(sends)]  # [local..., h, d]


def a2a_attention(attn: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor], ranks: Sequence[int],
                  qs, ks, vs, cp: int, fmt: str, cu_padded: tuple[Optional[torch.Tensor], Optional[torch.Tensor]],
                  exchange: ExchangeAll) -> list[torch.Tensor]:  # fmt: skip
    """Ulysses attention of the ranks ``ranks`` (all ``cp`` of them in a simulation, one on a
    real group): ``exchange`` maps every listed rank's ``[cp, ...]`` send to its receive, and
    ``attn(rank, q, k, v)`` attends the whole sequence with one head group."""
    pad_q, pad_kv = cu_padded
    qq = heads_to_sequence(qs, cp, fmt, pad_q, exchange)
    kk, vv = heads_to_sequence(ks, cp, fmt, pad_kv, exchange), heads_to_sequence(vs, cp, fmt, pad_kv, exchange)
    outs = [attn(rank, *qkv) for rank, *qkv in zip(ranks, qq, kk, vv)]
    return sequence_to_heads(outs, cp, fmt, pad_q, exchange)
