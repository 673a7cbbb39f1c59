"""Control and visibility: force or forbid a sub-backend, and switch on debug logging.

**Backend policy.** Automatic selection (:func:`select`: the sub-backends' declared rules of
:mod:`te_cudnn.backends`, then the policy) can be steered, most specific first:

1. the ``fused_attention_backend=`` argument of ``fused_attn_fwd`` / ``fused_attn_bwd``
   (or :class:`~te_cudnn.AttnOptions`) forces a sub-backend for that call;
2. :func:`backend_policy` forces and/or forbids sub-backends for the code it wraps. It lives
   in a :class:`contextvars.ContextVar`: other threads and asyncio tasks do not see it
   (autograd may run a backward in its own thread, outside the context); contexts nest (an
   inner ``force`` replaces the outer one, ``forbid`` sets add up) and are restored on exit,
   also when the body raises;
3. environment variables, **read once when te_cudnn is imported** (:func:`reload_env` reads
   them again, for tests): ``TE_CUDNN_FUSED_ATTN_BACKEND`` forces a sub-backend (a name such
   as ``F16_arbitrary_seqlen``, or TransformerEngine's int: 0 = ``F16_max512_seqlen``, 1 =
   ``F16_arbitrary_seqlen``, 2 = ``FP8``); ``TE_CUDNN_FORBID_BACKENDS=name,name`` forbids.
   When ``TE_CUDNN_FUSED_ATTN_BACKEND`` is unset, TransformerEngine's
   ``NVTE_FUSED_ATTN_BACKEND`` (same ints) is honoured with TransformerEngine's meaning: a
   *preference* (the named sub-backend is used where it serves the configuration, automatic
   selection elsewhere), never an error, so a TE setting that only picks between the F16
   sub-backends cannot break FP8 or long-sequence calls.

A forced sub-backend is checked, never silently replaced: one that declines the configuration
raises :class:`~te_cudnn.UnsupportedConfigError` with its reasons. A forbidden one declines
with the reason ``forbidden by ...`` (so the error, and :func:`te_cudnn.explain`, list it);
forcing a forbidden one raises. ``force`` applies to both directions; the backward otherwise
follows what the forward's ``aux_ctx_tensors`` hold. ``fused_attn_fwd`` / ``fused_attn_bwd``
remember a prepared call per call signature *and* per policy (the current :func:`token`),
so a changed policy never reuses a call prepared under another one.

**Debug logging** (the ``"te_cudnn"`` logger): which sub-backend serves each new call
signature and why the others declined, and each plan's build or load. Switched on by
``TE_CUDNN_DEBUG=1`` with ``TE_CUDNN_DEBUG_LEVEL=0|1|2`` (warnings only, INFO, DEBUG), modelled
on TransformerEngine's ``NVTE_DEBUG`` / ``NVTE_DEBUG_LEVEL``, which are honoured when the
te_cudnn ones are unset. Switched on, the logger gets that level and one stderr handler at
import; otherwise te_cudnn adds no handler (configure ``logging`` as usual). A malformed value
of any of these variables warns once and is ignored.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

from .backends import BY_ENUM, REGISTRY, Direction, SubBackend
from .backends import reasons as declared_reasons
from .config import AttnConfig
from .enums import FusedAttnBackend
from .errors import UnsupportedConfigError
from .runtime import RuntimeEnv

__all__ = [
    "Policy", "backend_policy", "current", "resolve", "reload_env", "token", "debug_level_from_env",
    "select", "explain_config", "choose",
]  # fmt: skip

_log = logging.getLogger("te_cudnn")

ARGUMENT = "the fused_attention_backend argument"
CONTEXT_FORCE = "te_cudnn.backend_policy(force=...)"
CONTEXT_FORBID = "te_cudnn.backend_policy(forbid=...)"
ENV_FORCE = "TE_CUDNN_FUSED_ATTN_BACKEND"
ENV_PREFER = "NVTE_FUSED_ATTN_BACKEND"
ENV_FORBID = "TE_CUDNN_FORBID_BACKENDS"

_AUTOMATIC = int(FusedAttnBackend.No_Backend)  # a context's force=No_Backend: automatic selection


class _Scope(NamedTuple):
    """What the active ``backend_policy`` contexts say, as plain ints: hashed by C code on every
    call (part of the call signature), compared by value (equal policies share prepared calls)."""

    force: Optional[int]  # None: no context forces; -1: automatic selection (overrides the env)
    forbid: frozenset  # ints


#: No ``backend_policy`` context active: the token every call outside a context carries.
NO_CONTEXT: Optional[_Scope] = None

_policy_var: ContextVar[Optional[_Scope]] = ContextVar("te_cudnn_backend_policy", default=NO_CONTEXT)

#: The hot path's read of the current policy token (a bound C method, no Python frame; None outside any context).
token = _policy_var.get


@dataclass(frozen=True)
class Policy:
    """The policy in force for one selection: what is forced, preferred and forbidden, and by whom."""

    force: Optional[FusedAttnBackend] = None
    force_origin: str = ""
    prefer: Optional[FusedAttnBackend] = None  # NVTE_FUSED_ATTN_BACKEND: used where it serves
    prefer_origin: str = ""
    forbid: Mapping[FusedAttnBackend, tuple[str, ...]] = field(default_factory=dict)  # backend -> origins

    def reasons(self, backend: FusedAttnBackend) -> list[str]:
        """The policy's reasons for ``backend`` to decline (added to its declared ones)."""
        why = [f"forbidden by {origin}" for origin in self.forbid.get(backend, ())]
        if self.force is not None and backend != self.force:
            why.append(f"{self.force.name} is forced by {self.force_origin}")
        return why

    def how(self, backend: FusedAttnBackend) -> str:
        """How ``backend`` came to be chosen, for the log."""
        if self.force is not None:
            return f"forced by {self.force_origin}"
        if self.prefer == backend:
            return f"preferred by {self.prefer_origin}"
        return "automatic selection" + (f"; forbidden: {', '.join(b.name for b in self.forbid)}" if self.forbid else "")


# ------------------------------------------------------------------------------- environment
_env_warned: set[tuple[str, str]] = set()


def _warn_env(name: str, raw: str, what: str, ignoring: str = "it") -> None:
    if (name, raw) not in _env_warned:
        _env_warned.add((name, raw))
        warnings.warn(f"te_cudnn: {name}={raw!r} is not {what}; ignoring {ignoring}", stacklevel=3)


def _parse_backend(raw: str) -> FusedAttnBackend:
    """A sub-backend from a name (any case) or TransformerEngine's int; ValueError otherwise."""
    text = raw.strip()
    try:
        value: Any = int(text)
    except ValueError:
        value = text
    return FusedAttnBackend.coerce(value)


_BACKEND_WORDS = "a sub-backend name or TransformerEngine's int (0 = F16_max512_seqlen, 1 = F16_arbitrary_seqlen, 2 = FP8)"


def _env_backend(environ: Mapping[str, str], name: str) -> tuple[bool, Optional[FusedAttnBackend]]:
    """(set, backend) for a forcing variable: unset or blank -> (False, None); a malformed value
    warns and counts as unset; -1 / No_Backend -> (True, None): automatic selection."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return False, None
    try:
        backend = _parse_backend(raw)
    except ValueError:
        _warn_env(name, raw, _BACKEND_WORDS)
        return False, None
    return True, None if backend == FusedAttnBackend.No_Backend else backend


@dataclass(frozen=True)
class _EnvPolicy:
    force: Optional[FusedAttnBackend] = None
    force_origin: str = ""
    prefer: Optional[FusedAttnBackend] = None
    forbid: frozenset = frozenset()


def _read_env(environ: Mapping[str, str]) -> _EnvPolicy:
    forced_set, force = _env_backend(environ, ENV_FORCE)
    prefer = None
    if not forced_set:
        _, prefer = _env_backend(environ, ENV_PREFER)
    forbid, bad = set(), []
    raw = environ.get(ENV_FORBID, "")
    for item in filter(None, (i.strip() for i in raw.split(","))):
        try:
            backend = _parse_backend(item)
        except ValueError:
            backend = FusedAttnBackend.No_Backend
        if backend == FusedAttnBackend.No_Backend:
            bad.append(item)
        else:
            forbid.add(backend)
    if bad:
        _warn_env(ENV_FORBID, raw, f"a comma-separated list of sub-backends ({', '.join(map(repr, bad))}: use "
                                   f"{_BACKEND_WORDS})", ignoring="those entries")  # fmt: skip
    origin = f"{ENV_FORCE}={environ.get(ENV_FORCE, '').strip()}" if force is not None else ""
    return _EnvPolicy(force, origin, prefer, frozenset(forbid))


_ENV = _read_env(os.environ)


def reload_env(environ: Optional[Mapping[str, str]] = None) -> None:
    """Read the backend-policy variables again (from ``environ``, default ``os.environ``) and
    forget every prepared call, so the next calls select under the new setting. For tests:
    te_cudnn otherwise reads them once, at import."""
    global _ENV
    _ENV = _read_env(os.environ if environ is None else environ)
    prepared = sys.modules.get(f"{__package__}.prepared")
    if prepared is not None:  # prepared calls key on the context token only; the environment is global
        prepared.forget_prepared()


# ------------------------------------------------------------------------------- resolution
def resolve(explicit: Optional[FusedAttnBackend] = None) -> Policy:
    """The policy for one selection: ``explicit`` (the ``fused_attention_backend`` argument)
    over the current :func:`backend_policy` context over the environment."""
    scope, env = _policy_var.get(), _ENV
    forbid: dict[FusedAttnBackend, tuple[str, ...]] = {b: (ENV_FORBID,) for b in sorted(env.forbid)}
    for b in sorted(scope.forbid if scope is not None else ()):
        forbid[FusedAttnBackend(b)] = (CONTEXT_FORBID,) + forbid.get(FusedAttnBackend(b), ())
    if explicit is not None and explicit != FusedAttnBackend.No_Backend:
        force, origin = explicit, ARGUMENT
    elif scope is not None and scope.force is not None:
        force = None if scope.force == _AUTOMATIC else FusedAttnBackend(scope.force)
        origin = CONTEXT_FORCE if force is not None else ""
    else:
        force, origin = env.force, env.force_origin
    prefer = env.prefer if force is None else None
    return Policy(force, origin, prefer, f"{ENV_PREFER}={int(prefer)}" if prefer is not None else "", forbid)


def current() -> Policy:
    """The policy in force here without an explicit ``fused_attention_backend``."""
    return resolve(None)


def _coerce(value: Any, argument: str) -> FusedAttnBackend:
    if isinstance(value, str):
        try:
            return _parse_backend(value)
        except ValueError:
            pass  # coerce again for its message, which names the argument
    return FusedAttnBackend.coerce(value, argument=argument)


def backend_policy(force: Any = None, forbid: Iterable[Any] = ()) -> contextlib.AbstractContextManager[Policy]:
    """Force and/or forbid sub-backends for the code in the ``with`` block (or a decorated function).

    ``force``: a :class:`~te_cudnn.FusedAttnBackend`, its name or TransformerEngine's int;
    ``None`` keeps the enclosing context's (or the environment's) force, ``No_Backend`` / -1
    restores automatic selection inside. ``forbid``: sub-backends to decline, added to the
    enclosing context's. Yields the resulting :class:`Policy`. The explicit
    ``fused_attention_backend=`` argument still wins over ``force``; forcing a sub-backend that
    declines the configuration, or is forbidden, raises :class:`~te_cudnn.UnsupportedConfigError`.

    Thread- and task-local (a :class:`contextvars.ContextVar`). Arguments are checked here,
    before the block runs::

        with te_cudnn.backend_policy(forbid=["F16_max512_seqlen"]):
            out, aux = te_cudnn.fused_attn_fwd(...)
    """
    f = None if force is None else int(_coerce(force, "force"))
    if isinstance(forbid, (str, bytes, int, FusedAttnBackend)):
        forbid = (forbid,)  # one sub-backend, not its characters
    try:
        items = list(forbid)
    except TypeError:
        raise TypeError(f"forbid must be an iterable of sub-backends, got {type(forbid).__name__}") from None
    banned = frozenset(int(_coerce(b, "forbid")) for b in items)
    if _AUTOMATIC in banned:
        raise ValueError("forbid=No_Backend means nothing: name the sub-backends to forbid")
    return _apply(f, banned)


@contextlib.contextmanager
def _apply(force: Optional[int], forbid: frozenset) -> Iterator[Policy]:
    outer = _policy_var.get()
    if outer is not None:
        force = outer.force if force is None else force
        forbid = outer.forbid | forbid
    scope = None if force is None and not forbid else _Scope(force, forbid)
    reset = _policy_var.set(scope)
    try:
        yield current()
    finally:
        _policy_var.reset(reset)


# ------------------------------------------------------------------------------- selection under the policy
# te_cudnn.backends holds the sub-backends' declared rules (and is hashed into the plan format:
# tests/test_plan_format.py); the policy is applied on top of them here.
def explain_config(cfg: AttnConfig, env: RuntimeEnv, direction: Direction = Direction.FWD,
                   policy: Optional[Policy] = None) -> dict[FusedAttnBackend, list[str]]:  # fmt: skip
    """Each sub-backend's reasons for declining ``cfg`` (an empty list means it serves it): its
    declared ones (:func:`te_cudnn.backends.explain_config`) and the policy's (default: the one
    in force here, :func:`current`)."""
    policy = current() if policy is None else policy
    return {b.enum: declared_reasons(b, cfg, env, direction) + policy.reasons(b.enum) for b in REGISTRY}


def choose(serving: Sequence[SubBackend], cfg: AttnConfig, env: RuntimeEnv, direction: Direction,
           policy: Policy) -> SubBackend:  # fmt: skip
    """Among sub-backends that all serve ``cfg`` (registry order): the policy's preferred one,
    else a later one that declares itself measured faster (``prefers``), else the first."""
    return (next((b for b in serving if b.enum == policy.prefer), None)
            or next((b for b in serving if b.prefers(cfg, env, direction)), serving[0]))  # fmt: skip


def select(cfg: AttnConfig, env: RuntimeEnv, forced: Optional[FusedAttnBackend] = None,
           direction: Direction = Direction.FWD, *, policy: Optional[Policy] = None) -> SubBackend:  # fmt: skip
    """:func:`te_cudnn.backends.select` under the policy: the sub-backend that serves ``cfg``, or
    :class:`~te_cudnn.UnsupportedConfigError` with every reason. ``forced`` is the explicit
    ``fused_attention_backend`` argument; ``policy`` defaults to :func:`resolve` of it. Logs the
    choice (INFO; the others' reasons at DEBUG): ``fused_attn_fwd`` / ``fused_attn_bwd`` call it
    once per new call signature, never per call."""
    policy = resolve(forced) if policy is None else policy
    if policy.force is not None:  # checked, never silently replaced
        backend = BY_ENUM[policy.force]
        why = declared_reasons(backend, cfg, env, direction) + policy.reasons(backend.enum)
        if why:
            by = "" if policy.force_origin == ARGUMENT else f" (forced by {policy.force_origin})"
            raise UnsupportedConfigError(f"{cfg.summary()} with the requested {backend.name}{by}", {backend.enum: why})
        _log_choice(backend, cfg, direction, policy, {})
        return backend
    per_backend = explain_config(cfg, env, direction, policy)
    serving = [BY_ENUM[b] for b, why in per_backend.items() if not why]
    if not serving:
        raise UnsupportedConfigError(cfg.summary(), per_backend)
    backend = choose(serving, cfg, env, direction, policy)
    _log_choice(backend, cfg, direction, policy, per_backend)
    return backend


def _log_choice(backend: SubBackend, cfg: AttnConfig, direction: Direction, policy: Policy,
                declined: Mapping[FusedAttnBackend, list[str]]) -> None:  # fmt: skip
    if not _log.isEnabledFor(logging.INFO):
        return
    _log.info("selected %s (%s) for %s [%s]", backend.name, direction.value, cfg.summary(), policy.how(backend.enum))
    if _log.isEnabledFor(logging.DEBUG):
        for enum, why in declined.items():
            if why and enum != backend.enum:
                _log.debug("  %s declined: %s", enum.name, "; ".join(why))


# ------------------------------------------------------------------------------- debug logging
_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}
_WORDS = {"true": 1, "yes": 1, "on": 1, "false": 0, "no": 0, "off": 0}
LOG_FORMAT = "[%(levelname)-8s | %(name)s | pid %(process)d]: %(message)s"


def _env_int(environ: Mapping[str, str], name: str) -> Optional[int]:
    """A non-negative int (or true/false/yes/no/on/off) in ``name``; None when unset, blank or
    malformed (a malformed value warns once)."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip().lower()
    if text in _WORDS:
        return _WORDS[text]
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        _warn_env(name, raw, "a non-negative integer")
        return None
    return value


def debug_level_from_env(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """The ``logging`` level the debug variables ask for, or None when debug logging is off.

    ``TE_CUDNN_DEBUG`` (else ``NVTE_DEBUG``) switches it on; ``TE_CUDNN_DEBUG_LEVEL`` (else
    ``NVTE_DEBUG_LEVEL``, default 0) picks 0 = WARNING, 1 = INFO, 2 (or more, as in
    TransformerEngine) = DEBUG. Each variable falls back to its ``NVTE_`` twin on its own."""
    environ = os.environ if environ is None else environ
    on = _env_int(environ, "TE_CUDNN_DEBUG")
    if on is None:
        on = _env_int(environ, "NVTE_DEBUG")
    if not on:
        return None
    level = _env_int(environ, "TE_CUDNN_DEBUG_LEVEL")
    if level is None:
        level = _env_int(environ, "NVTE_DEBUG_LEVEL")
    return _LEVELS[min(level or 0, 2)]


_handler: Optional[logging.Handler] = None


def _configure_logging() -> None:
    """At import: when the debug variables switch logging on, set the level of the "te_cudnn"
    logger and give it one stderr handler; otherwise leave logging alone."""
    global _handler
    level = debug_level_from_env()
    if level is None or _handler is not None:
        return
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter(LOG_FORMAT))
    _log.addHandler(_handler)
    _log.setLevel(level)
    _log.debug("debug logging on at level %s (TE_CUDNN_DEBUG / NVTE_DEBUG)", logging.getLevelName(level))


_configure_logging()
