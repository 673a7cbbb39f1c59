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
has the roster; their common interface is :mod:`.contender`.
"""

from __future__ import annotations

from typing import Any, Optional

from .contender import Contender, Run
from .handbuilt import HandBuilt
from .te_contender import TeCudnn, TeCudnnDecode
from .torch_contenders import FlexAttention, TorchSdpa

__all__ = ["Contender", "Run", "all_contenders", "select_contenders", "CONTENDER_GROUPS"]


# ============================================================================ the roster
def all_contenders(env: Any = None) -> list[Contender]:
    """Every contender, in column order. ``env`` (a ``te_cudnn.runtime.RuntimeEnv``) is what
    te_cudnn's rules are checked against (default: this machine)."""
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


