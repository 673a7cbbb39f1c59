"""Plan store timing, each case in a fresh process: the fwd+bwd plans of 8 shapes with an empty
store (built) and with a warm store (loaded); per-plan build vs load; the one-time cuDNN
initialisation neither path avoids.

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
    t0 = time.perf_counter()
    out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    t1 = time.perf_counter()
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


def child(store: str) -> dict:
    env = dict(os.environ, TE_CUDNN_PLAN_STORE=store)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as store:
        cold = child(store)
        warm = child(store)
        warm2 = child(store)
    res = {"cold": cold, "warm": warm, "warm_again": warm2}
    for name, r in res.items():
        rest = r["per_plan_s"][1:]
        print(f"{name:10} first call -> 16 plans ready {r['first_call_to_ready_s']:.3f} s (cuDNN handle {r['handle_s']:.3f} s, "
              f"first plan {r['per_plan_s'][0] * 1e3:.0f} ms, median of the other 15 {statistics.median(rest) * 1e3:.1f} ms); "
              f"builds {r['builds']}, loads {r['loads']}")  # fmt: skip
    speedup = cold["first_call_to_ready_s"] / warm["first_call_to_ready_s"]
    build_ms, load_ms = statistics.median(cold["plan_ms"][1:]), statistics.median(warm["plan_ms"][1:])
    per = build_ms / load_ms
    for name, r in (("build", cold), ("load", warm)):
        rest = r["stages_ms"][1:]
        stages = {k: statistics.median(st.get(k, 0.0) for st in rest) for k in rest[0]}
        print(f"    {name} stages, median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    for direction in ("fwd", "bwd"):
        b = [ms for ms, d in zip(cold["plan_ms"][1:], cold["dirs"][1:]) if d == direction]
        w = [ms for ms, d in zip(warm["plan_ms"][1:], warm["dirs"][1:]) if d == direction]
        print(f"    {direction} plans: build {statistics.median(b):.1f} ms vs load {statistics.median(w):.2f} ms "
              f"-> {statistics.median(b) / statistics.median(w):.1f}x")  # fmt: skip
    init = warm["handle_s"] + warm["per_plan_s"][0] - statistics.median(warm["per_plan_s"][1:])
    print(f"(a) first call until 8 shapes' fwd+bwd plans are ready: empty store {cold['first_call_to_ready_s']:.3f} s, "
          f"warm store {warm['first_call_to_ready_s']:.3f} s -> {speedup:.1f}x")  # fmt: skip
    print(f"(b) per plan after the first (inside the plan cache: build = validate..build_plans, load = read + "
          f"deserialize): build {build_ms:.1f} ms vs load {load_ms:.2f} ms -> {per:.1f}x; whole call incl. first-sight "
          f"validation and execution: {statistics.median(cold['per_plan_s'][1:]) * 1e3:.1f} vs "
          f"{statistics.median(warm['per_plan_s'][1:]) * 1e3:.1f} ms")  # fmt: skip
    print(f"(c) one-time cuDNN initialisation inside (a): ~{init:.3f} s of the warm {warm['first_call_to_ready_s']:.3f} s "
          f"(handle {warm['handle_s']:.3f} s + first plan's excess)")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
