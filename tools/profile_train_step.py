"""Where the host time of a compiled training step of ``examples/train_gpt.py`` goes, te_cudnn
against torch SDPA: median step time (CUDA events) and a cProfile of the steady state.

    python tools/profile_train_step.py [--mode compile] [--steps 60] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from te_cudnn.timing import EventSpan

HERE = os.path.dirname(os.path.abspath(__file__))


def _example():
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import train_gpt  # noqa: PLC0415 - the example's model, as a module Dynamo can import

    return train_gpt


def run(attn: str, mode: str, a: argparse.Namespace) -> None:
    ex = _example()
    args = ex.parse_args(["--batch", str(a.batch)])
    torch._dynamo.reset()
    model = ex.GPT(attn, args.vocab, args.seq, args.layers, args.width, args.heads, args.dropout)
    model.init_weights(args.seed, args.layers)
    model.cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3, device="cuda"), capturable=True)

    def loss_fn(x, y):
        with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
            logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    fwd = torch.compile(loss_fn, fullgraph=True) if mode == "compile" else loss_fn
    x = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    y = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()

    for _ in range(15):
        step()
    torch.cuda.synchronize()
    ms, host = [], []
    for _ in range(a.steps):
        span = EventSpan()
        t0 = time.perf_counter()
        span.begin()
        step()
        span.end()
        host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()  # isolate each step: host time and GPU time separately
        ms.append(span.ms())
    print(f"\n== {attn} {mode}: median step {statistics.median(ms):.2f} ms (events, synced per step), "
          f"host {statistics.median(host):.2f} ms")
    if a.profiler == "kernels":  # what the step launches: device kernels and runtime calls, per step
        from collections import Counter  # noqa: PLC0415

        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            for _ in range(a.steps):
                step()
        torch.cuda.synchronize()
        kernels, runtime, busy = Counter(), Counter(), Counter()
        for e in tp.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name[:90]] += 1
                busy[e.name[:90]] += e.time_range.elapsed_us()
            elif e.name.startswith(("cuda", "cu")) and "Launch" in e.name or e.name.startswith("cudaMemcpy"):
                runtime[e.name] += 1
        print(f"device kernels per step: {sum(kernels.values()) / a.steps:.1f}; runtime calls per step: "
              + ", ".join(f"{n} {c / a.steps:.1f}" for n, c in runtime.most_common()))
        print(f"device busy per step: {sum(busy.values()) / a.steps / 1e3:.3f} ms (sum of kernel durations)")
        print(f"  {'calls':>6s}  {'us/step':>9s}  kernel (by GPU time)")
        for name, us in busy.most_common(a.top):
            print(f"  {kernels[name] / a.steps:6.1f}  {us / a.steps:9.1f}  {name}")
        return
    if a.profiler == "torch":  # self-CPU time per op and region (C++ included), per step
        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

        with profile(activities=[ProfilerActivity.CPU]) as tp:
            for _ in range(a.steps):
                step()
        torch.cuda.synchronize()
        events = sorted(tp.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in events) / a.steps
        print(f"{'op / region (by self CPU)':70s} {'calls/step':>10s} {'self us':>9s} {'total us':>9s}   (all self: {total:.0f} us)")
        for e in events[: a.top]:
            print(f"{e.key[-70:]:70s} {e.count / a.steps:10.1f} {e.self_cpu_time_total / a.steps:9.1f} "
                  f"{e.cpu_time_total / a.steps:9.1f}")
        return
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        step()
    prof.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(prof)
    rows = sorted(((f"{f.split('site-packages/')[-1]}:{ln}:{fn}", nc, tt, ct)
                   for (f, ln, fn), (_c, nc, tt, ct, _) in st.stats.items()), key=lambda r: -r[2])
    print(f"{'function (by own time)':80s} {'calls/step':>10s} {'own us':>8s} {'cum us':>9s}")
    for name, nc, tt, ct in rows[: a.top]:
        print(f"{name[-80:]:80s} {nc / a.steps:10.1f} {tt / a.steps * 1e6:8.1f} {ct / a.steps * 1e6:9.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="compile", choices=("compile", "eager"))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--attn", default="te_cudnn,sdpa")
    p.add_argument("--profiler", default="cprofile", choices=("cprofile", "torch", "kernels"))
    a = p.parse_args(argv)
    for attn in a.attn.split(","):
        run(attn, a.mode, a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
