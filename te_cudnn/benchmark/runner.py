"""Running the benchmark: the GPU's ceilings, host time per cached call, then every case.

Per case: the inputs are made once; each contender that can run the case is prepared (plans
built or loaded, graphs compiled), called once (first-call time, plans it built or loaded),
and probed for peak memory; then every mode (fwd, bwd, fwd+bwd; decode: fwd) is timed for all
of them interleaved, eager and as CUDA-graph replay. A contender that declines is recorded as
``skipped`` with its reason, one that fails as ``error`` with the exception's first line;
neither stops the run. The result is a plain dict (see :mod:`.report`).
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import subprocess
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Optional

import torch

from .. import varlen
from ..ops import fused_attn_fwd, release_workspaces
from ..plans import plan_cache
from ..plans.cache import forget_stores
from ..plans.tune import format_record
from ..runtime import versions
from ..varlen import BatchLengths
from .cases import Case
from .contender import Contender
from .handbuilt import HandGraphs
from .inputs import make_inputs, tensor_bytes
from .measure import (
    EAGER_LEAD,
    adjacent_ratios,
    capture,
    copy_bandwidth_gbps,
    eager_sampler,
    event_ms,
    fp8_matmul_peak_tflops,
    free_memory,
    graph_sampler,
    host_medians,
    interleaved,
    lead_count,
    matmul_peak_tflops,  # fmt: skip
    summarize,
)
from .te_contender import TeCudnn, autotuning_context

__all__ = ["Settings", "run_benchmark", "plan_store_for_run", "environment", "host_section", "SCHEMA"]

SCHEMA = "te_cudnn.benchmark/1"


@dataclass
class Settings:
    """How long and how carefully to time. ``quick()`` is the one-minute run."""

    quick: bool = False
    rounds: int = 20  # at most, per case and mode
    min_rounds: int = 5
    mode_budget_s: float = 1.2  # timing seconds per case and mode; rounds shrink to fit (not below min_rounds)
    sample_ms: float = 2.0  # each sample times at least this much work: reps = sample_ms / call time
    max_reps: int = 50
    graph_max_ms: float = 20.0  # calls longer than this are timed eagerly only (launch gaps are noise there)
    lead_ms: float = 20.0  # untimed work of the same contender before each sample (the GPU's clocks settle to it)
    order_seed: int = 0  # the rounds' orders (measure.interleaved)
    pair_seconds: float = 1.0  # per case, comparison (SAME_ENGINE) and kind: adjacent a, b, b, a samples; 0: none
    graphs: bool = True
    host: bool = True
    host_rounds: int = 15
    host_calls: int = 2000
    host_tuned: bool = True  # the host problem again with its plan autotuned (rounds of its own)
    peaks: bool = True
    deadline_s: float = 600.0  # no case or contender starts after this many seconds (a full H100 run: ~500 s)
    every_case: bool = False  # FlexAttention and te_cudnn autotuned on every case, not their default subsets
    plan_store: str = "fresh"  # "fresh" (a private empty store for the run), "default", "off" or a directory

    @classmethod
    def for_run(cls, quick: bool, rounds: Optional[int] = None, **over: Any) -> "Settings":
        s = cls(quick=True, rounds=10, min_rounds=3, mode_budget_s=0.4, host_rounds=7, host_calls=1000,
                deadline_s=150.0, pair_seconds=0.3) if quick else cls()  # fmt: skip
        if rounds is not None:
            s.rounds = max(1, rounds)
            s.min_rounds = min(s.min_rounds, s.rounds)
        for k, v in over.items():
            setattr(s, k, v)
        return s


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


# ---------------------------------------------------------------------------- environment
def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        line = out.stdout.strip().splitlines()
        if out.returncode == 0 and line:
            return line[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def environment() -> dict[str, Any]:
    """What the numbers were measured on: GPU, driver, CUDA, cuDNN, torch, frontend, te_cudnn."""

    env: dict[str, Any] = dict(versions())
    env["driver"] = _driver_version() if torch.cuda.is_available() else "none"
    env["python"] = platform.python_version()
    env["torch_cudnn"] = str(torch.backends.cudnn.version()) if torch.cuda.is_available() else "none"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
        env["sm_count"] = p.multi_processor_count
    env["time"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return env


def measure_peaks(log: Callable[[str], None]) -> dict[str, Any]:
    peaks: dict[str, Any] = {}
    for key, fn in (("matmul_bf16_tflops", matmul_peak_tflops), ("matmul_fp8_tflops", fp8_matmul_peak_tflops),
                    ("copy_gbps", copy_bandwidth_gbps)):  # fmt: skip
        try:
            peaks[key] = fn()
        except Exception as exc:  # noqa: BLE001 - a ceiling we could not measure is left out
            peaks[key] = None
            peaks[f"{key}_error"] = _one_line(exc)
    free_memory()
    log(f"ceilings: bf16 matmul {_fmt(peaks.get('matmul_bf16_tflops'))} TFLOP/s, fp8 matmul "
        f"{_fmt(peaks.get('matmul_fp8_tflops'))} TFLOP/s, device copy {_fmt(peaks.get('copy_gbps'))} GB/s")  # fmt: skip
    return peaks


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.0f}"


# ---------------------------------------------------------------------------- host time
#: ``host`` section: te_cudnn's cached call may cost at most this much more host time than the
#: bare ``graph.execute`` of a hand-built graph (the report's target)
HOST_TARGET_US = 3.0
HOST_YARDSTICK = "bare graph.execute (hand-built graph)"
HOST_TE = "te_cudnn fused_attn_fwd"
#: the same call into preallocated O and stats, and the yardstick's graph with stats (what te_cudnn's
#: forward computes, as TE's does): the like-for-like pair, reported beside the target's pair
HOST_TE_PREALLOCATED = "te_cudnn, preallocated out and softmax_lse"
HOST_YARDSTICK_STATS = "bare graph.execute (hand-built graph with stats)"


def host_section(settings: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Host microseconds per cached forward call on a tiny problem (b=1, h=1, s=64, d=64, bf16,
    bshd, no mask, inference), where the host is the bottleneck."""
    import torch.nn.functional as F  # noqa: PLC0415
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415


    b, h, s, d = 1, 1, 64, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
    fns: dict[str, Callable[[], Any]] = {}
    fns[HOST_TE] = lambda: fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    o_pre = torch.empty_like(q)
    lse_pre = torch.empty(b, h, s, 1, dtype=torch.float32, device="cuda")
    fns["te_cudnn, preallocated out"] = lambda: fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None,
                                                                    out=o_pre, **kw)  # fmt: skip
    # like for like with the yardstick, which writes into outputs allocated once
    fns[HOST_TE_PREALLOCATED] = lambda: fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, out=o_pre,
                                                          softmax_lse=lse_pre, **kw)  # fmt: skip
    qb, kb, vb = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    hand = HandGraphs(qb, kb, vb, training=False, causal=False)
    fns[HOST_YARDSTICK] = lambda: hand.gf.execute(hand.fpack, hand.workspace, handle=hand.handle)
    hand_st = HandGraphs(qb, kb, vb, training=True, causal=False, d_o=torch.randn_like(qb))
    fns[HOST_YARDSTICK_STATS] = lambda: hand_st.gf.execute(hand_st.fpack, hand_st.workspace, handle=hand_st.handle)

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qb, kb, vb)

    fns["torch SDPA cuDNN"] = sdpa
    fns.update(_host_thd_calls(h, d))
    notes = []
    for name, fn in list(fns.items()):  # a contender that cannot run here is reported, not timed
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            notes.append(f"{name}: {_one_line(exc)}")
            del fns[name]
    us = host_medians(fns, settings.host_rounds, settings.host_calls, warmup=min(500, settings.host_calls))
    out: dict[str, Any] = {"problem": "b=1 h=1 s=64 d=64 bf16 bshd no_mask, forward (inference), cached plan",
                           "rounds": settings.host_rounds, "calls": settings.host_calls, "us": us,
                           "yardstick": HOST_YARDSTICK, "te_cudnn": HOST_TE, "target_us": HOST_TARGET_US,
                           "notes": notes}  # fmt: skip
    if HOST_TE in us and HOST_YARDSTICK in us:
        out["te_minus_yardstick_us"] = us[HOST_TE] - us[HOST_YARDSTICK]
    if HOST_TE_PREALLOCATED in us and HOST_YARDSTICK_STATS in us:
        out["like_for_like"] = [HOST_TE_PREALLOCATED, HOST_YARDSTICK_STATS]
        out["like_for_like_us"] = us[HOST_TE_PREALLOCATED] - us[HOST_YARDSTICK_STATS]
    if HOST_THD_REUSE in us:  # what deriving the lengths on every call costs against reusing them
        out["thd_vs_reuse_us"] = {n: us[n] - us[HOST_THD_REUSE] for n in (HOST_THD, HOST_THD_BATCH) if n in us}
    plan = _host_plan(b, h, s)
    if plan is not None:  # which engine and launch path te_cudnn's cached plan took (informational)
        out["te_cudnn_launch"] = str(getattr(plan.launch, "mode", "unknown"))
        out["te_cudnn_plan"] = _plan_words(plan)
    log("host us per cached forward: " + ", ".join(f"{n} {u:.1f}" for n, u in us.items()))
    if settings.host_tuned and HOST_TE in fns:
        try:
            out["tuned"] = _host_tuned(settings, fns, (b, h, s), log)
        except Exception as exc:  # noqa: BLE001 - reported, never fatal
            out["tuned"] = {"error": _one_line(exc)}
            log(f"host section, autotuned plan: {_one_line(exc)}")
    return out


HOST_THD = "te_cudnn THD, lengths per call"
HOST_THD_BATCH = "te_cudnn THD, BatchLengths"
HOST_THD_REUSE = "te_cudnn THD, reuse_lengths"


def _host_thd_calls(h: int, d: int) -> dict[str, Callable[[], Any]]:
    """The host problem as a THD batch (four sequences, 64 tokens, padding_causal): the lengths
    and offsets derived from cu_seqlens on every call (the default), taken from a BatchLengths
    built once, and from the version-keyed cache of the ``reuse_lengths`` opt-in."""

    gen = torch.Generator(device="cuda").manual_seed(1)
    lens = (16, 24, 8, 16)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(sum(lens), h, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    kw = dict(qkv_layout="thd_thd_thd", attn_mask_type="padding_causal")
    batch = BatchLengths(cu)

    def per_call():
        return fused_attn_fwd(False, 32, 32, cu, cu, q, k, v, q.dtype, None, **kw)

    def reuse():  # the opt-in's flag set around the call alone: the other contenders keep the default
        varlen._reuse_by_version[0] = True
        try:
            return per_call()
        finally:
            varlen._reuse_by_version[0] = False

    return {HOST_THD: per_call,
            HOST_THD_BATCH: lambda: fused_attn_fwd(False, 32, 32, cu, cu, q, k, v, q.dtype, None, lengths=batch, **kw),
            HOST_THD_REUSE: reuse}  # fmt: skip


def _host_plan(b: int, h: int, s: int) -> Any:
    """te_cudnn's cached plan of the host problem (None if not there)."""
    return next((p for p in plan_cache.plans() if p.key.config.sq == s and p.key.config.h == h
                 and p.key.config.b == b), None)  # fmt: skip


def _plan_words(plan: Any) -> str:
    return f"{plan.plan_name}, workspace {plan.workspace_size} B"


def _host_tuned(settings: Settings, fns: dict[str, Callable[[], Any]], bhs: tuple[int, int, int],
                log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """The host problem again with its plan autotuned (``autotuning(True)`` around one call, as a
    user turns it on): the tuner may choose another engine, whose launch can cost less host
    time (on an H100 the heuristic plan memsets its 256-byte workspace before every launch, a
    workspace-free engine does not). Timed in rounds of its own, interleaved with the
    yardsticks again, after the untuned calls are done (the tuned plan replaces the untuned
    one in the plan cache)."""
    ctx = autotuning_context()
    if ctx is None:
        return {"error": "autotuning not available in this build"}
    before = _host_plan(*bhs)
    with ctx():
        fns[HOST_TE]()
    torch.cuda.synchronize()
    plan = _host_plan(*bhs)
    if plan is None or getattr(plan, "tuning", None) is None:
        why = getattr(plan, "tuning_error", None) or "no tuning record"
        return {"error": f"the host problem's plan was not tuned: {why}"}
    names = (HOST_TE, HOST_TE_PREALLOCATED, HOST_YARDSTICK, HOST_YARDSTICK_STATS)
    tuned_fns = {n: fns[n] for n in names if n in fns}
    us = host_medians(tuned_fns, settings.host_rounds, settings.host_calls, warmup=min(500, settings.host_calls))
    res: dict[str, Any] = {"us": us, "plan": _plan_words(plan), "heuristic_plan": None if before is None else _plan_words(before),
                           "speedup": plan.tuning.get("speedup"), "rule": plan.tuning.get("rule"),
                           "tuning": plan.tuning}  # fmt: skip

    log(format_record(plan.tuning, indent="  "))
    if HOST_YARDSTICK in us:
        res["te_minus_yardstick_us"] = us[HOST_TE] - us[HOST_YARDSTICK]
    log("host us per cached forward, autotuned plan (" + res["plan"] + "): "
        + ", ".join(f"{n} {u:.1f}" for n, u in us.items()))  # fmt: skip
    return res


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


def _add(notes: Optional[str], note: str) -> str:
    return f"{notes}; {note}" if notes else note


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


def _sync_quietly() -> None:
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass


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
