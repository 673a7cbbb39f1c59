"""Where the host time of one attention layer goes, without a profiler's distortion.

Back-to-back calls on a shape small enough that the GPU never throttles the host; host
microseconds per call (perf_counter over many calls, one synchronize, interleaved rounds,
medians). Three levels:

1. cuDNN's own launch: ``PlanLauncher.raw`` with the pointers read beforehand, per plan
   (forward / backward, with and without dropout), next to te_cudnn's ``fused_attn_fwd`` /
   ``fused_attn_bwd`` for the same call and torch's flash-attention ops;
2. one attention layer forward + backward, eager and ``torch.compile(fullgraph=True)``,
   te_cudnn against torch SDPA;
3. ``torch.profiler`` self-CPU time per op of the compiled layers.

    python tools/probe_host_path.py [--rounds 7] [--calls 400] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import te_cudnn as tc
from te_cudnn import ops


def host_us(fns: dict, rounds: int, calls: int, warmup: int = 50) -> dict:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    reps: dict = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            reps[name].append((t1 - t0) / calls * 1e6)
    return {n: statistics.median(r) for n, r in reps.items()}


def launch_level(b: int, s: int, h: int, d: int, rounds: int, calls: int) -> dict:
    """cuDNN's raw launch vs te_cudnn's functions vs torch's flash ops, one layer's calls."""
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    d_o = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    fns: dict = {}
    for p in (0.0, 0.1):
        kw = dict(qkv_layout="bs3hd", attn_mask_type="causal", dropout=p)
        o, aux = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, torch.bfloat16, **kw)
        grads = tc.fused_attn_bwd(s, s, None, None, q, k, v, o, d_o, torch.bfloat16, aux, **kw)
        fprep = next(pr for pr in ops._fwd_memo.values() if pr.cfg.dropout == p and pr.cfg.b == b and pr.cfg.sq == s)
        bprep = next(pr for pr in ops._bwd_memo.values() if pr.cfg.dropout == p and pr.cfg.b == b and pr.cfg.sq == s)
        fbufs = [q, k, v, o, aux[0]] + (list(ops._seed_offset(aux[1])) if p else [])
        bbufs = [q, k, v, o, aux[0], d_o, *grads[:3]] + (list(ops._seed_offset(aux[1])) if p else [])
        for tag, prep, bufs in (("fwd", fprep, fbufs), ("bwd", bprep, bbufs)):
            plan = prep.get_plan()
            handle = ops.handle_for(q.device.index)
            ws = torch.empty(max(plan.workspace_size, 16), dtype=torch.uint8, device="cuda")
            ptrs = [t.data_ptr() for t in bufs]
            raw_handle = handle.backend_handle or 0
            launch = plan.launch
            print(f"  {tag} p={p}: launch mode {launch.mode}, workspace {plan.workspace_size} B, plan {plan.plan_name}")
            if launch.mode == "raw":
                fns[f"cuDNN raw launch {tag} p={p}"] = (lambda l=launch, pt=ptrs, w=ws.data_ptr(), hd=raw_handle: l.raw(pt, w, hd))
            fns[f"PlanLauncher() {tag} p={p}"] = (lambda l=launch, bf=bufs, w=ws, hd=handle: l(bf, w, hd))
            # the frontend's public execute of the same graph (what a hand-written binding calls)
            pack = dict(zip(plan.uids, [*bufs[: len(plan.uids)]]))
            if len(pack) == len(plan.uids):
                fns[f"graph.execute(dict) {tag} p={p}"] = (lambda g=plan.graph, pk=pack, w=ws, hd=handle: g.execute(pk, w, handle=hd))
        fns[f"fused_attn_fwd p={p}"] = lambda kw=kw: tc.fused_attn_fwd(True, s, s, None, None, q, k, v, torch.bfloat16, **kw)
        fns[f"fused_attn_bwd p={p}"] = (lambda kw=kw, o=o, aux=aux: tc.fused_attn_bwd(
            s, s, None, None, q, k, v, o, d_o, torch.bfloat16, aux, **kw))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        res = torch.ops.aten._scaled_dot_product_flash_attention(qt, kt, vt, p, True, False)
        fns[f"torch flash fwd op p={p}"] = lambda p=p: torch.ops.aten._scaled_dot_product_flash_attention(qt, kt, vt, p, True, False)
        out, lse, cq, ck, mq, mk, seed, off, _ = res
        fns[f"torch flash bwd op p={p}"] = (lambda p=p, out=out, lse=lse, seed=seed, off=off: torch.ops.aten._scaled_dot_product_flash_attention_backward(
            d_o.transpose(1, 2), qt, kt, vt, out, lse, cq, ck, mq, mk, p, True, seed, off))
    return host_us(fns, rounds, calls)


def layer_level(b: int, s: int, h: int, d: int, rounds: int, calls: int, profile: bool) -> tuple[dict, dict]:
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16)
    fns: dict = {}
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
            fns[name] = lambda fn=fn: fn(*qkv.unbind(2)).backward(g)
    res = host_us(fns, rounds, calls)
    prof_rows: dict = {}
    if profile:
        from torch.profiler import ProfilerActivity, profile as tprofile  # noqa: PLC0415

        for name in ("te_cudnn compiled p=0.1", "sdpa compiled p=0.1"):
            fn = fns[name]
            with tprofile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(100):
                    fn()
            torch.cuda.synchronize()
            rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:18]
            prof_rows[name] = [(e.key, e.count / 100, e.self_cpu_time_total / 100, e.cpu_time_total / 100) for e in rows]
    return res, prof_rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-profile", action="store_true")
    a = ap.parse_args(argv)
    b, s, h, d = 1, 128, 8, 64
    print(f"== launch level (b={b} s={s} h={h} d={d}, causal, bs3hd): host us per call")
    launch = launch_level(b, s, h, d, a.rounds, a.calls)
    for n, us in launch.items():
        print(f"  {n:40s} {us:8.2f}")
    print(f"== layer level fwd+bwd (b={b} s={s} h={h} d={d}, causal): host us per step")
    layer, prof = layer_level(b, s, h, d, a.rounds, max(a.calls // 4, 50), not a.no_profile)
    for n, us in layer.items():
        print(f"  {n:40s} {us:8.2f}")
    for name, rows in prof.items():
        print(f"== torch.profiler, {name}: per step  count  self-CPU us  CPU us")
        for key, cnt, self_us, tot_us in rows:
            print(f"  {key[-60:]:60s} {cnt:5.1f} {self_us:9.1f} {tot_us:9.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"launch": launch, "layer": layer, "profile": prof}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
