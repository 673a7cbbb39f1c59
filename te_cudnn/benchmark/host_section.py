"""The ``host`` section of a run: host microseconds per cached forward call on a tiny problem,
te_cudnn against the bare ``graph.execute`` of a hand-built graph (the yardstick) and torch SDPA,
the same problem as a THD batch (:func:`_host_thd_calls`), and again with its plan autotuned
(:func:`_host_tuned`)."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import varlen
from ..ops import fused_attn_fwd
from ..plans import plan_cache
from ..plans.tune import format_record
from ..varlen import BatchLengths
from .failures import _one_line
from .handbuilt import HandGraphs
from .measure import host_medians
from .settings import Settings
from .te_contender import autotuning_context

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
    time (on Hopper the heuristic plan memsets its 256-byte workspace before every launch, a
    workspace-free engine does not). Timed in rounds of its own, interleaved with the
    yardsticks again, after the untuned calls are done (the tuned plan replaces the untuned
    one in the plan cache)."""
    ctx = autotuning_context()
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
