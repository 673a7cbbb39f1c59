"""Host µs to put a dropout state [seed, offset] (int64, 2 values) on the GPU, by method.

    python tools/probe_rng_state.py
"""

from __future__ import annotations

import statistics
import time

import torch


def main() -> int:
    dev = torch.device("cuda")
    seed, offset = 1234567890123, 4096
    pinned = torch.empty(2, dtype=torch.int64, pin_memory=True)
    methods = {
        "tensor().to(non_blocking)": lambda: torch.tensor([seed, offset], dtype=torch.int64).to(dev, non_blocking=True),
        "tensor(device=)": lambda: torch.tensor([seed, offset], dtype=torch.int64, device=dev),
        "full + fill_ slice": lambda: torch.full((2,), seed, dtype=torch.int64, device=dev).narrow(0, 1, 1).fill_(offset),
        "arange(seed, offset+1, offset-seed)": lambda: torch.arange(seed, offset + (1 if offset > seed else -1), offset - seed,
                                                                    dtype=torch.int64, device=dev),
        "pinned copy": lambda: (pinned.copy_(torch.tensor([seed, offset])), torch.empty(2, dtype=torch.int64, device=dev).copy_(pinned, non_blocking=True)),
        "randint on device": lambda: torch.randint(0, 1 << 62, (2,), dtype=torch.int64, device=dev),
    }
    got = torch.arange(seed, offset + (1 if offset > seed else -1), offset - seed, dtype=torch.int64, device=dev)
    assert got.tolist() == [seed, offset], got
    res = {n: [] for n in methods}
    for _ in range(9):
        for name, fn in methods.items():
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(1000):
                fn()
            res[name].append((time.perf_counter() - t0) / 1000 * 1e6)
            torch.cuda.synchronize()
    for name, xs in res.items():
        print(f"{name:40s} {statistics.median(xs):6.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
