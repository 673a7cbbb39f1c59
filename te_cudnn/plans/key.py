"""Plan-cache keys: everything that changes a cuDNN graph, as named fields.

A :class:`PlanKey` holds the sub-backend, the direction, the validated call description
(:class:`~te_cudnn.config.AttnConfig`: shapes, strides, dtypes, layout, mask, bias shape,
dropout, window, scale, determinism, device) and the cuDNN / frontend versions. It holds no
tensor values, no pointers and no runtime sequence lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from ..backends.base import Direction
from ..config import AttnConfig
from ..enums import FusedAttnBackend
from .one_row import prefers_no_workspace

__all__ = ["PlanKey", "make_key"]


@dataclass(frozen=True)
class PlanKey:
    backend: FusedAttnBackend
    direction: Direction
    config: AttnConfig
    cudnn_version: int
    frontend_version: str
    #: the plan keeps only engine configurations without a workspace (te_cudnn.plans.one_row)
    no_workspace: bool = False

    def __post_init__(self) -> None:
        # Hashed once: a key has ~30 nested fields, and the hot path hashes a key per call.
        object.__setattr__(self, "_hash", hash((self.backend, self.direction, self.config, self.cudnn_version,
                                                self.frontend_version, self.no_workspace)))  # fmt: skip

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def describe(self, device: bool = True) -> dict[str, Any]:
        """A flat, JSON-friendly view (enums and dtypes as names) for tools and logs.

        ``device=False`` leaves out the GPU ordinal: the plan store's key. A plan is the same on
        every GPU of one model (the model is in the store's fingerprint), so the ranks of a node
        share one stored file per plan; in memory, plans stay per device."""
        out: dict[str, Any] = {
            "backend": self.backend.name,
            "direction": self.direction.value,
            "cudnn_version": self.cudnn_version,
            "frontend_version": self.frontend_version,
            "no_workspace": self.no_workspace,
        }
        for f in fields(self.config):
            if f.name == "device" and not device:
                continue
            value = getattr(self.config, f.name)
            if hasattr(value, "name") and not isinstance(value, (tuple, str)):
                value = value.name
            elif isinstance(value, tuple):
                value = list(value)
            elif not isinstance(value, (int, float, str, bool, type(None))):
                value = str(value).removeprefix("torch.")
            out[f.name] = value
        return out

    def __str__(self) -> str:
        c = self.config
        return f"PlanKey({self.backend.name} {self.direction.value}: {c.summary()}, cuda:{c.device})"


def make_key(backend: FusedAttnBackend, direction: Direction, cfg: AttnConfig, cudnn_version: int, frontend_version: str) -> PlanKey:
    """Normalise fields that do not change the graph for this direction, then key (with the
    plan's engine preference, :func:`te_cudnn.plans.one_row.prefers_no_workspace`)."""
    no_workspace = prefers_no_workspace(backend, direction, cfg)
    if direction == Direction.FWD:
        cfg = replace(cfg, deterministic=False, do_stride=None, cuda_graph=False)
    else:
        cfg = replace(cfg, is_training=True, return_max_logit=False, cuda_graph=False)
    return PlanKey(backend, direction, cfg, cudnn_version, frontend_version, no_workspace)
