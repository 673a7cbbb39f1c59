"""Why do the torch SDPA contenders' captured runs keep reserved memory that ``empty_cache``
cannot return? Runs one benchmark case for one contender under several variants (each mode
alone, CUDA graphs on or off) in fresh subprocesses, and after the case and ``free_memory()``
records: reserved / allocated MiB, the live CUDAGraph objects, and every segment still reserved
(pool id, size, bytes allocated in it, and the Python stack that allocated each live block,
from ``torch.cuda.memory._record_memory_history``).

    python tools/probe_sdpa_pools.py --out DIR [--case test_3] [--contender sdpa_cudnn]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

import torch


def _frames(block: dict, n: int = 8) -> list[str]:
    out = []
    for f in block.get("frames", []) or []:
        name = f.get("filename", "")
        if "torch/cuda/memory" in name or name.endswith("probe_sdpa_pools.py"):
            continue
        out.append(f"{os.path.basename(name)}:{f.get('line')} {f.get('name')}")
    return out[:n]


def one(case_name: str, contender_key: str, modes: str, graphs: bool) -> dict:
    from te_cudnn.benchmark.cases import case_by_name
    from te_cudnn.benchmark.contenders import select_contenders
    from te_cudnn.benchmark.measure import free_memory
    from te_cudnn.benchmark.runner import Settings, run_case

    torch.cuda.memory._record_memory_history(max_entries=200000)
    case = case_by_name(case_name)
    contenders = select_contenders(contender_key)
    settings = Settings.for_run(quick=True, graphs=graphs)
    import time

    if modes != "all":  # time only these modes: wrap run_case's mode list
        from te_cudnn.benchmark import runner

        real = runner._time_mode

        def only(mode, runs, rows, s):
            return real(mode, runs, rows, s) if mode in modes.split(",") else None

        runner._time_mode = only
    mode_env = os.environ.get("PROBE_CAPTURE_MODE")
    if mode_env:  # capture with this cudaStreamCaptureMode (global, thread_local, relaxed)
        real_graph = torch.cuda.graph

        class graph(real_graph):
            def __init__(self, g, *args, **kw):
                kw["capture_error_mode"] = mode_env
                super().__init__(g, *args, **kw)

        torch.cuda.graph = graph
        del _r
    rows = run_case(case, contenders, settings, time.monotonic() + 600, print)
    free_memory()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    graphs_alive = sum(isinstance(o, torch.cuda.CUDAGraph) for o in gc.get_objects())
    snap = torch.cuda.memory._snapshot()
    segs = []
    for s in snap["segments"]:
        live = [b for b in s["blocks"] if b["state"] == "active_allocated"]
        segs.append(dict(pool=str(s.get("segment_pool_id")), total_mib=round(s["total_size"] / 2**20, 2),
                         allocated_mib=round(s["allocated_size"] / 2**20, 3), stream=s.get("stream"),
                         live=[dict(size=b["size"], frames=_frames(b)) for b in live][:6]))  # fmt: skip
    segs.sort(key=lambda s: -s["total_mib"])
    return dict(case=case_name, contender=contender_key, modes=modes, graphs=graphs,
                reserved_mib=round(torch.cuda.memory_reserved() / 2**20, 1),
                allocated_mib=round(torch.cuda.memory_allocated() / 2**20, 1), graphs_alive=graphs_alive,
                rows=[{k: r.get(k) for k in ("contender", "status", "reason", "notes", "errors")} for r in rows],
                segments=segs[:40])  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--case", default="test_3")
    p.add_argument("--contender", default="sdpa_cudnn")
    p.add_argument("--child", nargs=2, metavar=("MODES", "GRAPHS"))
    a = p.parse_args()
    if a.child:
        res = one(a.case, a.contender, a.child[0], a.child[1] == "1")
        print("RESULT " + json.dumps(res))
        return 0
    os.makedirs(a.out, exist_ok=True)
    results = []
    variants = os.environ.get("PROBE_VARIANTS", "all:1,all:0,fwd:1,bwd:1,fwd_bwd:1")
    for modes, g in (v.split(":") for v in variants.split(",")):
        proc = subprocess.run([sys.executable, __file__, "--out", a.out, "--case", a.case, "--contender", a.contender,
                               "--child", modes, g], capture_output=True, text=True)  # fmt: skip
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if line:
            r = json.loads(line[-1][7:])
        else:
            r = dict(modes=modes, graphs=g, error=proc.stderr[-3000:])
        if os.environ.get("PROBE_STDERR"):
            print("\n".join(x for x in proc.stderr.splitlines() if "warn" not in x.lower())[-2500:])
        results.append(r)
        print(f"{a.case} {a.contender} modes={modes} graphs={g}: reserved {r.get('reserved_mib')} MiB, allocated "
              f"{r.get('allocated_mib')} MiB, CUDAGraphs alive {r.get('graphs_alive')}", flush=True)  # fmt: skip
        for s in r.get("segments", [])[:6]:
            print(f"   seg pool={s['pool']} {s['total_mib']} MiB alloc {s['allocated_mib']} MiB live="
                  f"{[(b['size'], b['frames'][:4]) for b in s['live'][:3]]}")  # fmt: skip
    with open(os.path.join(a.out, f"sdpa_pools_{a.case}_{a.contender}.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
