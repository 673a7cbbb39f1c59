"""A plan written to the store by one process is loaded by another: no build, same results;
several processes warming one empty store at once leave every file whole and agree bit for bit."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

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
dq, dk, dv, _, _ = tc.fused_attn_bwd(256, 256, cu, cu, q, k, v, out, out, q.dtype, aux, None, **kw)
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


# ----------------------------------------------------------------------------- several processes, one store
SHAPES = [(2, 256, 4, 64, "causal"), (1, 512, 8, 128, "no_mask"), (2, 384, 4, 64, "no_mask")]  # b, s, h, d, mask

WARM = r"""
import json, os, sys, time, torch
import te_cudnn as tc
out_file, go_file, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
torch.zeros(1, device="cuda")  # the CUDA context is up before the start signal
open(out_file + ".ready", "w").close()
deadline = time.monotonic() + 300
while not os.path.exists(go_file):
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.001)
results = {}
for i, (b, s, h, d, mask) in enumerate(shapes):
    g = torch.Generator(device="cuda").manual_seed(100 + i)
    q, k, v, d_o = (torch.randn(b, s, h, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4))
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type=mask)
    out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    dq, dk, dv, _, _ = tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, q.dtype, aux, None, deterministic=True, **kw)
    results[i] = {"out": out.cpu(), "lse": aux[0].cpu(), "dq": dq.cpu(), "dk": dk.cpu(), "dv": dv.cpu()}
torch.save(results, out_file)
st = tc.plan_cache.stats()
print(json.dumps({"builds": st.builds, "loads": st.loads, "sources": [p["source"] for p in tc.plan_cache.snapshot()]}))
"""


def _start(store: Path, out_file: Path, go_file: Path) -> subprocess.Popen:
    env = dict(os.environ, TE_CUDNN_PLAN_STORE=str(store))
    return subprocess.Popen([sys.executable, "-c", WARM, str(out_file), str(go_file), json.dumps(SHAPES)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert not any(w in err for w in ("plan file", "plan store", "store a plan", "stored plan")), f"the store warned: {err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def _check_against_reference(results: dict) -> None:
    """Each shape's O and gradients within tolerance of the fp32 reference."""
    import torch

    from te_cudnn import QKVLayout
    from te_cudnn.reference import attention_reference
    from te_cudnn.testing import check_close, to_bhsd

    layout = QKVLayout.bshd_bshd_bshd
    for i, (b, s, h, d, mask) in enumerate(SHAPES):
        g = torch.Generator(device="cuda").manual_seed(100 + i)  # the children's inputs, drawn again
        q, k, v, d_o = (torch.randn(b, s, h, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4))
        refs = {}
        for compute in (torch.float32, torch.bfloat16):
            leaves = [to_bhsd(t, layout).detach().to(compute).requires_grad_() for t in (q, k, v)]
            ref = attention_reference(*leaves, attn_mask_type=mask, compute_dtype=compute)
            refs[compute] = (ref.out, *torch.autograd.grad(ref.out, leaves, to_bhsd(d_o, layout).to(compute)))
        got = results[i]
        for j, name in enumerate(("out", "dq", "dk", "dv")):
            check_close(f"shape {i} {name}", to_bhsd(got[name].cuda(), layout), refs[torch.float32][j],
                        refs[torch.bfloat16][j], torch.bfloat16)  # fmt: skip


def test_processes_warming_one_store_at_once(tmp_path):
    """4 processes start at once on one empty store and build (or load what another already
    stored) the same 6 plans; afterwards every file is whole and valid, all agree bit for bit
    and with the fp32 reference, and a 5th process loads all 6 plans without building any."""
    import torch

    from te_cudnn.plans.store import PlanStore

    n_proc, n_plans = 4, 2 * len(SHAPES)
    store, go = tmp_path / "store", tmp_path / "go"
    outs = [tmp_path / f"p{i}.pt" for i in range(n_proc)]
    procs = [_start(store, out, go) for out in outs]
    try:
        deadline = time.monotonic() + 300
        while not all(Path(f"{out}.ready").exists() for out in outs):
            assert all(p.poll() is None for p in procs), "a process exited before the start signal"
            assert time.monotonic() < deadline, "processes not ready within 300 s"
            time.sleep(0.01)
        go.touch()  # all processes are past their imports: they build at once
        stats = [_finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(s["builds"] + s["loads"] == n_plans for s in stats), stats
    assert sum(s["builds"] for s in stats) >= n_plans  # each plan was built by someone

    files = sorted(store.glob("*/*.plan"))
    assert len(files) == n_plans and len({f.parent for f in files}) == 1, files  # one file per plan, one fingerprint
    assert not [p for p in store.rglob("*") if p.name.startswith(".tmp-")], "temporary files left behind"
    for f in files:
        entry = PlanStore.read(f)  # whole and intact
        assert entry.header["key"]["backend"] == "F16_arbitrary_seqlen" and "device" not in entry.header["key"]
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.stat().st_mode) == 0o700 and stat.S_IMODE(files[0].parent.stat().st_mode) == 0o700

    results = [torch.load(out) for out in outs]
    for other in results[1:]:
        for i in results[0]:
            for name in results[0][i]:
                assert torch.equal(results[0][i][name], other[i][name]), f"shape {i} {name} differs between processes"
    _check_against_reference(results[0])

    fifth = tmp_path / "p5.pt"
    late = _start(store, fifth, go)  # go exists: it starts at once
    s5 = _finish(late)
    assert (s5["builds"], s5["loads"]) == (0, n_plans) and set(s5["sources"]) == {"store"}
    r5 = torch.load(fifth)
    assert all(torch.equal(r5[i][n], results[0][i][n]) for i in r5 for n in r5[i]), "loaded plans give other results"
    print(f"plan store: {n_proc} processes x {n_plans} plans at once into one empty store: builds per process "
          f"{[s['builds'] for s in stats]}, loads {[s['loads'] for s in stats]}; {len(files)} files, all valid; "
          f"a 5th process: {s5['loads']} loads, {s5['builds']} builds")  # fmt: skip
