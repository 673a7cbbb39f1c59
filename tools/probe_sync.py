"""Does a cached attention step synchronise the host with the GPU? ``torch.cuda.set_sync_debug_mode``
reports every synchronising CUDA call; device time per step (CUDA events) against host time per step
tells whether a step is GPU-bound. One layer, fwd+bwd, eager and compiled, te_cudnn and torch SDPA.

    python tools/probe_sync.py [--b 1 --s 128]
"""
import argparse
import time
import warnings

import torch
import torch.nn.functional as F

import te_cudnn as tc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--s", type=int, default=128)
    a = ap.parse_args(argv)
    b, s, h, d = a.b, a.s, 8, 64
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16)
    for p in (0.0, 0.1):
        attn = tc.DotProductAttention(h, d, attention_dropout=p, qkv_format="bshd", attn_mask_type="causal").train()

        def te(q, k, v, attn=attn):
            return attn(q, k, v)

        def sd(q, k, v, p=p):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=p, is_causal=True)
            return o.transpose(1, 2).reshape(b, s, h * d)

        for name, fn in ((f"te_cudnn eager p={p}", te), (f"sdpa eager p={p}", sd),
                         (f"te_cudnn compiled p={p}", torch.compile(te, fullgraph=True)),
                         (f"sdpa compiled p={p}", torch.compile(sd, fullgraph=True))):
            for _ in range(30):
                fn(*qkv.unbind(2)).backward(g)
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                fn(*qkv.unbind(2)).backward(g)
                torch.cuda.set_sync_debug_mode(0)
            syncs = [str(x.message).splitlines()[0][:90] for x in w]
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            n = 200
            torch.cuda.synchronize()
            e0.record()
            t0 = time.perf_counter()
            for _ in range(n):
                fn(*qkv.unbind(2)).backward(g)
            t1 = time.perf_counter()
            e1.record()
            torch.cuda.synchronize()
            # device-only time: the GPU sleeps while the host queues the steps, so the events
            # around them measure the kernels alone
            m = 40
            torch.cuda._sleep(int(1e9))
            f0, f1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            f0.record()
            for _ in range(m):
                fn(*qkv.unbind(2)).backward(g)
            f1.record()
            torch.cuda.synchronize()
            print(f"{name:26s} host {1e6 * (t1 - t0) / n:8.1f} us/step, events {1e3 * e0.elapsed_time(e1) / n:8.1f} us/step, device {1e3 * f0.elapsed_time(f1) / m:8.1f} us/step, "
                  f"{len(syncs)} sync(s) {syncs[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
