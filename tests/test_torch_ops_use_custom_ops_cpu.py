"""When the public entry points take the custom-op path: ``use_custom_ops`` in eager mode and while
compiling, ``TE_CUDNN_CUSTOM_OPS`` read at import (in fresh processes), a first compile in a fresh
process, and the capture probe on CPU-only torch; CPU only."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from te_cudnn import torch_ops
from te_cudnn.torch_ops import use_custom_ops


def test_capture_probe_is_false_without_cuda() -> None:
    """CPU-only torch defines the capture probe as a stub that raises; te_cudnn replaces it."""
    from te_cudnn import ops

    if not torch.cuda.is_available():
        assert ops._is_capturing() is False


# ================================================================================ use_custom_ops


_FRESH_COMPILE = """
import torch, te_cudnn
counts = []
def backend(gm, example_inputs):
    counts.append("torch.ops.te_cudnn.fwd" in gm.code)
    return gm.forward
def f(q):
    return te_cudnn.fused_attention(q, q, q, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
compiled = torch.compile(f, backend=backend, fullgraph=True, dynamic=True)
for b, s in ((2, 16), (3, 24), (4, 40)):
    out = compiled(torch.randn(b, s, 4, 64, dtype=torch.bfloat16, device="meta"))
    assert tuple(out.shape) == (b, s, 4, 64)
print("RESULT", sum(counts))
"""

#: Subprocesses: TE_CUDNN_CUSTOM_OPS is read at import, and the fresh-process compile needs a
#: process where te_cudnn has not run yet. They start with the module's first test and run
#: alongside the others.
_PROBES = {
    "env=1": ("1", "from te_cudnn.torch_ops import use_custom_ops; print('RESULT', use_custom_ops())"),
    "env=on": ("on", "from te_cudnn.torch_ops import use_custom_ops; print('RESULT', use_custom_ops())"),
    "env=0": ("0", "from te_cudnn.torch_ops import use_custom_ops; print('RESULT', use_custom_ops())"),
    "fresh-compile": (None, _FRESH_COMPILE),
}


@pytest.fixture(scope="module", autouse=True)
def probes():
    procs = {}
    for name, (value, code) in _PROBES.items():
        env = {k: v for k, v in os.environ.items() if k != "TE_CUDNN_CUSTOM_OPS"}
        if value is not None:
            env["TE_CUDNN_CUSTOM_OPS"] = value
        procs[name] = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)  # fmt: skip
    results: dict = {}

    def result(name: str) -> str:
        if name not in results:
            stdout, stderr = procs[name].communicate(timeout=300)
            line = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
            last = [l for l in stderr.splitlines() if l.strip()][-1:]  # the exception, on failure
            results[name] = line[0].split(None, 1)[1] if line else f"exit {procs[name].returncode}: {last}"
        return results[name]

    yield result
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.communicate()


@pytest.mark.slow
def test_env_forces_custom_ops_in_eager(probes) -> None:
    assert probes("env=1") == "True"
    assert probes("env=on") == "True"


@pytest.mark.slow
def test_env_off_means_plain_eager(probes) -> None:
    assert probes("env=0") == "False"


@pytest.mark.slow
def test_compile_in_a_fresh_process(probes) -> None:
    """te_cudnn's first call in a process inside torch.compile (its lookup caches still empty):
    no failure, and one graph for three shapes (dynamic=True)."""
    result = probes("fresh-compile")
    assert result == "1", result  # "2": a lookup cache filled during the first trace made the next call recompile


def test_use_custom_ops_false_in_eager() -> None:
    assert torch_ops._FORCE_OPS is (os.environ.get("TE_CUDNN_CUSTOM_OPS", "0").lower() in ("1", "true", "yes", "on"))
    assert use_custom_ops() is torch_ops._FORCE_OPS


def test_use_custom_ops_true_while_compiling() -> None:
    seen: list = []

    def fn(x):
        seen.append(use_custom_ops())  # a side effect Dynamo replays after the graph runs
        return x + 1

    torch._dynamo.reset()
    y = torch.compile(fn, backend="eager")(torch.ones(3))
    assert seen == [True] and torch.equal(y, torch.full((3,), 2.0))
