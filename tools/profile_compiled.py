"""Where the host time of a compiled attention layer goes: cProfile of forward + backward
steps of a compiled ``DotProductAttention`` (and of compiled torch SDPA for comparison).

    python tools/profile_compiled.py [--steps 300] [--top 35]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ops import compiled_layer  # noqa: E402
from profile_host import profile_rows  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--top", type=int, default=35)
    a = p.parse_args(argv)
    q, k, v, g, fns, _ = compiled_layer()
    for name, fn in fns.items():
        for _ in range(20):
            fn(q, k, v).backward(g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            fn(q, k, v).backward(g)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"\n== {name}: {(t1 - t0) / a.steps * 1e6:.1f} us host per step (unprofiled)")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.steps):
            fn(q, k, v).backward(g)
        prof.disable()
        torch.cuda.synchronize()
        print(f"{'function':80s} {'calls/step':>10s} {'own us':>8s} {'cum us':>8s}  (per step)")
        for fname, nc, tt, ct in profile_rows(pstats.Stats(prof), a.steps)[: a.top]:
            print(f"{fname[-80:]:80s} {nc / a.steps:10.1f} {tt / a.steps * 1e6:8.1f} {ct / a.steps * 1e6:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
