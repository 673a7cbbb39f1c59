"""A plan written to the store by one process is loaded by another: no build, same results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = r"""
import json, sys, torch
import te_cudnn as tc
g = torch.Generator(device="cuda").manual_seed(11)
q, k, v = (torch.randn(2, 256, 4, 64, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
cu = torch.arange(0, 3 * 256, 256, dtype=torch.int32, device="cuda")
kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
out, aux = tc.fused_attn_fwd(True, 256, 256, cu, cu, q, k, v, q.dtype, None, **kw)
dq, dk, dv, _ = tc.fused_attn_bwd(256, 256, cu, cu, q, k, v, out, out, q.dtype, aux, None, **kw)
torch.save({"out": out.cpu(), "lse": aux[0].cpu(), "dq": dq.cpu(), "dk": dk.cpu(), "dv": dv.cpu()}, sys.argv[1])
s = tc.plan_cache.stats()
print(json.dumps({"builds": s.builds, "loads": s.loads, "sources": [p["source"] for p in tc.plan_cache.snapshot()]}))
"""


def _run(store, out_file):
    env = dict(os.environ, TE_CUDNN_PLAN_STORE=str(store))
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(out_file)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_plan_from_another_process_is_loaded_and_bit_identical(tmp_path):
    import torch

    first = _run(tmp_path / "store", tmp_path / "a.pt")
    assert (first["builds"], first["loads"]) == (2, 0)
    files = list((tmp_path / "store").glob("*/*.plan"))
    assert len(files) == 2
    second = _run(tmp_path / "store", tmp_path / "b.pt")
    assert (second["builds"], second["loads"]) == (0, 2) and second["sources"] == ["store", "store"]
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs between the built and the loaded plan"


def test_corrupted_store_file_is_rebuilt(tmp_path):
    _run(tmp_path / "store", tmp_path / "a.pt")
    for f in (tmp_path / "store").glob("*/*.plan"):
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])  # truncate every stored plan
    again = _run(tmp_path / "store", tmp_path / "b.pt")
    assert (again["builds"], again["loads"]) == (2, 0)
