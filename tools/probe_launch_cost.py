"""Host time of one cuDNN attention launch, by shape and option: te_cudnn's raw plan launch
against torch's whole cuDNN SDPA op, forward and backward, in plain loops on one stream.

    python tools/probe_launch_cost.py

For each configuration: median host µs per call over interleaved rounds (te_cudnn
``PlanLauncher.raw`` alone, ``fused_attn_fwd`` / ``fused_attn_bwd`` whole, and
``aten._scaled_dot_product_cudnn_attention`` / its backward whole)."""

from __future__ import annotations

import statistics
import time

import torch

import te_cudnn
from te_cudnn.plans import execute

CONFIGS = [  # (b, s, h, d, causal, dropout)
    (1, 128, 8, 64, True, 0.0),
    (8, 1024, 8, 64, True, 0.0),
    (8, 1024, 8, 64, True, 0.1),
    (8, 1024, 8, 64, False, 0.0),
    (1, 8192, 32, 128, True, 0.0),
]


def _host_us(fn, calls: int = 200) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / calls * 1e6


def main() -> int:
    raw_times: list[float] = []
    real = execute.PlanLauncher.raw

    def timed(self, ptrs, ws, handle):
        t0 = time.perf_counter()
        real(self, ptrs, ws, handle)
        raw_times.append((time.perf_counter() - t0) * 1e6)

    execute.PlanLauncher.raw = timed
    print(f"{'b, s, h, d, causal, p':28s} {'te raw fwd':>10s} {'te fwd':>8s} {'aten fwd':>9s} {'te raw bwd':>10s} "
          f"{'te bwd':>8s} {'aten bwd':>9s}  (host us per call, medians)")
    for b, s, h, d, causal, p in CONFIGS:
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        mask = "causal" if causal else "no_mask"
        out, aux = te_cudnn.fused_attn_fwd(True, s, s, None, None, q, k, v, q.dtype, None, qkv_layout="bshd_bshd_bshd",
                                           attn_mask_type=mask, dropout=p)  # fmt: skip
        d_o = torch.randn_like(out)
        te_f = lambda: te_cudnn.fused_attn_fwd(True, s, s, None, None, q, k, v, q.dtype, None,  # noqa: E731
                                               qkv_layout="bshd_bshd_bshd", attn_mask_type=mask, dropout=p)
        te_b = lambda: te_cudnn.fused_attn_bwd(s, s, None, None, q, k, v, out, d_o, q.dtype, aux, None,  # noqa: E731
                                               qkv_layout="bshd_bshd_bshd", attn_mask_type=mask, dropout=p)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(qt, kt, vt, None, True, p, causal, False)
        ao, lse, _, _, _, _, seed, offset, _ = res
        a_f = lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(qt, kt, vt, None, True, p, causal, False)  # noqa: E731
        dot = torch.randn_like(ao)
        a_b = lambda: torch.ops.aten._scaled_dot_product_cudnn_attention_backward(  # noqa: E731
            dot, qt, kt, vt, ao, lse, seed, offset, None, None, None, s, s, p, causal)
        rows = {n: [] for n in ("raw_f", "te_f", "a_f", "raw_b", "te_b", "a_b")}
        for _ in range(7):
            raw_times.clear()
            rows["te_f"].append(_host_us(te_f))
            rows["raw_f"].append(statistics.median(raw_times))
            rows["a_f"].append(_host_us(a_f))
            raw_times.clear()
            rows["te_b"].append(_host_us(te_b))
            rows["raw_b"].append(statistics.median(raw_times))
            rows["a_b"].append(_host_us(a_b))
        m = {n: statistics.median(x) for n, x in rows.items()}
        print(f"{str((b, s, h, d, causal, p)):28s} {m['raw_f']:10.1f} {m['te_f']:8.1f} {m['a_f']:9.1f} {m['raw_b']:10.1f} "
              f"{m['te_b']:8.1f} {m['a_b']:9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
