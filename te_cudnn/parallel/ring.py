"""Ring ("p2p") context parallelism: every rank keeps its queries and passes key/value blocks
around the ring, attending to one block per step through te_cudnn's fused F16 kernels.

Forward (rank ``r``, steps ``i = 0 .. cp-1``): post the exchange of the next block, attend the
local queries to the block held now (the section of :mod:`~te_cudnn.parallel.schedule`), merge
the step's output and log-sum-exp into fp32 accumulators (``lse = logaddexp(lse, lse_i)``,
``O += w_i (O_i - O)`` with ``w_i = exp(lse_i - lse)``; rows nothing reached yet stay at
``-inf`` and zero, never NaN), then wait for the block. Backward: the ordinary fused backward of
each block against the *global* O and lse is that block's exact share of the gradient; the
key/value gradient travels with its block (zero-initialised at the first rank that sees it,
added to at every hop, kept in fp32) and arrives complete at its owner after ``cp`` steps. The
last forward block is the first backward block, so the backward starts without communication, and
its last block is the rank's own, so it ends without a block message.

Sliding windows (dense formats, :class:`WindowTiles`): a step makes one fused call per (query
chunk, key chunk) pair the window reaches (:func:`~te_cudnn.parallel.schedule.window_calls`),
trimmed to the rectangle it reaches, with the window shifted to that rectangle; pairs out of
reach are neither computed forward nor backward (a step may launch nothing). Blocks still travel
the whole ring: every step's send is unchanged. Attention sinks are folded into the merged
accumulators once, after the ring (:mod:`~te_cudnn.parallel.ring_sink`); the kernels run
vanilla softmax.

THD batches (packed, each sequence padded to a multiple of ``2 cp``) keep the tensors whole:
half-sequence sections are described to cuDNN by per-sequence valid lengths and token offsets
(the second half of every sequence starts ``k_i`` tokens later), so no step copies a tensor.
Dense halves are strided views. Nothing here synchronises the host with the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..ops import fused_attn_bwd, fused_attn_fwd
from .partition import thd_valid_lengths
from .schedule import Section, WindowCall, bwd_origin, fwd_origin, fwd_step_of, section, window_calls
from .transport import Post, Wait

__all__ = ["RingSpec", "DenseTiles", "WindowTiles", "ThdTiles", "forward_program", "backward_program",
           "draw_rng_states", "lse_rows"]


@dataclass(frozen=True)
class RingSpec:
    """One rank's view of a ring attention call (everything but the tensors)."""

    cp: int
    rank: int
    fmt: str  # "bshd" | "sbhd" | "thd"
    causal: bool
    attn_scale: Optional[float] = None
    dropout: float = 0.0
    deterministic: bool = False

    @property
    def layout(self) -> str:
        return f"{self.fmt}_{self.fmt}_{self.fmt}"


def lse_rows(lse: torch.Tensor, fmt: str) -> torch.Tensor:
    """The fp32 stats ([b, h, s, 1]; THD [t, h, 1]) as a view broadcastable to O's rows."""
    if fmt == "bshd":
        return lse.transpose(1, 2)
    if fmt == "sbhd":
        return lse.permute(2, 0, 1, 3)
    return lse


def _merge(acc_o: torch.Tensor, acc_lse: torch.Tensor, o_i: torch.Tensor, lse_i: torch.Tensor, fmt: str) -> None:
    """Fold one step's (O_i, lse_i) into the accumulators, in place (all four alike in rows):
    ``O = O exp(lse - new) + O_i exp(lse_i - new)`` in fp32 without an fp32 copy of O_i."""
    new = torch.logaddexp(acc_lse, lse_i)  # (-inf, -inf) -> -inf
    w_old = torch.exp(acc_lse - new).nan_to_num_(0.0)  # -inf - -inf: no key seen on either side
    w_new = torch.exp(lse_i - new).nan_to_num_(0.0)
    acc_lse.copy_(new)
    acc_o.mul_(lse_rows(w_old, fmt)).addcmul_(o_i, lse_rows(w_new, fmt))


class _SectionSteps:
    """One fused call per ring step (the step's section), for :class:`DenseTiles` and
    :class:`ThdTiles`: the step interface the rank programs use."""

    def forward_step(self, origin: int, q, k, v, rng_state, acc):
        """Attend to ``origin``'s block and fold the result into ``acc`` (``(O, lse)`` in fp32, or
        None before the first step); returns the accumulators and the call's rng state."""
        sect = section(self.spec.rank, origin, self.spec.causal)
        o_i, lse_i, rng_i = self.forward(sect, origin, q, k, v, rng_state)
        if acc is None:
            return self.first(sect, origin, o_i, lse_i), rng_i
        self.merge(*acc, sect, origin, o_i, lse_i)
        return acc, rng_i

    def backward_step(self, origin: int, q, k, v, o, d_o, lse, rng_state):
        """The gradients of ``origin``'s block (added by :meth:`add_step` once the travelling
        key/value gradient has arrived)."""
        sect = section(self.spec.rank, origin, self.spec.causal)
        return sect, self.backward(sect, origin, q, k, v, o, d_o, lse, rng_state)

    def add_step(self, pending, dq_acc, dk_acc, dv_acc) -> None:
        sect, grads = pending
        self.add_grads(sect, dq_acc, dk_acc, dv_acc, *grads)


class DenseTiles(_SectionSteps):
    """Sections of bshd/sbhd tensors: halves are strided views along the sequence dim."""

    def __init__(self, spec: RingSpec, s_q: int, s_kv: int):
        self.spec = spec
        self.dim = 1 if spec.fmt == "bshd" else 0
        self.half_q, self.half_kv = s_q // 2, s_kv // 2

    def _q(self, t: torch.Tensor, sect: Section) -> torch.Tensor:
        return t.narrow(self.dim, self.half_q, self.half_q) if sect.q_half else t

    def _kv(self, t: torch.Tensor, sect: Section) -> torch.Tensor:
        return t.narrow(self.dim, 0, self.half_kv) if sect.kv_half else t

    def _lse(self, lse: torch.Tensor, sect: Section) -> torch.Tensor:
        return lse.narrow(2, self.half_q, self.half_q) if sect.q_half else lse

    def _options(self, sect: Section) -> dict[str, Any]:
        s = self.spec
        mask = "causal" if sect.causal else "no_mask"
        return dict(attn_scale=s.attn_scale, dropout=s.dropout, qkv_layout=s.layout, attn_mask_type=mask)

    def forward(self, sect: Section, origin: int, q, k, v, rng_state) -> tuple[torch.Tensor, ...]:
        qq, kk, vv = self._q(q, sect), self._kv(k, sect), self._kv(v, sect)
        out, aux = fused_attn_fwd(True, qq.shape[self.dim], kk.shape[self.dim], None, None, qq, kk, vv, q.dtype,
                                  rng_state=rng_state, **self._options(sect))  # fmt: skip
        return out, aux[0], aux[1]

    def merge(self, acc_o, acc_lse, sect: Section, origin: int, o_i, lse_i) -> None:
        _merge(self._q(acc_o, sect), self._lse(acc_lse, sect), o_i, lse_i, self.spec.fmt)

    def first(self, sect: Section, origin: int, o_i, lse_i) -> tuple[torch.Tensor, torch.Tensor]:
        return o_i.float(), lse_i  # step 0 covers every row (diagonal or full)

    def backward(self, sect: Section, origin: int, q, k, v, o, d_o, lse, rng_state) -> list[torch.Tensor]:
        qq, oo, dd = self._q(q, sect), self._q(o, sect), self._q(d_o, sect)
        kk, vv = self._kv(k, sect), self._kv(v, sect)
        stats = self._lse(lse, sect).contiguous()  # a copy of [b, h, s/2, 1] for the upper section only
        dq, dk, dv, _, _ = fused_attn_bwd(
            qq.shape[self.dim], kk.shape[self.dim], None, None, qq, kk, vv, oo, dd, q.dtype, [stats, rng_state],
            deterministic=self.spec.deterministic, **self._options(sect),
        )  # fmt: skip
        return [dq, dk, dv]

    def add_grads(self, sect: Section, dq_acc, dk_acc, dv_acc, dq, dk, dv) -> None:
        self._q(dq_acc, sect).add_(dq)
        self._kv(dk_acc, sect).add_(dk)
        self._kv(dv_acc, sect).add_(dv)


class WindowTiles:
    """Sliding-window steps of bshd/sbhd tensors (the calls of
    :func:`~te_cudnn.parallel.schedule.window_calls`): each step attends only the (query chunk,
    key chunk) pairs the window reaches, each trimmed to the rectangle it reaches and masked by
    the window shifted to the rectangle (top-left; the rectangles are square). A pair the window
    does not reach is not computed; a step no pair of which is reached launches nothing. The
    key/value blocks still travel the whole ring (rank ``r + 1``'s block, which a window that
    reaches past a chunk needs, arrives last). Accumulators start at zero / ``-inf``, so rows a
    step does not reach keep their values."""

    def __init__(self, spec: RingSpec, s_q: int, window: tuple[int, int]):
        self.spec, self.window = spec, window
        self.dim, self.c = (1 if spec.fmt == "bshd" else 0), s_q // 2

    def calls(self, origin: int) -> tuple[WindowCall, ...]:
        return window_calls(self.spec.cp, self.spec.rank, origin, self.c, self.window)

    def _options(self, call: WindowCall) -> dict[str, Any]:
        s = self.spec
        mask = "causal" if call.window[1] == 0 else "no_mask"
        return dict(attn_scale=s.attn_scale, dropout=s.dropout, qkv_layout=s.layout, attn_mask_type=mask,
                    window_size=call.window, bottom_right_diagonal=False)  # fmt: skip

    def _views(self, call: WindowCall, q, k, v, *rows):
        kv = [t.narrow(self.dim, call.kv_start, call.kv_len) for t in (k, v)]
        return [t.narrow(self.dim, call.q_start, call.q_len) for t in (q, *rows)], kv

    def forward_step(self, origin: int, q, k, v, rng_state, acc):
        if acc is None:
            b, h = (q.shape[0], q.shape[2]) if self.spec.fmt == "bshd" else (q.shape[1], q.shape[2])
            acc_o = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=torch.float32, device=q.device)
            acc = acc_o, torch.full((b, h, q.shape[self.dim], 1), float("-inf"), device=q.device)
        rng_i = None
        for call in self.calls(origin):
            (qq, oo), (kk, vv) = self._views(call, q, k, v, acc[0])
            out, aux = fused_attn_fwd(True, call.q_len, call.kv_len, None, None, qq, kk, vv, q.dtype,
                                      rng_state=rng_state, **self._options(call))  # fmt: skip
            _merge(oo, acc[1].narrow(2, call.q_start, call.q_len), out, aux[0], self.spec.fmt)
            rng_i = aux[1]
        return acc, rng_i

    def backward_step(self, origin: int, q, k, v, o, d_o, lse, rng_state):
        grads = []
        for call in self.calls(origin):
            (qq, oo, dd), (kk, vv) = self._views(call, q, k, v, o, d_o)
            stats = lse.narrow(2, call.q_start, call.q_len).contiguous()
            dq, dk, dv, _, _ = fused_attn_bwd(
                call.q_len, call.kv_len, None, None, qq, kk, vv, oo, dd, q.dtype, [stats, rng_state],
                deterministic=self.spec.deterministic, **self._options(call),
            )  # fmt: skip
            grads.append((call, dq, dk, dv))
        return grads

    def add_step(self, pending, dq_acc, dk_acc, dv_acc) -> None:
        for call, dq, dk, dv in pending:
            (dq_view,), (dk_view, dv_view) = self._views(call, dq_acc, dk_acc, dv_acc)
            dq_view.add_(dq)
            dk_view.add_(dk)
            dv_view.add_(dv)


def _cu(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


class _ThdSide:
    """Per-sequence chunk geometry of one side (queries or keys/values) of a THD batch."""

    def __init__(self, cp: int, cu: torch.Tensor, cu_padded: torch.Tensor, tokens: int):
        self.cp, self.cu_seqlens, self.cu_padded = cp, cu, cu_padded
        self.lens = cu[1:] - cu[:-1]
        self.chunk = (cu_padded[1:] - cu_padded[:-1]) // (2 * cp)  # k_i
        self.offsets = cu_padded // cp  # rank-local padded offsets
        self.offsets_second = torch.cat((self.offsets[:-1] + self.chunk, self.offsets[-1:]))
        rows = torch.arange(tokens, dtype=torch.int32, device=cu.device)
        self.seq = torch.searchsorted(self.offsets[1:], rows, right=True).clamp_(max=self.lens.shape[0] - 1)
        self.pos = rows - self.offsets[self.seq]  # position inside the rank-local sequence
        self._memo: dict[tuple, torch.Tensor] = {}

    def valid(self, rank: int, first: bool = True, second: bool = True) -> torch.Tensor:
        """Valid token counts of ``rank``'s chunks of every sequence (a prefix of each)."""
        key = (rank, first, second)
        if key not in self._memo:
            self._memo[key] = thd_valid_lengths(self.cu_seqlens, self.cu_padded, self.cp, rank, first, second)
        return self._memo[key]

    def cu(self, rank: int, first: bool = True, second: bool = True) -> torch.Tensor:
        key = ("cu", rank, first, second)
        if key not in self._memo:
            self._memo[key] = _cu(self.valid(rank, first, second))
        return self._memo[key]


class ThdTiles(_SectionSteps):
    """Sections of THD tensors: whole tensors, halves chosen by lengths and token offsets."""

    def __init__(self, spec: RingSpec, q_side: _ThdSide, kv_side: _ThdSide, max_q: int, max_kv: int):
        self.spec, self.qs, self.kvs = spec, q_side, kv_side
        self.max_q, self.max_kv = max_q, max_kv  # rank-local (two chunks) maxima

    @classmethod
    def build(cls, spec: RingSpec, q: torch.Tensor, k: torch.Tensor, cu_q, cu_kv, cu_q_padded, cu_kv_padded,
              max_seqlen_q: int, max_seqlen_kv: int) -> "ThdTiles":  # fmt: skip
        local = lambda n: -(-n // (2 * spec.cp)) * 2  # noqa: E731 - a padded global length, per rank
        q_side = _ThdSide(spec.cp, cu_q, cu_q_padded, q.shape[0])
        kv_side = q_side if cu_kv is cu_q and cu_kv_padded is cu_q_padded and k.shape[0] == q.shape[0] else (
            _ThdSide(spec.cp, cu_kv, cu_kv_padded, k.shape[0]))  # fmt: skip
        return cls(spec, q_side, kv_side, local(max_seqlen_q), local(max_seqlen_kv))

    def _args(self, sect: Section, origin: int) -> tuple:
        r, qs, kvs = self.spec.rank, self.qs, self.kvs
        if sect.q_half:
            q = (self.max_q // 2, qs.cu(r, first=False), qs.offsets_second)
        else:
            q = (self.max_q, qs.cu(r), qs.offsets)
        kv = (self.max_kv // 2, kvs.cu(origin, second=False)) if sect.kv_half else (self.max_kv, kvs.cu(origin))
        return q[0], kv[0], q[1], kv[1], q[2], kvs.offsets

    def _options(self, sect: Section) -> dict[str, Any]:
        s = self.spec
        mask = "padding_causal" if sect.causal else "padding"
        return dict(attn_scale=s.attn_scale, dropout=s.dropout, qkv_layout=s.layout, attn_mask_type=mask)

    def rows(self, sect: Section, origin: int) -> torch.Tensor:
        """[t, 1, 1] bool: query rows this section gives a defined result (valid, and at least one key)."""
        qs, r = self.qs, self.spec.rank
        if sect.q_half:
            start = qs.chunk[qs.seq]
            rows = (qs.pos >= start) & (qs.pos < start + qs.valid(r, first=False)[qs.seq])
        else:
            rows = qs.pos < qs.valid(r)[qs.seq]
        keys = self.kvs.valid(origin, second=not sect.kv_half)
        return (rows & (keys[qs.seq] > 0)).view(-1, 1, 1)

    def forward(self, sect: Section, origin: int, q, k, v, rng_state) -> tuple[torch.Tensor, ...]:
        max_q, max_kv, cu_q, cu_kv, off_q, off_kv = self._args(sect, origin)
        out, aux = fused_attn_fwd(True, max_q, max_kv, cu_q, cu_kv, q, k, v, q.dtype, cu_seqlens_q_padded=off_q,
                                  cu_seqlens_kv_padded=off_kv, rng_state=rng_state, **self._options(sect))  # fmt: skip
        return out, aux[0], aux[1]

    def _masked(self, sect: Section, origin: int, o_i, lse_i) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.rows(sect, origin)
        return torch.where(rows, o_i, 0), torch.where(rows, lse_i, float("-inf"))

    def first(self, sect: Section, origin: int, o_i, lse_i) -> tuple[torch.Tensor, torch.Tensor]:
        o, lse = self._masked(sect, origin, o_i, lse_i)
        return o.float(), lse

    def merge(self, acc_o, acc_lse, sect: Section, origin: int, o_i, lse_i) -> None:
        _merge(acc_o, acc_lse, *self._masked(sect, origin, o_i, lse_i), "thd")

    def backward(self, sect: Section, origin: int, q, k, v, o, d_o, lse, rng_state) -> list[torch.Tensor]:
        max_q, max_kv, cu_q, cu_kv, off_q, off_kv = self._args(sect, origin)
        dq, dk, dv, _, _ = fused_attn_bwd(
            max_q, max_kv, cu_q, cu_kv, q, k, v, o, d_o, q.dtype, [lse, rng_state], cu_seqlens_q_padded=off_q,
            cu_seqlens_kv_padded=off_kv, deterministic=self.spec.deterministic, **self._options(sect),
        )  # fmt: skip
        return [dq, dk, dv]  # zero outside the section's valid rows

    def add_grads(self, sect: Section, dq_acc, dk_acc, dv_acc, dq, dk, dv) -> None:
        dq_acc.add_(dq)
        dk_acc.add_(dk)
        dv_acc.add_(dv)


def draw_rng_states(spec: RingSpec, device: torch.device, gen: Optional[torch.Generator] = None) -> torch.Tensor:
    """[cp, 2] int64 Philox (seed, offset) per forward step, drawn on the device (no host sync).
    Ranks draw the same numbers from equal generators, so the rank is added to the seeds: the
    tiles of different ranks get independent dropout masks."""
    states = torch.randint(0, 1 << 62, (spec.cp, 2), dtype=torch.int64, device=device, generator=gen)
    states[:, 0] += spec.rank
    return states


def _packet(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """k and v copied into one flat buffer (one message per step; works for d_qk != d_v)."""
    buf = torch.empty(k.numel() + v.numel(), dtype=k.dtype, device=k.device)
    buf[: k.numel()].view(k.shape).copy_(k)
    buf[k.numel() :].view(v.shape).copy_(v)
    return buf


def _unpack(buf: torch.Tensor, k_shape: torch.Size, v_shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    nk = k_shape.numel()
    return buf[:nk].view(k_shape), buf[nk:].view(v_shape)


def forward_program(spec: RingSpec, tiles, q, k, v, rng_states: Optional[torch.Tensor]):
    """One rank's forward (a generator for a transport driver). Returns (O in fp32, lse,
    per-step rng states, the last key/value packet held)."""
    cp, r = spec.cp, spec.rank
    packet = _packet(k, v) if cp > 1 else None
    block = (k, v)  # step 0 attends to the rank's own block as given (no copy)
    acc = None
    rngs: list[Optional[torch.Tensor]] = []
    for i in range(cp):
        handle = None
        if i < cp - 1:
            incoming = torch.empty_like(packet)
            handle = yield Post((packet,), (incoming,), forward=True)
        origin = fwd_origin(cp, r, i)
        acc, rng_i = tiles.forward_step(origin, q, *block, None if rng_states is None else rng_states[i], acc)
        rngs.append(rng_i)
        if i < cp - 1:
            yield Wait(handle)
            packet = incoming
            block = _unpack(packet, k.shape, v.shape)
    return acc[0], acc[1], rngs, packet


def backward_program(spec: RingSpec, tiles, q, k, v, o, d_o, lse, rngs, packet):
    """One rank's backward (a generator). ``packet`` is the last forward block (rank r+1's);
    the caller hands over its reference, so each block is freed once its step is done (two
    blocks alive at most: the one attended and the one arriving). Blocks travel the other way
    round the ring, so the last step's block is the rank's own: it attends its ``k``, ``v``
    instead of receiving them (``cp - 2`` block messages, none at ``cp = 2``). Returns fp32
    (dq, dk, dv) of the rank's own tokens. (Two ranks with dense sections run
    :mod:`~te_cudnn.parallel.ring_pair` instead.)"""
    cp, r = spec.cp, spec.rank
    block = (k, v) if cp == 1 else _unpack(packet, k.shape, v.shape)
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dkv = outgoing = None
    for i in range(cp):
        origin = bwd_origin(cp, r, i)
        sends, recvs = [], []
        if i < cp - 2:  # the last step's block is the rank's own: it does not travel
            nxt = torch.empty_like(packet)
            sends.append(packet), recvs.append(nxt)
        if i > 0:
            dkv = torch.empty_like(outgoing)
            sends.append(outgoing), recvs.append(dkv)
        handle = (yield Post(tuple(sends), tuple(recvs), forward=False)) if sends else None
        pending = tiles.backward_step(origin, q, *block, o, d_o, lse, rngs[fwd_step_of(cp, r, origin)])
        if sends:
            yield Wait(handle)
        if i == 0:
            dkv = torch.zeros(k.numel() + v.numel(), dtype=torch.float32, device=k.device)
        tiles.add_step(pending, dq_acc, *_unpack(dkv, k.shape, v.shape))
        pending = None  # the step's gradients are added: free them before the next step's kernel
        outgoing = dkv
        if i < cp - 2:
            packet = nxt
            block = _unpack(packet, k.shape, v.shape)
        elif i == cp - 2:
            packet = nxt = None
            block = (k, v)
    dk, dv = _unpack(dkv, k.shape, v.shape)
    return dq_acc, dk, dv
