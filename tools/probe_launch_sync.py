"""Does a te_cudnn launch wait for the GPU? Host time of one call while the stream still holds
~20 ms of queued work (``torch.cuda._sleep``) against the same call on an idle GPU.

    python tools/probe_launch_sync.py [--busy-ms 20]

A call that returns in microseconds behind a busy queue is asynchronous; one that takes about
the queued time waits for the GPU somewhere on its path. Printed per callable: host µs idle,
host µs busy, and for te_cudnn the part spent inside ``te_cudnn.launch.launch`` (the cuDNN launch).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import te_cudnn
from te_cudnn import launch as te_launch
from te_cudnn import ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy-ms", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    torch.cuda.init()
    # calibrate _sleep: cycles per millisecond
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(10_000_000)
    e1.record()
    torch.cuda.synchronize()
    cycles = int(10_000_000 / e0.elapsed_time(e1) * a.busy_ms)

    b, s, h, d, p = 8, 1024, 8, 64, 0.1
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", dropout=p)
    out, aux = te_cudnn.fused_attn_fwd(True, s, s, None, None, q, k, v, q.dtype, None, **kw)
    d_o = torch.randn_like(out)
    te_cudnn.fused_attn_bwd(s, s, None, None, q, k, v, out, d_o, q.dtype, aux, None, **kw)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ao, lse, _, _, _, _, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        qt, kt, vt, None, True, p, True, False)
    dot = torch.randn_like(ao)
    x = torch.randn(1024, device="cuda")
    calls = {
        "te_cudnn fused_attn_fwd": lambda: te_cudnn.fused_attn_fwd(True, s, s, None, None, q, k, v, q.dtype, None, **kw),
        "te_cudnn fused_attn_fwd p=0": lambda: te_cudnn.fused_attn_fwd(
            True, s, s, None, None, q, k, v, q.dtype, None, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal"),
        "te_cudnn fused_attn_bwd": lambda: te_cudnn.fused_attn_bwd(s, s, None, None, q, k, v, out, d_o, q.dtype, aux,
                                                                   None, **kw),
        "aten cuDNN SDPA fwd": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
            qt, kt, vt, None, True, p, True, False),
        "aten cuDNN SDPA bwd": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            dot, qt, kt, vt, ao, lse, seed, offset, None, None, None, s, s, p, True),
        "torch add": lambda: x + 1,
        "torch.empty_like": lambda: torch.empty_like(qkv),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
    }
    launch_us: list[float] = []
    real = ops._launch  # every pointer-array launch (plain paths and launch.execute) goes through it

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            launch_us.append((time.perf_counter() - t0) * 1e6)

    ops._launch = te_launch.launch = timed
    print(f"queued work: {a.busy_ms} ms of torch.cuda._sleep; host us per call (median of {a.repeats})")
    print(f"{'call':32s} {'idle':>9s} {'busy':>10s} {'launch idle':>12s} {'launch busy':>12s}")
    try:
        for name, fn in calls.items():
            res = {"idle": [], "busy": [], "li": [], "lb": []}
            for _ in range(a.repeats):
                for state in ("idle", "busy"):
                    torch.cuda.synchronize()
                    if state == "busy":
                        torch.cuda._sleep(cycles)
                    launch_us.clear()
                    t0 = time.perf_counter()
                    fn()
                    res[state].append((time.perf_counter() - t0) * 1e6)
                    res["li" if state == "idle" else "lb"].append(sum(launch_us))
                    torch.cuda.synchronize()
            m = {k2: statistics.median(v2) for k2, v2 in res.items()}
            print(f"{name:32s} {m['idle']:9.1f} {m['busy']:10.1f} {m['li']:12.1f} {m['lb']:12.1f}", flush=True)
    finally:
        ops._launch = te_launch.launch = real
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
