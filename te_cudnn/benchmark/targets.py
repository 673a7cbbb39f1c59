"""The report's targets, each checked against the results as lines of text (:func:`_targets`):
host time, parity with the reference, autotuning, the hand-built graphs, FP8, memory, decode."""

from __future__ import annotations

import statistics
from typing import Optional

from .formatting import _num
from .ratios import RATIO_CONFIDENCE, median_interval, paired_ratio
from .rows import REFERENCE

MEM_TARGET = 1.1  # te_cudnn's peak / (inputs + outputs + gradients + workspace), 64K-token case
DECODE_TARGET_PCT = 90.0  # KV-cache read bandwidth in % of the device copy bandwidth, 8K and 32K


def _targets(results: dict, flat: list[dict]) -> list[str]:
    lines = []
    host = results.get("host") or {}
    if host.get("te_minus_yardstick_us") is not None:
        d, t = host["te_minus_yardstick_us"], host.get("target_us", 3.0)
        lines.append(f"- host time: te_cudnn {_num(host['us'][host['te_cudnn']], 3)} µs vs {host['yardstick']} "
                     f"{_num(host['us'][host['yardstick']], 3)} µs: {d:+.2f} µs (target ≤ +{t:g} µs: "
                     f"{'met' if d <= t else 'missed'})")  # fmt: skip
    if host.get("like_for_like_us") is not None:  # both into results allocated once, both writing the stats
        te, yard = host["like_for_like"]
        lines.append(f"- host time, like for like: {te} {_num(host['us'][te], 3)} µs vs {yard} "
                     f"{_num(host['us'][yard], 3)} µs: {host['like_for_like_us']:+.2f} µs")  # fmt: skip
    tuned = host.get("tuned") or {}
    if tuned.get("te_minus_yardstick_us") is not None:
        d, t, us = tuned["te_minus_yardstick_us"], host.get("target_us", 3.0), tuned["us"]
        lines.append(f"- host time, autotuned plan ({tuned.get('plan')}; heuristic plan {tuned.get('heuristic_plan')}): "
                     f"te_cudnn {_num(us[host['te_cudnn']], 3)} µs vs {host['yardstick']} "
                     f"{_num(us[host['yardstick']], 3)} µs in rounds of their own: {d:+.2f} µs (target ≤ +{t:g} µs: "
                     f"{'met' if d <= t else 'missed'})")  # fmt: skip
    elif tuned.get("error"):
        lines.append(f"- host time, autotuned plan: not measured ({tuned['error']})")
    lines += _parity_target(flat)
    lines += _autotune_target(flat)
    lines += _hand_built_target(flat, results.get("results", []))
    lines += _fp8_target(flat)
    for r in flat:
        if r["contender"] == "te_cudnn" and r["group"] == "memory" and r.get("mem_ratio") is not None:
            ok = r["mem_ratio"] <= MEM_TARGET
            lines.append(f"- memory, {r['case']}: peak / (inputs + outputs + gradients + workspace) = "
                         f"{r['mem_ratio']:.3f} (target ≤ {MEM_TARGET}: {'met' if ok else 'missed'})")  # fmt: skip
    for r in flat:
        if r["contender"].startswith("te_cudnn") and r["group"] == "decode" and r.get("pct_of_copy_bw") is not None:
            if r["case"].endswith(("kv8k", "kv32k")):
                ok = r["pct_of_copy_bw"] >= DECODE_TARGET_PCT
                lines.append(f"- decode, {r['case']}, {r['contender']}: KV-cache read {_num(r['kv_gbps'])} GB/s = "
                             f"{r['pct_of_copy_bw']:.1f}% of the copy bandwidth (target ≥ {DECODE_TARGET_PCT:g}%: "
                             f"{'met' if ok else 'missed'})")  # fmt: skip
    return lines


def _interval(r: dict) -> str:
    if r.get("ratio_paired") is None:
        return "no paired samples"
    return f"paired by round {r['ratio_paired']:.3f}×, 95% interval [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]"


def _parity_target(flat: list[dict]) -> list[str]:
    """te_cudnn against the reference on every case it shares with it (target: no slower): the
    cases above 1.0, each with its paired ratio and interval (1.0 inside it: parity within the
    run's noise)."""
    rows = [r for r in flat if r["contender"] == "te_cudnn" and r.get("ratio_vs_sdpa_cudnn") is not None]
    if not rows:
        return []
    over = [r for r in rows if r["ratio_vs_sdpa_cudnn"] > 1.0]
    lines = [f"- te_cudnn ≤ 1.0× {REFERENCE}: {len(rows) - len(over)} of {len(rows)} cases"
             + (" (met)" if not over else "; above 1.0:")]
    for r in over:
        low = r.get("ratio_low")
        verdict = "" if low is None else ("; 1.0 lies inside the interval" if low <= 1.0 else "; slower beyond the interval")
        lines.append(f"  - {r['case']}: {r['ratio_vs_sdpa_cudnn']:.3f}× ({_interval(r)}{verdict})")
    return lines


#: autotuning's target: at most this fraction of the reference's time on at least two cases ...
AUTOTUNE_TARGET = 0.97
AUTOTUNE_CASES = 2
#: ... where the tuned plan also beats the same sub-backend's heuristic plan by this much
AUTOTUNE_GAIN = 0.98
#: FP8 fwd+bwd at least this many times faster than bf16 fwd+bwd (te_cudnn both)
FP8_TARGET = 1.2


def _autotune_target(flat: list[dict]) -> list[str]:
    """Autotuned contenders (``... autotuned``) at most 0.97x the reference's time on at least two
    cases *thanks to tuning*: a case counts where the tuned contender is under 0.97x the reference
    and at most 0.98x the same sub-backend's heuristic contender (the name without
    " autotuned"), timed in the same run. Each tuned case is listed with both ratios."""
    by = {(r["case"], r["contender"]): r for r in flat if r["status"] == "ok"}
    rows = []
    for (case, who), r in by.items():
        plain = by.get((case, who.removesuffix(" autotuned")))
        if not who.endswith(" autotuned") or r.get("ratio_vs_sdpa_cudnn") is None or plain is None:
            continue
        field = next((f for f in ("fwd_bwd_ms", "fwd_ms") if r.get(f) and plain.get(f)), None)
        if field is None:
            continue
        rows.append((case, who, r["ratio_vs_sdpa_cudnn"], r[field] / plain[field]))
    if not rows:
        return []
    counted = {(case, who) for case, who, vs_ref, vs_plain in rows if vs_ref <= AUTOTUNE_TARGET and vs_plain <= AUTOTUNE_GAIN}
    ok = len(counted) >= AUTOTUNE_CASES
    lines = [f"- autotuning: ≤ {AUTOTUNE_TARGET}× {REFERENCE} and ≤ {AUTOTUNE_GAIN}× the heuristic plan on "
             f"{len(counted)} of {len(rows)} tuned cases (target: at least {AUTOTUNE_CASES}: "
             f"{'met' if ok else 'missed'})"]  # fmt: skip
    for case, who, vs_ref, vs_plain in sorted(rows):
        mark = " (counts)" if (case, who) in counted else ""
        lines.append(f"  - {case}, {who}: {vs_ref:.3f}× {REFERENCE}, {vs_plain:.3f}× its heuristic plan{mark}")
    return lines


def _fp8_target(flat: list[dict]) -> list[str]:
    """FP8 fwd+bwd against bf16 fwd+bwd (te_cudnn both) on every case both ran: the speed-up of
    each FP8 contender over its bf16 sibling timed in the same rounds ("te_cudnn fp8" over
    "te_cudnn", "te_cudnn fp8 autotuned" over "te_cudnn autotuned", both late contenders; the
    untuned "te_cudnn" where the sibling did not run); a case meets the target with its fastest."""
    by = {(r["case"], r["contender"]): r for r in flat if r["status"] == "ok"}
    per_case: dict[str, list[tuple[float, str]]] = {}
    for (case, who), r in by.items():
        if not who.startswith("te_cudnn fp8"):
            continue
        sibling = who.replace(" fp8", "", 1)
        bf = by.get((case, sibling)) or by.get((case, "te_cudnn"))
        if bf and bf.get("fwd_bwd_ms") and r.get("fwd_bwd_ms"):
            over = "" if bf["contender"] == "te_cudnn" else f" over {bf['contender']}"
            per_case.setdefault(case, []).append((bf["fwd_bwd_ms"] / r["fwd_bwd_ms"], who + over))
    lines = []
    for case, speedups in sorted(per_case.items()):
        best = max(speedups)[0]
        cells = ", ".join(f"{who} {x:.2f}×" for x, who in sorted(speedups, key=lambda t: t[1]))
        lines.append(f"- FP8 fwd+bwd speed-up over bf16, {case}: {cells} (target ≥ {FP8_TARGET}×: "
                     f"{'met' if best >= FP8_TARGET else 'missed'})")
    return lines


#: te_cudnn may be at most this much slower than the same graph written by hand
HAND_BUILT_TARGET = 1.02


def _samples_of(row: Optional[dict], field: str) -> Optional[list]:
    """The per-round samples behind ``row[field]`` (``fwd_bwd_graph_ms`` / ``fwd_bwd_eager_ms``):
    ``*_graph_samples`` / ``*_eager_samples``, or in results written before those were kept,
    ``{mode}_samples`` where it holds that kind (graph samples when the row has a graph time)."""
    if not row:
        return None
    kept = row.get(field.replace("_ms", "_samples"))
    if kept is not None:
        return kept
    mode, kind, _ = field.rsplit("_", 2)
    return row.get(f"{mode}_samples") if (kind == "graph") == (row.get(f"{mode}_graph_ms") is not None) else None


def _hand_built_target(flat: list[dict], raw: list[dict] = ()) -> list[str]:
    """te_cudnn's fwd+bwd over the hand-built graphs' on the cases both ran: the largest ratio in
    CUDA-graph replay and in eager back-to-back calls, against the graph writing into results
    allocated once and against the one allocating its results per call (as te_cudnn does). Each
    case above the target is listed with its ratio paired by round and that ratio's interval
    (both contenders are timed in the same rounds), where the run kept the samples; then the
    same comparison from adjacent samples (:func:`_adjacent_target`), where the run took them."""
    by = {(r["case"], r["contender"]): r for r in flat if r["status"] == "ok"}
    samples = {(r["case"], r["contender"]): r for r in raw}
    lines = []
    for hand, what in (("cuDNN graph (hand-built)", "results allocated once"),
                       ("cuDNN graph (hand-built, allocating)", "results allocated per call")):  # fmt: skip
        for kind, field in (("CUDA-graph replay", "fwd_bwd_graph_ms"), ("eager back-to-back", "fwd_bwd_eager_ms")):
            ratios = [(te[field] / h[field], case) for (case, who), h in by.items() if who == hand
                      and (te := by.get((case, "te_cudnn"))) and te.get(field) and h.get(field)]  # fmt: skip
            if not ratios:
                lines += _adjacent_target(raw, hand, what, kind, field.split("_")[2])
                continue
            worst, case = max(ratios)
            over = sorted((c, r) for r, c in ratios if r > HAND_BUILT_TARGET)
            lines.append(f"- te_cudnn / hand-built graph ({what}), {kind}: at most {worst:.3f}× ({case}) over "
                         f"{len(ratios)} cases (target ≤ {HAND_BUILT_TARGET}: "
                         + ("met)" if not over else f"missed on {', '.join(c for c, _ in over)})"))
            for c, r in over:
                paired = paired_ratio(_samples_of(samples.get((c, "te_cudnn")), field),
                                      _samples_of(samples.get((c, hand)), field))  # fmt: skip
                if paired is None:
                    continue
                med, low, high = paired
                verdict = (f"{HAND_BUILT_TARGET} lies inside the interval" if low <= HAND_BUILT_TARGET
                           else f"above {HAND_BUILT_TARGET} beyond the interval")  # fmt: skip
                lines.append(f"  - {c}: {r:.3f}× (paired by round {med:.3f}×, {RATIO_CONFIDENCE:.0%} interval "
                             f"[{low:.3f}, {high:.3f}]; {verdict})")
            lines += _adjacent_target(raw, hand, what, kind, field.split("_")[2])  # "graph" / "eager"
    return lines


def _adjacent_target(raw: list[dict], hand: str, what: str, kind: str, key: str) -> list[str]:
    """The same target from adjacent samples (``fwd_bwd_adjacent`` of te_cudnn's rows, written by
    the runner in a, b, b, a order): the median ratio per case, the largest, and for each case
    above the target its interval. Nothing where the run kept no adjacent samples."""
    per_case = []
    for r in raw:
        ratios = ((r.get("fwd_bwd_adjacent") or {}).get(hand) or {}).get(key) if r.get("contender") == "te_cudnn" else None
        if ratios:
            per_case.append((statistics.median(ratios), r["case"], ratios))
    if not per_case:
        return []
    worst, case, _ = max(per_case)
    over = sorted((c, m, v) for m, c, v in per_case if m > HAND_BUILT_TARGET)
    lines = [f"- te_cudnn / hand-built graph ({what}), {kind}, adjacent samples (a, b, b, a): at most {worst:.3f}× "
             f"({case}) over {len(per_case)} cases (target ≤ {HAND_BUILT_TARGET}: "
             + ("met)" if not over else f"missed on {', '.join(c for c, _, _ in over)})")]
    for c, med, ratios in over:
        low, high = median_interval(ratios)
        verdict = (f"{HAND_BUILT_TARGET} lies inside the interval" if low <= HAND_BUILT_TARGET
                   else f"above {HAND_BUILT_TARGET} beyond the interval")  # fmt: skip
        lines.append(f"  - {c}: {med:.3f}× over {len(ratios)} quads, {RATIO_CONFIDENCE:.0%} interval "
                     f"[{low:.3f}, {high:.3f}]; {verdict}")
    return lines
