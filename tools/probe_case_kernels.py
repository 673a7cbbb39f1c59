"""Which kernels each contender launches for one benchmark case, and for how long.

Where two contenders run the same cuDNN engines and still differ (test_0: te_cudnn and the
hand-built graph 1.009x and 1.016x torch SDPA cuDNN in a 2026-11-26 H200 run, fwd+bwd in
CUDA-graph replay), the kernel list says whether the difference is in the kernels (another
engine or an extra kernel) or between them. For each contender: ``iters`` calls of the mode
under ``torch.profiler`` (after a warm-up), then per kernel name the launches per call and the
mean device microseconds; the sum of kernel time per call; and the CUDA-graph replay time of
the mode in interleaved rounds (median of ``rounds``).

    python tools/probe_case_kernels.py --case test_0 --contenders te_cudnn,hand_built,sdpa_cudnn [--mode fwd_bwd]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import torch

from te_cudnn.benchmark.cases import case_by_name
from te_cudnn.benchmark.contenders import select_contenders
from te_cudnn.benchmark.inputs import make_inputs
from te_cudnn.benchmark.measure import capture, event_ms
from te_cudnn.plans.order import order_rng, round_order


def kernels(fn, iters: int) -> tuple[dict, float]:
    """``{kernel name: (launches per call, mean us)}`` and the kernel microseconds per call."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    acc: dict = collections.defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            acc[ev.name].append(ev.device_time_total)
    table = {name: (len(t) / iters, statistics.mean(t)) for name, t in acc.items()}
    return table, sum(n * us for n, us in table.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", default="test_0")
    p.add_argument("--contenders", default="te_cudnn,hand_built,sdpa_cudnn")
    p.add_argument("--mode", default="fwd_bwd", choices=("fwd", "bwd", "fwd_bwd"))
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    case = case_by_name(a.case)
    inputs = make_inputs(case)
    runs = {}
    for c in select_contenders(a.contenders):
        why = c.supports(case)
        if why:
            print(f"{c.name}: skipped ({why})")
            continue
        run = c.prepare(case, inputs)
        state = run.before(a.mode)
        fn = run.call(a.mode, state)
        for _ in range(5):
            fn()
        runs[c.name] = (run, fn)
    report: dict = {"case": a.case, "mode": a.mode, "gpu": torch.cuda.get_device_name(), "contenders": {}}
    for name, (_, fn) in runs.items():
        table, busy = kernels(fn, a.iters)
        report["contenders"][name] = {"kernels": table, "kernel_us_per_call": busy}
        print(f"\n== {name}: {busy:.2f} us of kernels per call")
        for k, (n, us) in sorted(table.items(), key=lambda kv: -kv[1][0] * kv[1][1]):
            print(f"   {n:5.2f} x {us:8.2f} us  {k[:110]}")
    replays, keep = {}, []
    for name, (run, _) in runs.items():
        try:
            g, state = capture(lambda st, run=run: run.call(a.mode, st), 20, setup=lambda run=run: run.before(a.mode))
            keep.append(state)
            replays[name] = g
        except Exception as exc:  # noqa: BLE001 - reported, not timed
            print(f"{name}: no CUDA graph ({type(exc).__name__}: {exc})")
    samples: dict = {n: [] for n in replays}
    rng = order_rng(0)
    for _ in range(a.rounds):
        for name in round_order(list(replays), rng):
            samples[name].append(event_ms(replays[name].replay, reps=5, lead=2) / 20 * 1e3)
    print("\nCUDA-graph replay, us per call (median of rounds, random order each round):")
    for name, s in samples.items():
        med = statistics.median(s)
        report["contenders"][name]["replay_us"] = med
        print(f"   {name:40s} {med:8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
