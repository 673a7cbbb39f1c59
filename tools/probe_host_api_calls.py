"""Which CUDA API calls and kernels one cached call makes, te_cudnn against the yardstick.

The benchmark's host problem (b=1, h=1, s=64, d=64, bf16, bshd, no mask, forward) compares
te_cudnn's ``fused_attn_fwd`` with the bare ``graph.execute`` of a hand-built graph. Host time
per launch is mostly the CUDA runtime's and the driver's; a plan that issues one more API call
(a memset of its workspace, a second kernel) pays for it on every call. For each contender:
``iters`` calls under ``torch.profiler`` (CPU and CUDA activities, after a warm-up), then per
CUDA API call and per kernel the count per call and the mean host / device microseconds, and
the engine each graph runs.

    python tools/probe_host_api_calls.py [--iters 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json

import torch

import te_cudnn as tc
from te_cudnn.benchmark.handbuilt import HandGraphs

from host_problem import host_problem  # tools/ (on sys.path when run as a script)

#: profiler event names that are CUDA runtime / driver API calls (the host side of a launch)
_API_PREFIXES = ("cuda", "cu")


def profile_calls(fn, iters: int) -> dict:
    """``{"api": {name: [per call, mean host us]}, "kernels": {name: [per call, mean device us]},
    "ops": {name: [per call, mean host us]}}`` (ops: torch's operators and autograd nodes, on every thread)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    api: dict = collections.defaultdict(list)
    kern: dict = collections.defaultdict(list)
    ops: dict = collections.defaultdict(list)
    for ev in prof.events():
        name = ev.name
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kern[name].append(ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total)
        elif name.startswith(_API_PREFIXES):
            if name != "cudaDeviceSynchronize":
                api[name].append(ev.cpu_time_total)
        else:
            ops[name].append(ev.cpu_time_total)

    def table(d: dict) -> dict:
        return {n: [round(len(v) / iters, 3), round(sum(v) / len(v), 3)] for n, v in sorted(d.items())}

    return {"api": table(api), "kernels": table(kern), "ops": table(ops)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    hp = host_problem()
    s, q, k, v, cu, kw, plan = hp.s, hp.q, hp.k, hp.v, hp.cu, hp.kw, hp.plan
    o_pre, st_pre = torch.empty_like(hp.out), torch.empty_like(hp.stats)
    qb, kb, vb = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    hand_inf = HandGraphs(qb, kb, vb, training=False, causal=False)
    hand_st = HandGraphs(qb, kb, vb, training=True, causal=False, d_o=torch.randn_like(q).permute(0, 2, 1, 3))
    engines = {"te_cudnn": f"{plan.plan_name} (workspace {plan.workspace_size} B)"}
    for name, hg in (("hand-built, no stats", hand_inf), ("hand-built, with stats", hand_st)):
        try:
            engines[name] = f"{hg.gf.get_plan_name_at_index(0)} (workspace {hg.gf.get_workspace_size()} B)"
        except Exception as exc:  # noqa: BLE001 - informational
            engines[name] = f"unknown ({type(exc).__name__}: {exc})"
    fns = {
        "bare graph.execute(dict), no stats (benchmark yardstick)":
            lambda: hand_inf.gf.execute(hand_inf.fpack, hand_inf.workspace, handle=hand_inf.handle),
        "bare graph.execute(dict), with stats":
            lambda: hand_st.gf.execute(hand_st.fpack, hand_st.workspace, handle=hand_st.handle),
        "te_cudnn fused_attn_fwd": lambda: tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw),
        "te_cudnn fused_attn_fwd, out + softmax_lse given":
            lambda: tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, out=o_pre, softmax_lse=st_pre, **kw),
    }  # fmt: skip
    out = {"device": torch.cuda.get_device_name(), "engines": engines, "iters": a.iters, "calls": {}}
    for name, e in engines.items():
        print(f"engine {name}: {e}")
    for name, fn in fns.items():
        res = out["calls"][name] = profile_calls(fn, a.iters)
        print(f"\n{name}: per call, mean us")
        for kind in ("api", "kernels"):
            for n, (count, us) in res[kind].items():
                print(f"  {kind:7s} {count:6.2f} x {us:8.2f} us  {n[:110]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
