"""All-gather ("all_gather", Llama 3) context parallelism.

Each rank all-gathers the key/value shares of the group once (one collective on a flat buffer
of k and v), puts them in natural sequence order, and attends its own two query chunks
(``r`` and ``2cp-1-r``, the dual-chunk split of :mod:`~te_cudnn.parallel.partition`) to the
keys each chunk reaches, one fused te_cudnn call per chunk. Every call sees all of its rows'
keys, so there is no log-sum-exp merge; the sink of ``softmax_type`` ``off_by_one`` /
``learnable`` enters each row's softmax once, in that row's own call.

Which keys a chunk needs (:func:`plan_tiles`): chunk ``j`` holds global query positions
``[j c, (j + 1) c)``; with the window ``(left, right)`` (``-1``: unbounded; causal is
``right = 0``) it reaches keys ``[max(0, j c - left), min(S, (j + 1) c + right))`` and nothing
else is computed. The call aligns its mask bottom-right (``causal_bottom_right``, or the window
with ``bottom_right_diagonal=True``) and shifts the window by the slice's ends, as
TransformerEngine's ``get_kv_seq_info_after_all_gather`` does. A call without mask or window
needs every key: both chunks then go through one call.

Backward: the key/value shares are all-gathered again (the forward keeps only the local ones),
each chunk's fused backward runs against its own O and log-sum-exp, the key/value gradients
add into full-length fp32 buffers, and one reduce-scatter (fp32, on a flat buffer of dK and dV)
returns every rank the complete gradient of its own keys. The learnable sink's gradient is the
sum over both chunks (and, through :class:`~te_cudnn.parallel.ulysses.SumGradOverGroup`, over
the group).

Dense ``bshd``/``sbhd`` only; nothing here synchronises the host with the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ..autograd import _readable_grad
from ..ops import fused_attn_bwd, fused_attn_fwd
from .partition import dual_chunks, shard, unshard

__all__ = ["AgSpec", "Tile", "key_range", "plan_tiles", "AgJob", "AllGatherAttn"]

Collective = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]


@dataclass(frozen=True)
class AgSpec:
    """One all-gather attention call (everything but the tensors); ``window`` is normalised
    (causal: ``right = 0``)."""

    cp: int
    fmt: str  # "bshd" | "sbhd"
    causal: bool
    window: tuple[int, int]
    attn_scale: Optional[float] = None
    dropout: float = 0.0
    deterministic: bool = False
    softmax_type: str = "vanilla"

    @property
    def layout(self) -> str:
        return f"{self.fmt}_{self.fmt}_{self.fmt}"

    @property
    def dim(self) -> int:
        return 1 if self.fmt == "bshd" else 0

    @property
    def full(self) -> bool:
        """Every query sees every key (no causal mask, no window): one call for both chunks."""
        return not self.causal and self.window == (-1, -1)


@dataclass(frozen=True)
class Tile:
    """One fused call of a rank: local query rows ``[q_start, q_start + q_len)`` against global
    keys ``[kv_start, kv_start + kv_len)``, with its mask and (shifted, bottom-right) window."""

    q_start: int
    q_len: int
    kv_start: int
    kv_len: int
    mask: str
    window: tuple[int, int]


def key_range(chunk: int, c: int, s: int, window: tuple[int, int]) -> tuple[int, int, tuple[int, int]]:
    """``(start, end, window')``: the keys ``[start, end)`` that the queries of chunk ``chunk``
    (``c`` rows each, ``s`` keys in all) reach under ``window = (left, right)``, and the window
    that, aligned bottom-right on that slice, masks exactly as ``window`` on the full sequence."""
    left, right = window
    end_q = (chunk + 1) * c
    end, right2 = (s, -1) if right < 0 else (min(s, end_q + right), end_q + right - min(s, end_q + right))
    start, left2 = (0, -1) if left < 0 else (max(0, end_q - c - left), left + end - end_q)
    return start, end, (left2, right2)


def plan_tiles(spec: AgSpec, rank: int, s_q: int, s_kv: int) -> tuple[Tile, ...]:
    """The calls of rank ``rank`` holding ``s_q`` queries and ``s_kv`` keys (two chunks each);
    the query rows of its tiles partition ``[0, s_q)`` in order."""
    total = spec.cp * s_kv
    if spec.full:
        return (Tile(0, s_q, 0, total, "no_mask", (-1, -1)),)
    c = s_q // 2  # windows and causal masks need s_q == s_kv (checked before the call)
    mask = "causal_bottom_right" if spec.causal else "no_mask"
    tiles = []
    for i, chunk in enumerate(dual_chunks(spec.cp, rank)):
        start, end, window = key_range(chunk, c, total, spec.window)
        tiles.append(Tile(i * c, c, start, end - start, mask, window))
    return tuple(tiles)


@dataclass(frozen=True)
class AgJob:
    """The listed ranks' calls (one rank on a process group, all ``cp`` in a simulation) and
    the two collectives: ``gather`` maps each listed rank's ``[n]`` to ``[cp, n]``,
    ``reduce_scatter`` each listed rank's ``[cp, n]`` to its summed ``[n]``."""

    spec: AgSpec
    ranks: tuple[int, ...]
    tiles: tuple[tuple[Tile, ...], ...]
    rng_states: tuple[Optional[torch.Tensor], ...]  # [tiles, 2] int64 per rank, or None without dropout
    gather: Collective
    reduce_scatter: Collective


def _flat(*ts: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The tensors copied into one flat buffer (one collective for k and v, any head dims)."""
    return torch.cat([t.reshape(-1).to(dtype or t.dtype) for t in ts])


def _split(buf: torch.Tensor, *shapes: torch.Size) -> list[torch.Tensor]:
    out, at = [], 0
    for shape in shapes:
        out.append(buf[at : at + shape.numel()].view(shape))
        at += shape.numel()
    return out


def _gathered_kv(job: AgJob, ks, vs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every listed rank's whole k and v in natural sequence order (one all-gather)."""
    fmt = job.spec.fmt
    gathered = job.gather([_flat(k, v) for k, v in zip(ks, vs)])  # [cp (source rank), n]
    fulls = []
    for g, k, v in zip(gathered, ks, vs):
        parts = [_split(row, k.shape, v.shape) for row in g.unbind(0)]
        fulls.append((unshard([p[0] for p in parts], fmt), unshard([p[1] for p in parts], fmt)))
    return fulls


def _narrow(t: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    return t if start == 0 and length == t.shape[dim] else t.narrow(dim, start, length)


def _options(spec: AgSpec, tile: Tile) -> dict:
    return dict(attn_scale=spec.attn_scale, dropout=spec.dropout, qkv_layout=spec.layout, attn_mask_type=tile.mask,
                softmax_type=spec.softmax_type, window_size=tile.window, bottom_right_diagonal=True)  # fmt: skip


def _forward_rank(spec: AgSpec, tiles, q, k_full, v_full, rng_states, offset) -> tuple[torch.Tensor, list]:
    """One rank's output (q's dtype) and each tile's aux tensors ([lse, rng_state(, sink)])."""
    dim, outs, auxes = spec.dim, [], []
    for i, t in enumerate(tiles):
        qq = _narrow(q, dim, t.q_start, t.q_len)
        kk, vv = (_narrow(x, dim, t.kv_start, t.kv_len) for x in (k_full, v_full))
        out, aux = fused_attn_fwd(True, t.q_len, t.kv_len, None, None, qq, kk, vv, q.dtype, softmax_offset=offset,
                                  rng_state=None if rng_states is None else rng_states[i],
                                  **_options(spec, t))  # fmt: skip
        outs.append(out)
        auxes.append(aux)
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim)), auxes


def _backward_rank(spec: AgSpec, tiles, q, k_full, v_full, out, d_out, auxes):
    """One rank's dq (q's dtype), fp32 dK/dV of the whole sequence, and the sink gradient."""
    dim = spec.dim
    dqs, d_offset = [], None
    dk = torch.zeros(k_full.shape, dtype=torch.float32, device=k_full.device)
    dv = torch.zeros(v_full.shape, dtype=torch.float32, device=v_full.device)
    for t, aux in zip(tiles, auxes):
        qq, oo, dd = (_narrow(x, dim, t.q_start, t.q_len) for x in (q, out, d_out))
        kk, vv = (_narrow(x, dim, t.kv_start, t.kv_len) for x in (k_full, v_full))
        dq_i, dk_i, dv_i, _, d_off_i = fused_attn_bwd(
            t.q_len, t.kv_len, None, None, qq, kk, vv, oo, dd, q.dtype, aux, deterministic=spec.deterministic,
            **_options(spec, t),
        )  # fmt: skip
        dqs.append(dq_i)
        _narrow(dk, dim, t.kv_start, t.kv_len).add_(dk_i)
        _narrow(dv, dim, t.kv_start, t.kv_len).add_(dv_i)
        if d_off_i is not None:
            d_offset = d_off_i.float() if d_offset is None else d_offset + d_off_i
    return (dqs[0] if len(dqs) == 1 else torch.cat(dqs, dim)), dk, dv, d_offset


class AllGatherAttn(torch.autograd.Function):
    """``AllGatherAttn.apply(job, softmax_offset, *qs, *ks, *vs) -> outs`` for the listed ranks;
    differentiable in q, k, v and (summed over the listed ranks and their chunks) the sink
    logits ``softmax_offset``."""

    @staticmethod
    def forward(ctx, job: AgJob, offset: Optional[torch.Tensor], *tensors: torch.Tensor):
        n = len(job.ranks)
        qs, ks, vs = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        results = [_forward_rank(job.spec, t, q, *kv, rng, offset)
                   for t, q, kv, rng in zip(job.tiles, qs, _gathered_kv(job, ks, vs), job.rng_states)]  # fmt: skip
        outs = tuple(o for o, _ in results)
        ctx.job, ctx.auxes = job, [a for _, a in results]
        ctx.save_for_backward(*qs, *ks, *vs, *outs)
        return outs

    @staticmethod
    def backward(ctx, *d_outs: Optional[torch.Tensor]):
        job, n, saved = ctx.job, len(ctx.job.ranks), ctx.saved_tensors
        qs, ks, vs, outs = saved[:n], saved[n : 2 * n], saved[2 * n : 3 * n], saved[3 * n :]
        d_outs = [torch.zeros_like(o) if d is None else _readable_grad(d) for d, o in zip(d_outs, outs)]
        cp, fmt = job.spec.cp, job.spec.fmt
        dqs, sends, d_offset = [], [], None
        for t, q, (k_full, v_full), o, d, aux in zip(job.tiles, qs, _gathered_kv(job, ks, vs), outs, d_outs, ctx.auxes):
            dq, dk, dv, d_off = _backward_rank(job.spec, t, q, k_full, v_full, o, d, aux)
            dqs.append(dq.to(q.dtype))
            sends.append(torch.stack([_flat(shard(dk, cp, r, fmt), shard(dv, cp, r, fmt)) for r in range(cp)]))
            if d_off is not None:
                d_offset = d_off if d_offset is None else d_offset + d_off
        dks, dvs = [], []
        for got, k, v in zip(job.reduce_scatter(sends), ks, vs):  # each rank's own keys, summed over the group
            dk, dv = _split(got, k.shape, v.shape)
            dks.append(dk.to(k.dtype))
            dvs.append(dv.to(v.dtype))
        return (None, d_offset if ctx.needs_input_grad[1] else None, *dqs, *dks, *dvs)
