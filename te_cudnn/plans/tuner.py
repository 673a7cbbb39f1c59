"""The interface through which the plan cache asks the autotuner (:class:`Tuner`), and the tuner
in use (:func:`use_tuner`; ``te_cudnn.plans.tune`` hands itself over when it is imported)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

from .compiled import CompiledPlan
from .key import PlanKey

__all__ = ["Tuner", "use_tuner"]


class Tuner(Protocol):
    """What the cache asks of the autotuner: ``te_cudnn.plans.tune``, which builds on the cache
    (``te_cudnn.plans.cache``) and hands itself over with :func:`use_tuner` when it is imported (its functions are
    looked up on every call, so replacing one, as tests do, takes effect)."""

    def autotune_enabled(self) -> bool: ...  # autotuning switched on at all (read on every lookup)

    def tuning_wanted(self, key: PlanKey) -> bool: ...  # this key wants a tuned plan

    def tune_plan(self, key: PlanKey, make_spec: Callable[[], Any]) -> "CompiledPlan": ...  # with its record

    def valid_record(self, record: Any) -> bool: ...  # a stored tuning record this version can use


_tuner: list = [None]  # the Tuner in use (a list: read on every lookup, set once)


def use_tuner(tuner: Optional[Tuner]) -> None:
    """Make ``tuner`` the one lookups ask (None: plans are never tuned)."""
    _tuner[0] = tuner


def _tuning_wanted(key: PlanKey) -> bool:
    """Whether a lookup of ``key`` wants a tuned plan (the tuner's ``tuning_wanted``); with autotuning
    off, a context-variable read and an environment lookup."""
    tuner = _tuner[0]
    return tuner is not None and tuner.autotune_enabled() and tuner.tuning_wanted(key)

