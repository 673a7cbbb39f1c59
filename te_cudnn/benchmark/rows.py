"""The results as flat rows, one per (case, contender) with every :data:`CSV_FIELDS` key, and the
values derived from the raw results (:func:`flat_rows`): each time relative to :data:`REFERENCE`
(also paired by round), TFLOP/s and % of the measured matmul peak, KV-cache GB/s and % of the
copy bandwidth."""

from __future__ import annotations

from typing import Any, Optional

from .ratios import paired_ratio

#: the contender every time is compared with
REFERENCE = "torch SDPA cuDNN"

CSV_FIELDS = (
    "case", "group", "description", "contender", "status", "precision", "backend",
    "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_eager_ms", "bwd_eager_ms", "fwd_bwd_eager_ms",
    "fwd_graph_ms", "bwd_graph_ms", "fwd_bwd_graph_ms", "fwd_spread_pct", "bwd_spread_pct", "fwd_bwd_spread_pct",
    "rounds", "ratio_vs_sdpa_cudnn", "ratio_paired", "ratio_low", "ratio_high", "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "pct_of_peak",
    "kv_gbps", "pct_of_copy_bw", "first_call_ms", "build_ms", "load_ms", "plans_built", "plans_loaded", "plans_tuned",
    "peak_mib", "workspace_mib", "mem_ratio", "rel_err", "plans", "notes", "errors", "reason",
)  # fmt: skip


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
