"""Decode with the query heads of a GQA group packed as query rows: is it faster?

A decode step (s_q = 1) with GQA (h = 32 query heads over hg = 8 key/value heads) launches one
tile per query head: the four heads of a group read the same keys and values in four CTAs. Seen
as ``h = hg`` heads with ``s_q = h / hg`` query rows each (a zero-copy view of q: row j of group
g is query head ``g * h/hg + j``), one CTA reads each key/value head once. This probe times both
forms of the same paged decode with te_cudnn (CUDA-graph replay, interleaved rounds), checks they
agree, and reports the KV-cache read bandwidth against the measured copy bandwidth.

    python tools/probe_decode_gqa_pack.py [--kv 8192,32768] [--page 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import te_cudnn as tc
from te_cudnn.benchmark.measure import capture, copy_bandwidth_gbps, graph_sampler, interleaved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="8192,32768")
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    b, h, hg, d, page = 8, 32, 8, 128, a.page
    g = h // hg
    copy = copy_bandwidth_gbps()
    out: dict = {"device": torch.cuda.get_device_name(), "copy_gbps": copy, "rows": []}
    print(f"copy bandwidth {copy:.0f} GB/s")
    for skv in map(int, a.kv.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(0)
        pages = skv // page
        k, v = (torch.randn(b * pages, page, hg, d, generator=gen, device="cuda").bfloat16() for _ in range(2))
        table = torch.randperm(b * pages, device="cuda").view(b, pages).to(torch.int32)
        q = torch.randn(b, 1, h, d, generator=gen, device="cuda").bfloat16()
        q_packed = q.view(b, hg, g, d).transpose(1, 2)  # [b, g rows, hg heads, d]: a view
        cu_kv = torch.arange(0, (b + 1) * skv, skv, dtype=torch.int32, device="cuda")
        cu_q1 = torch.arange(0, b + 1, dtype=torch.int32, device="cuda")
        cu_qg = cu_q1 * g
        kw = dict(qkv_layout="paged_kv_bshd_bshd_bshd", attn_mask_type="padding", page_table_k=table,
                  page_table_v=table)  # fmt: skip

        def plain():
            return tc.fused_attn_fwd(False, 1, skv, cu_q1, cu_kv, q, k, v, q.dtype, None, **kw)[0]

        def packed():
            return tc.fused_attn_fwd(False, g, skv, cu_qg, cu_kv, q_packed, k, v, q.dtype, None, **kw)[0]

        o1 = plain()
        o2 = packed()  # [b, g, hg, d] -> [b, 1, h, d]
        o2 = o2.transpose(1, 2).reshape(b, 1, h, d)
        diff = (o1.float() - o2.float()).abs().max().item()
        reps = 20
        graphs = {name: capture(lambda _s, fn=fn: fn, reps) for name, fn in (("per query head", plain),
                                                                             ("group rows packed", packed))}
        samples = interleaved({n: graph_sampler(gr, reps) for n, (gr, _) in graphs.items()}, a.rounds)
        kv_bytes = 2 * b * skv * hg * d * 2
        for name, ms in samples.items():
            med = statistics.median(ms)
            gbps = kv_bytes / (med * 1e-3) / 1e9
            row = {"skv": skv, "page": page, "form": name, "ms": med, "kv_gbps": gbps, "pct_copy": gbps / copy * 100,
                   "max_abs_diff": diff}  # fmt: skip
            out["rows"].append(row)
            print(f"  kv {skv:6d} page {page}: {name:18s} {med * 1e3:8.2f} us  {gbps:7.0f} GB/s = {row['pct_copy']:.1f} %"
                  f"  (max |diff| {diff:.3g})")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
