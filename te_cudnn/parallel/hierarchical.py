"""Hierarchical ("a2a+p2p") context parallelism: TransformerEngine's two-level scheme (USP /
LongVILA): Ulysses all-to-all inside small groups, the p2p ring across them.

The ``cp = A * P`` ranks form a grid: ``cp_group = [a2a_group, p2p_group]``, with the a2a
group of ``A`` ranks first (typically the GPUs of one node) and the ring of ``P`` ranks second
(across nodes). Global rank ``g = p * A + a`` (ring position ``p``, a2a position ``a``) holds
the dual-chunk share of ``cp`` (chunks ``g`` and ``2 cp - 1 - g``; :mod:`~te_cudnn.parallel.partition`).

1. The all-to-all of :mod:`~te_cudnn.parallel.ulysses` inside the a2a group ``p`` gathers its
   ``A`` shares, in order, for ``h / A`` heads: chunks ``pA .. pA + A - 1`` and
   ``(2P - 1 - p) A .. (2P - p) A - 1``, i.e. super-chunks ``p`` and ``2P - 1 - p`` of a
   sequence cut into ``2P`` -- exactly rank ``p``'s dual-chunk share of a ``P``-way split, the
   layout the ring expects (THD: the same per sequence, with the group's padded offsets
   ``cu_seqlens_padded // P``).
2. The ring of :mod:`~te_cudnn.parallel.ring` runs unchanged over the p2p group of ranks with
   the same ``a``, on the ``h / A`` heads of that a2a position (sliding windows and sinks as
   the ring serves them; the sink logits are those heads').
3. The inverse all-to-all returns each rank its own share with all heads.

Every step is differentiable (the all-to-all's gradient is the reverse all-to-all, the ring
has its own backward), so autograd gives the backward: a2a of dO, the ring backward, a2a of
dQ, dK, dV. Nothing here communicates by itself: the caller passes the exchange (a real
all-to-all, or stacking among virtual ranks) and the ring (over a real group or simulated).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from .ulysses import ExchangeAll, heads_to_sequence, sequence_to_heads

__all__ = ["check_layout", "grid_groups", "a2a_p2p_attention"]

#: ``ring(a, qs, ks, vs)``: the ring over the listed ranks of one p2p group (a2a position ``a``).
RingFn = Callable[[int, list, list, list], list]


def check_layout(layout: object, ranks: int) -> tuple[int, int]:
    """``(A, P)``: the a2a group size and the ring size of ``ranks = A * P`` ranks."""
    if (not isinstance(layout, (tuple, list)) or len(layout) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layout)):  # fmt: skip
        raise ValueError(f"cp_layout must be (a2a group size, p2p group size), two positive ints, got {layout!r}")
    if layout[0] * layout[1] != ranks:
        raise ValueError(f"cp_layout={tuple(layout)} makes {layout[0] * layout[1]} ranks, but {ranks} are given")
    return layout[0], layout[1]


def grid_groups(a2a: int, p2p: int) -> tuple[list[list[int]], list[tuple[int, list[int]]]]:
    """The groups of a ``(a2a, p2p)`` grid in global rank order ``g = p * a2a + a``: the a2a groups
    (each a contiguous block) and, for each a2a position ``a``, its ring."""
    blocks = [[p * a2a + a for a in range(a2a)] for p in range(p2p)]
    rings = [(a, [p * a2a + a for p in range(p2p)]) for a in range(a2a)]
    return blocks, rings


def _per_group(xs: Sequence[torch.Tensor], groups: Sequence[Sequence[int]],
               fn: Callable[[list[torch.Tensor]], list[torch.Tensor]]) -> list[torch.Tensor]:  # fmt: skip
    out: list[Optional[torch.Tensor]] = [None] * len(xs)
    for idx in groups:
        for i, y in zip(idx, fn([xs[i] for i in idx])):
            out[i] = y
    return out  # type: ignore[return-value]


def a2a_p2p_attention(ring: RingFn, qs, ks, vs, a2a: int, p2p: int, fmt: str,
                      cu_padded: tuple[Optional[torch.Tensor], Optional[torch.Tensor]], exchange: ExchangeAll,
                      blocks: Sequence[Sequence[int]],
                      rings: Sequence[tuple[int, Sequence[int]]]) -> list[torch.Tensor]:  # fmt: skip
    """The listed ranks' outputs (all ``A * P`` in a simulation, one on real groups).
    ``blocks``: the listed ranks of each a2a group (``exchange`` runs once per block);
    ``rings``: ``(a, listed ranks)`` of each ring; ``cu_padded``: the global THD padded offsets
    (None for dense formats)."""
    pad_q, pad_kv = (None if c is None else c // p2p for c in cu_padded)  # one a2a group's padded sequences

    def to_heads(xs, padded):
        return _per_group(xs, blocks, lambda sub: heads_to_sequence(sub, a2a, fmt, padded, exchange))

    q2, k2, v2 = to_heads(qs, pad_q), to_heads(ks, pad_kv), to_heads(vs, pad_kv)
    outs: list[Optional[torch.Tensor]] = [None] * len(qs)
    for a, idx in rings:
        for i, o in zip(idx, ring(a, [q2[i] for i in idx], [k2[i] for i in idx], [v2[i] for i in idx])):
            outs[i] = o
    return _per_group(outs, blocks, lambda sub: sequence_to_heads(sub, a2a, fmt, pad_q, exchange))
