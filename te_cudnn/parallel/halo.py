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
* in the backward, sends the fp32 key/value gradients of the tails it received back to their
  owners (the same two messages reversed) and adds the ones it gets to its own tails.

The sends of the ranks at the ends (rank 0 to ``cp - 1`` and back) carry nothing anyone uses:
the exchange stays the ring's lockstep pattern, and those halos are neither attended nor
added. Longer windows, windows right of the diagonal and ``no_mask`` keep the ring
(:class:`~te_cudnn.parallel.ring.WindowTiles`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator, Optional

import torch

from .ring import RingSpec, WindowTiles, _packet, _unpack
from .schedule import WindowCall
from .transport import Post, Wait

__all__ = ["halo_applies", "HaloTiles", "halo_forward_program", "halo_backward_program"]


def halo_applies(spec: RingSpec, window: Optional[tuple[int, int]], c: int) -> bool:
    """A causal window of ``1 <= left <= c`` keys (``c``: tokens per chunk) over at least two ranks."""
    return spec.cp > 1 and spec.causal and window is not None and window[1] == 0 and 1 <= window[0] <= c


class HaloTiles(WindowTiles):
    """:class:`~te_cudnn.parallel.ring.WindowTiles` whose neighbour blocks are their tails."""

    @property
    def left(self) -> int:
        return self.window[0]

    def _tail_start(self, origin: int) -> int:
        """Where, in ``origin``'s block of two chunks, the tail this rank receives starts."""
        return self.c - self.left if origin == self.spec.rank - 1 else 2 * self.c - self.left

    def calls(self, origin: int) -> tuple[WindowCall, ...]:
        found = super().calls(origin)
        if origin == self.spec.rank:
            return found
        start = self._tail_start(origin)
        return tuple(replace(call, kv_start=call.kv_start - start) for call in found)

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


def halo_forward_program(spec: RingSpec, tiles: HaloTiles, q, k, v, rng_states):
    """One rank's forward (a generator for a transport driver), returning what
    :func:`~te_cudnn.parallel.ring.forward_program` returns: the rng states of the own step and of
    each attended neighbour (in :meth:`HaloTiles.neighbours` order), and the received tails in
    place of the last packet."""
    send_next, send_prev = (_packet(tiles.tail(k, first), tiles.tail(v, first)) for first in (True, False))
    from_prev, from_next = torch.empty_like(send_next), torch.empty_like(send_prev)
    to_next = yield Post((send_next,), (from_prev,), forward=True)
    to_prev = yield Post((send_prev,), (from_next,), forward=False)
    state = [None] * 3 if rng_states is None else rng_states  # one per step (own, then each neighbour), as the ring
    acc, rng = tiles.forward_step(spec.rank, q, k, v, state[0], None)  # the own chunks while the tails travel
    rngs = [rng]
    yield Wait(to_next)
    yield Wait(to_prev)
    del send_next, send_prev
    shapes = tiles.tail_shapes(k, v)
    for i, (origin, packet) in enumerate(tiles.neighbours(from_prev, from_next), 1):
        acc, rng = tiles.forward_step(origin, q, *_unpack(packet, *shapes), state[i], acc)
        rngs.append(rng)
    return acc[0], acc[1], rngs, (from_prev, from_next)


def halo_backward_program(spec: RingSpec, tiles: HaloTiles, q, k, v, o, d_o, lse, rngs, packets):
    """One rank's backward (a generator): fp32 (dq, dk, dv) of the rank's own tokens, the
    gradients of its tails coming back from the neighbours that attended them."""
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    tiles.add_step(tiles.backward_step(spec.rank, q, k, v, o, d_o, lse, rngs[0]), dq, dk, dv)
    shapes = tiles.tail_shapes(k, v)
    size = shapes[0].numel() + shapes[1].numel()
    tail_grads = {}  # origin -> fp32 dK/dV of its tail
    for (origin, packet), rng in zip(tiles.neighbours(*packets), rngs[1:]):
        buf = torch.zeros(size, dtype=torch.float32, device=k.device)
        pending = tiles.backward_step(origin, q, *_unpack(packet, *shapes), o, d_o, lse, rng)
        tiles.add_step(pending, dq, *_unpack(buf, *shapes))
        tail_grads[origin] = buf
        pending = None
    del packets
    r = spec.rank
    sends = [tail_grads.pop(o) if o in tail_grads else torch.zeros(size, dtype=torch.float32, device=k.device)
             for o in (r - 1, r + 1)]  # fmt: skip
    back_a, back_b = (torch.empty(size, dtype=torch.float32, device=k.device) for _ in range(2))
    to_prev = yield Post((sends[0],), (back_a,), forward=False)  # my chunk a's tail, from r + 1
    to_next = yield Post((sends[1],), (back_b,), forward=True)  # my chunk b's tail, from r - 1
    del sends
    yield Wait(to_prev)
    yield Wait(to_next)
    for back, first in ((back_a, True), (back_b, False)):
        g_k, g_v = _unpack(back, *shapes)
        tiles.tail(dk, first).add_(g_k)
        tiles.tail(dv, first).add_(g_v)
    return dq, dk, dv
