"""Zero-size calls: their results, made without cuDNN.

A batch, sequence or token count of 0, an all-empty THD batch, or a ``max_seqlen_*`` of 0
leaves nothing to attend. Such calls are normal in real pipelines (the last shard of a data
loader, a context-parallel rank with no valid tokens, a filtered microbatch), and cuDNN must
never see their graphs: a padding-mask graph with s = 0 kills the process with SIGFPE inside
cuDNN's heuristics, b = 0 is ``CUDNN_STATUS_BAD_PARAM`` (cuDNN 9.19).
:meth:`te_cudnn.backends.SubBackend.build` refuses them; ``fused_attn_fwd`` / ``fused_attn_bwd``
answer them here, after the same validation as any call. The results:

* ``out``: zeros of the usual shape and format (a query row with no keys attends to nothing);
* ``aux_ctx_tensors[0]``: the usual shape; fp32 softmax stats are ``-inf`` (the logsumexp of
  no keys), a max512 softmax S is zeros;
* ``rng_state``: the generator advances exactly as a non-empty call would, so that later
  calls draw the same masks whether or not an empty batch came in between;
* gradients: zeros in the layout's own format (packed layouts: views of one buffer), dBias
  zeros in the bias' shape;
* FP8 amaxes: 0 at their slots (the amax of no elements).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .config import AttnConfig
from .layouts import alloc_qkv_grads

__all__ = ["empty_fwd", "empty_bwd"]


def _zero_slots(slots: Sequence[tuple[Optional[torch.Tensor], int]]) -> None:
    for table, offset in slots:
        if table is not None:
            table.narrow(0, offset, 1).zero_()


def empty_fwd(
    cfg: AttnConfig,
    q: torch.Tensor,
    out: Optional[torch.Tensor],
    softmax_lse: Optional[torch.Tensor],
    stats_shape: Sequence[int],
    stats_dtype: torch.dtype,
    amax_slots: Sequence[tuple[Optional[torch.Tensor], int]] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, stats)`` of a zero-size forward (``out`` / ``softmax_lse`` filled if given)."""
    if out is None:
        out = torch.zeros((*q.shape[:-1], cfg.d_v), dtype=q.dtype, device=q.device)
    else:
        out.zero_()
    fill = float("-inf") if stats_dtype == torch.float32 else 0.0
    if softmax_lse is None:
        softmax_lse = torch.full(tuple(stats_shape), fill, dtype=stats_dtype, device=q.device)
    else:
        softmax_lse.fill_(fill)
    _zero_slots(amax_slots)
    return out, softmax_lse


def empty_bwd(
    cfg: AttnConfig,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Optional[torch.Tensor],
    amax_slots: Sequence[tuple[Optional[torch.Tensor], int]] = (),
) -> list[Optional[torch.Tensor]]:
    """``[dq, dk, dv, dbias, d_softmax_offset]`` of a zero-size backward: zeros (None where
    there is no such gradient)."""
    dq, dk, dv = alloc_qkv_grads(cfg.layout, q, k, v, zero=True, dtype=cfg.do_dtype)
    dbias = torch.zeros_like(bias) if bias is not None and cfg.has_dbias else None
    d_sink = torch.zeros((1, cfg.h, 1, 1), dtype=torch.float32, device=q.device) if cfg.has_dsink else None
    _zero_slots(amax_slots)
    return [dq, dk, dv, dbias, d_sink]
