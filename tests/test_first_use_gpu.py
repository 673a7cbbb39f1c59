"""First use on a GPU machine: the demo is quiet, the README's GPU snippet runs,
and the shipped warm-up file builds its plans. GPU only."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "warm_configs.json"


def _python(*argv: str, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **env})  # fmt: skip


def test_demo_prints_versions_and_no_warnings() -> None:
    """No cuBLAS "no current CUDA context" warning (the reference backward runs on the calling
    thread), no requires_grad scalar warning, no NumPy warning."""
    # numpy is a dependency; a machine that runs the suite from a checkout without it gets torch's
    # own import warning, which is not what this test is about
    quiet_numpy = {} if importlib.util.find_spec("numpy") else {"PYTHONWARNINGS": "ignore:Failed to initialize NumPy"}
    proc = _python("-m", "te_cudnn.demo", "--configs", "test_0,test_1", "--iters", "2", **quiet_numpy)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("te_cudnn demo: te_cudnn ") and "CUDA " in first and "GPU " in first, first
    assert "no GPU" not in first
    assert "Warning" not in proc.stderr and "cuBLAS" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


def test_readme_gpu_snippet_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (code,) = [b for b in blocks if b.startswith("# needs a GPU\n")]
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)  # noqa: S102 - the README's own code
    b, s, h, d = ns["b"], ns["s"], ns["h"], ns["d"]
    assert ns["out"].shape == (b, s, h, d) and ns["dq"].shape == (b, s, h, d)
    assert all(torch.isfinite(ns[n].float()).all() for n in ("out", "dq", "dk", "dv"))


def test_warm_builds_the_example_configurations(tmp_path: Path) -> None:
    """`plans warm examples/warm_configs.json` in a fresh process and store: every
    configuration warms (6 training configurations x fwd+bwd + 2 inference forwards = 14
    plans), all built (the store was empty) and all stored."""
    configs = json.loads(EXAMPLES.read_text())
    expected = sum(2 if c.get("training", True) else 1 for c in configs)
    assert expected == 14
    store = tmp_path / "store"
    proc = _python("-m", "te_cudnn.cli", "plans", "warm", str(EXAMPLES), "--store", str(store), "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    assert stats["builds"] == expected and stats["loads"] == 0, stats
    listed = _python("-m", "te_cudnn.cli", "plans", "stats", "--store", str(store), "--json", timeout=120)
    assert listed.returncode == 0, listed.stderr
    totals = json.loads(listed.stdout)
    assert totals["plans"] == expected and totals["unreadable"] == 0 and totals["store"] == str(store)
    # a second process loads them all instead of building
    again = _python("-m", "te_cudnn.cli", "plans", "warm", str(EXAMPLES), "--store", str(store), "--json")
    assert again.returncode == 0, again.stderr
    stats = json.loads(again.stdout)
    assert stats["loads"] == expected and stats["builds"] == 0, stats
