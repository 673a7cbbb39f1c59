"""The benchmark package (``te-cudnn bench``) on the CPU: the report writers on recorded sample
results, the cases and their FLOP counts, the contenders' reasons for declining, the command
line and ``tools/bench.py``'s old options. Timing needs a GPU; nothing here pretends to time."""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from te_cudnn.benchmark import cli, report
from te_cudnn.benchmark.cases import QUICK, Case, all_cases, case_by_name, causal_pairs, select_cases, thd_lengths
from te_cudnn.benchmark.contenders import select_contenders
from te_cudnn.benchmark.torch_contenders import FLEX_DEFAULT_CASES
from te_cudnn.benchmark.inputs import make_inputs, tensor_bytes
from te_cudnn.benchmark.runner import Settings, _skip_reason
from te_cudnn.runtime import HOPPER_CUDNN_919

REPO = Path(__file__).resolve().parents[1]
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


# ----------------------------------------------------------------------------- cases
def test_case_names_unique_and_quick_subset() -> None:
    names = [c.name for c in all_cases()]
    assert len(names) == len(set(names))
    quick = select_cases(quick=True)
    assert quick and [c.name for c in quick] == [n for n in names if n in QUICK]
    default = select_cases()
    assert {c.group for c in default} == {"te", "llama", "thd", "decode", "fp8", "memory"}
    assert [c.name for c in select_cases("decode_kv8k,te")] == ["test_0", "test_1", "test_2", "test_3", "decode_kv8k"]
    assert select_cases("none") == []
    assert len(select_cases("all")) == len(names)
    with pytest.raises(ValueError, match="unknown case or group 'nope'"):
        select_cases("nope")


def test_te_cases_follow_testing_configs() -> None:
    from te_cudnn.testing import BENCHMARK_CONFIGS

    for name, cfg in BENCHMARK_CONFIGS.items():
        c = case_by_name(name)
        assert (c.b, c.h, c.hg, c.d, c.sq, c.skv, c.mask, c.bias) == (cfg.b, cfg.h, cfg.hg, cfg.d, cfg.sq, cfg.skv,
                                                                     cfg.mask, cfg.bias)  # fmt: skip


def test_shapes_of_the_groups() -> None:
    for c in select_cases("llama"):
        assert (c.d, c.hg, c.mask, c.layout) == (128, 8, "causal", "bshd_bshd_bshd")
        assert 16384 <= c.tokens <= 32768
    thd = case_by_name("thd_mixed_16k")
    assert sum(thd.lengths) == thd.tokens == 16384 and thd.lengths == thd_lengths() and len(set(thd.lengths)) > 1
    for c in select_cases("decode"):
        assert (c.sq, c.b, c.h, c.hg, c.training) == (1, 8, 32, 8, False) and c.is_paged and c.modes == ("fwd",)
    mem = case_by_name("mem_h32_s64k")
    assert (mem.b, mem.h, mem.hg, mem.d, mem.sq, mem.mask) == (1, 32, 8, 128, 65536, "causal")


def _brute_pairs(lq: int, lkv: int, bottom_right: bool) -> int:
    shift = lkv - lq if bottom_right else 0
    return sum(1 for i in range(lq) for j in range(lkv) if j <= i + shift)


@pytest.mark.parametrize("lq,lkv", [(1, 1), (5, 5), (3, 8), (8, 3), (1, 7), (7, 1)])
@pytest.mark.parametrize("br", [False, True])
def test_causal_pairs_exact(lq: int, lkv: int, br: bool) -> None:
    assert causal_pairs(lq, lkv, br) == _brute_pairs(lq, lkv, br)


def test_flops_causal_vs_no_mask() -> None:
    s, b, h, d = 2048, 2, 16, 128
    full = Case("full", "x", b, h, h, d, s, s, "no_mask")
    causal = Case("causal", "x", b, h, h, d, s, s, "causal")
    assert full.unmasked_pairs() == b * s * s
    assert causal.unmasked_pairs() == b * s * (s + 1) // 2  # the diagonal counts
    f_full, b_full = full.flops()
    f_causal, b_causal = causal.flops()
    assert f_full == 4 * b * h * s * s * d and b_full == 2.5 * f_full
    assert f_causal / f_full == pytest.approx(0.5, rel=1e-3) and f_causal > f_full / 2
    thd = case_by_name("thd_mixed_16k")  # per sequence, not over the padded square
    assert thd.unmasked_pairs() == sum(n * (n + 1) // 2 for n in thd.lengths)
    dec = case_by_name("decode_kv8k")
    assert dec.unmasked_pairs() == 8 * 8192
    assert dec.kv_bytes() == 2 * 8 * 8192 * 8 * 128 * 2  # K and V, bf16


# ----------------------------------------------------------------------------- contenders
def _by_key(key: str):
    return select_contenders(key, env=HOPPER_CUDNN_919)[0]


def test_max512_declines_long_sequences_with_a_reason() -> None:
    max512 = _by_key("te_cudnn_max512")
    why = max512.supports(case_by_name("test_3"))
    assert why and "F16_max512_seqlen" in why and "exceed 512" in why
    assert max512.supports(case_by_name("test_0")) is None  # s=512, d=64, MHA
    assert _by_key("te_cudnn").supports(case_by_name("test_3")) is None


def test_contender_reasons() -> None:
    assert "FP8 cases only" in _by_key("te_cudnn_fp8").supports(case_by_name("test_1"))
    assert _by_key("te_cudnn_fp8").supports(case_by_name("fp8_b2_h32_s8k")) is None
    assert "THD" in _by_key("sdpa_cudnn").supports(case_by_name("thd_mixed_16k"))
    assert "no attn_mask" in _by_key("sdpa_flash").supports(case_by_name("test_2"))
    assert "dense training" in _by_key("hand_built").supports(case_by_name("decode_kv8k"))
    assert _by_key("te_cudnn").supports(case_by_name("decode_kv8k")) is None  # paged, described on the meta device
    for key in ("te_cudnn_decode", "te_cudnn_decode_dense"):  # fused_attn_decode: decode cases only
        assert _by_key(key).supports(case_by_name("decode_kv8k")) is None
        assert "decode cases only" in _by_key(key).supports(case_by_name("test_1"))
    assert {"te_cudnn_decode", "te_cudnn_decode_dense"} <= {c.key for c in select_contenders("te")}
    assert _by_key("te_cudnn").supports(case_by_name("thd_mixed_16k")) is None
    assert _by_key("te_cudnn_autotuned").supports(case_by_name("test_1")) is None


def test_runner_skip_reasons() -> None:
    full, quick = Settings.for_run(False), Settings.for_run(True)
    flex, te = _by_key("flex"), _by_key("te_cudnn")
    assert "--quick" in _skip_reason(flex, case_by_name("test_3"), quick)
    assert "test_3" in FLEX_DEFAULT_CASES and _skip_reason(flex, case_by_name("test_3"), full) is None
    assert "--every-case" in _skip_reason(flex, case_by_name("test_0"), full)
    assert _skip_reason(flex, case_by_name("test_0"), Settings.for_run(False, every_case=True)) is None
    tuned = _by_key("te_cudnn_autotuned")
    assert tuned.runs_last and not te.runs_last  # tuning replaces the plans the others use: it runs last
    assert "--quick" in _skip_reason(tuned, case_by_name("test_3"), quick)
    assert "--every-case" in _skip_reason(tuned, case_by_name("llama_h64_s32k"), full)
    assert "runs te_cudnn, torch SDPA cuDNN only" in _skip_reason(_by_key("sdpa_flash"), case_by_name("mem_h32_s64k"), full)
    assert _skip_reason(te, case_by_name("mem_h32_s64k"), full) is None


@pytest.mark.parametrize("name", ["test_2", "test_3", "decode_kv4k"])
def test_hand_built_graphs_validate(name: str) -> None:
    """The hand-built yardstick graphs (forward, and backward for training) pass the frontend's
    validation for the case's shapes and strides (defined without a handle: no GPU)."""
    from te_cudnn.benchmark.handbuilt import HandGraphs
    from te_cudnn.benchmark.inputs import Inputs

    c = case_by_name(name)
    q = torch.empty(c.b, c.sq, c.h, c.d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(c.b, c.skv, c.hg, c.d, dtype=torch.bfloat16, device="meta")
    bias = torch.empty(*c.bias_shape, dtype=torch.bfloat16, device="meta") if c.bias_shape else None
    g = HandGraphs(Inputs.bhsd(q), Inputs.bhsd(k), Inputs.bhsd(k), training=c.training, causal=c.causal, bias=bias,
                   d_o=Inputs.bhsd(q), build=False)  # fmt: skip
    g.gf.validate()
    assert (g.gb is not None) == c.training
    if g.gb is not None:
        g.gb.validate()
    assert g.o.shape == (c.b, c.h, c.sq, c.d) and g.o.permute(0, 2, 1, 3).is_contiguous()  # O in bshd memory


@pytest.mark.parametrize("name,backend,fp8", [("test_2", "F16_arbitrary_seqlen", False), ("thd_mixed_16k", None, False),
                                              ("fp8_b2_h32_s8k", "FP8", True), ("decode_kv8k", "F16_arbitrary_seqlen", False),
                                              ("test_0", "F16_max512_seqlen", False)])  # fmt: skip
def test_te_cudnn_calls_pass_validation(name: str, backend, fp8: bool) -> None:
    """The contender's fused_attn_fwd / fused_attn_bwd arguments (layouts, lengths, page tables,
    bias, FP8 scales) pass te_cudnn's checks: on the CPU the calls get as far as the device check."""
    import dataclasses

    from te_cudnn.benchmark.te_contender import TeCudnnRun

    c = case_by_name(name)
    if not c.lengths and not c.is_paged:  # smaller, same kind
        c = dataclasses.replace(c, sq=min(c.sq, 256), skv=min(c.skv, 256))
    inp = make_inputs(c, device="cpu")
    run = TeCudnnRun(c, inp, backend, fp8, None)
    with pytest.raises(ValueError, match="executes on CUDA devices"):
        run.fwd()
    if c.training:
        stats = torch.zeros(c.tokens, c.h, 1) if c.is_thd else torch.zeros(c.b, c.h, c.sq, 1)
        aux = [stats, torch.zeros(2, dtype=torch.int64)] + ([inp.bias] if inp.bias is not None else [])
        with pytest.raises(ValueError, match="executes on CUDA devices"):
            run.bwd((run.q, aux))


def test_select_contenders() -> None:
    assert [c.key for c in select_contenders("sdpa")] == ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient"]
    targets = {c.key for c in select_contenders("targets")}  # every contender a target line reads, no other
    assert targets == {"te_cudnn", "te_cudnn_autotuned", "te_cudnn_fp8", "te_cudnn_fp8_autotuned", "te_cudnn_decode",
                       "te_cudnn_decode_dense", "hand_built", "hand_built_alloc", "sdpa_cudnn"}  # fmt: skip
    assert [c.key for c in select_contenders("flex,te_cudnn")] == ["te_cudnn", "flex"]  # column order kept
    assert [c.name for c in select_contenders("torch SDPA cuDNN")] == ["torch SDPA cuDNN"]
    with pytest.raises(ValueError, match="unknown contender 'nope'"):
        select_contenders("nope")


def test_inputs_on_cpu_are_shared_views() -> None:
    case = Case("tiny_decode", "decode", 2, 4, 2, 32, 1, 200, "padding", layout="paged_kv_bshd_bshd_bshd",
                training=False, page_size=64)  # fmt: skip
    inp = make_inputs(case, device="cpu")
    assert inp.k.shape == (2 * 4, 64, 2, 32) and inp.page_table_k.dtype == torch.int32
    k, _ = inp.dense_kv()
    assert k.shape == (2, 2, 200, 32)
    for b, pos in ((0, 0), (1, 130), (1, 199)):
        page = int(inp.page_table_k[b, pos // 64])
        assert torch.equal(inp.k[page, pos % 64], k[b, :, pos])
    assert inp.cu_seqlens_kv.tolist() == [0, 200, 400]
    dense = make_inputs(case_by_name("test_0"), device="cpu")
    assert Inputs_bhsd_is_view(dense.q)
    assert tensor_bytes([dense.q, dense.q[0], None]) == dense.q.numel() * 2


def Inputs_bhsd_is_view(t: torch.Tensor) -> bool:
    from te_cudnn.benchmark.inputs import Inputs

    v = Inputs.bhsd(t)
    return v.data_ptr() == t.data_ptr() and v.shape == (t.shape[0], t.shape[2], t.shape[1], t.shape[3])


# ----------------------------------------------------------------------------- command line
def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


@pytest.mark.slow
def test_help_works_without_a_gpu() -> None:
    p = _run("-m", "te_cudnn.benchmark", "--help")
    assert p.returncode == 0, p.stderr
    assert "--quick" in p.stdout and "--out DIR" in p.stdout and "case groups" in p.stdout


def test_list_works_without_a_gpu(capsys) -> None:
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "llama_h64_s32k" in out and "sdpa_efficient" in out


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_no_cuda_exits_non_zero_with_one_line() -> None:
    p = _run("-m", "te_cudnn.benchmark", "--quick")
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("te-cudnn bench: needs a CUDA GPU"), p.stderr


def test_bad_arguments_exit_2(capsys) -> None:
    assert cli.main(["--cases", "nope"]) == 2
    assert "unknown case or group" in capsys.readouterr().err
    assert cli.main(["--contenders", "nope"]) == 2


def test_register_adds_bench_subcommand() -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true")
    like_te_cudnn = argparse.ArgumentParser(add_help=False)  # te_cudnn.cli's common parent: a --json flag too
    like_te_cudnn.add_argument("--json", action="store_true")
    like_te_cudnn.add_argument("--debug", action="store_true")
    for parents in ((), (common,), (like_te_cudnn,)):
        p = argparse.ArgumentParser(prog="te-cudnn")
        sub = p.add_subparsers(dest="command", required=True)
        cli.register(sub, parents=parents)
        args = p.parse_args(["bench", "--quick", "--cases", "test_1", "--out", "d"])
        assert args.func is cli.run_from_args and args.quick and args.cases == "test_1" and args.out == "d"
        assert args.debug is False


def test_tools_bench_keeps_its_options() -> None:
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import bench  # tools/bench.py
    finally:
        sys.path.remove(str(REPO / "tools"))
    assert bench.translate(["--only", "max512", "--iters", "30"]) == [
        "--cases", "max512", "--contenders", "te_cudnn,te_cudnn_max512,hand_built", "--rounds", "30"]  # fmt: skip
    assert bench.translate(["--only", "host", "--json", "x.json"]) == ["--cases", "none", "--json", "x.json"]
    assert bench.translate(["--only", "dense", "--configs", "test_3"])[:2] == ["--cases", "test_3"]
    assert bench.translate(["--quick", "--out", "d"]) == ["--quick", "--out", "d"]
    assert bench.translate(["--json", "b.json"]) == ["--quick", "--json", "b.json"]  # tools/run_gpu_suite.sh
    assert bench.translate(["--full"]) == []
    assert callable(bench.host_medians)  # still importable from here (te_cudnn.timing holds it)


def test_interleaved_rounds_shuffle_the_order_reproducibly():
    """Every round takes every sampler once, in a fresh seeded order: each contender follows
    many different neighbours (a rotation would keep its predecessor fixed), and the same seed
    gives the same orders."""
    from te_cudnn.benchmark.measure import interleaved

    def run(seed):
        calls = []
        samples = interleaved({n: (lambda n=n: calls.append(n) or 1.0) for n in "abcde"}, 20, seed)
        return calls, samples

    calls, samples = run(0)
    assert {n: len(v) for n, v in samples.items()} == {n: 20 for n in "abcde"}
    rounds = [calls[i:i + 5] for i in range(0, 100, 5)]
    assert all(sorted(r) == list("abcde") for r in rounds)
    predecessors = {n: {r[r.index(n) - 1] for r in rounds if r.index(n) > 0} for n in "abcde"}
    assert all(len(p) >= 3 for p in predecessors.values()), predecessors
    assert run(0)[0] == calls and run(1)[0] != calls


def test_samplers_run_their_lead_untimed_first(monkeypatch):
    """The lead: untimed work of the same contender before each sample, sized from lead_ms."""
    from te_cudnn.benchmark import measure

    assert measure.lead_count(20.0, 7.0) == 3 and measure.lead_count(20.0, 30.0) == 1
    assert measure.lead_count(0.0, 7.0, least=1) == 1 and measure.lead_count(20.0, 0.0) == 0
    seen = []
    monkeypatch.setattr(measure, "event_ms", lambda fn, reps=1, lead=0: seen.append((reps, lead)) or 4.0)
    assert measure.eager_sampler(lambda: None, 2, lead=3)() == 4.0
    assert measure.eager_sampler(lambda: None, 2, lead=0)() == 4.0  # never below EAGER_LEAD

    class Graph:
        def replay(self):
            pass

    assert measure.graph_sampler(Graph(), 2, lead=5)() == 2.0  # one replay of 2 calls: 4.0 / 2
    assert seen == [(2, 3), (2, measure.EAGER_LEAD), (1, 5)]


def test_lead_ms_option():
    args = cli.build_parser().parse_args(["--lead-ms", "50"])
    assert args.lead_ms == 50.0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(SystemExit) as exc:
            cli.build_parser().parse_args(["--lead-ms", bad])
        assert exc.value.code == 2


def test_mode_seconds_option_sets_the_timing_budget():
    args = cli.build_parser().parse_args(["--mode-seconds", "3"])
    assert args.mode_seconds == 3.0
    assert cli.build_parser().parse_args([]).mode_seconds is None  # Settings keeps its default
    for bad in ("0", "-2", "inf", "nan", "long"):
        with pytest.raises(SystemExit) as exc:
            cli.build_parser().parse_args(["--mode-seconds", bad])
        assert exc.value.code == 2


def test_late_contenders_are_compared_within_their_own_rounds():
    """An autotuned row carries the references timed beside it; its ratio uses them, not the
    first phase's times, and the report lists the same-round ratios."""
    from te_cudnn.benchmark.report import flat_rows, to_markdown

    case = {"name": "c", "group": "llama", "training": True, "modes": ["fwd", "bwd", "fwd_bwd"], "description": "c"}
    ok = dict(case="c", status="ok")
    results = {"cases": [case], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, contender="torch SDPA cuDNN", fwd_ms=1.0, bwd_ms=2.0, fwd_bwd_ms=3.0),
        dict(ok, contender="te_cudnn autotuned", fwd_ms=1.0, bwd_ms=2.0, fwd_bwd_ms=3.3,
             same_phase={"torch SDPA cuDNN": {"fwd": 1.0, "bwd": 2.0, "fwd_bwd": 3.3},
                         "cuDNN graph (hand-built)": {"fwd": 1.0, "bwd": 2.0, "fwd_bwd": 3.0}}),
    ]}  # fmt: skip
    rows = {r["contender"]: r for r in flat_rows(results)}
    assert rows["te_cudnn autotuned"]["ratio_vs_sdpa_cudnn"] == 1.0  # 3.3 / 3.3 in the same rounds, not 3.3 / 3.0
    text = to_markdown(results)
    assert "Late contenders beside the others" in text and "cuDNN graph (hand-built) 1.1×" in text


# ----------------------------------------------------------------------------- ratios paired by round
def test_median_interval_uses_binomial_order_statistics():
    """n = 20 at 95 %: x_(6) and x_(15) (P(Bin(20, 1/2) <= 5) = 0.0207, <= 6 is 0.0577); too few
    values for the confidence give the whole range."""
    values = [float(v) for v in range(20, 0, -1)]  # unsorted on purpose
    assert report.median_interval(values) == (6.0, 15.0)
    assert report.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert report.median_interval([5.0]) == (5.0, 5.0)
    assert report.median_interval(list(map(float, range(1, 11)))) == (2.0, 9.0)  # n = 10: P(<= 1) = 0.0107
    with pytest.raises(ValueError):
        report.median_interval([])


@given(st.lists(st.floats(0.5, 2.0), min_size=1, max_size=60), st.sampled_from([0.8, 0.9, 0.95, 0.99]))
@settings(max_examples=200, deadline=None)
def test_median_interval_brackets_the_median(values, confidence):
    import statistics

    low, high = report.median_interval(values, confidence)
    assert min(values) <= low <= statistics.median(values) <= high <= max(values)
    wider = report.median_interval(values, min(0.999, confidence + 0.005))
    assert wider[0] <= low and high <= wider[1]  # more confidence never narrows it


def test_paired_ratio_cancels_drift_between_rounds():
    """Both contenders slow down together round after round (clocks): the per-round ratio is
    exactly 1.02, while the ratio of the two medians mixes different rounds."""
    ref = [1.0 + 0.05 * r for r in range(20)]
    te = [1.02 * t for t in ref]
    med, low, high = report.paired_ratio(te, ref)
    assert med == pytest.approx(1.02) and low == pytest.approx(1.02) and high == pytest.approx(1.02)
    assert report.paired_ratio(te, ref[:-1]) is None  # unpaired lengths
    assert report.paired_ratio(None, ref) is None and report.paired_ratio(te, [0.0] * 20) is None


def test_paired_ratios_reach_rows_targets_and_table():
    """Rows with per-round samples get ratio_paired / ratio_low / ratio_high; the targets list the
    cases above 1.0 with their interval and say whether 1.0 lies inside it."""
    case = {"name": "c", "group": "llama", "training": True, "modes": ["fwd_bwd"], "description": "c"}
    case2 = dict(case, name="d")
    ref = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.0, 1.01, 0.99]
    noisy = [1.01, 0.995, 1.0, 1.012, 1.0, 1.0, 1.018, 0.99, 1.02, 1.0]  # per-round ratios around 1.0
    ok = dict(status="ok")
    results = {"cases": [case, case2], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, case="c", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0, fwd_bwd_samples=ref),
        dict(ok, case="c", contender="te_cudnn", fwd_bwd_ms=1.005, fwd_bwd_samples=[a * b for a, b in zip(ref, noisy)]),
        dict(ok, case="d", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0, fwd_bwd_samples=ref),
        dict(ok, case="d", contender="te_cudnn", fwd_bwd_ms=1.05, fwd_bwd_samples=[1.05 * a for a in ref]),
    ]}  # fmt: skip
    rows = {(r["case"], r["contender"]): r for r in report.flat_rows(results)}
    c = rows[("c", "te_cudnn")]
    assert c["ratio_low"] <= 1.0 <= c["ratio_high"] and c["ratio_low"] <= c["ratio_paired"] <= c["ratio_high"]
    assert rows[("d", "te_cudnn")]["ratio_paired"] == pytest.approx(1.05)
    assert rows[("c", "torch SDPA cuDNN")]["ratio_paired"] == pytest.approx(1.0)
    text = report.to_markdown(results)
    assert "- te_cudnn ≤ 1.0× torch SDPA cuDNN: 0 of 2 cases; above 1.0:" in text
    assert "  - c: 1.005× (paired by round" in text and "1.0 lies inside the interval" in text
    assert "  - d: 1.050× (paired by round 1.050×, 95% interval [1.050, 1.050]; slower beyond the interval)" in text
    assert "## Ratios to torch SDPA cuDNN, paired by round" in text
    assert "| d | te_cudnn | 1.050 | 1.050 | [1.050, 1.050] |" in text
    assert report.read_csv(report.to_csv(results)) == report.flat_rows(results)


def test_late_contenders_pair_with_the_reference_of_their_own_rounds():
    case = {"name": "c", "group": "llama", "training": True, "modes": ["fwd_bwd"], "description": "c"}
    results = {"cases": [case], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(case="c", status="ok", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0, fwd_bwd_samples=[1.0] * 5),
        dict(case="c", status="ok", contender="te_cudnn autotuned", fwd_bwd_ms=1.1, fwd_bwd_samples=[1.1] * 5,
             same_phase={"torch SDPA cuDNN": {"fwd_bwd": 1.1}},
             same_phase_samples={"torch SDPA cuDNN": {"fwd_bwd": [1.1] * 5}}),
    ]}  # fmt: skip
    row = next(r for r in report.flat_rows(results) if r["contender"] == "te_cudnn autotuned")
    assert row["ratio_paired"] == pytest.approx(1.0)


def test_eager_samples_start_behind_an_untimed_call(monkeypatch):
    """A lone timed call would include its launch from an idle GPU (the host latency of the
    contender's Python); each eager sample therefore runs one untimed call first."""
    from te_cudnn.benchmark import measure

    seen = []
    monkeypatch.setattr(measure, "event_ms", lambda fn, reps=1, lead=0: seen.append((reps, lead)) or 1.0)
    assert measure.eager_sampler(lambda: None, 3)() == 1.0
    assert seen == [(3, measure.EAGER_LEAD)] and measure.EAGER_LEAD >= 1


def test_hand_built_target_in_replay_and_eager():
    """The ≤ 1.02× target against the hand-built graphs is reported for CUDA-graph replay and for
    eager back-to-back calls, against both hand-built variants, naming the cases that miss it."""
    case = {"name": "c", "group": "te", "training": True, "modes": ["fwd_bwd"], "description": "c"}
    ok = dict(case="c", status="ok")
    results = {"cases": [case], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, contender="te_cudnn", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.0, fwd_bwd_eager_ms=1.10),
        dict(ok, contender="cuDNN graph (hand-built)", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.0, fwd_bwd_eager_ms=1.0),
        dict(ok, contender="cuDNN graph (hand-built, allocating)", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=0.99,
             fwd_bwd_eager_ms=1.09),
    ]}  # fmt: skip
    text = report.to_markdown(results)
    assert ("- te_cudnn / hand-built graph (results allocated once), CUDA-graph replay: at most 1.000× (c) over 1 "
            "cases (target ≤ 1.02: met)") in text
    assert "(results allocated once), eager back-to-back: at most 1.100× (c) over 1 cases (target ≤ 1.02: missed on c)" in text
    assert "(results allocated per call), eager back-to-back: at most 1.009× (c) over 1 cases (target ≤ 1.02: met)" in text
    assert "(results allocated per call), CUDA-graph replay: at most 1.010×" in text


def test_allocating_hand_built_contender_is_listed():
    (c,) = select_contenders("hand_built_alloc")
    assert c.allocating and c.name == "cuDNN graph (hand-built, allocating)"
    assert c.supports(case_by_name("test_1")) is None and "dense training" in c.supports(case_by_name("decode_kv8k"))
    assert "hand_built_alloc" in cli._epilog()


def test_autotune_and_fp8_targets_are_listed():
    """Autotuning counts a case only where the tuned contender is ≤ 0.97× the reference *and*
    ≤ 0.98× its own heuristic plan; the FP8 target takes each case's fastest FP8 contender."""
    cases = [{"name": n, "group": "te", "training": True, "modes": ["fwd_bwd"], "description": n} for n in "abc"]
    ok = dict(status="ok")
    rows = [
        # a: tuning wins and the tuned plan is under 0.97 of the reference -> counts
        dict(ok, case="a", contender="te_cudnn", fwd_bwd_ms=1.0),
        dict(ok, case="a", contender="te_cudnn autotuned", fwd_bwd_ms=0.9),
        dict(ok, case="a", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0),
        # b: under 0.97 of the reference, but no faster than the heuristic plan -> does not count
        dict(ok, case="b", contender="te_cudnn", fwd_bwd_ms=0.9),
        dict(ok, case="b", contender="te_cudnn autotuned", fwd_bwd_ms=0.9),
        dict(ok, case="b", contender="torch SDPA cuDNN", fwd_bwd_ms=1.0),
        # c: FP8 heuristic 1.1x, FP8 tuned 1.25x over bf16
        dict(ok, case="c", contender="te_cudnn", fwd_bwd_ms=1.0),
        dict(ok, case="c", contender="te_cudnn fp8", fwd_bwd_ms=1.0 / 1.1),
        dict(ok, case="c", contender="te_cudnn fp8 autotuned", fwd_bwd_ms=0.8),
    ]  # fmt: skip
    text = report.to_markdown({"cases": cases, "env": {}, "peaks": {}, "settings": {}, "results": rows})
    assert ("- autotuning: ≤ 0.97× torch SDPA cuDNN and ≤ 0.98× the heuristic plan on 1 of 2 tuned cases "
            "(target: at least 2: missed)") in text
    assert "  - a, te_cudnn autotuned: 0.900× torch SDPA cuDNN, 0.900× its heuristic plan (counts)" in text
    assert "  - b, te_cudnn autotuned: 0.900× torch SDPA cuDNN, 1.000× its heuristic plan\n" in text
    assert ("- FP8 fwd+bwd speed-up over bf16, c: te_cudnn fp8 1.10×, te_cudnn fp8 autotuned 1.25× "
            "(target ≥ 1.2×: met)") in text
    rows[-1]["fwd_bwd_ms"] = 0.9  # the tuned FP8 contender now 1.11x: below the target
    text = report.to_markdown({"cases": cases, "env": {}, "peaks": {}, "settings": {}, "results": rows})
    assert "te_cudnn fp8 autotuned 1.11× (target ≥ 1.2×: missed)" in text
    # timed in the same rounds as a tuned bf16 sibling, the tuned FP8 contender is compared with it
    rows.append(dict(ok, case="c", contender="te_cudnn autotuned", fwd_bwd_ms=1.125))
    text = report.to_markdown({"cases": cases, "env": {}, "peaks": {}, "settings": {}, "results": rows})
    assert "te_cudnn fp8 autotuned over te_cudnn autotuned 1.25× (target ≥ 1.2×: met)" in text


def test_a_run_gets_a_private_plan_store_by_default(monkeypatch, tmp_path):
    """A store that holds tuned plans gives them to untuned contenders too, so a run uses a
    fresh, private store unless told otherwise; the caller's setting comes back afterwards and
    the cache's per-device store memo is forgotten on the way in and out."""
    import os

    from te_cudnn.benchmark.runner import plan_store_for_run
    from te_cudnn.plans import persist

    assert Settings().plan_store == "fresh"
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", "/the/callers/store")
    monkeypatch.setattr(persist, "_stores", {0: "the caller's store object"})
    with plan_store_for_run("fresh") as value:
        private = Path(value)
        assert os.environ["TE_CUDNN_PLAN_STORE"] == value and private.is_dir() and not any(private.iterdir())
        assert persist._stores == {}
        persist._stores[0] = "the run's store object"
    assert not private.exists() and os.environ["TE_CUDNN_PLAN_STORE"] == "/the/callers/store"
    assert persist._stores == {}
    with plan_store_for_run("default") as value:
        assert value is None and os.environ["TE_CUDNN_PLAN_STORE"] == "/the/callers/store"
    for setting in ("off", str(tmp_path)):
        with plan_store_for_run(setting) as value:
            assert value == setting == os.environ["TE_CUDNN_PLAN_STORE"]
    monkeypatch.delenv("TE_CUDNN_PLAN_STORE")
    with plan_store_for_run("off"):
        pass
    assert "TE_CUDNN_PLAN_STORE" not in os.environ


def test_plan_store_option():
    assert cli.build_parser().parse_args(["--plan-store", "default"]).plan_store == "default"
    assert cli.build_parser().parse_args([]).plan_store is None  # Settings' default: fresh
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["--plan-store", " "])
    assert exc.value.code == 2


def test_hand_built_misses_carry_their_paired_interval():
    """A case above the 1.02 target against a hand-built graph is listed with its ratio paired
    by round and the interval, which says whether 1.02 lies inside it (noise) or not."""
    case = {"name": "c", "group": "te", "training": True, "modes": ["fwd_bwd"], "description": "c"}
    ok = dict(case="c", status="ok")
    te_eager = [1.10, 1.00, 1.20, 0.95, 1.10, 1.00, 1.05, 1.15, 0.98, 1.12]
    hand_eager = [1.0] * 10
    results = {"cases": [case], "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, contender="te_cudnn", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.05, fwd_bwd_eager_ms=1.075,
             fwd_bwd_graph_samples=[1.05] * 10, fwd_bwd_eager_samples=te_eager),
        dict(ok, contender="cuDNN graph (hand-built)", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.0, fwd_bwd_eager_ms=1.0,
             fwd_bwd_graph_samples=[1.0] * 10, fwd_bwd_eager_samples=hand_eager),
    ]}  # fmt: skip
    text = report.to_markdown(results)
    assert "  - c: 1.050× (paired by round 1.050×, 95% interval [1.050, 1.050]; above 1.02 beyond the interval)" in text
    assert "  - c: 1.075× (paired by round 1.075×, 95% interval [0.980, 1.150]; 1.02 lies inside the interval)" in text


# ----------------------------------------------------------------------------- adjacent samples (a, b, b, a)
def test_adjacent_ratios_cancel_a_linear_clock_drift():
    """The clock slows with every sample taken; a is 2 % slower than b at any clock: each quad's
    ratio is exactly 1.02, in the order a, b, b, a."""
    from te_cudnn.benchmark.measure import adjacent_ratios

    taken = []

    def sampler(name, factor):
        def sample():
            taken.append(name)
            return factor * (1.0 + 0.03 * len(taken))
        return sample

    ratios = adjacent_ratios(sampler("a", 1.02), sampler("b", 1.0), 5)
    assert ratios == pytest.approx([1.02] * 5, rel=1e-12)
    assert "".join(taken) == "abba" * 5


def test_adjacent_comparisons_fill_the_rows_within_their_quad_bounds():
    from te_cudnn.benchmark import runner

    calls = []
    names = [n for pair in runner.SAME_ENGINE for n in pair]
    samplers = {(n, k): (lambda n=n, k=k: calls.append((n, k)) or 1.0) for n in set(names) for k in ("eager", "graph")}
    del samplers[("cuDNN graph (hand-built, allocating)", "graph")]  # a side without replay: eager only
    sample_ms = {key: 10.0 for key in samplers}
    rows = {n: {} for n in set(names)}
    runner._adjacent("fwd_bwd", samplers, sample_ms, rows, runner.Settings(pair_seconds=0.4))  # 400 ms / 40 ms
    adj = rows["te_cudnn"]["fwd_bwd_adjacent"]
    assert sorted(adj) == ["cuDNN graph (hand-built)", "cuDNN graph (hand-built, allocating)"]
    assert sorted(adj["cuDNN graph (hand-built)"]) == ["eager", "graph"]
    assert list(adj["cuDNN graph (hand-built, allocating)"]) == ["eager"]
    assert len(adj["cuDNN graph (hand-built)"]["eager"]) == 10 and len(calls) == 3 * 10 * 4
    rows = {n: {} for n in set(names)}
    runner._adjacent("fwd_bwd", samplers, {k: 1e4 for k in sample_ms}, rows, runner.Settings(pair_seconds=0.4))
    assert len(rows["te_cudnn"]["fwd_bwd_adjacent"]["cuDNN graph (hand-built)"]["eager"]) == runner.PAIR_QUADS[0]
    rows = {n: {} for n in set(names)}
    runner._adjacent("fwd_bwd", samplers, {k: 1e-3 for k in sample_ms}, rows, runner.Settings(pair_seconds=5))
    assert len(rows["te_cudnn"]["fwd_bwd_adjacent"]["cuDNN graph (hand-built)"]["graph"]) == runner.PAIR_QUADS[1]


def test_pair_seconds_option(capsys):
    assert cli.build_parser().parse_args(["--pair-seconds", "2.5"]).pair_seconds == 2.5
    assert cli.build_parser().parse_args(["--pair-seconds", "0"]).pair_seconds == 0.0
    assert cli.build_parser().parse_args([]).pair_seconds is None  # Settings keeps its default
    from te_cudnn.benchmark.runner import Settings

    assert Settings().pair_seconds > 0 and 0 < Settings.for_run(True).pair_seconds < Settings().pair_seconds
    assert cli.build_parser().parse_args(["--pair-seconds", "0.00"]).pair_seconds == 0.0
    for bad in ("-1", "inf", "nan", "soon"):
        with pytest.raises(SystemExit) as exc:
            cli.build_parser().parse_args(["--pair-seconds", bad])
        assert exc.value.code == 2
    assert "must be 0 (off) or a finite number > 0, got -1" in capsys.readouterr().err


def test_hand_built_target_from_adjacent_samples():
    """te_cudnn's row carries the adjacent-sample ratios; the targets list them after the
    ratio of medians, per hand-built variant and kind, with an interval for each case above."""
    cases = [{"name": n, "group": "te", "training": True, "modes": ["fwd_bwd"], "description": n} for n in ("c", "d")]
    ok = dict(status="ok", fwd_bwd_ms=1.0, fwd_bwd_graph_ms=1.0, fwd_bwd_eager_ms=1.0)
    hand = "cuDNN graph (hand-built)"
    results = {"cases": cases, "env": {}, "peaks": {}, "settings": {}, "results": [
        dict(ok, case="c", contender="te_cudnn", fwd_bwd_adjacent={hand: {"graph": [1.0, 1.01, 0.99, 1.0],
                                                                          "eager": [1.03, 1.05, 1.04, 1.06, 1.03]}}),
        dict(ok, case="c", contender=hand),
        dict(ok, case="d", contender="te_cudnn", fwd_bwd_adjacent={hand: {"graph": [1.005] * 4, "eager": [1.0] * 4}}),
        dict(ok, case="d", contender=hand),
    ]}  # fmt: skip
    text = report.to_markdown(results)
    assert ("- te_cudnn / hand-built graph (results allocated once), CUDA-graph replay, adjacent samples (a, b, b, a): "
            "at most 1.005× (d) over 2 cases (target ≤ 1.02: met)") in text
    assert "eager back-to-back, adjacent samples (a, b, b, a): at most 1.040× (c) over 2 cases (target ≤ 1.02: missed on c)" in text
    assert "  - c: 1.040× over 5 quads, 95% interval [1.030, 1.060]; above 1.02 beyond the interval" in text
    lines = text.splitlines()
    plain = lines.index(next(line for line in lines if line.startswith("- te_cudnn / hand-built graph (results allocated "
                                                                       "once), CUDA-graph replay: at most")))
    assert "adjacent samples" in lines[plain + 1]  # right after the ratio of medians it complements
    assert "allocated per call), CUDA-graph replay, adjacent" not in text  # no adjacent samples against that variant


def test_host_autotuned_plan_not_measured_says_why(results: dict) -> None:
    results = copy.deepcopy(results)
    results["host"]["tuned"] = {"error": "the host problem's plan was not tuned: no tuning record"}
    md = report.to_markdown(results)
    assert "- host time, autotuned plan: not measured (the host problem's plan was not tuned: no tuning record)" in md
    assert "- autotuned plan not timed: the host problem's plan was not tuned: no tuning record" in md
    del results["host"]["tuned"]
    md = report.to_markdown(results)
    assert "autotuned plan" not in md.split("## Host time per cached call")[1].split("##")[0]


@pytest.mark.parametrize("script", sorted(p.stem for p in (REPO / "tools").glob("*.py")))
def test_every_tools_script_imports_without_a_gpu(script: str) -> None:
    """The tools run on a GPU machine only; importing each one here (as ``python tools/x.py``
    would, with ``tools/`` on the path) catches a broken import or a name error at module level
    before a GPU run is spent on it. Each one says what it measures."""
    import importlib

    sys.path.insert(0, str(REPO / "tools"))
    try:
        module = importlib.import_module(script)
    finally:
        sys.path.remove(str(REPO / "tools"))
    assert module.__doc__ and module.__doc__.strip(), f"tools/{script}.py has no docstring"


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


def test_median_interval_holds_for_thousands_of_values():
    """Exact in integers: lockstep decode pairs over a thousand steps (the binomial terms of a
    float computation overflow from 1032 values)."""
    import random

    for n in (1143, 5000):
        values = [float(i) for i in range(n)]
        random.Random(n).shuffle(values)
        low, high = report.median_interval(values)
        assert low + high == n - 1  # symmetric order statistics
        assert 0.45 * n < low < 0.5 * n  # within about 2 standard deviations (sqrt(n) / 2 each) of the median


def test_front_doors_option_parses_all_or_no_hf() -> None:
    assert cli.build_parser().parse_args([]).front_doors is None
    assert cli.build_parser().parse_args(["--front-doors"]).front_doors == "all"
    assert cli.build_parser().parse_args(["--front-doors=no-hf"]).front_doors == "no-hf"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--front-doors=some"])


def test_front_doors_without_transformers_names_the_extra_and_no_hf(capsys, monkeypatch) -> None:
    monkeypatch.setattr(cli, "_has_transformers", lambda: False)
    assert cli.main(["--front-doors"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "te_cudnn[hf]" in err[0] and "--front-doors=no-hf" in err[0]
    if not torch.cuda.is_available():  # no-hf needs no transformers: the run goes on to the GPU check
        assert cli.main(["--front-doors=no-hf"]) == 1
        assert "needs a CUDA GPU" in capsys.readouterr().err
