"""Decode (s_q = 1, b=8, h=32, hg=8, d=128) against the KV cache: page size and layout.

The benchmark's decode cases read a paged KV cache of 64-token pages in a random order. This
probe runs the same decode through the benchmark's runner (same timing: CUDA-graph replay,
interleaved rounds, KV bytes over time against the measured copy bandwidth) with pages of
16 to 1024 tokens, token-major (TE's ``[pages, page_size, hg, d]``) and head-major in memory
(each page ``[hg, page_size, d]``), and with the cache not paged (dense ``bshd``), at 8K and 32K tokens, beside
torch SDPA cuDNN on the dense cache.

    python tools/probe_decode_pages.py [--out DIR] [--kv 8192,32768] [--pages 16,64,256,1024]
    python tools/probe_decode_pages.py --same-bytes 8,32,64 --pages 64   # split-KV upper bound

``--same-bytes B1,B2,..`` runs batch B with s_kv = kv * 8 / B instead (the same KV bytes spread
over more (batch, head) tiles): what a split-KV (flash-decoding) decode could at best get from
cuDNN's kernel, before the cost of merging the parts.
"""

from __future__ import annotations

import argparse
import json
import os

from te_cudnn.benchmark.cases import Case
from te_cudnn.benchmark.contenders import select_contenders
from te_cudnn.benchmark.report import flat_rows
from te_cudnn.benchmark.runner import Settings, run_benchmark


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--kv", default="8192,32768")
    ap.add_argument("--pages", default="16,64,256,1024")
    ap.add_argument("--same-bytes", default=None, help="batches to spread each KV size over (split-KV bound)")
    a = ap.parse_args(argv)
    cases = []
    for s in map(int, a.kv.split(",")) if a.same_bytes else ():
        for b in map(int, a.same_bytes.split(",")):
            for p in map(int, a.pages.split(",")):
                cases.append(Case(f"decode_kv{s // 1024}k_b{b}_s{s * 8 // b}_page{p}", "decode", b, 32, 8, 128, 1,
                                  s * 8 // b, "padding", layout="paged_kv_bshd_bshd_bshd", training=False, page_size=p,
                                  only=() if b == 8 else ("te_cudnn",)))  # fmt: skip
    for s in map(int, a.kv.split(",")) if not a.same_bytes else ():
        for p in map(int, a.pages.split(",")):
            for fmt in ("bshd", "bhsd"):  # token-major pages (TE's), head-major pages (FlashInfer's HND)
                cases.append(Case(f"decode_kv{s // 1024}k_page{p}_{fmt}", "decode", 8, 32, 8, 128, 1, s, "padding",
                                  layout="paged_kv_bshd_bshd_bshd", training=False, page_size=p, pool_format=fmt,
                                  only=() if (p, fmt) == (64, "bshd") else ("te_cudnn",)))  # SDPA once  # fmt: skip
        cases.append(Case(f"decode_kv{s // 1024}k_dense", "decode", 8, 32, 8, 128, 1, s, "padding",
                          layout="bshd_bshd_bshd", training=False))  # fmt: skip
    settings = Settings(host=False)
    res = run_benchmark(cases, select_contenders("te_cudnn,sdpa_cudnn"), settings)
    print(f"copy bandwidth {res['peaks'].get('copy_gbps')} GB/s")
    for row in flat_rows(res):
        if row.get("status", "ok") != "ok" and row.get("fwd_ms") is None:
            continue
        print(f"  {row['case']:24s} {row['contender']:18s} fwd {row.get('fwd_ms')} ms  KV {row.get('kv_gbps')} GB/s "
              f"= {row.get('pct_of_copy_bw')} %")  # fmt: skip
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "decode_pages.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
