"""What every contender is: :class:`Contender` (who computes a case: ``name``,
``supports(case)``, ``prepare(case, inputs) -> Run``) and :class:`Run` (what one contender set up
for one case, and the callable of each timed mode). The roster is :mod:`.contenders`."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .cases import Case
from .inputs import Inputs

__all__ = ["Contender", "Run"]


class Run:
    """One contender prepared for one case."""

    precision = "bf16"
    #: plan build / load / compile facts and notes, merged into the result row
    info: dict

    def __init__(self) -> None:
        self.info = {}

    def before(self, mode: str) -> Any:
        """State a mode needs, made on the current stream (``bwd``: a forward's results)."""
        return None

    def call(self, mode: str, state: Any = None) -> Callable[[], Any]:
        """The callable timed for ``mode`` (``fwd``, ``bwd`` or ``fwd_bwd``)."""
        fn = {"fwd": self.fwd, "fwd_bwd": self.fwd_bwd}.get(mode)
        if mode == "bwd":
            return lambda: self.bwd(state)
        if fn is None:
            raise ValueError(f"unknown mode {mode!r}")
        return fn

    def fwd(self) -> Any:
        raise NotImplementedError

    def bwd(self, state: Any) -> Any:
        raise NotImplementedError

    def fwd_bwd(self) -> Any:
        raise NotImplementedError

    def first(self) -> Any:
        """The call the first-call time and the memory probe use: fwd+bwd, or fwd for inference."""
        return self.fwd_bwd() if self.training else self.fwd()

    def output(self) -> torch.Tensor:
        """O of one forward, in the case's q layout (bshd, thd, or [b, 1, h, d] for decode),
        dequantized where it is FP8: the runner compares contenders' results with it."""
        raise NotImplementedError

    training = True


class Contender:
    name = ""
    key = ""  # short name for --contenders
    quick = True  # part of --quick
    quick_why = ""  # why not, when it is not
    #: cases this contender runs by default (None: every case it supports), and why only those
    default_cases: Optional[frozenset] = None
    subset_why = ""
    #: prepared and timed after the other contenders of a case (it changes state they share)
    runs_last = False
    # False: nothing it does changes te_cudnn's plan cache, so it can be timed again beside the
    # contenders that run last (their ratios then come from one interleaved phase)
    shares_plan_cache = False

    def supports(self, case: Case) -> Optional[str]:
        return None

    def prepare(self, case: Case, inputs: Inputs) -> Run:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
