"""Does cuDNN's other SDPA implementation hold a faster forward plan than the one AUTO picks?

``graph.sdpa(implementation=AUTO)`` (what te_cudnn, the hand-built graph and most users build)
resolves to the UNIFIED backend op when the cuDNN version covers the graph, else to the
COMPOSITE sub-graph; each offers its own engine configurations. For each case this builds the
forward graph with AUTO, COMPOSITE and UNIFIED, builds every plan cuDNN offers
(``build_plan_policy.ALL``), and times each plan (CUDA events around back-to-back calls,
interleaved rounds, medians), checking each plan's O against the AUTO heuristic plan's. It also
times the host side of one cached ``execute`` per implementation on a tiny problem.

    python tools/probe_sdpa_implementation.py [--cases llama_h32_s8k,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

CASES = {  # name: (b, h, hg, sq, skv, d, causal)
    "test_3": (2, 16, 16, 2048, 2048, 128, False),
    "llama_h32_s4k": (2, 32, 8, 4096, 4096, 128, True),
    "llama_h32_s8k": (2, 32, 8, 8192, 8192, 128, True),
    "llama_h64_s8k": (1, 64, 8, 8192, 8192, 128, True),
    "decode_kv8k": (8, 32, 8, 1, 8192, 128, False),
    "host_tiny": (1, 1, 1, 64, 64, 64, False),
}


def build(cudnn, impl, b, h, hg, sq, skv, d, causal, handle):
    bf = cudnn.data_type.BFLOAT16
    g = cudnn.pygraph(io_data_type=bf, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)  # fmt: skip
    # bshd memory, BHSD dims (as te_cudnn binds the caller's tensors)
    q = g.tensor(dim=[b, h, sq, d], stride=[sq * h * d, d, h * d, 1], data_type=bf, uid=1)
    k = g.tensor(dim=[b, hg, skv, d], stride=[skv * hg * d, d, hg * d, 1], data_type=bf, uid=2)
    v = g.tensor(dim=[b, hg, skv, d], stride=[skv * hg * d, d, hg * d, 1], data_type=bf, uid=3)
    kw = {}
    if causal:
        kw["diagonal_band_right_bound"] = 0
        kw["diagonal_alignment"] = cudnn.diagonal_alignment.TOP_LEFT
    o, st = g.sdpa(q=q, k=k, v=v, generate_stats=True, attn_scale=d**-0.5,
                   implementation=getattr(cudnn.attention_implementation, impl), **kw)  # fmt: skip
    o.set_output(True).set_uid(4).set_dim([b, h, sq, d]).set_stride([sq * h * d, d, h * d, 1])
    st.set_output(True).set_uid(5).set_data_type(cudnn.data_type.FLOAT)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    heuristic_name = None
    try:
        g.build_plans(cudnn.build_plan_policy.ALL)
    except Exception:  # noqa: BLE001
        g.build_plans()
    try:
        heuristic_name = str(g.get_plan_name_at_index(int(getattr(g, "_plan_index", 0))))
    except Exception:  # noqa: BLE001
        pass
    return g, heuristic_name


def time_plans(runs: dict, rounds: int, reps: int) -> dict:
    """runs: name -> callable. Interleaved rounds of ``reps`` back-to-back calls; median ms per call."""
    samples = {n: [] for n in runs}
    for fn in runs.values():
        fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for n, fn in runs.items():
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            z.record()
            z.synchronize()
            samples[n].append(a.elapsed_time(z) / reps)
    return {n: statistics.median(s) for n, s in samples.items()}


def host_us(runs: dict, rounds: int = 9, calls: int = 2000) -> dict:
    out = {n: [] for n in runs}
    for _ in range(rounds):
        for n, fn in runs.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out[n].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return {n: statistics.median(s) for n, s in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    import cudnn  # noqa: PLC0415

    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    report = {"device": torch.cuda.get_device_name(), "cudnn": cudnn.backend_version(), "cases": {}}
    for case in a.cases.split(","):
        b, h, hg, sq, skv, d, causal = CASES[case]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, sq, h, d, generator=gen, device="cuda").to(torch.bfloat16)
        k = torch.randn(b, skv, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
        v = torch.randn(b, skv, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
        entry = {"shape": dict(b=b, h=h, hg=hg, sq=sq, skv=skv, d=d, causal=causal), "impl": {}}
        runs, outs, host_runs = {}, {}, {}
        for impl in ("AUTO", "COMPOSITE", "UNIFIED"):
            try:
                g, heur = build(cudnn, impl, b, h, hg, sq, skv, d, causal, handle)
            except Exception as exc:  # noqa: BLE001
                entry["impl"][impl] = {"error": str(exc).splitlines()[0][:300]}
                print(f"{case} {impl}: not built: {entry['impl'][impl]['error']}", flush=True)
                continue
            info = {"heuristic": heur, "plans": []}
            ws_max = 0
            n = int(g.get_execution_plan_count())
            for i in range(n):
                try:
                    ws_max = max(ws_max, int(g.get_workspace_size_plan_at_index(i)))
                except Exception:  # noqa: BLE001
                    pass
            ws = torch.empty(max(ws_max, 1), dtype=torch.uint8, device="cuda")
            for i in range(n):
                name = str(g.get_plan_name_at_index(i))
                try:
                    g.get_workspace_size_plan_at_index(i)
                except Exception as exc:  # noqa: BLE001
                    info["plans"].append({"index": i, "name": name, "error": str(exc).splitlines()[0][:200]})
                    continue
                o = torch.empty_like(q)
                st = torch.empty(b, h, sq, 1, dtype=torch.float32, device="cuda")
                pack = {1: q, 2: k, 3: v, 4: o, 5: st}
                label = f"{impl}[{i}] {name}"

                def fn(g=g, pack=pack, i=i):
                    g.execute_plan_at_index(pack, ws, index=i, handle=handle)

                try:
                    fn()
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001
                    info["plans"].append({"index": i, "name": name, "error": str(exc).splitlines()[0][:200]})
                    continue
                runs[label] = fn
                outs[label] = o
                info["plans"].append({"index": i, "name": name, "label": label})
            if heur is not None and case == "host_tiny":
                o = torch.empty_like(q)
                st = torch.empty(b, h, sq, 1, dtype=torch.float32, device="cuda")
                pack = {1: q, 2: k, 3: v, 4: o, 5: st}
                host_runs[f"{impl} execute ({heur})"] = lambda g=g, pack=pack: g.execute(pack, ws, handle=handle)
            entry["impl"][impl] = info
        reps = 200 if sq * skv <= 1 << 20 else (20 if sq * skv <= 1 << 26 else 5)
        ms = time_plans(runs, a.rounds, reps)
        ref_label = next((p["label"] for p in entry["impl"].get("AUTO", {}).get("plans", [])
                          if p.get("label") and p["name"] == entry["impl"]["AUTO"].get("heuristic")), None)  # fmt: skip
        ref = outs.get(ref_label) if ref_label else None
        for impl, info in entry["impl"].items():
            for p in info.get("plans", []):
                if "label" in p:
                    p["ms"] = ms[p["label"]]
                    if ref is not None:
                        o = outs[p["label"]].float()
                        p["max_abs_diff_vs_auto_heuristic"] = float((o - ref.float()).abs().max())
        entry["auto_heuristic"] = ref_label
        if host_runs:
            entry["host_us"] = host_us(host_runs)
        report["cases"][case] = entry
        base = ms.get(ref_label) if ref_label else None
        print(f"\n== {case} {entry['shape']}", flush=True)
        for label, t in sorted(ms.items(), key=lambda kv: kv[1]):
            rel = f" ({t / base:.3f}x AUTO heuristic)" if base else ""
            print(f"  {t:9.4f} ms{rel}  {label}", flush=True)
        for n, u in entry.get("host_us", {}).items():
            print(f"  host {u:.2f} us  {n}", flush=True)
        for impl, info in entry["impl"].items():
            if "error" in info:
                print(f"  {impl}: {info['error']}")
            else:
                print(f"  {impl}: heuristic {info['heuristic']}; "
                      f"{sum('label' in p for p in info['plans'])} plans timed, "
                      f"{sum('error' in p for p in info['plans'])} not runnable")  # fmt: skip
        del q, k, v, runs, outs
        torch.cuda.empty_cache()
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "sdpa_implementation.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
