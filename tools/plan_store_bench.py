"""Plan store timing, each case in a fresh process: the fwd+bwd plans of 8 shapes with an empty
store (built) and with a warm store (loaded); per-plan build vs load; the one-time cuDNN
initialisation neither path avoids.

Host timings on shared cloud machines vary by 1.5x between processes, so the cold/warm pair runs
``--repeat`` times (each with its own empty store) and the summary gives every pair and the
medians over pairs.

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
                  "dirs": [p["key"]["direction"] for p in tc.plan_cache.snapshot()],
                  "keys": [json.dumps(p["key"], sort_keys=True) for p in tc.plan_cache.snapshot()]}))
""".replace("SEQLENS", repr(SEQLENS))


def child(store: str) -> dict:
    env = dict(os.environ, TE_CUDNN_PLAN_STORE=store)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_ms(r: dict, direction: str | None = None) -> float:
    """Median plan-cache time (build or load) of the plans after the process's first."""
    return statistics.median(ms for ms, d in zip(r["plan_ms"][1:], r["dirs"][1:]) if direction in (None, d))


def _by_key(r: dict) -> dict[str, tuple[str, float]]:
    """Plan key -> (direction, plan-cache ms), without the process's first plan."""
    return {k: (d, ms) for k, d, ms in list(zip(r["keys"], r["dirs"], r["plan_ms"]))[1:]}


def per_plan_ratios(colds: list[dict], warms: list[dict]) -> dict[str, float]:
    """The same plan built vs loaded: per key, the median build over ``colds`` / the median load
    over ``warms``; then the median over keys (all, and per direction)."""
    builds, loads = [_by_key(r) for r in colds], [_by_key(r) for r in warms]
    keys = set.intersection(*(set(x) for x in builds + loads))
    ratio = {k: statistics.median(b[k][1] for b in builds) / statistics.median(w[k][1] for w in loads) for k in keys}
    out = {"all": statistics.median(ratio.values())}
    for direction in ("fwd", "bwd"):
        out[direction] = statistics.median(v for k, v in ratio.items() if builds[0][k][0] == direction)
    return out


def report(label: str, cold: dict, warm: dict, warm2: dict) -> dict:
    print(f"--- {label}")
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
    same = per_plan_ratios([cold], [warm])
    print(f"    the same plan built vs loaded, median over plans: {same['all']:.1f}x (fwd {same['fwd']:.1f}x, "
          f"bwd {same['bwd']:.1f}x)")  # fmt: skip
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
    return {
        "a_speedup": speedup,
        "a_cold_s": cold["first_call_to_ready_s"],
        "a_warm_s": warm["first_call_to_ready_s"],
        "b_build_ms": _median_ms(cold),
        "b_load_ms": _median_ms(warm),
        "b_ratio": ratios,
        "b_same_plan": same,
        "c_init_s": init,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--repeat", type=int, default=3, help="cold/warm pairs, each with its own empty store")
    args = p.parse_args(argv)
    res = {}
    for i in range(1, args.repeat + 1):
        with tempfile.TemporaryDirectory() as store:
            runs = [child(store) for _ in range(3)]  # empty store, then warm twice
        res[f"pair{i}"] = {
            "cold": runs[0],
            "warm": runs[1],
            "warm_again": runs[2],
            "summary": report(f"pair {i}", *runs),
        }
    sums = [r["summary"] for r in res.values()]
    med = statistics.median

    def spread(values) -> str:
        values = list(values)
        return f"{med(values):.1f}x (pairs: {', '.join(f'{v:.1f}' for v in values)})"

    print(f"=== medians over {len(sums)} pairs")
    print(
        f"(a) {med(x['a_cold_s'] for x in sums):.3f} s empty store vs {med(x['a_warm_s'] for x in sums):.3f} s warm: "
        + spread(x["a_speedup"] for x in sums)
    )
    print(
        f"(b) build {med(x['b_build_ms'] for x in sums):.1f} ms vs load {med(x['b_load_ms'] for x in sums):.2f} ms: "
        + spread(x["b_ratio"]["all"] for x in sums)
        + f"; fwd {spread(x['b_ratio']['fwd'] for x in sums)}, "
        f"bwd {spread(x['b_ratio']['bwd'] for x in sums)}"
    )
    pooled = per_plan_ratios([r["cold"] for r in res.values()], [r["warm"] for r in res.values()])
    print(
        f"(b) the same plan built vs loaded: {spread(x['b_same_plan']['all'] for x in sums)}; fwd "
        f"{spread(x['b_same_plan']['fwd'] for x in sums)}, bwd {spread(x['b_same_plan']['bwd'] for x in sums)}; "
        f"per plan over all pairs (median build / median load, then median over plans): {pooled['all']:.1f}x "
        f"(fwd {pooled['fwd']:.1f}x, bwd {pooled['bwd']:.1f}x)"
    )
    print(f"(c) one-time cuDNN initialisation: {med(x['c_init_s'] for x in sums):.3f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
