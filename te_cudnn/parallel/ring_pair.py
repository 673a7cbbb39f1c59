"""Two ranks (``cp = 2``, bshd/sbhd without a window): the p2p ring without fp32 accumulators.

With two ranks a rank sees one block besides its own, so no row needs a running merge:

* **Forward** (no dropout, no sink): the neighbour's keys and values are joined to the rank's
  own, in sequence order, and every query row is computed by one fused call against the keys it
  reaches. With the dual-chunk split (rank 0 holds chunks 0 and 3 of ``c`` tokens, rank 1
  chunks 1 and 2) and a causal mask, rank 1's queries reach ``[chunk 0, its own two]`` with the
  diagonal at the bottom right, rank 0's chunk 3 reaches all four chunks likewise, and rank 0's
  chunk 0 reaches only itself (computed while the block travels). Without a mask every query
  reaches the own and the neighbour's block. The outputs come from the kernels in the inputs'
  dtype: no fp32 output, no merge passes.
* **Backward**: every row of dQ, dK and dV is the sum of exactly two kernel results, the
  neighbour's block's and the rank's own. The own block's gradients, in q's dtype, take the
  neighbour block's in place (fp32 arithmetic, rounded once: the fp32 accumulators' result bit
  for bit), and the gradient of the neighbour's block travels in k's dtype. The neighbour's
  block comes first (it is the forward's last packet); the own block's step overlaps the
  exchange.

With dropout (the backward's calls must see the forward's masks, call for call) or a sink
(folded into the merged rows) the forward is the ring's (:func:`~te_cudnn.parallel.ring.forward_program`).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..ops import fused_attn_fwd
from .ring import DenseTiles, RingSpec, _packet, _unpack
from .schedule import bwd_origin, fwd_step_of
from .transport import Post, Wait

__all__ = ["pair_applies", "pair_forward_applies", "pair_forward_program", "pair_backward_program"]


def pair_applies(spec: RingSpec, tiles) -> bool:
    """Two ranks, one fused call per step (dense sections): the backward of this module."""
    return spec.cp == 2 and isinstance(tiles, DenseTiles)


def pair_forward_applies(spec: RingSpec, tiles, sink: Optional[torch.Tensor]) -> bool:
    """:func:`pair_applies` without dropout or sink: the forward of this module."""
    return pair_applies(spec, tiles) and spec.dropout == 0.0 and sink is None


def _rows(tiles: DenseTiles, t: torch.Tensor, start: int, length: int) -> torch.Tensor:
    return t.narrow(tiles.dim, start, length)


def _call(tiles: DenseTiles, q, k, v, mask: str, out: Optional[torch.Tensor] = None):
    """One fused forward; ``out`` (a view of the rank's output) is written in place when cuDNN
    can (contiguous), else copied into."""
    spec, dim = tiles.spec, tiles.dim
    o, aux = fused_attn_fwd(True, q.shape[dim], k.shape[dim], None, None, q, k, v, q.dtype, attn_scale=spec.attn_scale,
                            dropout=0.0, qkv_layout=spec.layout, attn_mask_type=mask,
                            out=out if out is not None and out.is_contiguous() else None)  # fmt: skip
    if out is not None and o is not out:
        out.copy_(o)
    return o, aux[0], aux[1]


def pair_forward_program(spec: RingSpec, tiles: DenseTiles, q, k, v, rng_states=None):
    """One rank's forward (a generator for a transport driver): (O and lse of the rank's rows,
    O in q's dtype, the rng states of both steps, the neighbour's block for the backward)."""
    del rng_states  # no dropout: the calls draw nothing
    packet = _packet(k, v)
    incoming = torch.empty_like(packet)
    handle = yield Post((packet,), (incoming,), forward=True)
    c, c_kv = tiles.half_q, tiles.half_kv
    split = spec.causal and spec.rank == 0
    if split:  # rank 0's chunk 0 reaches only itself: computed while the block travels
        o = q.new_empty((*q.shape[:-1], v.shape[-1]))
        _, lse_a, rng = _call(tiles, _rows(tiles, q, 0, c), _rows(tiles, k, 0, c_kv), _rows(tiles, v, 0, c_kv),
                              "causal", out=_rows(tiles, o, 0, c))  # fmt: skip
    yield Wait(handle)
    del packet
    nk, nv = _unpack(incoming, k.shape, v.shape)
    dim = tiles.dim
    if not spec.causal:
        o, lse, rng = _call(tiles, q, torch.cat((k, nk), dim), torch.cat((v, nv), dim), "no_mask")
    elif spec.rank == 1:  # [chunk 0 | chunks 1, 2]
        joined = [torch.cat((_rows(tiles, n, 0, c_kv), t), dim) for n, t in ((nk, k), (nv, v))]
        o, lse, rng = _call(tiles, q, *joined, "causal_bottom_right")
    else:  # rank 0's chunk 3: [chunk 0 | chunks 1, 2 | chunk 3]
        joined = [torch.cat((_rows(tiles, t, 0, c_kv), n, _rows(tiles, t, c_kv, c_kv)), dim) for n, t in ((nk, k), (nv, v))]
        _, lse_b, _ = _call(tiles, _rows(tiles, q, c, c), *joined, "causal_bottom_right", out=_rows(tiles, o, c, c))
        lse = torch.cat((lse_a, lse_b), 2)
    return o, lse, [rng, rng], incoming


def pair_backward_program(spec: RingSpec, tiles: DenseTiles, q, k, v, o, d_o, lse, rngs, packet):
    """One rank's backward (a generator): (dq, dk, dv) of the rank's own tokens in their dtype.
    ``packet``, the neighbour's block, is freed after its step."""
    r = spec.rank
    origin = bwd_origin(2, r, 0)
    sect, grads = tiles.backward_step(origin, q, *_unpack(packet, k.shape, v.shape), o, d_o, lse,
                                      rngs[fwd_step_of(2, r, origin)])  # fmt: skip
    del packet
    dq_other = grads[0]
    outgoing = torch.zeros(k.numel() + v.numel(), dtype=k.dtype, device=k.device)  # rows outside the section: 0
    out_k, out_v = _unpack(outgoing, k.shape, v.shape)
    tiles._kv(out_k, sect).copy_(grads[1])
    tiles._kv(out_v, sect).copy_(grads[2])
    del grads, out_k, out_v
    incoming = torch.empty_like(outgoing)
    handle = yield Post((outgoing,), (incoming,), forward=False)
    _, (dq, dk, dv) = tiles.backward_step(r, q, k, v, o, d_o, lse, rngs[fwd_step_of(2, r, r)])  # every row and key
    tiles._q(dq, sect).add_(dq_other)
    del dq_other
    yield Wait(handle)
    del outgoing
    back_k, back_v = _unpack(incoming, k.shape, v.shape)
    dk.add_(back_k)
    dv.add_(back_v)
    return dq, dk, dv
