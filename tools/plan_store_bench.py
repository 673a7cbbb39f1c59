"""Plan store timing, each case in a fresh process: the fwd+bwd plans of 8 shapes with an empty
store (built) and with a warm store (loaded); per-plan build vs load; the one-time cuDNN
initialisation neither path avoids.

Each case runs twice: "queued", the natural flow (each call finds the previous calls' GPU work
still queued), and "idle" (the GPU is synchronised, untimed, before each call). They differ for
a load: the frontend's deserialize ends with a warm-up capture and a cudaFree, which waits for
all queued GPU work, so a queued load also pays for the caller's earlier kernels.

    python tools/plan_store_bench.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SEQLENS = [256, 384, 512, 640, 768, 1024, 1536, 2048]

CHILD = r"""
import json, sys, time
idle = sys.argv[1] == "idle"
t_start = time.perf_counter()
import torch
import te_cudnn as tc
from te_cudnn.plans import handle_for
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t_ready = time.perf_counter()
handle_for(0)  # cuDNN library and handle: part of the one-time initialisation
t_handle = time.perf_counter()
per_plan = []
for s in SEQLENS:
    q, k, v = (torch.randn(2, s, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, 3 * s, s, dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    if idle:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    t1 = time.perf_counter()
    if idle:
        torch.cuda.synchronize()
        t1 = time.perf_counter()  # the forward's kernels are not the backward's cost
    tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, out, q.dtype, aux, None, **kw)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    per_plan += [t1 - t0, t2 - t1]
t_end = time.perf_counter()
s = tc.plan_cache.stats()
print(json.dumps({"startup_s": t_ready - t_start, "handle_s": t_handle - t_ready, "plans_s": t_end - t_handle,
                  "first_call_to_ready_s": t_end - t_ready, "per_plan_s": per_plan, "builds": s.builds, "loads": s.loads,
                  "plan_ms": [p["build_ms"] for p in tc.plan_cache.snapshot()],
                  "stages_ms": [p["stages_ms"] for p in tc.plan_cache.snapshot()],
                  "dirs": [p["key"]["direction"] for p in tc.plan_cache.snapshot()]}))
""".replace("SEQLENS", repr(SEQLENS))


def child(store: str, mode: str) -> dict:
    env = dict(os.environ, TE_CUDNN_PLAN_STORE=store)
    out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_ms(r: dict, direction: str | None = None) -> float:
    """Median plan-cache time (build or load) of the plans after the process's first."""
    return statistics.median(ms for ms, d in zip(r["plan_ms"][1:], r["dirs"][1:]) if direction in (None, d))


def report(mode: str, cold: dict, warm: dict, warm2: dict) -> dict:
    print(f"--- {mode}")
    for name, r in (("cold", cold), ("warm", warm), ("warm_again", warm2)):
        rest = r["per_plan_s"][1:]
        print(f"{name:10} first call -> 16 plans ready {r['first_call_to_ready_s']:.3f} s (cuDNN handle {r['handle_s']:.3f} s, "
              f"first plan {r['per_plan_s'][0] * 1e3:.0f} ms, median of the other 15 {statistics.median(rest) * 1e3:.1f} ms); "
              f"builds {r['builds']}, loads {r['loads']}")  # fmt: skip
    for name, r in (("build", cold), ("load", warm)):
        rest = r["stages_ms"][1:]
        stages = {k: statistics.median(st.get(k, 0.0) for st in rest) for k in rest[0]}
        print(f"    {name} stages, median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    ratios = {}
    for direction in ("fwd", "bwd", None):
        b, w = _median_ms(cold, direction), _median_ms(warm, direction)
        ratios[direction or "all"] = b / w
        print(f"    {direction or 'all'} plans: build {b:.1f} ms vs load {w:.2f} ms -> {b / w:.1f}x")
    speedup = cold["first_call_to_ready_s"] / warm["first_call_to_ready_s"]
    init = warm["handle_s"] + warm["per_plan_s"][0] - statistics.median(warm["per_plan_s"][1:])
    print(f"(a) first call until 8 shapes' fwd+bwd plans are ready: empty store {cold['first_call_to_ready_s']:.3f} s, "
          f"warm store {warm['first_call_to_ready_s']:.3f} s -> {speedup:.1f}x")  # fmt: skip
    print(f"(b) per plan after the first (inside the plan cache: build = graph..build_plans, load = read + "
          f"deserialize): build {_median_ms(cold):.1f} ms vs load {_median_ms(warm):.2f} ms -> {ratios['all']:.1f}x; "
          f"whole call incl. first-sight validation and execution: {statistics.median(cold['per_plan_s'][1:]) * 1e3:.1f} vs "
          f"{statistics.median(warm['per_plan_s'][1:]) * 1e3:.1f} ms")  # fmt: skip
    print(f"(c) one-time cuDNN initialisation inside (a): ~{init:.3f} s of the warm {warm['first_call_to_ready_s']:.3f} s "
          f"(handle {warm['handle_s']:.3f} s + first plan's excess)")  # fmt: skip
    return {"a_speedup": speedup, "b_ratio": ratios, "c_init_s": init}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    res = {}
    for mode in ("queued", "idle"):
        with tempfile.TemporaryDirectory() as store:
            runs = [child(store, mode) for _ in range(3)]  # empty store, then warm twice
        res[mode] = {"cold": runs[0], "warm": runs[1], "warm_again": runs[2], "summary": report(mode, *runs)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
