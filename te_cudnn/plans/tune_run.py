"""Running, checking and timing a planned key's candidates on its device: the tuner's measurement.

:func:`time_and_choose` runs the heuristic plan and every other candidate once on synthesized
operands (:mod:`~te_cudnn.plans.tune_operands`) and checks their results
(:mod:`~te_cudnn.plans.tune_checks`), times the candidates that pass side by side
(:func:`interleaved_event_timer`), confirms a swap away from the heuristic plan in CUDA-graph
replay, and for the FP8 backward measures whether running it in parts pays
(:mod:`te_cudnn.plans.split`). The timers are :mod:`te_cudnn.timing`'s, with the tuner's policy:
how long a sample lasts, how long the GPU settles, in which order the rounds visit the runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

import torch

from ..backends import BY_ENUM
from ..backends.base import Uid
from ..timing import event_ms, interleaved_samples, spin_ahead_samples
from . import cache as _cache  # looked up per call (the builder can be replaced)
from .handles import handle_for
from .order import ORDER_SEED, order_rng, round_order
from .split import measure_splits, splittable
from .tune_checks import agreement_error, agreement_tolerance, check_error, result_checks, run_checks
from .tune_operands import make_operands
from .tune_results import (DEFAULT_REPS, DEFAULT_WARMUP, Candidate, Planned, Timer, TuningError, TuningResult, choose,
                           measure)  # fmt: skip

__all__ = ["DEFAULT_MAX_WORKSPACE", "GROUP_SAMPLE_MS", "MIN_SAMPLE_MS", "SETTLE_MS", "SPLIT_ROUNDS", "cuda_event_timer",
           "interleaved_event_timer", "time_and_choose"]  # fmt: skip

#: Candidates needing more workspace than this (or than the heuristic plan, if more) are not timed.
DEFAULT_MAX_WORKSPACE = 1 << 30
#: :func:`cuda_event_timer`: a sample lasts at least this long (several launches per sample for
#: short kernels), of at most :data:`MAX_INNER` launches.
MIN_SAMPLE_MS = 1.0
MAX_INNER = 50
#: Interleaved rounds in which the whole FP8 backward and its splits are timed side by side.
SPLIT_ROUNDS = 5
#: :func:`interleaved_event_timer`: a sample lasts at least this long, and the GPU runs this long
#: under load before the rounds start (the clock under a power limit is what training sees).
GROUP_SAMPLE_MS = 5.0
SETTLE_MS = 300.0
MAX_GROUP_INNER = 2000
MAX_SETTLE_LAUNCHES = 20000


def cuda_event_timer(run: Callable[[], None], candidate: Optional[Candidate] = None, *,
                     warmup: int = DEFAULT_WARMUP, reps: int = DEFAULT_REPS) -> list[float]:  # fmt: skip
    """Milliseconds per launch of ``run`` on the current stream, one value per sample: ``warmup``
    launches, then ``reps`` samples of about :data:`MIN_SAMPLE_MS` each, host launch overhead
    kept out by a spin of the stream (:func:`te_cudnn.timing.spin_ahead_samples`). A
    :data:`~te_cudnn.plans.tune_results.Timer`: ``candidate`` is not used."""
    return spin_ahead_samples(run, warmup=warmup, reps=reps, sample_ms=MIN_SAMPLE_MS, max_inner=MAX_INNER)


def interleaved_event_timer(runs: Sequence[Callable[[], None]], *, warmup: int = DEFAULT_WARMUP,
                            reps: int = DEFAULT_REPS, seed: int = ORDER_SEED) -> list[Any]:  # fmt: skip
    """Milliseconds per launch of each of ``runs``, timed side by side
    (:func:`te_cudnn.timing.interleaved_samples`): ``reps`` interleaved rounds, each visiting every
    run in a fresh order drawn from ``seed`` (:mod:`te_cudnn.plans.order`), one sample per run
    per round of about :data:`GROUP_SAMPLE_MS`, after the GPU ran the first run for about
    :data:`SETTLE_MS`. Returns one list of samples per run, or the exception a run raised.

    Why not one candidate at a time: a few milliseconds of work after an idle spell run at the
    GPU's boost clock, while training runs at the clock its power limit allows under sustained
    load, and clock drift during tuning would favour whichever candidate ran in the faster
    spell. Timed alone, engines that are equally fast in a short burst look alike even where
    sustained runs separate them; side by side, every candidate sees the same conditions (as
    the benchmark times its contenders)."""
    rng = order_rng(seed)
    return interleaved_samples(runs, warmup=warmup, reps=reps, order=lambda pending: round_order(pending, rng),
                               sample_ms=GROUP_SAMPLE_MS, max_inner=MAX_GROUP_INNER, settle_ms=SETTLE_MS,
                               max_settle_launches=MAX_SETTLE_LAUNCHES)  # fmt: skip


def time_and_choose(key: Any, planned: Planned, *, timer: Optional[Timer], warmup: int, reps: int,
                    min_speedup: float, max_workspace: Optional[int], check_numerics: bool) -> TuningResult:  # fmt: skip
    """Run, check and time every candidate of ``planned`` on the key's device."""
    with torch.cuda.device(key.config.device):  # events, spins and the handle on the key's device
        return _time_and_choose_here(key, planned, timer=timer, warmup=warmup, reps=reps, min_speedup=min_speedup,
                                     max_workspace=max_workspace, check_numerics=check_numerics)  # fmt: skip


def _time_and_choose_here(key: Any, planned: Planned, *, timer: Optional[Timer], warmup: int, reps: int,
                          min_speedup: float, max_workspace: Optional[int], check_numerics: bool) -> TuningResult:  # fmt: skip
    cfg, g, uids = key.config, planned.graph, tuple(planned.spec.uids)
    device = torch.device("cuda", cfg.device)
    start = time.perf_counter()
    heur = next((c for c in planned.candidates if c.index == planned.heuristic_index), None)
    if heur is None or heur.error is not None:
        raise TuningError(f"the heuristic plan [{planned.heuristic_index}] is not available: {heur and heur.error}")
    limit = max(DEFAULT_MAX_WORKSPACE if max_workspace is None else max_workspace, heur.workspace or 0)
    candidates = [c if c.error is not None or (c.workspace or 0) <= limit else
                  Candidate(c.index, c.name, c.workspace,
                            f"needs {c.workspace} bytes of workspace, over the limit {limit}")
                  for c in planned.candidates]  # fmt: skip
    torch.cuda.synchronize(device)  # queued work of the caller would distort the first timings
    handle = handle_for(cfg.device)
    ops = make_operands(g, uids, cfg, device)
    outputs = [uid for uid in uids if uid in {t.uid for t in g.get_outputs()}]
    tol = agreement_tolerance(cfg.dtype)
    checks = result_checks(key, g, uids, ops, device) if check_numerics else []

    # one workspace for every candidate (they run one after another on this stream): the
    # candidates are prepared before they are timed side by side
    shared = torch.empty(max([c.workspace or 0 for c in candidates if c.error is None] + [1]), dtype=torch.uint8,
                         device=device)  # fmt: skip

    def workspace(c: Candidate) -> Any:
        return shared

    def execute(index: int, ws: Any) -> None:
        g.execute_plan_at_index(ops, ws, index=index, handle=handle)

    def run_once(index: int, ws: Any) -> None:
        for uid in outputs:
            ops[uid].zero_()
        execute(index, ws)
        torch.cuda.synchronize(device)

    def run_checked(index: int, ws: Any) -> tuple[list[dict], Optional[str]]:
        def run(check_ops: dict) -> None:
            g.execute_plan_at_index(check_ops, ws, index=index, handle=handle)
            torch.cuda.synchronize(device)

        return run_checks(checks, run)

    reference, heur_problem = None, None
    if check_numerics:
        reference, heur_problem = run_checked(heur.index, workspace(heur))

    def run_for(c: Candidate) -> Callable[[], None]:
        ws = workspace(c)
        if reference is not None:
            got, problem = (reference, heur_problem) if c.index == heur.index else run_checked(c.index, ws)
            why = check_error(got, problem, reference, outputs, tol)
            if why is not None:
                raise TuningError(why)
        return lambda: execute(c.index, ws)

    if timer is None:  # on the device: every candidate side by side, under sustained load
        timings = measure(candidates, run_for, group_timer=interleaved_event_timer, warmup=warmup, reps=reps)
    else:
        timings = measure(candidates, run_for, timer, warmup=warmup, reps=reps)
    chosen, heuristic, rule = choose(timings, heur.index, min_speedup)
    if heuristic is not None and heuristic.error is not None:
        rule = f"{rule}; the heuristic plan was rejected ({heuristic.error})"
    if timer is None and heuristic is not None and heuristic.error is None and chosen.index != heuristic.index:
        # confirm a swap the way calls run in training loops and CUDA graphs: each plan's launches
        # captured in a CUDA graph, the two graphs replayed in alternation (an engine faster
        # back-to-back can be slower than the heuristic one in graph replay)
        spaces = {c.index: workspace(c) for c in candidates if c.index in (chosen.index, heuristic.index)}
        ratio = _graph_replay_ratio(lambda i: execute(i, spaces[i]), chosen.index, heuristic.index, device, cfg.device)
        if ratio is None or ratio * min_speedup > 1.0:
            rule = (f"heuristic kept: [{chosen.index}] {chosen.name} was faster back-to-back but not in CUDA-graph "
                    f"replay beside the heuristic plan (time ratio {'n/a' if ratio is None else f'{ratio:.3f}'})")
            chosen = heuristic
    split = None
    if splittable(key) and chosen.median_ms is not None:  # FP8 backward: does running it in parts pay?
        run_once(chosen.index, workspace(chosen))
        want = {uid: ops[uid].clone() for uid in outputs}

        def build_part(part_cfg: Any) -> Any:

            part_key = replace(key, config=part_cfg)
            return _cache.build_plan(part_key, lambda: BY_ENUM[key.backend].build(part_cfg, key.direction, handle))

        def run_part(plan: Any, part_ops: dict) -> None:
            ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device=device)
            plan.graph.execute(part_ops, ws, handle=handle)

        def agree(uid: int, got: Any, ref: Any) -> Optional[str]:
            return agreement_error(Uid.NAMES.get(uid, str(uid)), got, ref, tol)

        def time_ms(fn: Callable[[], None]) -> float:
            return statistics.median(float(x) for x in (timer or cuda_event_timer)(fn, None, warmup=warmup, reps=reps))

        whole_ws = workspace(chosen)
        split = measure_splits(key, chosen.median_ms, ops, want, build_part, run_part, agree, time_ms, min_speedup,
                               whole=lambda: execute(chosen.index, whole_ws), rounds=SPLIT_ROUNDS)  # fmt: skip
    return TuningResult(timings, chosen, heuristic, rule, planned.modes, warmup, reps, planned.duplicates,
                        time.perf_counter() - start, time.time(), key, split)  # fmt: skip


def _graph_replay_ratio(run: Callable[[int], None], a: int, b: int, device: Any, device_index: int,
                        launches: int = 20, rounds: int = 15) -> Optional[float]:  # fmt: skip
    """Median time of plan ``a`` over plan ``b`` when each one's ``launches`` launches (``run(index)``,
    one workspace per plan) are captured in a CUDA graph and the graphs replay in alternation
    (None if capture fails)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    graphs = {}
    try:
        with torch.cuda.stream(side):
            handle_for(device_index)  # binds this thread's handle to the capture stream
            for index in (a, b):
                run(index)  # warm: lazy module loading happens outside the capture
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=side):
                    for _ in range(launches):
                        run(index)
                graphs[index] = graph
    except Exception:  # noqa: BLE001 - no confirmation possible: the caller keeps the heuristic plan
        return None
    finally:
        torch.cuda.current_stream(device).wait_stream(side)
        handle_for(device_index)  # back on the current stream
    times: dict[int, list[float]] = {a: [], b: []}
    for r in range(rounds):
        for index in ((a, b) if r % 2 == 0 else (b, a)):
            times[index].append(event_ms(graphs[index].replay))
    return statistics.median(times[a]) / max(statistics.median(times[b]), 1e-9)

