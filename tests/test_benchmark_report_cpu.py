"""The benchmark report writers (``te_cudnn.benchmark.report``) on recorded sample results: CSV,
JSON, the Markdown table and summary, the chart, the host-time section, and the names the report
and runner modules re-export; CPU only."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from te_cudnn.benchmark import report
from te_cudnn.benchmark.cases import case_by_name


GPU = "NVIDIA H100 80GB HBM3 (sm90)"


# ----------------------------------------------------------------------------- sample results
def _ok(case: str, who: str, **times) -> dict:
    return {"case": case, "contender": who, "status": "ok", "reason": "", "precision": "bf16", **times}


@pytest.fixture
def results() -> dict:
    """Recorded-style results: two training cases, one decode case, one of each status."""
    cases = [case_by_name(n).as_dict() for n in ("test_1", "decode_kv8k", "fp8_b2_h32_s8k")]
    rows = [
        _ok("test_1", "te_cudnn", fwd_ms=0.1, bwd_ms=0.3, fwd_bwd_ms=0.38, fwd_bwd_eager_ms=0.5, fwd_bwd_graph_ms=0.38,
            first_call_ms=512.5, build_ms=94.0, load_ms=0.0, plans_built=2, plans_loaded=0, peak_mib=40.0,
            mem_ratio=1.04, rel_err=0.0, rounds=20, plans="fwd eng2_k24=7 (built 47 ms, ws 0.0 MiB)"),
        _ok("test_1", "torch SDPA cuDNN", fwd_ms=0.11, bwd_ms=0.3, fwd_bwd_ms=0.4, fwd_bwd_eager_ms=0.55,
            first_call_ms=700.25, peak_mib=48.5, rel_err=0.0021, rounds=20),
        {"case": "test_1", "contender": "te_cudnn max512", "status": "skipped",
         "reason": "F16_max512_seqlen declines: sequence lengths sq=2048, skv=2048 exceed 512"},
        {"case": "test_1", "contender": "torch SDPA flash", "status": "error", "reason": "RuntimeError: No available kernel"},
        _ok("decode_kv8k", "te_cudnn", fwd_ms=0.1, fwd_eager_ms=0.12, rounds=20),
        _ok("decode_kv8k", "torch SDPA cuDNN", fwd_ms=0.125, rounds=20, notes="dense KV cache (torch SDPA has no paged KV)"),
        _ok("decode_kv8k", "te_cudnn decode, dense cache", fwd_ms=0.09, rounds=20),
        _ok("fp8_b2_h32_s8k", "te_cudnn", fwd_ms=2.0, bwd_ms=6.0, fwd_bwd_ms=8.0),
        {**_ok("fp8_b2_h32_s8k", "te_cudnn fp8", fwd_ms=1.0, bwd_ms=6.0, fwd_bwd_ms=7.0), "precision": "fp8"},
    ]  # fmt: skip
    return {
        "schema": "te_cudnn.benchmark/1",
        "env": {"gpu": GPU, "driver": "580.159.04", "cuda": "13.0", "cudnn": "9.19.0", "frontend": "1.32.0",
                "torch": "2.11.0+cu130", "te_cudnn": "0.1.0", "python": "3.12.3", "time": "2026-11-24 12:00:00 UTC"},
        "settings": {"quick": False, "rounds": 20, "contenders": ["te_cudnn", "te_cudnn fp8", "te_cudnn max512",
                                                                   "torch SDPA cuDNN", "torch SDPA flash"], "wall_s": 300.0},
        "peaks": {"matmul_bf16_tflops": 700.0, "matmul_fp8_tflops": 1300.0, "copy_gbps": 3000.0},
        "host": {"problem": "tiny", "rounds": 15, "calls": 2000, "yardstick": "bare graph.execute (hand-built graph)",
                 "te_cudnn": "te_cudnn fused_attn_fwd", "target_us": 3.0, "te_minus_yardstick_us": 2.5, "notes": [],
                 "like_for_like": ["te_cudnn, preallocated out and softmax_lse",
                                   "bare graph.execute (hand-built graph with stats)"],
                 "like_for_like_us": -0.75,
                 "us": {"te_cudnn fused_attn_fwd": 16.0, "bare graph.execute (hand-built graph)": 13.5,
                        "te_cudnn, preallocated out and softmax_lse": 13.25,
                        "bare graph.execute (hand-built graph with stats)": 14.0, "torch SDPA cuDNN": 40.0},
                 "te_cudnn_launch": "raw", "te_cudnn_plan": "eng9_k24=7, workspace 256 B",
                 "tuned": {"plan": "eng8_k24=3, workspace 0 B", "heuristic_plan": "eng9_k24=7, workspace 256 B",
                           "speedup": 1.3, "te_minus_yardstick_us": 1.75,
                           "us": {"te_cudnn fused_attn_fwd": 15.25, "bare graph.execute (hand-built graph)": 13.5}}},
        "cases": cases,
        "results": rows,
    }  # fmt: skip


def _row(flat: list[dict], case: str, who: str) -> dict:
    return next(r for r in flat if r["case"] == case and r["contender"] == who)


def test_csv_round_trips(results: dict, tmp_path: Path) -> None:
    text = report.to_csv(results)
    assert text.splitlines()[0].split(",") == list(report.CSV_FIELDS)
    assert report.read_csv(text) == report.flat_rows(results)
    written = report.write_all(results, str(tmp_path))
    assert report.read_csv(Path(written["results.csv"]).read_text()) == report.flat_rows(results)
    assert {"results.json", "results.csv", "table.md"} <= set(written)


def test_derived_values(results: dict) -> None:
    flat = report.flat_rows(results)
    te, ref = _row(flat, "test_1", "te_cudnn"), _row(flat, "test_1", "torch SDPA cuDNN")
    assert te["ratio_vs_sdpa_cudnn"] == pytest.approx(0.38 / 0.4)
    assert ref["ratio_vs_sdpa_cudnn"] == pytest.approx(1.0)
    f, b = case_by_name("test_1").flops()
    assert te["fwd_tflops"] == pytest.approx(f / 0.1e-3 / 1e12)
    assert te["fwd_bwd_tflops"] == pytest.approx((f + b) / 0.38e-3 / 1e12)
    assert te["pct_of_peak"] == pytest.approx(te["fwd_bwd_tflops"] / 700.0 * 100)
    fp8 = _row(flat, "fp8_b2_h32_s8k", "te_cudnn fp8")  # FP8 rows against the FP8 matmul peak
    assert fp8["pct_of_peak"] == pytest.approx(fp8["fwd_bwd_tflops"] / 1300.0 * 100)
    dec = _row(flat, "decode_kv8k", "te_cudnn")
    kv = case_by_name("decode_kv8k").kv_bytes()
    assert dec["kv_gbps"] == pytest.approx(kv / 0.1e-3 / 1e9)
    assert dec["pct_of_copy_bw"] == pytest.approx(dec["kv_gbps"] / 3000.0 * 100)
    assert dec["ratio_vs_sdpa_cudnn"] == pytest.approx(0.8)  # decode is judged by its forward
    assert dec["fwd_bwd_tflops"] is None
    assert _row(flat, "test_1", "te_cudnn max512")["ratio_vs_sdpa_cudnn"] is None


def test_markdown_table(results: dict) -> None:
    md = report.to_markdown(results)
    assert GPU in md and "580.159.04" in md and "9.19.0" in md and "2.11.0+cu130" in md and "1.32.0" in md
    # the headline grid: time and ratio to torch SDPA cuDNN; skipped "—", failed "error"
    line = next(l for l in md.splitlines() if l.startswith("| test_1 |") and "×" in l)
    cells = [c.strip() for c in line.strip("|").split("|")]
    header = next(l for l in md.splitlines() if l.startswith("| case |") and "te_cudnn" in l)
    names = [c.strip() for c in header.strip("|").split("|")]
    col = dict(zip(names, cells))
    assert col["te_cudnn"] == "0.38 (0.95×)"
    assert col["torch SDPA cuDNN"] == "0.4 (1.00×)"
    assert col["torch SDPA flash"] == "error"
    assert "te_cudnn max512" not in col or col["te_cudnn max512"] == "—"
    assert "exceed 512" in md  # skipped with its reason
    assert "No available kernel" in md
    assert "+2.50 µs (target ≤ +3 µs: met)" in md
    assert ("- host time, like for like: te_cudnn, preallocated out and softmax_lse 13.2 µs vs bare graph.execute "
            "(hand-built graph with stats) 14 µs: -0.75 µs") in md
    assert ("- host time, autotuned plan (eng8_k24=3, workspace 0 B; heuristic plan eng9_k24=7, workspace 256 B): "
            "te_cudnn 15.2 µs vs bare graph.execute (hand-built graph) 13.5 µs in rounds of their own: +1.75 µs "
            "(target ≤ +3 µs: met)") in md
    assert "- te_cudnn launch path: raw (eng9_k24=7, workspace 256 B)" in md
    assert "| te_cudnn fused_attn_fwd | 15.2 | +1.75 |" in md  # the tuned rounds' own table
    assert "FP8 vs bf16" in md and "2×" in md  # fwd speed-up 2.0 / 1.0
    assert "- torch SDPA cuDNN on decode_kv8k: dense KV cache (torch SDPA has no paged KV)" in md
    # the decode target is reported for every te_cudnn entry point that ran the case
    assert "- decode, decode_kv8k, te_cudnn: KV-cache read 2684 GB/s = 89.5% of the copy bandwidth (target ≥ 90%: missed)" in md
    assert "- decode, decode_kv8k, te_cudnn decode, dense cache: KV-cache read 2983 GB/s = 99.4%" in md


def test_summary(results: dict) -> None:
    text = report.to_summary(results)
    assert GPU in text and "580.159.04" in text and "0.38 (0.95×)" in text and "target ≤ +3 µs: met" in text
    assert "1 contender runs failed" in text


def test_json_has_environment_header(results: dict, tmp_path: Path) -> None:
    data = json.loads(report.to_json(results))
    for key in ("gpu", "driver", "cudnn", "torch", "frontend", "cuda"):
        assert data["env"][key]
    written = report.write_all(results, str(tmp_path))
    assert json.loads(Path(written["results.json"]).read_text())["env"]["gpu"] == GPU


def test_chart_png(results: dict, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "chart.png"
    assert report.write_chart(results, str(path)) is None
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_without_matplotlib_the_rest_is_written(results: dict, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    written = report.write_all(results, str(tmp_path))
    assert "matplotlib" in written["chart"] and not (tmp_path / "chart.png").exists()
    assert (tmp_path / "table.md").read_text().startswith("# te_cudnn benchmark")


def test_host_autotuned_plan_not_measured_says_why(results: dict) -> None:
    results = copy.deepcopy(results)
    results["host"]["tuned"] = {"error": "the host problem's plan was not tuned: no tuning record"}
    md = report.to_markdown(results)
    assert "- host time, autotuned plan: not measured (the host problem's plan was not tuned: no tuning record)" in md
    assert "- autotuned plan not timed: the host problem's plan was not tuned: no tuning record" in md
    del results["host"]["tuned"]
    md = report.to_markdown(results)
    assert "autotuned plan" not in md.split("## Host time per cached call")[1].split("##")[0]


def test_report_and_runner_still_export_what_moved_to_modules_of_one_concern() -> None:
    """:mod:`.report` and :mod:`.runner` re-export the names that moved into the modules of one
    concern beside them: the same objects, under the names importers use."""
    from te_cudnn.benchmark import chart, csv_json, markdown, ratios, rows, runner, targets
    from te_cudnn.benchmark import environment as environment_module
    from te_cudnn.benchmark import host_section as host_section_module
    from te_cudnn.benchmark import settings as settings_module

    assert all(hasattr(report, n) for n in report.__all__) and all(hasattr(runner, n) for n in runner.__all__)
    assert (report.flat_rows, report.CSV_FIELDS, report.REFERENCE) == (rows.flat_rows, rows.CSV_FIELDS, rows.REFERENCE)
    assert (report.to_csv, report.read_csv, report.to_json) == (csv_json.to_csv, csv_json.read_csv, csv_json.to_json)
    assert (report.to_markdown, report.to_summary) == (markdown.to_markdown, markdown.to_summary)
    assert (report.paired_ratio, report.median_interval) == (ratios.paired_ratio, ratios.median_interval)
    assert (report.MEM_TARGET, report.DECODE_TARGET_PCT) == (targets.MEM_TARGET, targets.DECODE_TARGET_PCT)
    assert report.write_chart is chart.write_chart
    assert runner.Settings is settings_module.Settings and runner.environment is environment_module.environment
    assert runner.host_section is host_section_module.host_section
