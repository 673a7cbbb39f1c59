"""Attention sinks on the p2p ring: the sink enters each row's softmax once, after the ring.

With the sink logit ``s_h`` of head ``h`` (``softmax_type="off_by_one"``: 0; ``"learnable"``:
``softmax_offset``), row ``i``'s softmax over keys ``j`` and the sink is
``p_ij = exp(x_ij - L_i)``, ``p_sink,i = exp(s_h - L_i)`` with ``L_i = logaddexp(lse_i, s_h)``,
where ``lse_i`` is the log-sum-exp over the keys alone: exactly what the ring's merged
accumulators hold. So the ring runs vanilla fused calls and, once every block has been
attended, :func:`add_sink` folds the sink in: ``L = logaddexp(lse, s_h)``,
``O = O exp(lse - L)`` (the sink has no value row). Adding it at a step instead would need one
designated step per row; after the ring it is added once by construction, and ranks with
rows that no step reached (none here: every window holds its diagonal) would still be right.

Backward: the fused backward of every block, given the final ``O`` and ``L``, already
computes ``p_ij`` and ``D_i = dO_i . O_i`` with the sink in the normaliser, so the kernels
need no sink. The sink's own gradient is ``d s_h = sum_i p_sink,i (0 - D_i)`` (it has no value,
so its ``dP`` is 0), summed over the batch and the rank's rows (:func:`sink_grad`) and then
over the group (the caller sums over virtual ranks, or all-reduces on a real group).
"""

from __future__ import annotations

from typing import Optional

import torch

from .ring import lse_rows

__all__ = ["sink_logits", "add_sink", "sink_grad"]


def sink_logits(softmax_type: str, offset: Optional[torch.Tensor], heads: int,
                device: torch.device) -> Optional[torch.Tensor]:  # fmt: skip
    """fp32 ``[heads]`` sink logits (zeros for ``off_by_one`` without an offset), or None for a
    vanilla softmax."""
    if softmax_type == "vanilla":
        return None
    if offset is None:
        return torch.zeros(heads, dtype=torch.float32, device=device)
    return offset.detach().float().reshape(heads)


def _stats_shaped(sink: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The logits as a view broadcastable to the stats (dense ``[b, h, s, 1]``, THD ``[t, h, 1]``)."""
    return sink.view(1, -1, 1, 1) if lse.dim() == 4 else sink.view(1, -1, 1)


def add_sink(acc_o: torch.Tensor, acc_lse: torch.Tensor, sink: torch.Tensor, fmt: str) -> None:
    """Fold the sink into the ring's fp32 accumulators, in place."""
    new = torch.logaddexp(acc_lse, _stats_shaped(sink, acc_lse))
    acc_o.mul_(lse_rows(torch.exp(acc_lse - new), fmt))  # rows nothing reached: exp(-inf) = 0
    acc_lse.copy_(new)


def sink_grad(out: torch.Tensor, d_out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp32 ``[1, h, 1, 1]``: ``-sum over rows of exp(s_h - L) (dO . O)`` for one rank's rows."""
    big_d = (d_out.float() * out.float()).sum(-1, keepdim=True)  # [..., h, 1] in O's layout
    p_sink = lse_rows(torch.exp(_stats_shaped(sink, lse) - lse), fmt)
    return -(p_sink * big_d).movedim(-2, 0).reshape(sink.numel(), -1).sum(1).view(1, -1, 1, 1)
