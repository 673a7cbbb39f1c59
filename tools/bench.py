"""Side-by-side timing on one GPU, in one run: te_cudnn vs the same cuDNN graph built by hand
vs torch SDPA's cuDNN backend, on TransformerEngine's benchmark configurations; then host
microseconds per cached call.

    python tools/bench.py [--configs test_0,test_1,test_3] [--json out.json]

Device time: forward+backward captured 10 times in one CUDA graph and replayed (no host
gaps), CUDA events around each replay, warm-up first, the three contenders timed in turn in
every round, median over rounds. Eager time (events around
eager calls, host overhead included) is reported beside it. Host time: perf_counter over many
back-to-back cached calls on a tiny problem, where the host, not the GPU, is the bottleneck.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import te_cudnn as tc
from te_cudnn.plans import handle_for
from te_cudnn.runtime import cudnn_module, current_env
from te_cudnn.testing import BENCHMARK_CONFIGS, BenchConfig, make_qkv, to_bhsd

LAYOUT = tc.QKVLayout.bshd_bshd_bshd


REPEATS_PER_GRAPH = 10


def graphed(fn):
    """Capture ``REPEATS_PER_GRAPH`` calls of ``fn`` (after a warm-up on the capture stream);
    return a replay callable. Timing several iterations per replay keeps event resolution
    and launch jitter out of sub-0.1 ms measurements."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPEATS_PER_GRAPH):
            fn()
    return g.replay


def interleaved_medians(fns: dict, rounds: int) -> dict:
    """Median ms per call of each function, timing them in turn in every round (A B C A B C
    ...), so that clock or thermal drift affects all of them alike."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b))
    return {name: statistics.median(t) for name, t in times.items()}


# ------------------------------------------------------------------ the three contenders
class TeCudnn:
    name = "te_cudnn"

    def __init__(self, cfg: BenchConfig, q, k, v, bias, d_o):
        self.cfg, self.q, self.k, self.v, self.bias, self.d_o = cfg, q, k, v, bias, d_o
        self.cu_q = torch.arange(0, (cfg.b + 1) * cfg.sq, cfg.sq, dtype=torch.int32, device="cuda")
        self.cu_kv = torch.arange(0, (cfg.b + 1) * cfg.skv, cfg.skv, dtype=torch.int32, device="cuda")
        self.kw = dict(qkv_layout=LAYOUT.name, attn_mask_type=cfg.mask, attn_bias_type=cfg.bias)

    def fwd_bwd(self):
        c = self.cfg
        out, aux = tc.fused_attn_fwd(True, c.sq, c.skv, self.cu_q, self.cu_kv, self.q, self.k, self.v, self.q.dtype, None,
                                     attn_bias=self.bias, **self.kw)  # fmt: skip
        return tc.fused_attn_bwd(c.sq, c.skv, self.cu_q, self.cu_kv, self.q, self.k, self.v, out, self.d_o, self.q.dtype,
                                 aux, None, **self.kw)  # fmt: skip


class HandBuilt:
    """The same cuDNN SDPA graphs written directly against the frontend (no te_cudnn code)."""

    name = "hand-built graph"

    def __init__(self, cfg: BenchConfig, q, k, v, bias, d_o):
        cudnn = cudnn_module()
        self.handle = cudnn.create_handle()
        BF, FL = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
        qb, kb, vb = (to_bhsd(t, LAYOUT) for t in (q, k, v))
        self.o = torch.empty_like(q)
        self.stats = torch.empty(cfg.b, cfg.h, cfg.sq, 1, device="cuda", dtype=torch.float32)
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ob, dob = to_bhsd(self.o, LAYOUT), to_bhsd(d_o, LAYOUT)
        dqb, dkb, dvb = (to_bhsd(t, LAYOUT) for t in (self.dq, self.dk, self.dv))
        scale = cfg.d**-0.5
        causal = dict(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0) if cfg.mask == "causal" else {}

        def T(g, t, uid, dt=BF):
            return g.tensor(name=f"t{uid}", dim=list(t.shape), stride=list(t.stride()), data_type=dt, uid=uid)

        gf = cudnn.pygraph(io_data_type=BF, intermediate_data_type=FL, compute_data_type=FL, handle=self.handle)
        extra = {"bias": T(gf, bias, 6)} if bias is not None else {}
        o, st = gf.sdpa(q=T(gf, qb, 1), k=T(gf, kb, 2), v=T(gf, vb, 3), attn_scale=scale, generate_stats=True, **causal, **extra)
        o.set_output(True).set_uid(4).set_dim(list(ob.shape)).set_stride(list(ob.stride()))
        st.set_output(True).set_uid(5).set_data_type(FL).set_dim(list(self.stats.shape)).set_stride(list(self.stats.stride()))
        gf.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        gb = cudnn.pygraph(io_data_type=BF, intermediate_data_type=FL, compute_data_type=FL, handle=self.handle)
        extra_b = {}
        if bias is not None:
            self.dbias = torch.empty_like(bias)
            dbias_t = T(gb, self.dbias, 15)
            extra_b = {"bias": T(gb, bias, 6), "dBias": dbias_t}
        dq, dk, dv = gb.sdpa_backward(q=T(gb, qb, 1), k=T(gb, kb, 2), v=T(gb, vb, 3), o=T(gb, ob, 4), dO=T(gb, dob, 11),
                                      stats=T(gb, self.stats, 5, FL), attn_scale=scale, use_deterministic_algorithm=False,
                                      **causal, **extra_b)  # fmt: skip
        for t, ref, uid in ((dq, dqb, 12), (dk, dkb, 13), (dv, dvb, 14)):
            t.set_output(True).set_uid(uid).set_dim(list(ref.shape)).set_stride(list(ref.stride()))
        if bias is not None:
            extra_b["dBias"].set_output(True)
        gb.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        self.gf, self.gb = gf, gb
        self.ws = torch.empty(max(gf.get_workspace_size(), gb.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
        self.fpack = {1: qb, 2: kb, 3: vb, 4: ob, 5: self.stats}
        self.bpack = {1: qb, 2: kb, 3: vb, 4: ob, 5: self.stats, 11: dob, 12: dqb, 13: dkb, 14: dvb}
        if bias is not None:
            self.fpack[6] = self.bpack[6] = bias
            self.bpack[15] = self.dbias
        self.plan_names = (gf.get_plan_name_at_index(0), gb.get_plan_name_at_index(0))

    def fwd_bwd(self):
        cudnn_module().set_stream(self.handle, torch.cuda.current_stream().cuda_stream)
        self.gf.execute(self.fpack, self.ws, handle=self.handle)
        self.gb.execute(self.bpack, self.ws, handle=self.handle)


class TorchSdpaCudnn:
    name = "torch SDPA (cuDNN)"

    def __init__(self, cfg: BenchConfig, q, k, v, bias, d_o):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.ctx = lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
        self.cfg = cfg
        self.q, self.k, self.v = (to_bhsd(t, LAYOUT).detach().requires_grad_() for t in (q, k, v))
        self.mask = None
        if bias is not None:  # torch takes the bias as an additive mask; causal folds into it
            causal = torch.full((cfg.sq, cfg.skv), float("-inf"), device="cuda").triu(1)
            self.mask = (bias.float() + causal).to(q.dtype)
        self.d_o = to_bhsd(d_o, LAYOUT)
        self.gqa = cfg.h != cfg.hg
        self.note = ""

    def fwd_bwd(self):
        with self.ctx():
            causal = self.cfg.mask == "causal" and self.mask is None
            out = F.scaled_dot_product_attention(self.q, self.k, self.v, attn_mask=self.mask, is_causal=causal, enable_gqa=self.gqa)
            return torch.autograd.grad(out, (self.q, self.k, self.v), self.d_o)


def bench_config(cfg: BenchConfig, iters: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = make_qkv(LAYOUT, cfg.b, cfg.h, cfg.hg, cfg.sq, cfg.skv, cfg.d, generator=gen)
    bias = torch.randn(cfg.bias_shape, generator=gen, device="cuda").to(q.dtype) if cfg.bias_shape else None
    d_o = torch.randn(q.shape, generator=gen, device="cuda").to(q.dtype)
    row: dict = {"config": cfg.name}
    eager, replays = {}, {}
    for cls in (TeCudnn, HandBuilt, TorchSdpaCudnn):
        try:
            impl = cls(cfg, q, k, v, bias, d_o)
            impl.fwd_bwd()
            eager[cls.name] = impl.fwd_bwd
            replays[cls.name] = graphed(impl.fwd_bwd)
            if isinstance(impl, HandBuilt):
                row["hand_plans"] = impl.plan_names
        except Exception as exc:  # reported, never hidden
            row[cls.name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        torch.cuda.synchronize()
    graph_ms = interleaved_medians(replays, iters)
    eager_ms = interleaved_medians(eager, iters)
    for name in replays:
        row[name] = {"graph_ms": graph_ms[name] / REPEATS_PER_GRAPH, "eager_ms": eager_ms[name]}
    return row


def host_us(rounds: int = 15, calls: int = 2000) -> dict:
    """Host microseconds per cached forward call on a tiny problem (b=1, h=1, s=64, d=64),
    for te_cudnn and for bare ``graph.execute`` on te_cudnn's own plan."""
    b, h, s, d = 1, 1, 64, 64
    q, k, v = make_qkv(LAYOUT, b, h, h, s, s, d)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout=LAYOUT.name, attn_mask_type="no_mask")
    call = lambda: tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)  # noqa: E731
    call()
    o_pre, lse_pre = torch.empty_like(q), torch.empty(b, h, s, 1, device="cuda")
    call_pre = lambda: tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, out=o_pre, softmax_lse=lse_pre, **kw)  # noqa: E731
    call_pre()
    plan = next(
        p for p in tc.plan_cache.plans()
        if (p.key.config.sq, p.key.config.h, p.key.config.b, p.key.direction.value) == (s, h, b, "fwd")
    )  # fmt: skip
    print(f"te_cudnn plan launch mode: {plan.launch.mode}")
    handle = handle_for(0)
    o, st = torch.empty_like(q), torch.empty(b, h, s, 1, device="cuda")
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    bufs = [to_bhsd(t, LAYOUT) for t in (q, k, v, o)] + [st]
    pack = dict(zip(plan.uids, bufs))
    dev = torch.device("cuda", 0)

    def bare():  # the frontend's ordered fast path, outputs preallocated
        plan.graph.execute(bufs, ws, handle=handle, tensor_uids=plan.uids)

    def bare_dict():  # the documented uid -> tensor form (the form gpu_findings.md measured)
        plan.graph.execute(pack, ws, handle=handle)

    def bare_alloc():  # ordered execute that allocates fresh outputs the cheapest way torch offers
        o2 = torch.empty_like(q)
        st2 = torch.empty_strided((b, h, s, 1), (h * s, s, 1, 1), dtype=torch.float32, device=dev)
        plan.graph.execute([q, k, v, o2, st2], ws, handle=handle, tensor_uids=plan.uids)

    from torch.nn.attention import SDPBackend, sdpa_kernel

    qb, kb, vb = (to_bhsd(t, LAYOUT) for t in (q, k, v))

    def torch_sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qb, kb, vb)

    contenders = {
        "bare graph.execute (ordered)": bare,
        "bare graph.execute (dict)": bare_dict,
        "bare ordered + allocating O, stats": bare_alloc,
        "te_cudnn fused_attn_fwd": call,
        "te_cudnn, preallocated out/softmax_lse": call_pre,
        "torch SDPA cuDNN": torch_sdpa,
    }
    return host_medians(contenders, rounds, calls)


def host_medians(fns: dict, rounds: int, calls: int, warmup: int = 500) -> dict:
    """Median host microseconds per call of each function: ``calls`` back-to-back calls timed
    with the host clock, then one synchronize; interleaved rounds, so machine noise hits every
    contender alike."""
    reps: dict = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            reps[name].append((t1 - t0) / calls * 1e6)
    return {name: statistics.median(r) for name, r in reps.items()}


def varlen_bench(iters: int) -> dict:
    """fwd+bwd of a THD batch vs the same tokens padded to bshd (padding_causal, bf16), and the
    plans a 50-batch random-composition THD loop builds."""
    import random

    rng = random.Random(7)
    b, h, d, s_max = 8, 16, 128, 2048
    lengths = [rng.randint(256, s_max) for _ in range(b)]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    t = int(cu[-1])
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, d_o = (torch.randn(t, h, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(4))
    padded = []
    for x in (q, k, v, d_o):
        p = torch.zeros(b, s_max, h, d, device="cuda", dtype=torch.bfloat16)
        for i, n in enumerate(lengths):
            p[i, :n] = x[int(cu[i]):int(cu[i]) + n]
        padded.append(p)
    qp, kp, vp, dop = padded

    def run(layout, q_, k_, v_, do_):
        kw = dict(qkv_layout=layout, attn_mask_type="padding_causal")
        out, aux = tc.fused_attn_fwd(True, s_max, s_max, cu, cu, q_, k_, v_, q_.dtype, None, **kw)
        return tc.fused_attn_bwd(s_max, s_max, cu, cu, q_, k_, v_, out, do_, q_.dtype, aux, None, **kw)

    fns = {"THD (thd_thd_thd)": lambda: run("thd_thd_thd", q, k, v, d_o),
           "padded bshd (bshd_bshd_bshd)": lambda: run("bshd_bshd_bshd", qp, kp, vp, dop)}  # fmt: skip
    for fn in fns.values():
        fn()
    replays = {name: graphed(fn) for name, fn in fns.items()}
    graph_ms = interleaved_medians(replays, iters)
    eager_ms = interleaved_medians(fns, iters)
    res = {"lengths": lengths, "tokens": t, "padded_tokens": b * s_max}
    for name in fns:
        res[name] = {"graph_ms": graph_ms[name] / REPEATS_PER_GRAPH, "eager_ms": eager_ms[name]}

    before = tc.plan_cache.stats().builds
    for i in range(50):
        n = rng.randint(1, 8)
        lens = [rng.randint(1, 256) for _ in range(n)]
        cu_i = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
        x = torch.randn(int(cu_i[-1]), 4, 64, device="cuda").to(torch.bfloat16)
        kw = dict(qkv_layout="thd_thd_thd", attn_mask_type="padding_causal")
        out, aux = tc.fused_attn_fwd(True, 256, 256, cu_i, cu_i, x, x, x, x.dtype, None, **kw)
        tc.fused_attn_bwd(256, 256, cu_i, cu_i, x, x, x, out, out, x.dtype, aux, None, **kw)
    res["plans_built_50_batches"] = tc.plan_cache.stats().builds - before
    return res


def fp8_bench(names: list[str], iters: int) -> dict:
    """FP8 (E4M3 forward, E5M2 backward, delayed scaling) vs bf16, forward and backward
    separately, CUDA-graph replay, interleaved; TFLOP/s count only unmasked scores."""
    from te_cudnn.fp8 import Fp8AttentionMeta

    res = {}
    for name in names:
        cfg = BENCHMARK_CONFIGS[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = make_qkv(LAYOUT, cfg.b, cfg.h, cfg.hg, cfg.sq, cfg.skv, cfg.d, generator=gen)
        d_o = torch.randn(q.shape, generator=gen, device="cuda").to(q.dtype)
        cu_q = torch.arange(0, (cfg.b + 1) * cfg.sq, cfg.sq, dtype=torch.int32, device="cuda")
        cu_kv = torch.arange(0, (cfg.b + 1) * cfg.skv, cfg.skv, dtype=torch.int32, device="cuda")
        kw = dict(qkv_layout=LAYOUT.name, attn_mask_type=cfg.mask)
        meta = Fp8AttentionMeta(device="cuda")
        for t in (q, k, v):
            meta.quantize(t, "qkv")
        meta.fwd.amax_history[0, 3] = v.abs().max()
        meta.fwd.amax_history[0, 8] = 1.0
        meta.bwd.amax_history[0, :] = 1.0
        meta.update()
        q8, k8, v8 = (meta.quantize(t, "qkv") for t in (q, k, v))
        d_o8 = meta.quantize(d_o, "do")
        fk, bk = meta.fwd_kwargs(), meta.bwd_kwargs()
        o16, aux16 = tc.fused_attn_fwd(True, cfg.sq, cfg.skv, cu_q, cu_kv, q, k, v, q.dtype, None, **kw)
        o8, aux8 = tc.fused_attn_fwd(True, cfg.sq, cfg.skv, cu_q, cu_kv, q8, k8, v8, q8.dtype, None, **kw, **fk)
        fns = {
            "bf16 fwd": lambda: tc.fused_attn_fwd(True, cfg.sq, cfg.skv, cu_q, cu_kv, q, k, v, q.dtype, None, **kw),
            "fp8 fwd": lambda: tc.fused_attn_fwd(True, cfg.sq, cfg.skv, cu_q, cu_kv, q8, k8, v8, q8.dtype, None, **kw, **fk),
            "bf16 bwd": lambda: tc.fused_attn_bwd(cfg.sq, cfg.skv, cu_q, cu_kv, q, k, v, o16, d_o, q.dtype, aux16, None, **kw),
            "fp8 bwd": lambda: tc.fused_attn_bwd(cfg.sq, cfg.skv, cu_q, cu_kv, q8, k8, v8, o8, d_o8, q8.dtype, aux8, None,
                                                 **kw, **bk),
        }  # fmt: skip
        ms = interleaved_medians({n: graphed(fn) for n, fn in fns.items()}, iters)
        f_flops, b_flops = cfg.flops()
        res[name] = {n: {"ms": t / REPEATS_PER_GRAPH, "tflops": (f_flops if "fwd" in n else b_flops) / (t / REPEATS_PER_GRAPH) / 1e9}
                     for n, t in ms.items()}  # fmt: skip
    return res


def max512_bench(iters: int, seqlens=(128, 256, 512), masks=("no_mask", "causal")) -> list:
    """F16_max512_seqlen vs F16_arbitrary_seqlen, fwd and bwd separately, b=32 h=16 d=64 bf16
    bshd (issue #6's shapes), CUDA-graph replay, interleaved."""
    B = tc.FusedAttnBackend
    rows = []
    for s in seqlens:
        for mask in masks:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = make_qkv(LAYOUT, 32, 16, 16, s, s, 64, generator=gen)
            d_o = torch.randn(q.shape, generator=gen, device="cuda").to(q.dtype)
            cu = torch.arange(0, 33 * s, s, dtype=torch.int32, device="cuda")
            kw = dict(qkv_layout=LAYOUT.name, attn_mask_type=mask)
            fns = {}
            for be in (B.F16_max512_seqlen, B.F16_arbitrary_seqlen):
                o, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, be, **kw)
                fns[f"{be.name} fwd"] = (lambda be=be: tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, be, **kw))
                fns[f"{be.name} bwd"] = (lambda be=be, o=o, aux=aux: tc.fused_attn_bwd(s, s, cu, cu, q, k, v, o, d_o, q.dtype,
                                                                                      aux, be, **kw))  # fmt: skip
            ms = interleaved_medians({n: graphed(fn) for n, fn in fns.items()}, iters)
            row = {"s": s, "mask": mask, **{n: t / REPEATS_PER_GRAPH for n, t in ms.items()}}
            m = row["F16_max512_seqlen fwd"] + row["F16_max512_seqlen bwd"]
            a = row["F16_arbitrary_seqlen fwd"] + row["F16_arbitrary_seqlen bwd"]
            print(f"  s={s:4} {mask:8} max512 fwd {row['F16_max512_seqlen fwd']:.4f} bwd {row['F16_max512_seqlen bwd']:.4f} | "
                  f"arbitrary fwd {row['F16_arbitrary_seqlen fwd']:.4f} bwd {row['F16_arbitrary_seqlen bwd']:.4f} | "
                  f"fwd+bwd max512/arbitrary {m / a:.2f}")  # fmt: skip
            rows.append(row)
    return rows


def report_max512(iters: int) -> list:
    print("\nF16_max512_seqlen vs F16_arbitrary_seqlen (b=32, h=16, d=64, bf16, bshd), CUDA-graph replay, median ms")
    return max512_bench(iters)


def report_dense(names: list[str], iters: int) -> list:
    rows = [bench_config(BENCHMARK_CONFIGS[n], iters) for n in names]
    contenders = (TeCudnn.name, HandBuilt.name, TorchSdpaCudnn.name)
    print("\nfwd+bwd milliseconds per iteration, median (graph = CUDA-graph replay: device time; eager = events around eager calls)")
    print(f"{'config':8}" + "".join(f"{n + ' graph':>26}{'eager':>9}" for n in contenders) + f"{'te/hand (graph)':>17}{'te/hand (eager)':>17}")
    for r in rows:
        line = f"{r['config']:8}"
        for n in contenders:
            cell = r[n]
            line += f"{'ERR':>26}{'':>9}" if "error" in cell else f"{cell['graph_ms']:26.4f}{cell['eager_ms']:9.4f}"
        te, hand = r[TeCudnn.name], r[HandBuilt.name]
        if "error" not in te and "error" not in hand:
            line += f"{te['graph_ms'] / hand['graph_ms']:17.4f}{te['eager_ms'] / hand['eager_ms']:17.4f}"
        print(line)
        for n in contenders:
            if "error" in r[n]:
                print(f"   {n}: {r[n]['error']}")
    return rows


def report_host() -> dict:
    host = host_us()
    print("\nhost microseconds per cached forward call (b=1, h=1, s=64, d=64), median of 15 interleaved rounds x 2000 calls")
    te = host["te_cudnn fused_attn_fwd"]
    for name, us in host.items():
        print(f"  {name:40} {us:7.2f}" + ("" if name.startswith("te_cudnn") else f"   te_cudnn minus this: {te - us:+6.2f}"))
    pre, bare = host["te_cudnn, preallocated out/softmax_lse"], host["bare graph.execute (ordered)"]
    print(f"  like for like, outputs preallocated: te_cudnn {pre:.2f} vs bare ordered execute {bare:.2f} = {pre - bare:+.2f}")
    return host


def report_varlen(iters: int) -> dict:
    vl = varlen_bench(iters)
    print(f"\nvariable length: {len(vl['lengths'])} sequences, {vl['tokens']} tokens ({vl['padded_tokens']} when padded "
          f"to 2048), h=16, d=128, bf16, padding_causal, fwd+bwd ms per iteration (median)")  # fmt: skip
    for name in ("THD (thd_thd_thd)", "padded bshd (bshd_bshd_bshd)"):
        print(f"  {name:30} graph {vl[name]['graph_ms']:8.4f}   eager {vl[name]['eager_ms']:8.4f}")
    thd, pad = vl["THD (thd_thd_thd)"], vl["padded bshd (bshd_bshd_bshd)"]
    print(f"  THD / padded: graph {thd['graph_ms'] / pad['graph_ms']:.3f}, eager {thd['eager_ms'] / pad['eager_ms']:.3f}")
    print(f"  plans built over 50 random-composition THD batches (1-8 sequences of 1-256 tokens): {vl['plans_built_50_batches']}")
    return vl


def report_fp8(iters: int) -> dict:
    f8 = fp8_bench(["test_1", "test_3"], iters)
    print("\nFP8 (E4M3 fwd, E5M2 bwd, delayed scaling) vs bf16, bshd, CUDA-graph replay, median ms and TFLOP/s")
    for name, r in f8.items():
        cells = "  ".join(f"{n} {r[n]['ms']:.4f} ms {r[n]['tflops']:6.1f} TF/s" for n in ("bf16 fwd", "fp8 fwd", "bf16 bwd", "fp8 bwd"))
        print(f"  {name}: {cells}")
        print(f"  {name}: fp8/bf16 speed-up fwd {r['bf16 fwd']['ms'] / r['fp8 fwd']['ms']:.2f}x, "
              f"bwd {r['bf16 bwd']['ms'] / r['fp8 bwd']['ms']:.2f}x")  # fmt: skip
    return f8


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, choices=("dense", "host", "varlen", "fp8", "max512"), help="run one section")
    p.add_argument("--configs", default="test_0,test_1,test_3")
    p.add_argument("--iters", type=int, default=50, help="timed rounds per contender (interleaved)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    env = current_env()
    print(f"{env.describe()}; torch {torch.__version__}")
    out: dict = {"env": env.describe()}
    run = (lambda section: args.only in (None, section))  # noqa: E731
    if run("dense"):
        out["rows"] = report_dense(args.configs.split(","), args.iters)
    if run("host"):
        out["host_us"] = report_host()
    if run("varlen"):
        out["varlen"] = report_varlen(args.iters)
    if run("fp8"):
        out["fp8"] = report_fp8(args.iters)
    if run("max512"):
        out["max512"] = report_max512(args.iters)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
