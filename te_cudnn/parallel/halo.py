"""Sliding windows on p2p without the ring: each rank fetches, once, the key/value tokens its
window reaches from its two neighbours (a halo exchange).

With the dual-chunk split (rank ``r`` holds chunks ``a = r`` and ``b = 2 cp - 1 - r`` of ``c``
tokens) and a causal window of ``left`` keys, ``1 <= left <= c``, a query of chunk ``j`` reaches
keys of chunk ``j`` and of the last ``left`` tokens of chunk ``j - 1``, nothing else. Chunk
``a - 1`` is rank ``r - 1``'s first chunk; chunk ``b - 1`` is rank ``r + 1``'s second chunk (for
``r = cp - 1`` it is ``a``, the rank's own). So rank ``r``

* sends the tail (last ``left`` tokens) of its chunk ``a`` to ``r + 1`` and of its chunk ``b``
  to ``r - 1``, receives the other two tails, and attends them with the calls
  :func:`~te_cudnn.parallel.schedule.window_calls` gives for those neighbours' blocks (the
  other origins' calls are empty), shifted into the tails: ``2 left`` tokens received instead
  of the ``(cp - 1) 2 c`` a ring moves, and one exchange instead of ``cp - 1``;
* in the backward, sends the key/value gradients of the tails it received back to their
  owners (the same two messages reversed) and adds the ones it gets to its own tails.

No full-size fp32 accumulator: every row of a chunk is reached by the chunk's own diagonal
call, and only its first ``left`` rows by one more call (the previous chunk's tail). The
diagonal calls write the outputs and gradients directly; the rows a second call reaches are
merged in fp32 and rounded once (the output), or the second call's bf16 gradient is added in
place, which computes in fp32 and rounds once. Either way a row sees exactly the arithmetic
of the ring's fp32 accumulators, which also round once, at the end; the sink is folded into
the merged rows before their rounding.

The sends of the ranks at the ends (rank 0 to ``cp - 1`` and back) carry nothing anyone uses:
the exchange stays the ring's lockstep pattern, and those halos are neither attended nor
added. Longer windows, windows right of the diagonal and ``no_mask`` keep the ring
(:class:`~te_cudnn.parallel.ring.WindowTiles`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator, Optional

import torch

from ..ops import fused_attn_bwd, fused_attn_fwd
from .ring import RingSpec, WindowTiles, _merge, _packet, _unpack
from .ring_sink import add_sink
from .schedule import WindowCall
from .transport import Post, Wait

__all__ = ["halo_applies", "HaloTiles", "halo_forward_program", "halo_backward_program"]


def halo_applies(spec: RingSpec, window: Optional[tuple[int, int]], c: int) -> bool:
    """A causal window of ``1 <= left <= c`` keys (``c``: tokens per chunk) over at least two ranks."""
    return spec.cp > 1 and spec.causal and window is not None and window[1] == 0 and 1 <= window[0] <= c


class HaloTiles(WindowTiles):
    """:class:`~te_cudnn.parallel.ring.WindowTiles` whose neighbour blocks are their tails, with
    the outputs and gradients written in the inputs' dtype (see the module docstring)."""

    @property
    def left(self) -> int:
        return self.window[0]

    def _tail_start(self, origin: int) -> int:
        """Where, in ``origin``'s block of two chunks, the tail this rank receives starts."""
        return self.c - self.left if origin == self.spec.rank - 1 else 2 * self.c - self.left

    def calls(self, origin: int) -> tuple[WindowCall, ...]:
        found = super().calls(origin)
        if origin == self.spec.rank:  # the chunks' diagonal calls first: they write their rows
            return tuple(sorted(found, key=lambda x: not self.diagonal(x)))
        start = self._tail_start(origin)
        return tuple(replace(call, kv_start=call.kv_start - start) for call in found)

    def diagonal(self, call: WindowCall) -> bool:
        """A chunk against itself (of the rank's own block): every row of the chunk."""
        return call.q_len == self.c and call.kv_start == call.q_start

    def tail(self, t: torch.Tensor, first: bool) -> torch.Tensor:
        """The last ``left`` tokens of the rank's first (``a``) or second (``b``) chunk of ``t``."""
        return t.narrow(self.dim, (self.c if first else 2 * self.c) - self.left, self.left)

    def tail_shapes(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Size, torch.Size]:
        return self.tail(k, True).shape, self.tail(v, True).shape

    def neighbours(self, from_prev, from_next) -> Iterator[tuple[int, torch.Tensor]]:
        """(origin, what came from it) for the neighbours whose tails this rank attends."""
        r, cp = self.spec.rank, self.spec.cp
        if r >= 1:
            yield r - 1, from_prev
        if r <= cp - 2:
            yield r + 1, from_next

    def _head(self, call: WindowCall) -> int:
        """The chunk whose first ``left`` rows a non-diagonal call reaches (and nothing else)."""
        chunk = call.q_start // self.c
        if call.q_start + call.q_len > chunk * self.c + self.left:
            raise AssertionError(f"a halo call beyond the first {self.left} rows of chunk {chunk}: {call}")
        return chunk

    def attend(self, origin: int, q, k, v, rng_state, o, lse, staged: dict):
        """Forward calls against ``origin``'s block (the own chunks or a neighbour's tail): a
        diagonal call writes its rows of ``o`` and ``lse``; another call's result is merged into
        ``staged[chunk]``, the fp32 (O, lse) of the chunk's first ``left`` rows. Returns the
        step's rng state."""
        rng = None
        for call in self.calls(origin):
            (qq, oo), (kk, vv) = self._views(call, q, k, v, o)
            diag = origin == self.spec.rank and self.diagonal(call)
            o_i, aux = fused_attn_fwd(True, call.q_len, call.kv_len, None, None, qq, kk, vv, q.dtype,
                                      rng_state=rng_state, out=oo if diag and oo.is_contiguous() else None,
                                      **self._options(call))  # fmt: skip
            rng = aux[1]
            if diag:
                if o_i is not oo:
                    oo.copy_(o_i)
                lse.narrow(2, call.q_start, call.q_len).copy_(aux[0])
                continue
            chunk = self._head(call)
            if chunk not in staged:
                first = chunk * self.c
                staged[chunk] = (o.narrow(self.dim, first, self.left).float(), lse.narrow(2, first, self.left).clone())
            acc_o, acc_lse = staged[chunk]
            at = call.q_start - chunk * self.c
            _merge(acc_o.narrow(self.dim, at, call.q_len), acc_lse.narrow(2, at, call.q_len), o_i, aux[0], self.spec.fmt)
        return rng

    def finish(self, o, lse, staged: dict, sink: Optional[torch.Tensor]) -> None:
        """The sink (once per row) and the merged rows, rounded once into ``o``."""
        if sink is not None:
            add_sink(o, lse, sink, self.spec.fmt)  # the merged rows are overwritten below
        for chunk, (acc_o, acc_lse) in staged.items():
            if sink is not None:
                add_sink(acc_o, acc_lse, sink, self.spec.fmt)
            o.narrow(self.dim, chunk * self.c, self.left).copy_(acc_o)
            lse.narrow(2, chunk * self.c, self.left).copy_(acc_lse)

    def gradients(self, origin: int, q, k, v, o, d_o, lse, rng_state, dq, dk, dv) -> None:
        """Backward calls against ``origin``'s block: a diagonal call writes its rows of the
        gradients, another call adds to them (in place: fp32 arithmetic, rounded once)."""
        for call in self.calls(origin):
            (qq, oo, dd), (kk, vv) = self._views(call, q, k, v, o, d_o)
            stats = lse.narrow(2, call.q_start, call.q_len).contiguous()
            grads = fused_attn_bwd(call.q_len, call.kv_len, None, None, qq, kk, vv, oo, dd, q.dtype, [stats, rng_state],
                                   deterministic=self.spec.deterministic, **self._options(call))[:3]  # fmt: skip
            (dq_view,), kv_views = self._views(call, dq, dk, dv)
            diag = origin == self.spec.rank and self.diagonal(call)
            for view, grad in zip((dq_view, *kv_views), grads):
                view.copy_(grad) if diag else view.add_(grad)


def halo_forward_program(spec: RingSpec, tiles: HaloTiles, q, k, v, rng_states, sink: Optional[torch.Tensor] = None):
    """One rank's forward (a generator for a transport driver): (O in q's dtype, lse with the
    sink folded in, the rng states of the own step and of each attended neighbour in
    :meth:`HaloTiles.neighbours` order, the received tails)."""
    send_next, send_prev = (_packet(tiles.tail(k, first), tiles.tail(v, first)) for first in (True, False))
    from_prev, from_next = torch.empty_like(send_next), torch.empty_like(send_prev)
    to_next = yield Post((send_next,), (from_prev,), forward=True)
    to_prev = yield Post((send_prev,), (from_next,), forward=False)
    o = q.new_empty((*q.shape[:-1], v.shape[-1]))
    b, h, s = (q.shape[0], q.shape[2], q.shape[1]) if spec.fmt == "bshd" else (q.shape[1], q.shape[2], q.shape[0])
    lse = torch.empty((b, h, s, 1), dtype=torch.float32, device=q.device)
    staged: dict = {}
    state = [None] * 3 if rng_states is None else rng_states  # one per step (own, then each neighbour), as the ring
    rngs = [tiles.attend(spec.rank, q, k, v, state[0], o, lse, staged)]  # the own chunks while the tails travel
    yield Wait(to_next)
    yield Wait(to_prev)
    del send_next, send_prev
    shapes = tiles.tail_shapes(k, v)
    for i, (origin, packet) in enumerate(tiles.neighbours(from_prev, from_next), 1):
        rngs.append(tiles.attend(origin, q, *_unpack(packet, *shapes), state[i], o, lse, staged))
    tiles.finish(o, lse, staged, sink)
    return o, lse, rngs, (from_prev, from_next)


def halo_backward_program(spec: RingSpec, tiles: HaloTiles, q, k, v, o, d_o, lse, rngs, packets):
    """One rank's backward (a generator): (dq, dk, dv) of the rank's own tokens in their dtype,
    the gradients of its tails coming back from the neighbours that attended them."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tiles.gradients(spec.rank, q, k, v, o, d_o, lse, rngs[0], dq, dk, dv)
    shapes = tiles.tail_shapes(k, v)
    size = shapes[0].numel() + shapes[1].numel()
    tail_grads = {}  # origin -> dK/dV of its tail, in k's dtype
    for (origin, packet), rng in zip(tiles.neighbours(*packets), rngs[1:]):
        tail_grads[origin] = torch.zeros(size, dtype=k.dtype, device=k.device)
        tiles.gradients(origin, q, *_unpack(packet, *shapes), o, d_o, lse, rng, dq, *_unpack(tail_grads[origin], *shapes))
    del packets
    r = spec.rank
    sends = [tail_grads.pop(x) if x in tail_grads else torch.zeros(size, dtype=k.dtype, device=k.device)
             for x in (r - 1, r + 1)]  # fmt: skip
    back_a, back_b = (torch.empty(size, dtype=k.dtype, device=k.device) for _ in range(2))
    to_prev = yield Post((sends[0],), (back_a,), forward=False)  # my chunk a's tail, from r + 1
    to_next = yield Post((sends[1],), (back_b,), forward=True)  # my chunk b's tail, from r - 1
    del sends
    yield Wait(to_prev)
    yield Wait(to_next)
    for back, first, came in ((back_a, True, r <= spec.cp - 2), (back_b, False, r >= 1)):
        if came:  # the end ranks' messages carry nothing
            g_k, g_v = _unpack(back, *shapes)
            tiles.tail(dk, first).add_(g_k)
            tiles.tail(dv, first).add_(g_v)
    return dq, dk, dv
