"""CPU checks of examples/train_gpt.py: ``--help``, a tiny SDPA training run (loss falls, PNG and
JSON written), and the clear exit 2 when te_cudnn is asked for without CUDA; examples/decode_paged.py:
``--help`` and its exit 2 without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_gpt.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # One intra-op thread: the tiny model is ~100x slower when torch's thread pool competes for a busy CPU.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_help() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "--mode" in proc.stdout and "--attn" in proc.stdout


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
@pytest.mark.parametrize("extra", [("--attn", "te_cudnn"), ("--device", "cpu", "--attn", "te_cudnn")])
def test_te_cudnn_needs_cuda(extra: tuple[str, ...], tmp_path: Path) -> None:
    proc = _run(*extra, "--steps", "5", "--png", str(tmp_path / "x.png"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "CUDA" in proc.stderr and "--device cpu --attn sdpa --mode eager" in proc.stderr
    assert not (tmp_path / "x.png").exists()


DECODE = ROOT / "examples" / "decode_paged.py"


def test_decode_example_help() -> None:
    proc = subprocess.run([sys.executable, str(DECODE), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--page-size" in proc.stdout and "continuous-batching" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_decode_example_needs_cuda() -> None:
    proc = subprocess.run([sys.executable, str(DECODE), "--steps", "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr
