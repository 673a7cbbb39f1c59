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
"""

from __future__ import annotations

import enum

__all__ = ["Section", "section", "fwd_origin", "bwd_origin", "fwd_step_of", "check_rank"]


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
