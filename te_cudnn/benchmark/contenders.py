"""The contenders: who computes a case, and how.

Each :class:`Contender` has a ``name``, ``supports(case) -> Optional[str]`` (the reason it
cannot run the case, or None) and ``prepare(case, inputs) -> Run``. A :class:`Run` holds what
one contender set up for one case (plans, graphs, views of the shared inputs) and gives the
callable for each timed mode: ``fwd``, ``bwd`` (after a forward, whose results
:meth:`Run.before` makes) and ``fwd_bwd``. Training forwards save what their backward needs
(te_cudnn's softmax stats, autograd's saved tensors), as in training.

Contenders: te_cudnn forced to each sub-backend (``F16_arbitrary_seqlen``, ``F16_max512_seqlen``,
``FP8``) and autotuned (when ``te_cudnn.plans.tune`` exists); on decode cases also
``te_cudnn.fused_attn_decode`` on the paged cache and on the dense cache torch SDPA reads; the
same cuDNN graph built by hand with the frontend (its heuristics, ``graph.execute``); torch SDPA
with each CUDA backend (BHSD views of the same bshd data, ``enable_gqa``); FlexAttention
compiled once per case.

The contenders themselves live in :mod:`.te_contender` (te_cudnn), :mod:`.handbuilt` (the
frontend graph by hand) and :mod:`.torch_contenders` (torch SDPA, FlexAttention); this module
has their common interface and the roster.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .cases import Case
from .inputs import Inputs

__all__ = ["Contender", "Run", "all_contenders", "select_contenders", "CONTENDER_GROUPS"]


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


# ============================================================================ the roster
def all_contenders(env: Any = None) -> list[Contender]:
    """Every contender, in column order. ``env`` (a ``te_cudnn.runtime.RuntimeEnv``) is what
    te_cudnn's rules are checked against (default: this machine)."""
    from .handbuilt import HandBuilt  # noqa: PLC0415 - they import this module
    from .te_contender import TeCudnn, TeCudnnDecode  # noqa: PLC0415
    from .torch_contenders import FlexAttention, TorchSdpa  # noqa: PLC0415

    return [
        TeCudnn("te_cudnn", "te_cudnn", "F16_arbitrary_seqlen", env=env),
        TeCudnn("te_cudnn autotuned", "te_cudnn_autotuned", None, autotune=True, env=env),
        TeCudnn("te_cudnn fp8", "te_cudnn_fp8", "FP8", fp8=True, env=env),
        TeCudnn("te_cudnn fp8 autotuned", "te_cudnn_fp8_autotuned", "FP8", fp8=True, autotune=True, env=env),
        TeCudnn("te_cudnn max512", "te_cudnn_max512", "F16_max512_seqlen", env=env),
        TeCudnnDecode("te_cudnn decode", "te_cudnn_decode", dense=False),
        TeCudnnDecode("te_cudnn decode, dense cache", "te_cudnn_decode_dense", dense=True),
        HandBuilt(),
        HandBuilt(allocating=True),
        TorchSdpa("cuDNN"),
        TorchSdpa("flash"),
        TorchSdpa("efficient"),
        FlexAttention(),
    ]


#: --contenders groups
#: ``targets``: the contenders the report's targets compare (te_cudnn heuristic / autotuned / FP8 /
#: decode, the hand-built graph, torch SDPA cuDNN), without those no target reads (torch SDPA
#: flash and efficient, FlexAttention, max512): the same timing seconds give each of them about
#: twice the rounds, so the intervals around the targets' ratios narrow (clocks drift over a
#: sustained run; a few samples per contender cannot tell 2 % from noise).
CONTENDER_GROUPS = {"te": ("te_cudnn", "te_cudnn_autotuned", "te_cudnn_fp8", "te_cudnn_fp8_autotuned",
                           "te_cudnn_max512", "te_cudnn_decode", "te_cudnn_decode_dense"),
                    "sdpa": ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient"),
                    "targets": ("te_cudnn", "te_cudnn_autotuned", "te_cudnn_fp8", "te_cudnn_fp8_autotuned",
                                "te_cudnn_decode", "te_cudnn_decode_dense", "hand_built", "hand_built_alloc",
                                "sdpa_cudnn")}  # fmt: skip


def select_contenders(spec: Optional[str] = None, env: Any = None) -> list[Contender]:
    """Contenders by key (``te_cudnn``, ``sdpa_flash``, ...), display name or group (``te``,
    ``sdpa``), comma-separated; None or ``all``: every contender."""
    roster = all_contenders(env)
    if not spec or spec == "all":
        return roster
    keys: set[str] = set()
    by = {**{c.key: c for c in roster}, **{c.name.lower(): c for c in roster}}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        low = item.lower()
        if low in CONTENDER_GROUPS:
            keys |= set(CONTENDER_GROUPS[low])
        elif low in by:
            keys.add(by[low].key)
        else:
            raise ValueError(f"unknown contender {item!r}; contenders: {', '.join(c.key for c in roster)}; "
                             f"groups: {', '.join(CONTENDER_GROUPS)}")  # fmt: skip
    return [c for c in roster if c.key in keys]


