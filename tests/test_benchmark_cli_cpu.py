"""The ``te-cudnn bench`` command line: help and ``--list`` without a GPU, its options, the private
plan store a run gets, the subcommand registration, ``tools/bench.py``'s old options, and every
``tools/*.py`` importing without a GPU; CPU only."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from te_cudnn.benchmark import cli
from te_cudnn.benchmark.runner import Settings


REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize(("script", "argv", "message"), [
    ("probe_decode_engines", ["--shapes", "1x"], "expected comma-separated BxL"),
    ("probe_decode_engines", ["--shapes", "0x600"], "expected comma-separated BxL"),
    ("probe_decode_engines", ["--rounds", "0"], "must be >= 1, got 0"),
    ("probe_generate_spread", ["--turns", "x"], "expected a whole number, got 'x'"),
    ("probe_train_backward", ["--calls", "0"], "must be >= 1, got 0"),
    ("probe_switched_steps", ["--batch", "0"], "must be >= 1, got 0"),
])  # fmt: skip
def test_probe_options_refuse_bad_values_with_a_message(script, argv, message, capsys) -> None:
    """A mistyped option ends in argparse's usage error naming the option, not a traceback on
    the GPU machine."""
    import importlib

    sys.path.insert(0, str(REPO / "tools"))
    try:
        module = importlib.import_module(script)
    finally:
        sys.path.remove(str(REPO / "tools"))
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and argv[0] in err


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
