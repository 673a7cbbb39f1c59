"""Context parallelism on two GPUs over NCCL: runs ``tests/cp_two_gpu.py`` under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (torchrun --nproc-per-node 2)")
def test_context_parallel_two_gpus(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "cp_two_gpu.py")
    report = tmp_path / "cp_two_gpu.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           script, "--json", str(report)], capture_output=True, text=True, timeout=1200)  # fmt: skip
    print(proc.stdout[-6000:])
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert report.exists() and proc.stdout.count("PASS") == 23
