"""CPU checks of the examples: each says in one line what it needs and exits with code 2 when it
is missing, without a traceback. examples/train_gpt.py: ``--help``, a tiny SDPA training run (loss
falls, PNG and JSON written where asked, nothing written into the source tree by default, from any
directory); examples/decode_paged.py and examples/context_parallel.py: ``--help`` and the exit 2
without CUDA (or torchrun)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

requires_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_gpt.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(*args: str, timeout: float = 120, script: Path = SCRIPT, cwd: Path = ROOT,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # One intra-op thread: the tiny model is ~100x slower when torch's thread pool competes for a busy CPU.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", **(env or {})}
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], *needed: str) -> str:
    """The process said what it needs in one line on stderr, exited with code 2, printed nothing else."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stdout + proc.stderr
    for text in needed:
        assert text in proc.stderr, (text, proc.stderr)
    return proc.stderr


@pytest.mark.slow
def test_help() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "--mode" in proc.stdout and "--attn" in proc.stdout


@pytest.mark.slow
def test_cpu_smoke_run(tmp_path: Path) -> None:
    png, out = tmp_path / "loss.png", tmp_path / "numbers.json"
    proc = _run("--device", "cpu", "--attn", "sdpa", "--mode", "eager", "--steps", "30", "--layers", "2",
                "--width", "64", "--heads", "4", "--seq", "64", "--batch", "4", "--png", str(png),
                "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "final loss" in proc.stdout
    numbers = json.loads(out.read_text())
    assert {"config", "device", "ln_vocab", "entropy_floor", "results", "failed", "comparison"} <= numbers.keys()
    assert numbers["failed"] == [] and numbers["comparison"] == {}  # one implementation: nothing to compare
    (result,) = numbers["results"]
    assert {"attn", "mode", "median_step_ms", "tokens_per_s", "final_loss_mean", "losses", "step_ms"} <= result.keys()
    assert (result["attn"], result["mode"]) == ("sdpa", "eager")
    losses = result["losses"]
    assert len(losses) == 30
    assert sum(losses[:10]) / 10 > sum(losses[-10:]) / 10, losses
    assert result["median_step_ms"] > 0 and result["tokens_per_s"] > 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in proc.stdout
    else:
        assert png.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_cpu_run_from_another_directory_writes_nothing_into_the_tree(tmp_path: Path) -> None:
    """Started elsewhere, without --png: the plot goes to a new temporary directory, never over
    the tracked examples/train_gpt_loss.png."""
    tracked = ROOT / "examples" / "train_gpt_loss.png"
    before = tracked.read_bytes() if tracked.exists() else None
    work = tmp_path / "elsewhere"
    work.mkdir()
    proc = _run("--device", "cpu", "--attn", "sdpa", "--mode", "eager", "--steps", "8", "--layers", "1", "--width",
                "32", "--heads", "2", "--seq", "16", "--batch", "2", "--timing-warmup", "2", cwd=work)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "final loss" in proc.stdout
    assert (tracked.read_bytes() if tracked.exists() else None) == before
    assert list(work.iterdir()) == []
    written = [line.removeprefix("loss curves written to ") for line in proc.stdout.splitlines()
               if line.startswith("loss curves written to ")]  # fmt: skip
    if written:  # matplotlib installed
        (png,) = written
        assert Path(png).parent.name.startswith("train_gpt-") and Path(png).read_bytes()[:8] == PNG_MAGIC
        assert ROOT not in Path(png).resolve().parents
        Path(png).unlink()
        Path(png).parent.rmdir()
    else:
        assert "matplotlib is not installed" in proc.stdout


def test_train_docstring_points_to_pages_that_exist() -> None:
    text = SCRIPT.read_text()
    assert 'README, "examples"' not in text
    for page in ("docs/performance.md", "docs/guide/pytorch.md"):
        if page in text:
            assert (ROOT / page).exists(), page


@pytest.mark.slow
@requires_no_cuda
@pytest.mark.parametrize("extra", [("--attn", "te_cudnn"), ()])
def test_te_cudnn_needs_cuda(extra: tuple[str, ...], tmp_path: Path) -> None:
    proc = _run(*extra, "--steps", "5", "--png", str(tmp_path / "x.png"), cwd=tmp_path)
    _one_line_exit_2(proc, "train_gpt.py needs a CUDA GPU", "--device cpu --attn sdpa --mode eager")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [("--device", "cpu", "--attn", "te_cudnn"), ("--device", "cpu", "--mode", "graph")])
def test_cpu_runs_only_the_smoke_configuration(extra: tuple[str, ...], tmp_path: Path) -> None:
    proc = _run(*extra, "--steps", "5", "--png", str(tmp_path / "x.png"))
    _one_line_exit_2(proc, "train_gpt.py needs a CUDA GPU", "--device cpu --attn sdpa --mode eager")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow
def test_missing_output_directory_is_a_usage_error(tmp_path: Path) -> None:
    """Checked before any training, not when the numbers are written."""
    proc = _run("--device", "cpu", "--attn", "sdpa", "--mode", "eager", "--json", str(tmp_path / "no" / "x.json"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"--json {tmp_path / 'no' / 'x.json'}: directory {tmp_path / 'no'} does not exist" in proc.stderr


DECODE = ROOT / "examples" / "decode_paged.py"


@pytest.mark.slow
def test_decode_example_help() -> None:
    proc = subprocess.run([sys.executable, str(DECODE), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--page-size" in proc.stdout and "continuous-batching" in proc.stdout


@pytest.mark.slow
@requires_no_cuda
def test_decode_example_needs_cuda(tmp_path: Path) -> None:
    proc = _run("--steps", "2", script=DECODE, cwd=tmp_path)
    _one_line_exit_2(proc, "decode_paged.py needs a CUDA GPU")


CP = ROOT / "examples" / "context_parallel.py"
TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_context_parallel_needs_torchrun(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    proc = subprocess.run([sys.executable, str(CP), "--seqlens", "1024"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip
    _one_line_exit_2(proc, "context_parallel.py needs torchrun", "RANK", "--alone 2")


@pytest.mark.slow
@requires_no_cuda
@pytest.mark.parametrize("how", ["torchrun", "alone"])
def test_context_parallel_needs_cuda(how: str, tmp_path: Path) -> None:
    extra, env = (["--alone", "2"], {}) if how == "alone" else ([], TORCHRUN_ENV)
    proc = _run("--seqlens", "1024", *extra, script=CP, cwd=tmp_path, env=env)
    _one_line_exit_2(proc, "context_parallel.py needs a CUDA GPU")
    assert list(tmp_path.iterdir()) == []
