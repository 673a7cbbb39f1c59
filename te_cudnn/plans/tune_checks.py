"""Checking a candidate plan's results before it is timed: the autotuner's agreement check.

Every candidate runs on the same operands as the heuristic plan, for padding masks and THD with
partial lengths as calls bind them (:func:`result_checks`, :func:`run_checks`), into results
prefilled with NaN; :func:`check_error` excludes a candidate whose promised rows are wrong or
whose outputs differ from the heuristic plan's by more than :func:`agreement_tolerance`.
:mod:`te_cudnn.plans.tune` re-exports every public name.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from ..backends import BY_ENUM, Direction
from ..backends.base import Uid
from .padded_rows import ResultCheck, probe_batches
from ..row_fill import skips_grads_fill, skips_out_fill
from ..tolerances import TOLERANCES

__all__ = ["FP8_AGREEMENT", "agreement_error", "agreement_tolerance", "check_error", "result_checks", "run_checks"]

#: The relative (Frobenius) difference from the heuristic plan's results allowed for FP8 graphs:
#: E4M3/E5M2 results carry 2-3 mantissa bits, so this catches a broken engine, not drift (the
#: GPU suite holds every candidate to the FP8 tests' own bounds).
FP8_AGREEMENT = 0.15


def agreement_error(name: str, actual: Any, reference: Any, tol: float) -> Optional[str]:
    """Why ``actual`` does not match the heuristic plan's ``reference`` (None: it does)."""
    a, r = actual.detach().float(), reference.detach().float()
    fa, fr = torch.isfinite(a), torch.isfinite(r)
    if not torch.equal(fa, fr):
        return f"{name}: non-finite values where the heuristic plan's are finite (or the reverse)"
    a, r = a[fr].double(), r[fr].double()
    err = float((a - r).norm() / r.norm().clamp_min(1e-30)) if r.numel() else 0.0
    if err > tol:
        return f"{name}: relative difference {err:.3e} from the heuristic plan's result exceeds {tol:.1e}"
    return None


def result_checks(key: Any, graph: Any, uids: Sequence[int], ops: dict[int, Any], device: Any) -> list[Any]:
    """The runs of the agreement check (:class:`te_cudnn.plans.padded_rows.ResultCheck`): for padding
    masks and THD, partial lengths as calls bind them (an empty sequence, shorter ones, a full
    one; :func:`te_cudnn.plans.padded_rows.probe_batches`), sharing ``ops``' inputs and outputs.
    The promised results (O; dQ, dK, dV) are prefilled with NaN, so a row an engine leaves
    unwritten shows; where te_cudnn zero-fills them for this key whatever the engine
    (``te_cudnn.row_fill``'s static rule), the rows past each sequence's end start at zero, as
    the fill leaves them (``fill_padded``)."""
    cfg, backend = key.config, BY_ENUM[key.backend]
    skips = (skips_out_fill if key.direction == Direction.FWD else skips_grads_fill)(cfg, backend)
    filled = (cfg.mask.is_padding or cfg.is_ragged) and not skips
    return [ResultCheck(graph, uids, cfg, key.direction, ops, batch, device, fill_padded=filled)
            for batch in probe_batches(cfg, backend)]  # fmt: skip


def run_checks(checks: Sequence[Any], run: Callable[[dict], None]) -> tuple[list[dict], Optional[str]]:
    """Run one plan on each check's operands (``run(ops)``, which returns when the results are
    there) into prefilled results: the outputs to compare (:meth:`ResultCheck.snapshot`, one
    per check) and why the promised rows are wrong (None: they are right)."""
    got, problems = [], []
    for check in checks:
        check.prefill()
        run(check.ops)
        problem = check.problems()
        if problem is not None:
            problems.append(problem)
        got.append(check.snapshot())
    return got, "; ".join(problems) or None


def check_error(got: Sequence[dict], problem: Optional[str], reference: Sequence[dict], outputs: Sequence[int],
                tol: float) -> Optional[str]:  # fmt: skip
    """Why a candidate is excluded (None: it passes): its promised rows are wrong ("padded
    rows: ..."; such an engine is never chosen, whatever its speed), or an output differs from
    the heuristic plan's by more than ``tol`` ("numerics: ..."). ``got`` / ``problem``:
    :func:`run_checks`' answer for the candidate, ``reference``: for the heuristic plan."""
    if problem is not None:
        return f"padded rows: {problem}"
    for mine, ref in zip(got, reference):
        for uid in outputs:
            why = agreement_error(Uid.NAMES.get(uid, str(uid)), mine[uid], ref[uid], tol)
            if why is not None:
                return f"numerics: {why}"
    return None


def agreement_tolerance(dtype: Any) -> float:
    """How far a candidate's results may be from the heuristic plan's: the dtype's ceiling in
    :data:`te_cudnn.tolerances.TOLERANCES`; :data:`FP8_AGREEMENT` for FP8."""
    tol = TOLERANCES.get(dtype)
    return tol.ceiling if tol is not None else FP8_AGREEMENT
