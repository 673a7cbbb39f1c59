"""Running the benchmark: the GPU's ceilings, host time per cached call, then every case.

Per case: the inputs are made once; each contender that can run the case is prepared (plans
built or loaded, graphs compiled), called once (first-call time, plans it built or loaded),
and probed for peak memory; then every mode (fwd, bwd, fwd+bwd; decode: fwd) is timed for all
of them interleaved, eager and as CUDA-graph replay. A contender that declines is recorded as
``skipped`` with its reason, one that fails as ``error`` with the exception's first line;
neither stops the run. The result is a plain dict (see :mod:`.report`).

Here: the case loop (:func:`run_case`, :func:`_time_mode`) and the run around it
(:func:`run_benchmark`). Beside it: :mod:`.settings`, :mod:`.environment` (versions, ceilings),
:mod:`.host_section` (host time per cached call), :mod:`.prepare` (one contender before it is
timed), :mod:`.failures` (recording what failed).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
import traceback
from dataclasses import asdict
from typing import Any, Callable, Iterator, Optional

import torch

from ..plans.cache import forget_stores
from .cases import Case
from .contender import Contender
from .environment import environment, measure_peaks
from .failures import _add, _one_line, _sync_quietly
from .host_section import host_section
from .inputs import make_inputs
from .measure import (
    EAGER_LEAD,
    adjacent_ratios,
    capture,
    eager_sampler,
    event_ms,
    free_memory,
    graph_sampler,
    interleaved,
    lead_count,
    summarize,
)
from .prepare import _check_output, _prepare
from .settings import Settings

__all__ = ["Settings", "run_benchmark", "plan_store_for_run", "environment", "host_section", "SCHEMA"]

SCHEMA = "te_cudnn.benchmark/1"


# ---------------------------------------------------------------------------- one case
def _skip_reason(contender: Contender, case: Case, settings: Settings) -> Optional[str]:
    if case.only and contender.name not in case.only:
        return f"this case runs {', '.join(case.only)} only ({case.note})"
    if settings.quick and not contender.quick:
        return f"left out of --quick ({contender.quick_why})"
    if contender.default_cases is not None and case.name not in contender.default_cases and not settings.every_case:
        return (f"runs on a subset of cases to keep the full run under 9 minutes ({contender.subset_why}): "
                f"{', '.join(sorted(contender.default_cases))}; --every-case runs it on every case")  # fmt: skip
    try:
        return contender.supports(case)
    except Exception as exc:  # noqa: BLE001 - a rule that fails is a reason too
        return f"supports() failed: {_one_line(exc)}"


def _row(case: Case, contender: Contender, status: str, reason: str = "") -> dict[str, Any]:
    return {"case": case.name, "contender": contender.name, "status": status, "reason": reason}


#: what a failed capture costs the rest of the run (pytorch/pytorch#190348, fixed after torch 2.11)
CAPTURE_FAILURE_COST = ("eager time only; torch may keep a failed capture's memory until the process ends, "
                        "leaving later cases less")  # fmt: skip


#: the contenders that run the same cuDNN engines, compared from adjacent samples as well
#: (measure.adjacent_ratios): te_cudnn and the graph written by hand, both variants
SAME_ENGINE = (("te_cudnn", "cuDNN graph (hand-built)"), ("te_cudnn", "cuDNN graph (hand-built, allocating)"))
#: adjacent-sample ratios per comparison and kind: at least / at most this many a, b, b, a quads
PAIR_QUADS = (4, 24)


def _adjacent(mode: str, samplers: dict, sample_ms: dict, rows: dict[str, dict], settings: Settings) -> None:
    """Each SAME_ENGINE comparison from adjacent samples (both kinds where both sides have them):
    ``rows[a][f"{mode}_adjacent"][b][kind]`` is the list of ratios a / b."""
    for a, b in SAME_ENGINE:
        for kind in ("eager", "graph"):
            if (a, kind) not in samplers or (b, kind) not in samplers:
                continue
            per_quad = 2.0 * (sample_ms[(a, kind)] + sample_ms[(b, kind)])
            quads = max(PAIR_QUADS[0], min(PAIR_QUADS[1], int(settings.pair_seconds * 1e3 / max(per_quad, 1e-3))))
            ratios = adjacent_ratios(samplers[(a, kind)], samplers[(b, kind)], quads)
            rows[a].setdefault(f"{mode}_adjacent", {}).setdefault(b, {})[kind] = ratios


def _time_mode(mode: str, runs: dict[str, Any], rows: dict[str, dict], settings: Settings,
               adjacent: bool = False) -> None:  # fmt: skip
    """Time every run in ``mode``: interleaved rounds of eager and replayed samples; with
    ``adjacent`` (the case's headline mode), the SAME_ENGINE comparisons from adjacent samples too."""
    calls, est, keep = {}, {}, []
    for name, run in runs.items():
        try:
            state = run.before(mode)
            call = run.call(mode, state)
            for _ in range(2):
                call()
            torch.cuda.synchronize()
            est[name] = max(event_ms(call), 1e-4)
            calls[name] = call
            keep.append(state)
        except Exception as exc:  # noqa: BLE001
            _sync_quietly()
            rows[name]["errors"] = (rows[name].get("errors", "") + f" {mode}: {_one_line(exc)}").strip()
    reps = {n: max(1, min(settings.max_reps, math.ceil(settings.sample_ms / est[n]))) for n in calls}
    graphs = {}
    for n in calls:
        if not settings.graphs:
            continue
        if est[n] > settings.graph_max_ms:
            rows[n]["notes"] = _add(rows[n].get("notes"), f"{mode}: eager only (calls over {settings.graph_max_ms:.0f} ms)")
            continue
        run = runs[n]
        try:
            graphs[n] = capture(lambda st, run=run: run.call(mode, st), reps[n], setup=lambda run=run: run.before(mode))
        except Exception as exc:  # noqa: BLE001 - recorded; the eager time still stands
            _sync_quietly()
            rows[n]["notes"] = _add(rows[n].get("notes"), f"{mode}: CUDA-graph capture failed ({_one_line(exc)}); "
                                    f"{CAPTURE_FAILURE_COST}")  # fmt: skip
    samplers, sample_ms = {}, {}  # (name, kind) -> sampler, its estimated ms per sample (lead included)
    for n in calls:
        lead = lead_count(settings.lead_ms, est[n], EAGER_LEAD)
        samplers[(n, "eager")] = eager_sampler(calls[n], reps[n], lead)
        sample_ms[(n, "eager")] = est[n] * (reps[n] + lead)
        if n in graphs:
            lead = lead_count(settings.lead_ms, est[n] * reps[n])
            samplers[(n, "graph")] = graph_sampler(graphs[n][0], reps[n], lead)
            sample_ms[(n, "graph")] = est[n] * reps[n] * (1 + lead)
    per_round = sum(sample_ms.values())
    rounds = max(settings.min_rounds, min(settings.rounds, int(settings.mode_budget_s * 1e3 / (per_round or 1.0))))
    samples = interleaved(samplers, rounds, settings.order_seed) if samplers else {}
    if adjacent and settings.pair_seconds > 0:
        _adjacent(mode, samplers, sample_ms, rows, settings)
    for n in calls:
        eager, spread_e = summarize(samples[(n, "eager")])
        row = rows[n]
        row[f"{mode}_eager_ms"] = eager
        row[f"{mode}_ms"], row[f"{mode}_spread_pct"] = eager, spread_e
        row[f"{mode}_samples"] = samples[(n, "eager")]  # per round, for ratios paired by round (report)
        row[f"{mode}_eager_samples"] = samples[(n, "eager")]
        if n in graphs:
            graph, spread_g = summarize(samples[(n, "graph")])
            row[f"{mode}_graph_ms"] = graph
            row[f"{mode}_ms"], row[f"{mode}_spread_pct"] = graph, spread_g
            row[f"{mode}_samples"] = row[f"{mode}_graph_samples"] = samples[(n, "graph")]
        row["rounds"] = max(row.get("rounds", 0), rounds)
    del graphs, keep, samplers
    torch.cuda.synchronize()


def run_case(case: Case, contenders: list[Contender], settings: Settings, deadline: float,
             log: Callable[[str], None]) -> list[dict[str, Any]]:  # fmt: skip
    rows: dict[str, dict] = {}
    eligible = []
    for c in contenders:
        why = _skip_reason(c, case, settings)
        rows[c.name] = _row(case, c, "skipped" if why else "ok", why or "")
        if not why:
            eligible.append(c)
    if not eligible:
        return list(rows.values())
    t0 = time.monotonic()
    inputs = None
    runs: dict[str, Any] = {}
    ref: list = []  # [(contender, O)]: the reference output of this case
    try:
        inputs = make_inputs(case)
        # contenders that change shared state (autotuning replaces te_cudnn's cached plans with
        # tuned ones) are prepared and timed after the others are done
        last = [c for c in eligible if c.runs_last]
        for number, phase in enumerate(([c for c in eligible if not c.runs_last], last)):
            if number == 1 and last:  # the late contenders are timed beside the others that do not share te_cudnn's
                # plans again (their own rows keep the first phase's times; the late rows get these as *_ref_ms)
                again = {c.name: runs[c.name] for c in eligible if not c.shares_plan_cache and c.name in runs}
            for c in phase:
                row = rows[c.name]
                if time.monotonic() > deadline:
                    row.update(status="skipped", reason=f"time budget of {settings.deadline_s:.0f} s used up")
                    continue
                try:
                    runs[c.name] = _prepare(c, case, inputs, row)
                    _check_output(runs[c.name], row, ref)
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    _sync_quietly()
                    row.update(status="error", reason=_one_line(exc), traceback=traceback.format_exc(limit=6))
            if number == 1 and last:
                shadow = {n: {} for n in again}
                runs.update(again)
                for mode in case.modes:
                    _time_mode(mode, runs, {**rows, **shadow}, settings)
                for c in last:
                    rows[c.name]["same_phase"] = {n: {m: v.get(f"{m}_ms") for m in case.modes} for n, v in shadow.items()}
                    rows[c.name]["same_phase_samples"] = {n: {m: v.get(f"{m}_samples") for m in case.modes}
                                                          for n, v in shadow.items()}  # fmt: skip
            else:
                for mode in case.modes:
                    _time_mode(mode, runs, rows, settings, adjacent=mode == case.modes[-1])  # the headline mode
            if number == 0 and last:
                runs = {n: r for n, r in runs.items() if n in {c.name for c in eligible if not c.shares_plan_cache}}
            else:
                runs.clear()
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory making the inputs
        _sync_quietly()
        for c in eligible:
            if rows[c.name]["status"] == "ok" and f"{case.modes[-1]}_ms" not in rows[c.name]:
                rows[c.name].update(status="error", reason=f"case failed: {_one_line(exc)}")
    finally:
        ref.clear()
        runs.clear()
        if inputs is not None:
            inputs.release()
        del inputs
        free_memory()
    for row in rows.values():  # a contender that ran but has no time for any mode failed
        if row["status"] == "ok" and not any(f"{m}_ms" in row for m in case.modes):
            row.update(status="error", reason=row.get("errors", "no mode could be timed"))
    head = "fwd_bwd_ms" if case.training else "fwd_ms"
    parts = [f"{n} {r[head]:.4g}" for n, r in rows.items() if r["status"] == "ok" and head in r]
    log(f"{case.name:22} {head[:-3]} ms: " + (" | ".join(parts) or "nothing ran") + f"  ({time.monotonic() - t0:.1f} s)")
    return list(rows.values())


# ---------------------------------------------------------------------------- everything
@contextlib.contextmanager
def plan_store_for_run(setting: str) -> Iterator[Optional[str]]:
    """The plan store the run uses (``Settings.plan_store``), as ``TE_CUDNN_PLAN_STORE`` while
    it runs; yields that value (None: the caller's own setting).

    ``fresh`` (the default): a private, empty store, deleted afterwards. A store that already
    holds tuned plans gives them to every later process, with autotuning off too (tuning is paid
    once per GPU model): in the caller's store, te_cudnn's untuned contenders would run tuned
    plans, and plan build times would read as loads. ``default``: the caller's store as it is;
    ``off``: none; anything else: that directory."""
    if setting == "default":
        yield None
        return
    before = os.environ.get("TE_CUDNN_PLAN_STORE")
    with contextlib.ExitStack() as stack:
        value = setting
        if setting == "fresh":
            value = stack.enter_context(tempfile.TemporaryDirectory(prefix="te_cudnn_bench_plans_"))
        os.environ["TE_CUDNN_PLAN_STORE"] = value
        forget_stores()
        try:
            yield value
        finally:
            if before is None:
                os.environ.pop("TE_CUDNN_PLAN_STORE", None)
            else:
                os.environ["TE_CUDNN_PLAN_STORE"] = before
            forget_stores()


def run_benchmark(cases: list[Case], contenders: list[Contender], settings: Settings,
                  log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Run ``cases`` x ``contenders``; the results dict :mod:`.report` renders. The plans live in
    the store ``settings.plan_store`` names (:func:`plan_store_for_run`)."""
    with plan_store_for_run(settings.plan_store):
        return _run_benchmark(cases, contenders, settings, log)


def _run_benchmark(cases: list[Case], contenders: list[Contender], settings: Settings,
                   log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    start = time.monotonic()
    deadline = start + settings.deadline_s
    res: dict[str, Any] = {
        "schema": SCHEMA,
        "env": environment(),
        "settings": {**asdict(settings), "cases": [c.name for c in cases], "contenders": [c.name for c in contenders]},
        "peaks": {},
        "host": None,
        "cases": [c.as_dict() for c in cases],
        "results": [],
    }
    log(f"te_cudnn benchmark on {res['env'].get('gpu')}, driver {res['env'].get('driver')}, cuDNN "
        f"{res['env'].get('cudnn')}, torch {res['env'].get('torch')}, frontend {res['env'].get('frontend')}")  # fmt: skip
    if settings.peaks:
        res["peaks"] = measure_peaks(log)
    if settings.host:
        try:
            res["host"] = host_section(settings, log)
        except Exception as exc:  # noqa: BLE001
            _sync_quietly()
            res["host"] = {"error": _one_line(exc)}
            log(f"host section failed: {_one_line(exc)}")
        free_memory()
    for i, case in enumerate(cases):
        if time.monotonic() > deadline:
            res["results"] += [_row(case, c, "skipped", f"time budget of {settings.deadline_s:.0f} s used up")
                               for c in contenders]  # fmt: skip
            continue
        res["results"] += run_case(case, contenders, settings, deadline, log)
    res["settings"]["wall_s"] = time.monotonic() - start
    return res
