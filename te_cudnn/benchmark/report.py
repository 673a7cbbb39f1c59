"""Rendering results: pure functions from the results dict to a markdown table, CSV, JSON and a
PNG chart (matplotlib, the optional ``bench`` extra; without it the chart is skipped, saying so).

The results dict (written by :func:`.runner.run_benchmark`, read back from results.json):
``env`` (versions, GPU, driver), ``settings``, ``peaks`` (``matmul_bf16_tflops``,
``matmul_fp8_tflops``, ``copy_gbps``), ``host`` (``us`` per contender, ``yardstick``,
``te_cudnn``, ``target_us``), ``cases`` (each case's fields with ``flops_fwd``, ``flops_bwd``,
``kv_bytes``, ``modes``) and ``results``: one row per (case, contender) with ``status``
(``ok`` / ``skipped`` / ``error``), ``reason`` and, when it ran, ``{mode}_ms`` (GPU time:
CUDA-graph replay, or eager where no graph was captured), ``{mode}_eager_ms``,
``{mode}_graph_ms``, ``first_call_ms``, ``build_ms``, ``load_ms``, ``peak_mib``, ``mem_ratio``.
Derived here: TFLOP/s and % of the measured matmul peak, KV-cache GB/s and % of the copy
bandwidth, and each time relative to torch SDPA (cuDNN) on the same case.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
from math import comb
from typing import Any, Optional

__all__ = ["flat_rows", "to_csv", "read_csv", "to_json", "to_markdown", "to_summary", "write_chart", "write_all",
           "CSV_FIELDS", "paired_ratio", "median_interval",
           "REFERENCE", "MEM_TARGET", "DECODE_TARGET_PCT"]  # fmt: skip

#: the contender every time is compared with
REFERENCE = "torch SDPA cuDNN"
MEM_TARGET = 1.1  # te_cudnn's peak / (inputs + outputs + gradients + workspace), 64K-token case
DECODE_TARGET_PCT = 90.0  # KV-cache read bandwidth in % of the device copy bandwidth, 8K and 32K
MODES = ("fwd", "bwd", "fwd_bwd")

CSV_FIELDS = (
    "case", "group", "description", "contender", "status", "precision", "backend",
    "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_eager_ms", "bwd_eager_ms", "fwd_bwd_eager_ms",
    "fwd_graph_ms", "bwd_graph_ms", "fwd_bwd_graph_ms", "fwd_spread_pct", "bwd_spread_pct", "fwd_bwd_spread_pct",
    "rounds", "ratio_vs_sdpa_cudnn", "ratio_paired", "ratio_low", "ratio_high", "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "pct_of_peak",
    "kv_gbps", "pct_of_copy_bw", "first_call_ms", "build_ms", "load_ms", "plans_built", "plans_loaded", "plans_tuned",
    "peak_mib", "workspace_mib", "mem_ratio", "rel_err", "plans", "notes", "errors", "reason",
)  # fmt: skip
_INT_FIELDS = {"rounds", "plans_built", "plans_loaded", "plans_tuned"}
_TEXT_FIELDS = {"case", "group", "description", "contender", "status", "precision", "backend", "plans", "notes",
                "errors", "reason"}  # fmt: skip


# ---------------------------------------------------------------------------- derived values
#: confidence of the interval around a paired ratio
RATIO_CONFIDENCE = 0.95


def median_interval(values: list[float], confidence: float = RATIO_CONFIDENCE) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values``: the order statistics
    ``x_(k)`` and ``x_(n+1-k)`` with the largest ``k`` for which the binomial(n, 1/2) chance of
    the median falling outside is at most ``1 - confidence``. With too few values for that
    confidence the interval is the whole range."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval needs at least one value")
    k, tail = 0, 0.0  # tail: P(Binomial(n, 1/2) <= k - 1) = chance the median lies below x_(k)
    term = 0.5**n
    while True:
        tail_next = tail + term * comb(n, k)
        if 2 * tail_next > 1 - confidence or k + 1 > (n + 1) // 2:
            break
        tail, k = tail_next, k + 1
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


def paired_ratio(samples: Optional[list], reference: Optional[list]) -> Optional[tuple[float, float, float]]:
    """The ratio of two contenders timed in the same interleaved rounds, round by round:
    ``(median, low, high)`` of ``samples[r] / reference[r]`` with :func:`median_interval`.
    Clock and power drift between rounds hit both samples of a round alike and cancel here,
    which the ratio of the two medians does not do. None without paired samples."""
    if not samples or not reference or len(samples) != len(reference):
        return None
    ratios = [a / b for a, b in zip(samples, reference) if b]
    if len(ratios) != len(samples):
        return None
    low, high = median_interval(ratios)
    return statistics.median(ratios), low, high


def headline(case: dict) -> str:
    """The mode a case is judged by: fwd+bwd for training, fwd for inference."""
    return "fwd_bwd" if case.get("training", True) else "fwd"


def _cases(results: dict) -> dict[str, dict]:
    return {c["name"]: c for c in results.get("cases", [])}


def _contenders(results: dict) -> list[str]:
    """Contender names in column order: the run's order, then any others met in the rows."""
    names = list(results.get("settings", {}).get("contenders", []))
    for r in results.get("results", []):
        if r["contender"] not in names:
            names.append(r["contender"])
    return names


def _div(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b not in (None, 0) else None


def flat_rows(results: dict) -> list[dict[str, Any]]:
    """One dict per (case, contender) with every :data:`CSV_FIELDS` key (None where unknown),
    derived values included."""
    cases = _cases(results)
    peaks = results.get("peaks") or {}
    ref = {r["case"]: r for r in results.get("results", []) if r["contender"] == REFERENCE and r["status"] == "ok"}
    out = []
    for r in results.get("results", []):
        case = cases.get(r["case"], {})
        row: dict[str, Any] = {f: r.get(f) for f in CSV_FIELDS}
        row["group"] = case.get("group")
        row["description"] = case.get("description")
        if r["status"] == "ok":
            head = headline(case)
            base = ref.get(r["case"])
            same = (r.get("same_phase") or {}).get(REFERENCE)  # timed beside it in one phase (late contenders)
            base_ms = same.get(head) if same else (base.get(f"{head}_ms") if base else None)
            row["ratio_vs_sdpa_cudnn"] = _div(r.get(f"{head}_ms"), base_ms)
            same_samples = (r.get("same_phase_samples") or {}).get(REFERENCE)
            base_samples = same_samples.get(head) if same_samples else (base.get(f"{head}_samples") if base else None)
            paired = paired_ratio(r.get(f"{head}_samples"), base_samples)
            if paired is not None:
                row["ratio_paired"], row["ratio_low"], row["ratio_high"] = paired
            if case.get("training", True):
                f, b = case.get("flops_fwd"), case.get("flops_bwd")
                row["fwd_tflops"] = _div(f, _scale(r.get("fwd_ms"), 1e9))
                row["bwd_tflops"] = _div(b, _scale(r.get("bwd_ms"), 1e9))
                row["fwd_bwd_tflops"] = _div((f or 0) + (b or 0) if f is not None else None, _scale(r.get("fwd_bwd_ms"), 1e9))
                peak = peaks.get("matmul_fp8_tflops") if r.get("precision") == "fp8" else peaks.get("matmul_bf16_tflops")
                row["pct_of_peak"] = _scale(_div(row["fwd_bwd_tflops"], peak), 100.0)
            else:
                row["kv_gbps"] = _div(case.get("kv_bytes"), _scale(r.get("fwd_ms"), 1e6))
                row["pct_of_copy_bw"] = _scale(_div(row["kv_gbps"], peaks.get("copy_gbps")), 100.0)
        for k, v in row.items():
            if v == "":
                row[k] = None
        out.append(row)
    return out


def _scale(x: Optional[float], k: float) -> Optional[float]:
    return None if x is None else x * k


# ---------------------------------------------------------------------------- CSV / JSON
def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def to_csv(results: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for row in flat_rows(results):
        w.writerow({k: _cell(row[k]) for k in CSV_FIELDS})
    return buf.getvalue()


def read_csv(text: str) -> list[dict[str, Any]]:
    """The rows of :func:`to_csv`, numbers parsed back (``read_csv(to_csv(r)) == flat_rows(r)``)."""
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row: dict[str, Any] = {}
        for k in CSV_FIELDS:
            v = raw.get(k, "")
            if v == "":
                row[k] = None
            elif k in _TEXT_FIELDS:
                row[k] = v
            elif k in _INT_FIELDS:
                row[k] = int(float(v))
            else:
                row[k] = float(v)
        rows.append(row)
    return rows


def to_json(results: dict) -> str:
    return json.dumps(results, indent=1, default=str)


# ---------------------------------------------------------------------------- markdown
def _num(x: Optional[float], digits: int = 4) -> str:
    if x is None:
        return ""
    if abs(x) >= 10 ** digits:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return lines


def _grid(results: dict, flat: list[dict], cell, *, only: Optional[callable] = None) -> list[str]:
    """Rows = cases, columns = contenders that ran (or failed) on any case of this selection."""
    cases = [c for c in results.get("cases", []) if only is None or only(c)]
    by = {(r["case"], r["contender"]): r for r in flat}
    names = [n for n in _contenders(results)
             if any(by.get((c["name"], n), {}).get("status") in ("ok", "error") for c in cases)]
    if not cases or not names:
        return ["(nothing ran)"]
    rows = []
    for c in cases:
        line = [c["name"]]
        for n in names:
            r = by.get((c["name"], n))
            if r is None or r["status"] == "skipped":
                line.append("—")
            elif r["status"] == "error":
                line.append("error")
            else:
                line.append(cell(r, c))
        rows.append(line)
    return _table(["case", *names], rows)


def _time_cell(mode: Optional[str] = None, ratio: bool = False):
    def cell(r: dict, case: dict) -> str:
        m = mode or headline(case)
        v = r.get(f"{m}_ms")
        if v is None:
            return "error" if f"{m}:" in (r.get("errors") or "") else ""
        text = _num(v)
        if ratio and r.get("ratio_vs_sdpa_cudnn") is not None:
            text += f" ({r['ratio_vs_sdpa_cudnn']:.2f}×)"
        return text

    return cell


def _env_lines(results: dict) -> list[str]:
    env, peaks, st = results.get("env", {}), results.get("peaks") or {}, results.get("settings", {})
    gpu = env.get("gpu", "?")
    extra = ", ".join(x for x in (f"{env['sm_count']} SMs" if env.get("sm_count") else "",
                                  f"{env['gpu_memory_gib']} GiB" if env.get("gpu_memory_gib") else "") if x)  # fmt: skip
    ceilings = [f"dense bf16 matmul {_num(peaks.get('matmul_bf16_tflops'))} TFLOP/s (8192³)"]
    if peaks.get("matmul_fp8_tflops"):
        ceilings.append(f"fp8 matmul {_num(peaks['matmul_fp8_tflops'])} TFLOP/s")
    ceilings.append(f"device copy {_num(peaks.get('copy_gbps'))} GB/s (read + write)")
    rows = [
        ["GPU", gpu + (f" ({extra})" if extra else "")],
        ["driver", str(env.get("driver", "?"))],
        ["CUDA / cuDNN / frontend", f"{env.get('cuda', '?')} / {env.get('cudnn', '?')} / {env.get('frontend', '?')}"],
        ["torch / te_cudnn / Python", f"{env.get('torch', '?')} / {env.get('te_cudnn', '?')} / {env.get('python', '?')}"],
        ["measured ceilings", "; ".join(ceilings)],
        ["run", f"{'quick' if st.get('quick') else 'full'}, {len(results.get('cases', []))} cases, at most "
                f"{st.get('rounds', '?')} interleaved rounds per mode, {_num(st.get('wall_s'), 3)} s, {env.get('time', '')}"],
    ]  # fmt: skip
    return _table(["", ""], rows)


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


def _paired_lines(flat: list[dict]) -> list[str]:
    """Every te_cudnn contender's and the hand-built graphs' ratio to the reference, paired by round."""
    rows = [[r["case"], r["contender"], f"{r['ratio_vs_sdpa_cudnn']:.3f}", f"{r['ratio_paired']:.3f}",
             f"[{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]"]
            for r in flat if r.get("ratio_paired") is not None
            and (r["contender"].startswith("te_cudnn") or r["contender"].startswith("cuDNN graph"))]  # fmt: skip
    if not rows:
        return []
    return [f"## Ratios to {REFERENCE}, paired by round", "",
            "The headline mode's time over the reference's in each interleaved round (both timed in that round), "
            f"the median over rounds and a distribution-free {RATIO_CONFIDENCE:.0%} interval for it (order "
            "statistics of the per-round ratios). Round-to-round clock drift cancels in each pair.", "",
            *_table(["case", "contender", "ratio of medians", "paired median", "interval"], rows), ""]


def _host_lines(results: dict) -> list[str]:
    host = results.get("host")
    if not host:
        return []
    if "error" in host:
        return ["## Host time per cached call", "", f"failed: {host['error']}", ""]
    us = host.get("us", {})
    yard = us.get(host.get("yardstick"))
    rows = [[n, _num(u, 3), "" if yard is None or n == host.get("yardstick") else f"{u - yard:+.2f}"]
            for n, u in us.items()]  # fmt: skip
    lines = ["## Host time per cached call", "",
             f"{host.get('problem', '')}; median of {host.get('rounds')} interleaved rounds x {host.get('calls')} "
             f"back-to-back calls (perf_counter, then one synchronize).", ""]  # fmt: skip
    lines += _table(["call", "µs", f"minus {host.get('yardstick')}"], rows)
    for n in host.get("notes", []):
        lines.append(f"- not timed: {n}")
    for name, delta in (host.get("thd_vs_reuse_us") or {}).items():
        lines.append(f"- {name}: {delta:+.2f} µs against the version-keyed reuse (reuse_lengths)")
    if host.get("te_cudnn_launch"):
        lines.append(f"- te_cudnn launch path: {host['te_cudnn_launch']}"
                     + (f" ({host['te_cudnn_plan']})" if host.get("te_cudnn_plan") else ""))  # fmt: skip
    tuned = host.get("tuned") or {}
    if tuned.get("us"):
        tus = tuned["us"]
        tyard = tus.get(host.get("yardstick"))
        lines += ["", f"With the host problem's plan autotuned ({tuned.get('plan')}; the heuristic plan: "
                      f"{tuned.get('heuristic_plan')}), in interleaved rounds of their own:", ""]  # fmt: skip
        lines += _table(["call", "µs", f"minus {host.get('yardstick')}"],
                        [[n, _num(u, 3), "" if tyard is None or n == host.get("yardstick") else f"{u - tyard:+.2f}"]
                         for n, u in tus.items()])  # fmt: skip
    elif tuned.get("error"):
        lines.append(f"- autotuned plan not timed: {tuned['error']}")
    return lines + [""]


def _skip_lines(flat: list[dict]) -> list[str]:
    by_reason: dict[tuple[str, str, str], list[str]] = {}
    for r in flat:
        if r["status"] in ("skipped", "error"):
            by_reason.setdefault((r["status"], r["contender"], r.get("reason") or ""), []).append(r["case"])
        elif r.get("errors"):  # ran, but a mode failed
            by_reason.setdefault(("error", r["contender"], r["errors"]), []).append(r["case"])
    lines = []
    for (status, who, why), cases in sorted(by_reason.items(), key=lambda kv: (kv[0][0] != "error", kv[0][1])):
        lines.append(f"- **{status}** {who} on {', '.join(cases)}: {why}")
    return lines


def _fp8_lines(results: dict, flat: list[dict]) -> list[str]:
    by = {(r["case"], r["contender"]): r for r in flat if r["status"] == "ok"}
    rows = []
    for c in results.get("cases", []):
        f8, bf = by.get((c["name"], "te_cudnn fp8")), by.get((c["name"], "te_cudnn"))
        if f8 and bf:
            rows.append([c["name"], *(f"{_num(_div(bf.get(f'{m}_ms'), f8.get(f'{m}_ms')), 3)}×" for m in MODES)])
    if not rows:
        return []
    return ["## FP8 vs bf16 (te_cudnn): speed-up of the FP8 sub-backend", "",
            *_table(["case", "fwd", "bwd", "fwd+bwd"], rows), ""]  # fmt: skip


def _thd_lines(flat: list[dict]) -> list[str]:
    by = {(r["case"], r["contender"]): r for r in flat if r["status"] == "ok"}
    thd, pad = by.get(("thd_mixed_16k", "te_cudnn")), by.get(("thd_mixed_16k_padded", "te_cudnn"))
    if not (thd and pad):
        return []
    ratios = "; ".join(f"{m} {_num(_div(thd.get(f'{m}_ms'), pad.get(f'{m}_ms')), 3)}" for m in MODES)
    return ["## Packed (THD) vs padded batch, te_cudnn", "", f"THD time / padded time: {ratios}", ""]


def _same_phase_lines(raw: list[dict]) -> list[str]:
    """Contenders timed after the others (autotuned: tuning replaces te_cudnn's plans) against the
    contenders timed again beside them, in the same interleaved rounds."""
    rows = []
    for r in raw:
        same = r.get("same_phase")
        if r["status"] != "ok" or not same:
            continue
        for mode in MODES:
            mine = r.get(f"{mode}_ms")
            if mine is None:
                continue
            cells = [f"{n} {_num(_div(mine, t.get(mode)), 3)}×" for n, t in same.items() if t.get(mode)]
            rows.append([r["case"], r["contender"], mode, _num(mine), "; ".join(cells)])
    if not rows:
        return []
    return ["## Late contenders beside the others, same rounds", "",
            "Autotuned contenders run after the rest (tuning replaces te_cudnn's cached plans); the contenders "
            "that do not share those plans are timed again in the same interleaved rounds: time / theirs.", "",
            *_table(["case", "contender", "mode", "ms", "ratio to (same rounds)"], rows), ""]


def to_markdown(results: dict) -> str:
    flat = flat_rows(results)
    training = lambda c: c.get("training", True)  # noqa: E731
    decode = lambda c: not c.get("training", True)  # noqa: E731
    out = ["# te_cudnn benchmark", "", *_env_lines(results), ""]
    targets = _targets(results, flat)
    if targets:
        out += ["## Targets", "", *targets, ""]
    out += ["## Time (ms): fwd+bwd for training, fwd for decode", "",
            f"GPU time, median over interleaved rounds: CUDA-graph replay of back-to-back calls (eager calls "
            f"where a call takes over 20 ms or capture failed). (×) = time relative to {REFERENCE} on the same "
            f"case (below 1 is faster). — = not run (reasons below).", "",
            *_grid(results, flat, _time_cell(ratio=True)), ""]  # fmt: skip
    out += _same_phase_lines(results.get("results", []))
    out += _paired_lines(flat)
    for mode, title in (("fwd", "Forward (ms)"), ("bwd", "Backward after a forward (ms)")):
        out += [f"## {title}", "", *_grid(results, flat, _time_cell(mode), only=training), ""]
    out += ["## Eager back-to-back calls, fwd+bwd (ms; decode: fwd)", "",
            "Events around consecutive eager calls: host overhead shows where the GPU waits for the host.", "",
            *_grid(results, flat, lambda r, c: _num(r.get(f"{headline(c)}_eager_ms"))), ""]  # fmt: skip
    out += ["## Throughput, fwd+bwd TFLOP/s (% of the measured matmul peak)", "",
            "Unmasked (query, key) pairs only; fwd 4·h·d FLOPs per pair, bwd 2.5x that. FP8 rows against the "
            "fp8 matmul peak.", "",
            *_grid(results, flat, lambda r, c: "" if r.get("fwd_bwd_tflops") is None else
                   f"{r['fwd_bwd_tflops']:.0f}" + ("" if r.get("pct_of_peak") is None else f" ({r['pct_of_peak']:.0f}%)"),
                   only=training), ""]  # fmt: skip
    if any(decode(c) for c in results.get("cases", [])):
        out += ["## Decode: KV-cache read bandwidth, GB/s (% of the device copy bandwidth)", "",
                *_grid(results, flat, lambda r, c: "" if r.get("kv_gbps") is None else
                       f"{r['kv_gbps']:.0f}" + ("" if r.get("pct_of_copy_bw") is None else f" ({r['pct_of_copy_bw']:.0f}%)"),
                       only=decode), ""]  # fmt: skip
    out += _host_lines(results)
    out += ["## Peak memory of one fwd+bwd (decode: fwd), MiB above the shared inputs", "",
            "The contender's own state (preallocated outputs, workspaces) plus what the call allocates. te_cudnn: "
            "(ratio of inputs + peak to inputs + outputs + gradients + workspace).", "",
            *_grid(results, flat, lambda r, c: _num(r.get("peak_mib")) + (
                "" if r.get("mem_ratio") is None else f" ({r['mem_ratio']:.3f})")), ""]  # fmt: skip
    out += ["## Agreement: relative error of O against the case's first bf16 contender (te_cudnn where it runs)", "",
            "‖O − O_ref‖ / ‖O_ref‖ on the same inputs; bf16 implementations differ by about 1e-3 to 1e-2, FP8 more.",
            "", *_grid(results, flat, lambda r, c: "" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"), ""]  # fmt: skip
    out += ["## First call and plans (ms)", "",
            "First call: prepare + one call, synchronized (plan builds, torch.compile). te_cudnn: plans built / "
            "loaded from the plan store in that call, and their milliseconds.", "",
            *_grid(results, flat, _first_cell), ""]  # fmt: skip
    out += _fp8_lines(results, flat)
    out += _thd_lines(flat)
    out += ["## Cases", "", *_table(["case", "group", "what", "note"], [
        [c["name"], c.get("group", ""), c.get("description", ""), c.get("note", "")] for c in results.get("cases", [])]), ""]
    notes: dict[tuple[str, str], list[str]] = {}
    for r in flat:
        for note in filter(None, (n.strip() for n in (r.get("notes") or "").split(";"))):
            notes.setdefault((r["contender"], note), []).append(r["case"])
    if notes:
        out += ["## Notes", "", *(f"- {who} on {', '.join(cs)}: {note}" for (who, note), cs in notes.items()), ""]
    skips = _skip_lines(flat)
    if skips:
        out += ["## Not run", "", *skips, ""]
    return "\n".join(out)


def to_summary(results: dict) -> str:
    """The short form printed after a run that wrote its files: versions, targets, the time grid."""
    flat = flat_rows(results)
    env = results.get("env", {})
    head = (f"te_cudnn benchmark: {env.get('gpu', '?')}, driver {env.get('driver', '?')}, CUDA {env.get('cuda', '?')}, "
            f"cuDNN {env.get('cudnn', '?')}, torch {env.get('torch', '?')}, frontend {env.get('frontend', '?')}")  # fmt: skip
    out = [head, ""]
    targets = _targets(results, flat)
    if targets:
        out += ["Targets:", *targets, ""]
    out += [f"fwd+bwd ms (decode: fwd), (×) = time / {REFERENCE}'s:", "", *_grid(results, flat, _time_cell(ratio=True))]
    failed = [r for r in flat if r["status"] == "error" or r.get("errors")]
    if failed:
        out += ["", f"{len(failed)} contender runs failed (see table.md, 'Not run')"]
    return "\n".join(out)


def _first_cell(r: dict, case: dict) -> str:
    text = _num(r.get("first_call_ms"))
    if r.get("plans_built") or r.get("plans_loaded"):
        text += f" (built {r.get('plans_built') or 0}: {_num(r.get('build_ms') or 0.0)}; loaded " \
                f"{r.get('plans_loaded') or 0}: {_num(r.get('load_ms') or 0.0)})"
    elif r.get("build_ms") is not None:
        text += f" (build {_num(r['build_ms'])})"
    return text


# ---------------------------------------------------------------------------- chart
def write_chart(results: dict, path: str) -> Optional[str]:
    """A PNG: fwd+bwd TFLOP/s per training case and KV-cache GB/s per decode case, one bar per
    contender, with the measured ceilings as lines. Returns None, or why no chart was written."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "matplotlib is not installed (pip install 'te_cudnn[bench]'); no chart written"
    flat = [r for r in flat_rows(results) if r["status"] == "ok"]
    cases = results.get("cases", [])
    panels = [("fwd+bwd TFLOP/s", "fwd_bwd_tflops", [c for c in cases if c.get("training", True)],
               (results.get("peaks") or {}).get("matmul_bf16_tflops"), "bf16 matmul peak"),
              ("decode: KV-cache read GB/s", "kv_gbps", [c for c in cases if not c.get("training", True)],
               (results.get("peaks") or {}).get("copy_gbps"), "device copy")]  # fmt: skip
    panels = [p for p in panels if any(r.get(p[1]) is not None for r in flat if r["case"] in {c["name"] for c in p[2]})]
    if not panels:
        return "no case with a throughput to draw"
    names = [n for n in _contenders(results) if any(r["contender"] == n for r in flat)]
    by = {(r["case"], r["contender"]): r for r in flat}
    widths = [max(4.0, 0.9 * len(p[2])) for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths) + 3, 5.5), squeeze=False,
                             gridspec_kw={"width_ratios": widths})  # fmt: skip
    colors = plt.get_cmap("tab10")
    bar = 0.8 / max(1, len(names))
    for ax, (title, key, pcases, ceiling, ceiling_name) in zip(axes[0], panels):
        for j, n in enumerate(names):
            xs, ys = [], []
            for i, c in enumerate(pcases):
                v = by.get((c["name"], n), {}).get(key)
                if v is not None:
                    xs.append(i - 0.4 + bar * (j + 0.5))
                    ys.append(v)
            if xs:
                ax.bar(xs, ys, bar, label=n, color=colors(j % 10))
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1)
            ax.text(len(pcases) - 0.5, ceiling, f" {ceiling_name} {ceiling:.0f}", va="bottom", ha="right", fontsize=8)
        ax.set_xticks(range(len(pcases)))
        ax.set_xticklabels([c["name"] for c in pcases], rotation=45, ha="right", fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper center", ncol=min(5, len(labels)), fontsize=8, frameon=False)
    env = results.get("env", {})
    fig.suptitle(f"te_cudnn benchmark: {env.get('gpu', '?')}, cuDNN {env.get('cudnn', '?')}, torch {env.get('torch', '?')}",
                 y=0.02, fontsize=9)  # fmt: skip
    fig.tight_layout(rect=(0, 0.04, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_all(results: dict, out_dir: str) -> dict[str, str]:
    """results.json, results.csv, table.md and chart.png in ``out_dir``; returns what was
    written (name -> path) and, under ``"chart"``, why no chart was written if it was not."""
    os.makedirs(out_dir, exist_ok=True)
    written: dict[str, str] = {}
    for name, text in (("results.json", to_json(results)), ("results.csv", to_csv(results)),
                       ("table.md", to_markdown(results))):  # fmt: skip
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        written[name] = path
    png = os.path.join(out_dir, "chart.png")
    why = write_chart(results, png)
    if why is None:
        written["chart.png"] = png
    else:
        written["chart"] = why
    return written
