"""Are the results of te_cudnn's first (plan-building) call freed when the caller drops them?

The benchmark's memory probe on the 64K-token case (b=1, h=32, hg=8, d=128, causal, bf16) once
found one extra set of results (O, stats, dQ, dK, dV) alive during the second call. This probe
makes the same two calls and reports, after dropping the first call's results, whether O is
still alive (a weak reference), what refers to it, and the memory before / after a gc.collect().

    python tools/probe_first_call_memory.py [--seq 65536] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import weakref

import torch

import te_cudnn as tc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=65536)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    dev, dt, s = "cuda", torch.bfloat16, a.seq
    q = torch.randn(1, s, 32, 128, device=dev, dtype=dt)
    k, v = (torch.randn(1, s, 8, 128, device=dev, dtype=dt) for _ in range(2))
    d_o = torch.randn_like(q)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")

    def call():
        out, aux = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, dt, None, **kw)
        return out, aux, tc.fused_attn_bwd(s, s, None, None, q, k, v, out, d_o, dt, aux, None, **kw)

    from te_cudnn.plans import cache

    report = {"build_apart": cache.BUILD_APART}
    print("TE_CUDNN_BUILD_APART:", cache.BUILD_APART)
    for label in ("first call (builds plans)", "second call (cached)"):
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        r = call()
        torch.cuda.synchronize()
        o_ref = weakref.ref(r[0])
        after_call = torch.cuda.memory_allocated()
        del r
        alive = o_ref() is not None
        referrers = [type(x).__name__ for x in gc.get_referrers(o_ref())] if alive else []
        after_del = torch.cuda.memory_allocated()
        gc.collect()
        after_gc = torch.cuda.memory_allocated()
        report[label] = dict(held_mib=held / 2**20, results_mib=(after_call - after_del) / 2**20,
                             alive_after_del=alive, referrers=referrers, freed_by_gc_mib=(after_del - after_gc) / 2**20,
                             alive_after_gc=o_ref() is not None)  # fmt: skip
        print(label, json.dumps(report[label]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
