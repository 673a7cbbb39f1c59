"""Context parallelism on two (and four) GPUs over NCCL: runs ``tests/cp_two_gpu.py`` under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu


def _torchrun(tmp_path, gpus: int) -> str:
    script = os.path.join(os.path.dirname(__file__), "cp_two_gpu.py")
    report = tmp_path / f"cp_{gpus}_gpu.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(gpus), script, "--json", str(report)], capture_output=True, text=True, timeout=1800)  # fmt: skip
    print(proc.stdout[-6000:])
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert report.exists()
    return proc.stdout


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (torchrun --nproc-per-node 2)")
def test_context_parallel_two_gpus(tmp_path):
    assert _torchrun(tmp_path, 2).count("PASS") == 23


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs four GPUs (torchrun --nproc-per-node 4)")
def test_context_parallel_four_gpus(tmp_path):
    """cp=4: the two-GPU cases at cp=4 (23 lines) and a2a+p2p on a 2 x 2 grid (8 lines: five
    cases, deterministic, sink with a window, module)."""
    assert _torchrun(tmp_path, 4).count("PASS") == 31
