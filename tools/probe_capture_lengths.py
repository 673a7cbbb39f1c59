"""What do per-call sequence lengths cost a CUDA graph of many decode layers, with and without
the capture-scoped runtime-buffer cache?

A decode step of ``--layers`` attention calls through TransformerEngine's entry point
(``fused_attn_fwd``, paged KV cache, padding mask, b=8, h=32, hg=8, d=128, s_q=1) sharing one
pair of ``cu_seqlens`` tensors, captured as one CUDA graph twice: with te_cudnn as it is (the
lengths computed by the first call of the capture, ``te_cudnn.varlen``) and with the capture id
hidden (``varlen.capture_id`` answering None: every call computes its lengths, as before the
cache). Replays are timed in interleaved rounds (fresh order each round, CUDA events). The
outputs of both graphs are compared with those of an eager step. cuDNN's split-KV decode engine
is not bitwise deterministic (two eager steps differ in about one layer in 32, by a bf16 ulp), so
the probe reports the largest difference beside that of two eager steps and fails only past
``TOLERANCE``.

    python tools/probe_capture_lengths.py [--layers 1,8,32] [--kv 8192] [--rounds 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import te_cudnn as tc
from te_cudnn import varlen
from te_cudnn.benchmark.measure import copy_bandwidth_gbps, event_ms, interleaved


TOLERANCE = 2e-3  # |O| is O(0.1) here; a stale length changes whole rows by far more


def _max_diff(a: list, b: list) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def _kv_cache(b: int, skv: int, hg: int, d: int, page: int, gen: torch.Generator):
    n_pages = b * skv // page
    k = torch.randn(n_pages, page, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(n_pages, page, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
    perm = torch.randperm(n_pages, generator=gen, device="cuda")
    return k, v, perm.to(torch.int32).view(b, skv // page).contiguous()


def _graph(step, cached: bool):
    real = varlen.capture_id
    if not cached:
        varlen.capture_id = lambda index: None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            outs = step()
        torch.cuda.synchronize()
        return graph, outs
    finally:
        varlen.capture_id = real


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="1,8,32")
    ap.add_argument("--kv", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    b, h, hg, d, page, skv = 8, 32, 8, 128, 64, a.kv
    gen = torch.Generator(device="cuda").manual_seed(0)
    k, v, table = _kv_cache(b, skv, hg, d, page, gen)
    bw = copy_bandwidth_gbps()
    kv_bytes = 2 * b * skv * hg * d * 2
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    cu_kv = cu_q * skv  # every sequence the full cache (what kv_bytes counts)
    rows = []
    for layers in map(int, a.layers.split(",")):
        qs = [torch.randn(b, 1, h, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(layers)]

        def step(qs=qs):
            return [tc.fused_attn_fwd(False, 1, skv, cu_q, cu_kv, q, k, v, torch.bfloat16, None,
                                      qkv_layout="paged_kv_bshd_bshd_bshd", attn_mask_type="padding",
                                      page_table_k=table, page_table_v=table)[0] for q in qs]  # fmt: skip

        graphs = {"lengths once per replay (te_cudnn)": _graph(step, True),
                  "lengths in every call (capture id hidden)": _graph(step, False)}  # fmt: skip
        for g, _ in graphs.values():
            g.replay()
        eager, eager2 = [o.clone() for o in step()], [o.clone() for o in step()]
        torch.cuda.synchronize()
        (_, cached_out), (_, per_call_out) = graphs.values()
        diffs = {"eager vs eager": _max_diff(eager, eager2), "cached graph vs eager": _max_diff(cached_out, eager),
                 "per-call graph vs eager": _max_diff(per_call_out, eager)}  # fmt: skip
        same = max(diffs.values()) <= TOLERANCE
        samples = interleaved({n: (lambda g=g: event_ms(g.replay, lead=2)) for n, (g, _) in graphs.items()}, a.rounds)
        med = {n: statistics.median(s) for n, s in samples.items()}
        (n_c, t_c), (n_p, t_p) = med.items()
        row = {"layers": layers, "skv": skv, "max_abs_diff": diffs, "within_tolerance": same, "copy_gbps": bw,
               "ms_per_replay": med, "us_per_layer": {n: t / layers * 1e3 for n, t in med.items()},
               "kv_read_pct_of_copy": {n: kv_bytes / (t / layers * 1e-3) / 1e9 / bw * 100 for n, t in med.items()},
               "saved_us_per_layer": (t_p - t_c) / layers * 1e3, "ratio": t_c / t_p}
        rows.append(row)
        print(f"layers={layers:3d} skv={skv}: {n_c} {t_c / layers * 1e3:7.2f} us/layer "
              f"({row['kv_read_pct_of_copy'][n_c]:.1f} % of copy), {n_p} {t_p / layers * 1e3:7.2f} us/layer "
              f"({row['kv_read_pct_of_copy'][n_p]:.1f} %); ratio {row['ratio']:.3f}; max |diff| "
              + ", ".join(f"{n} {x:.1e}" for n, x in diffs.items()), flush=True)
        del graphs, cached_out, per_call_out, eager, eager2
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0 if all(r["within_tolerance"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
