"""Host time of one attention layer's forward + backward in eager mode, direct path against the
custom-op path, with and without dropout, and how much of it is cuDNN's own launch
(``PlanLauncher`` calls timed from Python). The example's shape: b=8, s=1024, h=8, d=64, causal,
bf16, q/k/v views of one [b, s, 3, h, d] buffer.

    python tools/probe_launch_cost.py [--iters 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import te_cudnn as tc
from te_cudnn import torch_ops
from te_cudnn.plans import execute

_launch_s = [0.0, 0]


def _timed(fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            _launch_s[0] += time.perf_counter() - t0
            _launch_s[1] += 1
    return wrapper


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=200)
    a = p.parse_args(argv)
    b, s, h, d = 8, 1024, 8, 64
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16)
    launcher = execute.PlanLauncher
    launcher.raw = _timed(launcher.raw)
    launcher.__call__ = _timed(launcher.__call__)

    def te(path, p_drop):
        def step():
            q, k, v = qkv.unbind(2)
            if path == "direct":
                o = tc.fused_attention(q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", dropout=p_drop)
            else:
                o = torch_ops.attention(q, k, v, None, None, None, s, s, True, qkv_layout="bshd_bshd_bshd",
                                        attn_mask_type="causal", attn_bias_type="no_bias", attn_scale=None,
                                        dropout=p_drop, window_size=(-1, 0), bottom_right_diagonal=None, backend=None,
                                        softmax_type="vanilla", deterministic=False)  # fmt: skip
            o.reshape(b, s, h * d).backward(g)
        return step

    def sd(backend, p_drop):
        def step():
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop, is_causal=True)
            o.transpose(1, 2).reshape(b, s, h * d).backward(g)
        return step

    cases = {}
    for p_drop in (0.0, 0.1):
        cases[f"te_cudnn direct    p={p_drop}"] = te("direct", p_drop)
        cases[f"te_cudnn op path   p={p_drop}"] = te("op", p_drop)
        cases[f"torch SDPA cuDNN   p={p_drop}"] = sd(SDPBackend.CUDNN_ATTENTION, p_drop)
        cases[f"torch SDPA flash   p={p_drop}"] = sd(SDPBackend.FLASH_ATTENTION, p_drop)
    print(f"{'fwd+bwd, eager':28s} {'host us/step':>12s} {'device us':>10s} {'cuDNN launch us/step':>21s} {'launches':>8s}")
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        host, dev, launch = [], [], []
        for _ in range(5):
            _launch_s[:] = [0.0, 0]
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                fn()
            t1 = time.perf_counter()
            e1.record()
            torch.cuda.synchronize()
            host.append((t1 - t0) / a.iters * 1e6)
            dev.append(e0.elapsed_time(e1) * 1e3 / a.iters)
            launch.append(_launch_s[0] / a.iters * 1e6)
        n = _launch_s[1] / a.iters
        print(f"{name:28s} {statistics.median(host):12.1f} {statistics.median(dev):10.1f} "
              f"{statistics.median(launch):21.1f} {n:8.1f}")
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    for name in ("te_cudnn direct    p=0.1", "te_cudnn op path   p=0.1"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.iters):
            cases[name]()
        prof.disable()
        torch.cuda.synchronize()
        rows = sorted(((f"{f.split('site-packages/')[-1]}:{ln}:{fn}", nc, tt, ct)
                       for (f, ln, fn), (_c, nc, tt, ct, _) in pstats.Stats(prof).stats.items()), key=lambda r: -r[2])
        print(f"\n== cProfile {name}: {'calls/step':>10s} {'own us':>8s} {'cum us':>8s}")
        for fname, nc, tt, ct in rows[:28]:
            print(f"{fname[-80:]:80s} {nc / a.iters:10.1f} {tt / a.iters * 1e6:8.1f} {ct / a.iters * 1e6:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
