"""The ring schedule of context parallelism, as pure functions of (cp, rank, step).

Rank ``r`` of ``cp`` holds query/key/value chunks ``r`` and ``2cp-1-r`` of the sequence (see
:mod:`te_cudnn.parallel.partition`). In the forward ring, step ``i`` attends the local queries
to the key/value block of rank ``(r - i) mod cp`` (each rank sends its block to ``r + 1``); in
the backward ring, step ``i`` holds the block of rank ``(r + 1 + i) mod cp`` (blocks and their
partial gradients travel to ``r - 1``), so that the last forward block starts the backward and
every block's gradient ends at its owner. Which part of the tile is computed depends only on
where the block comes from (TransformerEngine's sections):

=========  ==================  ===========================  =================  =================
section    block origin ``j``  queries                      keys/values        mask
=========  ==================  ===========================  =================  =================
DIAGONAL   ``j == r``          both chunks                  both chunks        causal (top-left)
LOWER      ``j < r``           both chunks                  first chunk only   none
UPPER      ``j > r``           second chunk only            both chunks        none
FULL       any (non-causal)    both chunks                  both chunks        none
=========  ==================  ===========================  =================  =================

Lower: both local query chunks come after chunk ``j`` and before chunk ``2cp-1-j``. Upper:
query chunk ``r`` precedes both key chunks, chunk ``2cp-1-r`` follows both. Diagonal: local
queries and keys are laid out alike, so the ordinary causal mask is exact. Every rank does the
same amount of causal work.

Sliding windows ``(left, right)`` (query ``p`` reaches keys ``[p - left, p + right]``; causal:
``right = 0``) replace the sections with :func:`window_calls`: for each of the four (query
chunk, key chunk) pairs of a tile, the rectangle of the pairs the window reaches, or nothing.
A band cuts a pair of equal chunks in a square (the whole pair, or the corner triangle's
bounding square), so every call has as many queries as keys and its top-left window has
bounds >= 0. The caller declines a window for which some corner is a single query and key
(:func:`single_key_tiles`; cuDNN has no ``sq = skv = 1`` backward).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Optional

__all__ = ["Section", "section", "fwd_origin", "bwd_origin", "fwd_step_of", "check_rank", "WindowCall", "ring_window",
           "window_calls", "single_key_tiles"]


class Section(enum.Enum):
    DIAGONAL = "diagonal"
    LOWER = "lower"
    UPPER = "upper"
    FULL = "full"

    @property
    def q_half(self) -> bool:
        """Only the second query chunk takes part."""
        return self is Section.UPPER

    @property
    def kv_half(self) -> bool:
        """Only the first key/value chunk takes part."""
        return self is Section.LOWER

    @property
    def causal(self) -> bool:
        return self is Section.DIAGONAL


def check_rank(cp: int, rank: int) -> None:
    if not isinstance(cp, int) or isinstance(cp, bool) or cp < 1:
        raise ValueError(f"cp (the context-parallel group size) must be a positive int, got {cp!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < cp:
        raise ValueError(f"rank={rank!r} is outside the context-parallel group of size cp={cp}")


def section(rank: int, origin: int, causal: bool) -> Section:
    """The part of rank ``rank``'s tile against the key/value block of rank ``origin``."""
    if not causal:
        return Section.FULL
    if origin == rank:
        return Section.DIAGONAL
    return Section.LOWER if origin < rank else Section.UPPER


def fwd_origin(cp: int, rank: int, step: int) -> int:
    """Whose key/value block rank ``rank`` holds at forward step ``step``."""
    return (rank - step) % cp


def bwd_origin(cp: int, rank: int, step: int) -> int:
    """Whose key/value block rank ``rank`` holds at backward step ``step``."""
    return (rank + 1 + step) % cp


def fwd_step_of(cp: int, rank: int, origin: int) -> int:
    """The forward step at which rank ``rank`` attended to ``origin``'s block (its dropout state)."""
    return (rank - origin) % cp


# ----------------------------------------------------------------------------- sliding windows
@dataclass(frozen=True)
class WindowCall:
    """One fused call of a windowed ring step: the rank's local query rows
    ``[q_start, q_start + q_len)`` against the held block's rows ``[kv_start, kv_start + kv_len)``,
    masked by the *top-left* window ``window`` (``(-1, -1)``: no mask)."""

    q_start: int
    q_len: int
    kv_start: int
    kv_len: int
    window: tuple[int, int]


def ring_window(window: tuple[int, int], causal: bool, total: int) -> Optional[tuple[int, int]]:
    """The window the ring computes with for a sequence of ``total`` keys: causal sets
    ``right = 0``, a bound of ``total - 1`` or more is no bound (``-1``). None when nothing is
    left of it (plain causal or full attention: the sections above serve those)."""
    left, right = window
    if causal:
        right = 0
    left, right = (-1 if w < 0 or w >= total - 1 else w for w in (left, right))
    return None if (left, right) == ((-1, 0) if causal else (-1, -1)) else (left, right)


def _sub_tile(a: int, b: int, c: int, window: tuple[int, int]) -> Optional[tuple[int, int, int, int, tuple[int, int]]]:
    """Query chunk ``a`` against key chunk ``b`` (``c`` tokens each) under the global window:
    ``(q_off, nq, k_off, nk, window')`` of the smallest rectangle holding every allowed pair
    (offsets inside the chunks), or None when the window reaches no pair. Query ``p`` reaches
    keys ``[p - left, p + right]``; the rectangle's rows are those reaching a key of chunk ``b``,
    its keys those some row reaches, and ``window'`` the top-left window that masks it exactly
    (both bounds >= 0 after trimming; a bound covering the whole rectangle becomes -1)."""
    left, right = window
    q0 = a * c if right < 0 else max(a * c, b * c - right)
    q1 = (a + 1) * c if left < 0 else min((a + 1) * c, (b + 1) * c + left)
    if q0 >= q1:
        return None
    k0 = b * c if left < 0 else max(b * c, q0 - left)
    k1 = (b + 1) * c if right < 0 else min((b + 1) * c, q1 + right)
    nq, nk, shift = q1 - q0, k1 - k0, k0 - q0
    w_left = -1 if left < 0 or left + shift >= nq - 1 else left + shift
    w_right = -1 if right < 0 or right - shift >= nk - 1 else right - shift
    return q0 - a * c, nq, k0 - b * c, nk, (w_left, w_right)


@functools.lru_cache(maxsize=4096)
def window_calls(cp: int, rank: int, origin: int, c: int, window: tuple[int, int]) -> tuple[WindowCall, ...]:
    """The fused calls of rank ``rank`` against the block of rank ``origin`` (chunks of ``c``
    tokens) under the global window ``window`` (as :func:`ring_window` returns it): one per
    (query chunk, key chunk) pair the window reaches, trimmed to the reached rectangle (square:
    a band cuts a square chunk pair in a square). Pairs the window does not reach are left
    out. Where a query chunk reaches both key chunks in full, the two merge into one call
    without a mask (and both query chunks into one call when they both do)."""
    rows: list[list[WindowCall]] = []
    for qi, a in enumerate((rank, 2 * cp - 1 - rank)):
        row = []
        for ki, b in enumerate((origin, 2 * cp - 1 - origin)):
            t = _sub_tile(a, b, c, window)
            if t is not None:
                row.append(WindowCall(qi * c + t[0], t[1], ki * c + t[2], t[3], t[4]))
        if len(row) == 2 and all(x.q_len == x.kv_len == c and x.window == (-1, -1) for x in row):
            row = [WindowCall(qi * c, c, 0, 2 * c, (-1, -1))]
        rows.append(row)
    if all(len(r) == 1 and r[0].kv_len == 2 * c and r[0].window == (-1, -1) for r in rows):
        return (WindowCall(0, 2 * c, 0, 2 * c, (-1, -1)),)
    return tuple(x for r in rows for x in r)


def single_key_tiles(cp: int, c: int, window: tuple[int, int]) -> bool:
    """Whether some rank's windowed ring has a call of one query against one key (cuDNN has no
    backward for ``sq = skv = 1``)."""
    return any(x.q_len == 1 and x.kv_len == 1 for r in range(cp) for j in range(cp)
               for x in window_calls(cp, r, j, c, window))  # fmt: skip
