"""Where the host time of a compiled attention layer goes: cProfile of forward + backward
steps of a compiled ``DotProductAttention`` (and of compiled torch SDPA for comparison).

    python tools/profile_compiled.py [--steps 300] [--top 35]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import te_cudnn as tc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--top", type=int, default=35)
    a = p.parse_args(argv)
    b, s, h, d = 2, 512, 8, 64
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16)
    attn = tc.DotProductAttention(h, d, attention_dropout=0.1, qkv_format="bshd", attn_mask_type="causal").train()

    def sdpa(q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=0.1,
                                           is_causal=True)  # fmt: skip
        return o.transpose(1, 2).reshape(b, s, h * d)

    for name, fn in (("te_cudnn", torch.compile(attn, fullgraph=True)), ("sdpa", torch.compile(sdpa, fullgraph=True))):
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
        st = pstats.Stats(prof).stats
        rows = [(f"{f.split('site-packages/')[-1]}:{ln}:{fn_}", nc, tt, ct) for (f, ln, fn_), (_, nc, tt, ct, _) in st.items()
                if nc >= a.steps]  # fmt: skip
        rows.sort(key=lambda r: -r[3])
        print(f"{'function':80s} {'calls/step':>10s} {'own us':>8s} {'cum us':>8s}  (per step)")
        for fname, nc, tt, ct in rows[: a.top]:
            print(f"{fname[-80:]:80s} {nc / a.steps:10.1f} {tt / a.steps * 1e6:8.1f} {ct / a.steps * 1e6:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
