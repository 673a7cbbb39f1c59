"""The full benchmark with device memory logged around every timed mode: PyTorch's allocated and
reserved bytes and the memory outside PyTorch's allocator (cudaMemGetInfo), and errors kept
whole (the report cuts them to one line). Finds what filled the GPU when the full run's late
FP8 cases failed to capture a CUDA graph ("CUDA out of memory", 79 GiB in use).

    python tools/probe_bench_memory.py --out DIR [bench options, e.g. --cases fp8]
"""

from __future__ import annotations

import json
import os
import sys

import torch

from te_cudnn.benchmark import runner
from te_cudnn.benchmark.cli import main as bench_main

LOG: list[dict] = []


def _mib(x: int) -> float:
    return round(x / 2**20, 1)


def _snapshot(where: str) -> None:
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    LOG.append(dict(where=where, allocated_mib=_mib(torch.cuda.memory_allocated()), reserved_mib=_mib(reserved),
                    outside_pytorch_mib=_mib(total - free - reserved), free_mib=_mib(free)))  # fmt: skip
    print(f"[mem] {where:60s} alloc {LOG[-1]['allocated_mib']:9.1f}  reserved {LOG[-1]['reserved_mib']:9.1f}  "
          f"outside {LOG[-1]['outside_pytorch_mib']:9.1f}  free {LOG[-1]['free_mib']:9.1f} MiB", flush=True)


def main() -> int:
    real_time_mode, real_one_line = runner._time_mode, runner._one_line

    def time_mode(mode, runs, rows, settings):
        names = ",".join(runs)
        case = next(iter(rows.values())).get("case", "?") if rows else "?"
        _snapshot(f"{case} {mode} before ({len(runs)} runs)")
        try:
            return real_time_mode(mode, runs, rows, settings)
        finally:
            _snapshot(f"{case} {mode} after")
            del names

    def one_line(exc: BaseException) -> str:
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return f"{type(exc).__name__}: {' '.join(str(exc).split())[:1500]}"
        return real_one_line(exc)

    runner._time_mode, runner._one_line = time_mode, one_line
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    try:
        rc = bench_main(sys.argv[1:])
        runner.free_memory()  # gc, te_cudnn's workspaces, torch.cuda.empty_cache()
        _snapshot("end of run, after free_memory")
        return rc
    finally:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "memory_log.json"), "w") as f:
            json.dump(LOG, f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
