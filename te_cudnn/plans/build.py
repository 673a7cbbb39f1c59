"""Building a plan: cuDNN's validate -> plan -> build pipeline (:func:`build_plan`), and running
a build in a thread of its own (:func:`run_apart`)."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from typing import Any, Callable

import torch

from ..errors import GraphBuildError
from ..runtime import cudnn_module
from .compiled import CompiledPlan
from .key import PlanKey

__all__ = ["build_plan", "run_apart"]

_log = logging.getLogger("te_cudnn")


def _heuristics(cudnn) -> list:
    return [cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK]


def build_plan(key: PlanKey, make_spec: Callable[[], Any]) -> CompiledPlan:
    """Build a graph spec into an executable plan, timing it; cuDNN errors -> GraphBuildError.
    A key that prefers configurations without a workspace (``key.no_workspace``,
    te_cudnn.plans.one_row) keeps only those; where none builds, the heuristics' plan is built."""
    if getattr(key, "no_workspace", False):
        try:
            return _build(key, make_spec, True)
        except GraphBuildError as exc:
            _log.debug("%s: no plan without a workspace (%s: %s); the heuristics' plan instead", key, exc.stage,
                       exc.cause)  # fmt: skip
    return _build(key, make_spec, False)


def _build(key: PlanKey, make_spec: Callable[[], Any], no_workspace: bool) -> CompiledPlan:
    cudnn = cudnn_module()
    start = time.perf_counter()
    spec = make_spec()
    g = spec.graph
    steps = [
        ("validate", "validate", g.validate),
        ("operation_graph", "build the operation graph of", g.build_operation_graph),
        ("heuristics", "create execution plans for", lambda: g.create_execution_plans(_heuristics(cudnn))),
        ("check_support", "check support of", g.check_support),
        ("build_plans", "build plans for", g.build_plans),
    ]
    if no_workspace:
        steps.insert(3, ("workspace", "keep the plans without a workspace of",
                         lambda: g.deselect_workspace_greater_than(0)))  # fmt: skip
    stages = {"graph": time.perf_counter() - start}
    for name, stage, step in steps:
        t0 = time.perf_counter()
        try:
            step()
        except Exception as exc:  # cudnnGraphNotSupportedError, RuntimeError from the backend, ...
            raise GraphBuildError(key, stage, exc) from exc
        stages[name] = time.perf_counter() - t0
    workspace = int(g.get_workspace_size())
    try:
        plan_name = str(g.get_plan_name_at_index(int(getattr(g, "_plan_index", 0))))
    except Exception:  # naming is informational only
        plan_name = "unknown"
    return CompiledPlan(key, g, spec.uids, workspace, plan_name, time.perf_counter() - start, stages=stages)


def run_apart(build: Callable[..., Any], key: PlanKey, *args: Any) -> Any:
    """``build(key, *args)`` in a short-lived thread of its own (with the caller's context
    variables and, where CUDA is up, ``key``'s device current); its result, or its exception
    raised here.

    Why: cudnn-frontend 1.32's Python planner (``create_execution_plans``) catches
    ``cudnnGraphNotSupportedError`` for engine configurations it cannot use and keeps the
    exception in a local variable: exception -> traceback -> frame -> exception, a reference
    cycle. Every frame holds its caller (``f_back``), so that cycle held the whole calling
    stack, te_cudnn's frames and the user's, with their locals (the call's results, a training
    step's activations) until the next full garbage collection: one extra set of results on a
    long-sequence first call. Built in a thread of its own, the planner's frames
    reach only that thread's stack. Costs a thread start per build, little against the build
    itself; the cached path never comes here."""
    box: dict[str, Any] = {}
    context = contextvars.copy_context()  # autotuning() and backend_policy() are context variables
    device = getattr(getattr(key, "config", None), "device", None)

    def work() -> None:
        try:
            if isinstance(device, int) and device >= 0 and torch.cuda.is_initialized():
                torch.cuda.set_device(device)  # the planner's device, as in the caller
            box["plan"] = context.run(build, key, *args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            box["error"] = exc

    worker = threading.Thread(target=work, name="te_cudnn plan build", daemon=True)
    worker.start()
    worker.join()
    error = box.pop("error", None)
    if error is not None:
        try:
            raise error
        finally:
            del error  # no cycle through this frame
    return box.pop("plan")

