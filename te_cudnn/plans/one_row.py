"""Which plans of one-row inference forwards launch from the fewest host microseconds.

A decode step's attention call (one query row per sequence, a KV cache, no gradient) runs a few
microseconds of GPU work, and the loops that make such calls (Hugging Face ``generate`` with
a dynamic cache, any Python decode loop) are bound by the host: the GPU waits for the next
launch. For these graphs cuDNN's heuristics rank first a split-KV configuration, which spreads
the keys over more thread blocks and reduces the parts in a second kernel through a workspace:
the least GPU time, but two kernels to launch. Its configurations without a workspace run one
kernel, launched in fewer host microseconds for more GPU time (measured in the plan-cache
guide). Up to :data:`MAX_KEYS` keys the single kernel takes less GPU time than te_cudnn's
cached call takes on the host, so even a loop of nothing but these calls stays bound by the
host, and every call saves the second launch. Beyond it the split-KV plan is kept. The plan key
carries the choice (``PlanKey.no_workspace``), so plans of either kind never stand in for each
other, in memory or in the plan store.

Forwards qualify that are F16 arbitrary-seqlen, dense (not THD, not paged), one query row,
without bias, dropout or softmax stats (no backward follows), at most :data:`MAX_KEYS` keys,
and not declared to run in a CUDA graph (``cuda_graph=True``: a replayed graph pays no launch,
only the GPU time). Where cuDNN offers no configuration without a workspace the heuristics'
plan is built. :func:`lean_one_row` turns the preference off (and on);
``TE_CUDNN_LEAN_ONE_ROW=0`` turns it off at import.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from ..backends.base import Direction
from ..enums import AttnBiasType, FusedAttnBackend

__all__ = ["MAX_KEYS", "keep_without_workspace", "lean_one_row", "prefers_no_workspace"]

#: The most keys per sequence for which a one-row inference forward prefers a plan without a workspace.
MAX_KEYS = 1024

_on = [os.environ.get("TE_CUDNN_LEAN_ONE_ROW", "1").strip().lower() not in ("0", "false", "off", "no")]


def lean_one_row(on: Optional[bool] = None) -> bool:
    """Whether one-row inference forwards of up to :data:`MAX_KEYS` keys prefer cuDNN's engine
    configurations without a workspace (one kernel to launch instead of two; see the module's
    description). On unless ``TE_CUDNN_LEAN_ONE_ROW=0`` was in the environment at import; pass
    ``on`` to change it (the calls prepared so far are forgotten, so that later ones key their
    plans under the new setting). Returns the setting in force before the call."""
    was = _on[0]
    if on is not None:
        if not isinstance(on, bool):
            raise TypeError(f"lean_one_row(on=...): on must be a bool or None, got {type(on).__name__} {on!r}")
        _on[0] = on
        prepared = sys.modules.get(f"{__package__.rpartition('.')[0]}.prepared")
        if on != was and prepared is not None:
            prepared.forget_prepared()
    return was


def prefers_no_workspace(backend: FusedAttnBackend, direction: Direction, cfg: Any) -> bool:
    """Whether the plan of this call keeps only configurations without a workspace."""
    return (_on[0] and direction == Direction.FWD and backend == FusedAttnBackend.F16_arbitrary_seqlen
            and cfg.sq == 1 and cfg.skv <= MAX_KEYS and not cfg.writes_stats and not cfg.is_ragged
            and cfg.paged is None and cfg.bias_type == AttnBiasType.no_bias and not cfg.dropout
            and not cfg.cuda_graph)  # fmt: skip


def keep_without_workspace(key: Any, graph: Any) -> None:
    """Leave ``graph`` (planned, not yet checked) only its configurations without a workspace
    when ``key`` prefers those (the autotuner then times only them)."""
    if getattr(key, "no_workspace", False):
        graph.deselect_workspace_greater_than(0)
