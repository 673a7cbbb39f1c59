"""Host microseconds of the pieces a cached call is made of, on CUDA tensors (perf_counter over
back-to-back calls, medians of interleaved rounds): result allocation in its several forms,
the current device/stream reads, pointer reads, the signature tuple. Which form is cheapest
decides how te_cudnn's hot path is written. The "one allocation" forms ask whether O and the
stats cut from one buffer (views) would cost less than two allocations.

    python tools/probe_host_pieces.py [--rounds 9] [--calls 5000] [--json out.json] [--device cuda]
"""

from __future__ import annotations

import argparse
from array import array
import json
import statistics
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the probe itself (no GPU numbers)")
    a = ap.parse_args(argv)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    q = torch.empty(1, 64, 1, 64, dtype=torch.bfloat16, device=a.device)
    k, v = torch.empty_like(q), torch.empty_like(q)
    tmpl_o = q.new_empty(1).expand(1, 64, 1, 64)
    tmpl_s = torch.empty(1, dtype=torch.float32, device=a.device).expand(1, 1, 64, 1)
    shape_o, shape_s = (1, 64, 1, 64), (1, 1, 64, 1)
    f32, bf16, dev = torch.float32, torch.bfloat16, q.device
    empty, empty_like, empty_strided = torch.empty, torch.empty_like, torch.empty_strided
    dp = torch.Tensor.data_ptr
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 0)  # absent in CPU builds
    get_dev = getattr(torch._C, "_cuda_getDevice", lambda: 0)
    stride_o = (64 * 64, 64, 64, 1)
    u8 = torch.uint8
    n_o, n_s = 64 * 64, 64  # elements of O (bf16) and of the stats (fp32); O's bytes are a multiple of 256

    def one_alloc_bytes():  # one uint8 buffer, two typed views
        buf = empty(n_o * 2 + n_s * 4, dtype=u8, device=dev)
        return buf[: n_o * 2].view(bf16).view(shape_o), buf[n_o * 2:].view(f32).view(shape_s)

    def one_alloc_as_strided():  # one bf16 buffer; the stats as an fp32 view of it
        buf = empty(n_o + 2 * n_s, dtype=bf16, device=dev)
        return buf.as_strided(shape_o, stride_o), buf.view(f32).as_strided(shape_s, (n_s, n_s, 1, 1), n_o // 2)

    def one_alloc_split():  # one fp32 buffer split in one call
        st, rest = empty(n_s + n_o // 2, dtype=f32, device=dev).split((n_s, n_o // 2))
        return rest.view(bf16).view(shape_o), st.view(shape_s)

    fns = {
        "empty_like(q)": lambda: empty_like(q),
        "empty_like(expanded 1-element template)": lambda: empty_like(tmpl_o),
        "empty_like(stats template)": lambda: empty_like(tmpl_s),
        "q.new_empty(shape)": lambda: q.new_empty(shape_o),
        "torch.empty(shape, dtype=, device=)": lambda: empty(shape_o, dtype=bf16, device=dev),
        "torch.empty(*shape, dtype=, device=)": lambda: empty(1, 64, 1, 64, dtype=bf16, device=dev),
        "torch.empty_strided(shape, stride, dtype=, device=)": lambda: empty_strided(shape_o, stride_o, dtype=bf16, device=dev),
        "empty_like(q) + empty_like(stats template)": lambda: (empty_like(q), empty_like(tmpl_s)),
        "one allocation: uint8 buffer, two typed views": one_alloc_bytes,
        "one allocation: bf16 buffer, as_strided + view(f32).as_strided": one_alloc_as_strided,
        "one allocation: fp32 buffer .split, two views": one_alloc_split,
        "t.as_strided(shape, stride)": lambda: q.as_strided(shape_o, stride_o),
        "t.view(shape)": lambda: q.view(shape_o),
        "current raw stream": lambda: raw_stream(0),
        "current device": get_dev,
        "5 data_ptr into array('Q')": lambda: array("Q", map(dp, (q, k, v, q, k))),
        "5 data_ptr as a tuple": lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr(), q.data_ptr(), k.data_ptr()),
        "array('Q', tuple of 5)": lambda: array("Q", (1, 2, 3, 4, 5)),
        "meta of q, k, v": lambda: (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype,
                                    v.dtype, q.get_device(), k.get_device(), v.get_device()),  # fmt: skip
        "a no-op lambda": lambda: None,
    }
    reps = {n: [] for n in fns}
    names = list(fns)
    for fn in fns.values():
        for _ in range(500):
            fn()
    for r in range(a.rounds):
        for j in range(len(names)):
            n = names[(j + r) % len(names)]
            fn = fns[n]
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn()
            reps[n].append((time.perf_counter() - t0) / a.calls * 1e6)
        sync()
    us = {n: statistics.median(r) for n, r in reps.items()}
    w = max(map(len, us))
    for n, u in us.items():
        print(f"  {n:{w}s} {u:7.3f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device, "us": us}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
