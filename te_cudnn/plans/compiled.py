"""A built cuDNN plan ready to execute, and what is known about it (:class:`CompiledPlan`).

What the plan cache (``te_cudnn.plans.cache``) holds, the builder (``te_cudnn.plans.build``) and the
plan store (``te_cudnn.plans.persist``) give, and the launchers run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .execute import PlanLauncher
from .key import PlanKey

__all__ = ["CompiledPlan"]


@dataclass(eq=False)
class CompiledPlan:
    """A built cuDNN graph ready to execute, and what is known about it."""

    key: PlanKey
    graph: Any
    uids: tuple[int, ...]
    workspace_size: int
    plan_name: str
    build_seconds: float
    hits: int = 0
    last_used: int = 0  # recency stamp (a process-wide counter), for least-recently-used eviction
    created: float = field(default_factory=time.time)
    evicted: bool = False  # set when the cache drops it; holders then look it up again
    launch: Any = None  # PlanLauncher: launch(buffers, workspace, handle)
    source: str = "built"  # "built" here, or "store" (deserialized from the plan store)
    stages: dict = field(default_factory=dict)  # seconds per build or load stage, for inspection
    tuning: Optional[dict] = None  # the autotuning record (te_cudnn.plans.tune) when the plan is tuned
    tuning_error: Optional[str] = None  # why tuning this plan's key failed (the heuristic plan serves)
    tune_checked: bool = False  # landed while autotuning was on: not tuned again in this process

    def __post_init__(self) -> None:
        if self.launch is None:
            self.launch = PlanLauncher(self.graph, self.uids)

    def info(self) -> dict[str, Any]:
        return {
            "key": self.key.describe(),
            "plan_name": self.plan_name,
            "workspace_bytes": self.workspace_size,
            "build_ms": round(self.build_seconds * 1e3, 3),
            "stages_ms": {name: round(sec * 1e3, 3) for name, sec in self.stages.items()},
            "source": self.source,
            "hits": self.hits,
            "direct_launch": bool(getattr(self.launch, "direct", False)),
            "launch": getattr(self.launch, "mode", "custom"),
            "tuned": self.tuning is not None,
            **({"tuning": _tuning_summary(self.tuning)} if self.tuning is not None else {}),
            **({"tuning_error": self.tuning_error} if self.tuning_error else {}),
        }


def _tuning_summary(record: dict) -> dict[str, Any]:
    """What ``CompiledPlan.info()`` shows of a tuning record: the choice and every candidate."""
    keys = ("chosen", "heuristic", "speedup", "rule", "candidates", "timestamp")
    return {k: record.get(k) for k in keys}

