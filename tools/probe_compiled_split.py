"""Splits a compiled te_cudnn layer's host time per step into: time inside fused_attn_fwd/bwd
(te_cudnn's Python and cuDNN's launch), inside cuDNN's launch alone, and the rest (compiled
graph, dispatcher, autograd). Interleaved rounds against compiled torch SDPA; with and without
Python's garbage collector.

    python tools/probe_compiled_split.py [--b 1 --s 128 --p 0.0]
"""
import argparse
import gc
import statistics
import time

import torch
import torch.nn.functional as F

import te_cudnn as tc
from te_cudnn import torch_ops
from te_cudnn.plans import execute

acc = {"fa": 0.0, "launch": 0.0}


def timed(fn, slot):
    def w(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[slot] += time.perf_counter() - t0
    return w


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--s", type=int, default=128)
    ap.add_argument("--p", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args(argv)
    b, s, h, d = a.b, a.s, 8, 64
    torch_ops.fused_attn_fwd = timed(torch_ops.fused_attn_fwd, "fa")
    torch_ops.fused_attn_bwd = timed(torch_ops.fused_attn_bwd, "fa")
    from te_cudnn import autograd as ag

    ag.fused_attn_fwd = timed(ag.fused_attn_fwd, "fa")
    ag.fused_attn_bwd = timed(ag.fused_attn_bwd, "fa")
    execute.PlanLauncher.raw = timed(execute.PlanLauncher.raw, "launch")
    execute.PlanLauncher.__call__ = timed(execute.PlanLauncher.__call__, "launch")
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16)
    attn = tc.DotProductAttention(h, d, attention_dropout=a.p, qkv_format="bshd", attn_mask_type="causal").train()

    def sd(q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=a.p, is_causal=True)
        return o.transpose(1, 2).reshape(b, s, h * d)

    te_c = torch.compile(attn, fullgraph=True)
    sd_c = torch.compile(sd, fullgraph=True)
    fns = {"te_cudnn compiled": te_c, "sdpa compiled": sd_c, "te_cudnn eager": attn, "sdpa eager": sd}
    res = {(n, gcmode): [] for n in fns for gcmode in ("gc on", "gc off")}
    split = {n: [] for n in fns}
    for fn in fns.values():
        for _ in range(30):
            fn(*qkv.unbind(2)).backward(g)
    torch.cuda.synchronize()
    for _ in range(a.rounds):
        for gcmode in ("gc on", "gc off"):
            if gcmode == "gc off":
                gc.disable()
            for name, fn in fns.items():
                acc["fa"] = acc["launch"] = 0.0
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    fn(*qkv.unbind(2)).backward(g)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                res[(name, gcmode)].append((t1 - t0) / a.steps * 1e6)
                if gcmode == "gc on":
                    split[name].append((acc["fa"] / a.steps * 1e6, acc["launch"] / a.steps * 1e6))
            gc.enable()
    print(f"b={b} s={s} h={h} d={d} p={a.p}: host us per fwd+bwd step, median of {a.rounds} rounds x {a.steps}")
    for name in fns:
        fa = statistics.median(x[0] for x in split[name])
        la = statistics.median(x[1] for x in split[name])
        print(f"  {name:20s} gc on {statistics.median(res[(name, 'gc on')]):8.1f}  gc off {statistics.median(res[(name, 'gc off')]):8.1f}"
              f"   in fused_attn_* {fa:7.1f} (cuDNN launch {la:6.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
