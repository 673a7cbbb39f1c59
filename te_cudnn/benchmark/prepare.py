"""One contender on one case before it is timed: prepared (plans built or loaded, graphs
compiled), called once (first-call time, the plans te_cudnn built or loaded), probed for peak
memory (:func:`_prepare`), and its output compared with the case's reference (:func:`_check_output`)."""

from __future__ import annotations

import time
from typing import Any

import torch

from ..ops import release_workspaces
from ..plans import plan_cache
from .cases import Case
from .contender import Contender
from .failures import _add, _one_line, _sync_quietly
from .inputs import tensor_bytes
from .te_contender import TeCudnn


def _plan_ids() -> set[int]:
    return {id(p) for p in plan_cache.plans()}


def _new_plans(before: set[int]) -> dict[str, Any]:
    """Build / load milliseconds of the plans te_cudnn added since ``before``."""

    new = [p for p in plan_cache.plans() if id(p) not in before]
    built = [p for p in new if p.source != "store"]
    loaded = [p for p in new if p.source == "store"]
    desc = []
    for p in new:
        direction = getattr(getattr(p.key, "direction", None), "value", "?")
        tuning = getattr(p, "tuning", None)  # te_cudnn.plans.tune's record, where the plan was tuned
        tuned = ""
        if isinstance(tuning, dict):
            sp = tuning.get("speedup")
            tuned = ", tuned" + (f" {sp:.3f}x the heuristic plan" if isinstance(sp, (int, float)) else "")
            split = tuning.get("split")
            if isinstance(split, dict) and split.get("chosen"):  # an FP8 backward run in parts
                tuned += f", runs as {split['chosen'][1]} parts ({split['chosen'][0]})"
        desc.append(f"{direction} {p.plan_name} ({'loaded' if p.source == 'store' else 'built'} "
                    f"{p.build_seconds * 1e3:.0f} ms, ws {p.workspace_size / 2**20:.1f} MiB{tuned})")  # fmt: skip
    return {"build_ms": sum(p.build_seconds for p in built) * 1e3 if built else 0.0,
            "load_ms": sum(p.build_seconds for p in loaded) * 1e3 if loaded else 0.0,
            "plans_built": len(built), "plans_loaded": len(loaded),
            "plans_tuned": sum(getattr(p, "tuning", None) is not None for p in new), "plans": "; ".join(desc)}  # fmt: skip


def _release_te_workspaces() -> int:
    return int(release_workspaces())


def _prepare(contender: Contender, case: Case, inputs, row: dict[str, Any]):
    """Prepare, first call, peak memory; fills ``row``; returns the Run."""

    is_te = isinstance(contender, TeCudnn)
    _release_te_workspaces()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    plans_before = _plan_ids() if is_te else set()
    t0 = time.perf_counter()
    run = contender.prepare(case, inputs)
    r = run.first()
    torch.cuda.synchronize()
    row["first_call_ms"] = (time.perf_counter() - t0) * 1e3
    del r
    row.update(run.info)
    row["precision"] = run.precision
    if is_te:
        row.update(_new_plans(plans_before))
    # peak memory of one call (fwd+bwd; decode: fwd) above what the shared inputs hold: this
    # contender's own state (preallocated outputs, workspaces) plus what the call allocates
    torch.cuda.reset_peak_memory_stats()
    r = run.first()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - held
    row["peak_mib"] = peak / 2**20
    if is_te:
        results = tensor_bytes(r)
        del r
        ws = _release_te_workspaces()
        row["workspace_mib"] = ws / 2**20
        if case.training and run.precision == "bf16":
            need = inputs.nbytes() + results + ws  # inputs (q, k, v, dO) + outputs (O, stats) + gradients + workspace
            row["mem_ratio"] = (inputs.nbytes() + peak) / need
    return run


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (Frobenius, fp32); inf where ``a`` holds NaN or Inf."""
    a, b = a.detach().float(), b.detach().float()
    if a.shape != b.shape:
        raise ValueError(f"O has shape {tuple(a.shape)}, the reference {tuple(b.shape)}")
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))


def _check_output(run, row: dict[str, Any], ref: list) -> None:
    """Compare the run's O with the case's reference O (the first bf16 contender's, te_cudnn's
    when it runs): ``rel_err``. The first bf16 contender becomes the reference."""
    try:
        out = run.output()
        torch.cuda.synchronize()
        if not ref and run.precision == "bf16":
            ref.append((row["contender"], out.detach().clone()))
            row["rel_err"] = 0.0
        elif ref:
            row["rel_err"] = _rel_err(out, ref[0][1])
        del out
    except Exception as exc:  # noqa: BLE001 - a contender whose O cannot be read is still timed
        _sync_quietly()
        row["notes"] = _add(row.get("notes"), f"output check failed ({_one_line(exc)})")
