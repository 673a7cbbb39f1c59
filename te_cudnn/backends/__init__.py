"""Sub-backends in priority order, and the selector that explains its choice.

``select`` walks :data:`REGISTRY` and returns the first sub-backend whose
``not_supported_reasons`` is empty, unless a later one that also serves declares itself
measured faster for the configuration (``SubBackend.prefers``); ``explain`` returns every sub-backend's reasons. A
forced backend (argument or ``force_backend`` context) is checked, never silently replaced.
:data:`OPERANDS_BY_UID` names each uid's operand for a graph whose sub-backend is not known.
"""

from __future__ import annotations

from typing import Optional

from ..config import AttnConfig
from ..enums import FusedAttnBackend
from ..errors import UnsupportedConfigError
from ..runtime import RuntimeEnv
from .base import Capabilities, Direction, GraphSpec, SubBackend, Uid
from .f16_arbitrary import F16ArbitrarySeqlen
from .f16_max512 import F16Max512Seqlen
from .fp8 import FP8Backend
from .operands import Operand

__all__ = [
    "Capabilities", "Direction", "GraphSpec", "SubBackend", "Uid",
    "REGISTRY", "BY_ENUM", "OPERANDS_BY_UID", "explain_config", "reasons", "select",
]  # fmt: skip

#: Priority order. TE prefers arbitrary-seqlen over max512 whenever both are eligible.
REGISTRY: tuple[SubBackend, ...] = (F16ArbitrarySeqlen(), F16Max512Seqlen(), FP8Backend())
BY_ENUM: dict[FusedAttnBackend, SubBackend] = {b.enum: b for b in REGISTRY}


def _first_declarations() -> dict[int, Operand]:
    found: dict[int, Operand] = {}
    for backend in REGISTRY:
        for direction in Direction:
            for op in backend.operands(direction):
                found.setdefault(op.uid, op)
    return found


#: The first declaration of each uid in registry order (forward before backward).
OPERANDS_BY_UID = _first_declarations()


def reasons(backend: SubBackend, cfg: AttnConfig, env: RuntimeEnv, direction: Direction = Direction.FWD) -> list[str]:
    """``backend``'s reasons to decline ``cfg``. A training forward also asks for the
    backward's reasons, so a configuration never fails only once it reaches backward."""
    why = backend.not_supported_reasons(cfg, env, direction)
    if direction == Direction.FWD and cfg.is_training:
        why += [r for r in backend.not_supported_reasons(cfg, env, Direction.BWD) if r not in why]
    return why


def explain_config(cfg: AttnConfig, env: RuntimeEnv, direction: Direction = Direction.FWD) -> dict[FusedAttnBackend, list[str]]:
    """Each sub-backend's reasons for declining ``cfg`` (an empty list means it serves it)."""
    return {backend.enum: reasons(backend, cfg, env, direction) for backend in REGISTRY}


def select(
    cfg: AttnConfig, env: RuntimeEnv, forced: Optional[FusedAttnBackend] = None, direction: Direction = Direction.FWD
) -> SubBackend:
    """The sub-backend that serves ``cfg``; raises :class:`UnsupportedConfigError` otherwise."""
    if forced is not None and forced != FusedAttnBackend.No_Backend:
        backend = BY_ENUM[forced]
        why = reasons(backend, cfg, env, direction)
        if why:
            raise UnsupportedConfigError(f"{cfg.summary()} with the requested {forced.name}", {forced: why})
        return backend
    declined: dict[FusedAttnBackend, list[str]] = {}
    serving = []
    for backend in REGISTRY:
        why = reasons(backend, cfg, env, direction)
        if why:
            declined[backend.enum] = why
        else:
            serving.append(backend)
    if not serving:
        raise UnsupportedConfigError(cfg.summary(), declined)
    # A later sub-backend wins only where it declares itself measured faster (prefers).
    return next((b for b in serving if b.prefers(cfg, env, direction)), serving[0])
