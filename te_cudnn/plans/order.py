"""The order in which side-by-side timings visit their contenders, round after round.

Every timing loop in te_cudnn that compares contenders (the autotuner's engine candidates, the
FP8 backward's splits, the benchmark's contenders) takes samples in rounds, one sample of each
contender per round, so that a drift of the GPU's clocks hits every contender alike. The order
*within* a round matters too: a sample's time depends on what the GPU ran just before it (a
cuDNN engine timed right after a slower, cooler kernel runs faster than after a fast one). A
fixed order, or one rotated by one each round, keeps every contender's predecessor the same in all but one position
of the cycle, so that bias goes into the medians. :func:`round_order` draws a fresh permutation
each round from a seeded generator: every contender meets every neighbour, and a run's orders
replay exactly.
"""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

__all__ = ["ORDER_SEED", "round_order", "order_rng"]

T = TypeVar("T")

#: The seed of the orders when the caller names none (the same orders in every process).
ORDER_SEED = 0


def order_rng(seed: int = ORDER_SEED) -> random.Random:
    """The generator one timing loop draws all its round orders from."""
    return random.Random(seed)


def round_order(items: Sequence[T], rng: random.Random) -> list[T]:
    """A fresh order of ``items`` for one round (``items`` itself is left as it is)."""
    order = list(items)
    rng.shuffle(order)
    return order
