"""Decode (s_q = 1, b=8, h=32, hg=8, d=128) graphs written directly against the frontend: does
generating the softmax stats, the padding mask or the page table cost KV-read bandwidth?

te_cudnn's forward always writes the stats (TransformerEngine's contract: aux_ctx_tensors[0]);
torch's cuDNN SDPA skips them when no gradient is needed. This probe times each combination
(CUDA-graph replay of 20 calls, medians of interleaved rounds), beside torch SDPA cuDNN on the
dense cache, and prints the plan each graph got.

    python tools/probe_decode_stats.py [--kv 8192,32768] [--rounds 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics

import torch

from te_cudnn.runtime import cudnn_module


def copy_gbps() -> float:
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20):
        dst.copy_(src)
    e1.record()
    torch.cuda.synchronize()
    return 2 * src.numel() * 20 / (e0.elapsed_time(e1) * 1e-3) / 1e9


def build(cudnn, handle, q, kc, vc, o, stats, *, mask: bool, paged: bool, tables, seq_kv, skv):
    io = cudnn.data_type.BFLOAT16
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)  # fmt: skip
    T = lambda t, uid, dt=io: g.tensor(name=f"t{uid}", dim=list(t.shape), stride=list(t.stride()), data_type=dt, uid=uid)  # noqa: E731
    kw = {}
    pack = {1: q, 2: kc, 3: vc, 4: o}
    if mask:
        i32 = cudnn.data_type.INT32
        sq_t = torch.ones(q.shape[0], 1, 1, 1, dtype=torch.int32, device="cuda")
        kw.update(use_padding_mask=True, seq_len_q=T(sq_t, 20, i32), seq_len_kv=T(seq_kv, 21, i32))
        pack[20], pack[21] = sq_t, seq_kv
    if paged:
        i32 = cudnn.data_type.INT32
        kw.update(paged_attention_k_table=T(tables, 22, i32), paged_attention_v_table=T(tables, 23, i32),
                  paged_attention_max_seq_len_kv=skv)  # fmt: skip
        pack[22], pack[23] = tables, tables
    out, st = g.sdpa(q=T(q, 1), k=T(kc, 2), v=T(vc, 3), attn_scale=q.shape[-1] ** -0.5,
                     generate_stats=stats is not None, **kw)  # fmt: skip
    out.set_output(True).set_uid(4).set_dim(list(o.shape)).set_stride(list(o.stride()))
    if stats is not None:
        st.set_output(True).set_uid(5).set_data_type(cudnn.data_type.FLOAT).set_dim(list(stats.shape)).set_stride(
            list(stats.stride()))
        pack[5] = stats
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws = torch.empty(max(g.get_workspace_size(), 16), dtype=torch.uint8, device="cuda")
    name = g.get_plan_name_at_index(0) if hasattr(g, "get_plan_name_at_index") else "?"
    return (lambda: g.execute(pack, ws, handle=handle)), name


@contextlib.contextmanager
def te_patched(cached_runtime: bool, zero_fill: bool):
    """te_cudnn with its per-call runtime buffers (sequence lengths) taken from the cache during
    capture too, and/or without zero-filling O: what each costs inside a CUDA graph."""
    from te_cudnn import ops, varlen  # noqa: PLC0415

    saved = ops._cached_runtime_buffers, torch.zeros_like
    memo: dict = {}
    if cached_runtime:
        def cached(prep, *cu):
            key = (id(prep), *map(id, cu))
            if key not in memo:
                memo[key] = varlen.runtime_buffers(prep, *cu)
            return memo[key]

        ops._cached_runtime_buffers = cached
    if not zero_fill:
        torch.zeros_like = torch.empty_like
    try:
        yield
    finally:
        ops._cached_runtime_buffers, torch.zeros_like = saved


def graphed(fn, cudnn, handle, n=20, patch=contextlib.nullcontext):
    """Capture ``n`` calls; the frontend graphs launch on ``handle``'s stream, so it is bound to
    the capturing stream for the capture (an unbound handle leaves the CUDA graph empty)."""
    cg = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cudnn.set_stream(handle, s.cuda_stream)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with patch(), torch.cuda.graph(cg, stream=s):
            for _ in range(n):
                fn()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return cg, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="8192,32768")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    cudnn = cudnn_module()
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    bw = copy_gbps()
    b, h, hg, d, page = 8, 32, 8, 128, 64
    rows = []
    for skv in map(int, a.kv.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, 1, h, d, generator=gen, device="cuda").to(torch.bfloat16).permute(0, 2, 1, 3)
        k = torch.randn(b, skv, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
        v = torch.randn(b, skv, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
        kd, vd = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)  # dense bhsd views of bshd memory
        n_pages = b * skv // page
        perm = torch.randperm(n_pages, generator=gen, device="cuda")
        kp = torch.empty(n_pages, page, hg, d, dtype=torch.bfloat16, device="cuda")
        vp = torch.empty_like(kp)
        kp[perm] = k.reshape(n_pages, page, hg, d)
        vp[perm] = v.reshape(n_pages, page, hg, d)
        tables = perm.to(torch.int32).reshape(b, 1, skv // page, 1).contiguous()
        seq_kv = torch.full((b, 1, 1, 1), skv, dtype=torch.int32, device="cuda")
        o = torch.empty(b, 1, h, d, dtype=torch.bfloat16, device="cuda").permute(0, 2, 1, 3)
        st = torch.empty(b, h, 1, 1, dtype=torch.float32, device="cuda")
        variants = {}
        for mask, paged in ((False, False), (True, False), (True, True)):
            for stats in (st, None):
                kc, vc = (kp.permute(0, 2, 1, 3), vp.permute(0, 2, 1, 3)) if paged else (kd, vd)
                name = f"{'paged' if paged else 'dense'}{' padding' if mask else ' no_mask'}{' stats' if stats is not None else ' no stats'}"
                try:
                    fn, plan = build(cudnn, handle, q, kc, vc, o, stats, mask=mask, paged=paged, tables=tables,
                                     seq_kv=seq_kv, skv=skv)  # fmt: skip
                    variants[name] = (fn, plan)
                except Exception as e:  # noqa: BLE001
                    print(f"  {skv} {name}: {type(e).__name__}: {str(e)[:200]}")
        ref = torch.nn.functional.scaled_dot_product_attention
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

        def sdpa():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return ref(q, kd, vd, enable_gqa=True)

        variants["torch SDPA cuDNN (dense, no grad)"] = (sdpa, "aten")
        import te_cudnn as tc  # noqa: PLC0415

        qb = q.permute(0, 2, 1, 3)  # bshd
        cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        cu_kv = cu_q * skv
        table2 = tables.view(b, -1)

        def te_call():
            return tc.fused_attn_fwd(False, 1, skv, cu_q, cu_kv, qb, kp, vp, torch.bfloat16, None,
                                     qkv_layout="paged_kv_bshd_bshd_bshd", attn_mask_type="padding",
                                     page_table_k=table2, page_table_v=table2)  # fmt: skip

        ref_o = te_call()[0]
        variants["paged padding stats"][0]()  # the hand-built paged graph writes o
        torch.cuda.synchronize()
        patches = {}
        for label, cached, fill in (("te_cudnn paged (as is)", False, True),
                                    ("te_cudnn paged, lengths cached in the graph", True, True),
                                    ("te_cudnn paged, lengths cached, no O fill", True, False),
                                    ("te_cudnn paged, lengths per call, no O fill", False, False)):  # fmt: skip
            variants[label] = (te_call, "te_cudnn")
            patches[label] = (lambda c=cached, f=fill: te_patched(c, f))
        print(f"  skv={skv}: te_cudnn vs hand-built paged O max abs diff "
              f"{(ref_o.float() - o.permute(0, 2, 1, 3).float()).abs().max().item():.2e}")
        graphs = {n: graphed(fn, cudnn, handle, patch=patches.get(n, contextlib.nullcontext))
                  for n, (fn, _) in variants.items()}
        times = {n: [] for n in graphs}
        names = list(graphs)
        for r in range(a.rounds):
            for j in range(len(names)):
                n = names[(j + r) % len(names)]
                cg, reps = graphs[n]
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                cg.replay()
                e1.record()
                torch.cuda.synchronize()
                times[n].append(e0.elapsed_time(e1) / reps)
        kv_bytes = 2 * b * skv * hg * d * 2
        for n in names:
            ms = statistics.median(times[n])
            gbps = kv_bytes / (ms * 1e-3) / 1e9
            row = dict(skv=skv, variant=n, plan=variants[n][1], ms=ms, kv_gbps=gbps, pct_copy=100 * gbps / bw)
            rows.append(row)
            print(f"skv={skv:6d} {n:38s} {ms:.4f} ms  {gbps:7.1f} GB/s = {row['pct_copy']:5.1f}% of copy  ({row['plan']})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_gbps=bw, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
