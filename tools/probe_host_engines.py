"""Every engine configuration of the host problem's forward: host time per launch, API calls.

On the benchmark's host problem (b=1, h=1, s=64, d=64, bf16, bshd, no mask, forward with
stats, as te_cudnn builds it) the heuristic plan and the hand-built graph both launch a
``cudaMemsetAsync`` of their 256-byte workspace before the kernel (about 2 us of host time per
call, ``tools/probe_host_api_calls.py``). This probe plans the key with every heuristic mode
(and, with ``--knobs N``, the knob sweep of ``TE_CUDNN_AUTOTUNE_KNOBS``), builds every plan and
reports for each: workspace bytes; host microseconds per call of back-to-back launches from a
pointer array (the native call te_cudnn makes; interleaved rounds, medians); CUDA API calls and
kernels per call under ``torch.profiler``; the kernel microseconds per call; and the largest
difference of O and the stats from the heuristic plan's.

    python tools/probe_host_engines.py [--knobs 0] [--rounds 7] [--calls 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from array import array

import torch

from te_cudnn.plans import tune
from te_cudnn.plans.execute import PlanLauncher
from te_cudnn.plans.handles import handle_for

from host_problem import host_problem  # tools/ (on sys.path when run as a script)
from probe_host_api_calls import profile_calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knobs", type=int, default=0, help="knob sweep values (TE_CUDNN_AUTOTUNE_KNOBS)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--s", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.knobs:
        os.environ[tune.KNOBS_ENV] = str(a.knobs)
    hp = host_problem(a.s)
    b, h, s, d, prep = 1, 1, hp.s, 64, hp.prep
    key = prep.key
    backend = prep.backend
    t0 = time.perf_counter()
    planned = tune.plan_candidates(key, lambda: backend.build(key.config, key.direction, handle_for(0)))
    print(f"planned {len(planned.candidates)} candidates in {time.perf_counter() - t0:.1f} s (modes {planned.modes}, "
          f"heuristic index {planned.heuristic_index})")  # fmt: skip
    g, uids = planned.graph, tuple(planned.spec.uids)
    operands = tune.make_operands(g, uids, key.config, "cuda")
    handle = handle_for(0)
    raw_handle = handle.backend_handle or 0
    launchers = {}
    for c in planned.candidates:
        if c.error is not None:
            continue
        try:
            g.build_plan_at_index(c.index)
            pl = PlanLauncher(g, uids)
            if pl.native is None:
                print(f"[{c.index}] {c.name}: launch mode {pl.mode}, skipped")
                continue
            ws = torch.empty(max(c.workspace or 0, 16), dtype=torch.uint8, device="cuda")
            arr = array("Q", [operands[u].data_ptr() for u in uids])
            launchers[c.index] = (c, pl.native, arr, ws)
        except Exception as exc:  # noqa: BLE001
            print(f"[{c.index}] {c.name}: {type(exc).__name__}: {exc}")
    g.build_plan_at_index(planned.heuristic_index)

    def run(idx: int):
        c, native, arr, ws = launchers[idx]
        addr, wptr = arr.buffer_info()[0], ws.data_ptr()
        return lambda: native[0](addr, native[1], wptr, raw_handle, native[2])

    fns = {i: run(i) for i in launchers}
    outputs = {}
    out_uids = [u for u in uids if u in {t.uid for t in g.get_outputs()}]
    for i, fn in fns.items():
        for u in out_uids:
            operands[u].zero_()
        fn()
        torch.cuda.synchronize()
        outputs[i] = [operands[u].float().clone() for u in out_uids]
    ref = outputs[planned.heuristic_index]
    host = {i: [] for i in fns}
    for fn in fns.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    for _ in range(a.rounds):
        for i, fn in fns.items():
            t = time.perf_counter()
            for _ in range(a.calls):
                fn()
            host[i].append((time.perf_counter() - t) / a.calls * 1e6)
            torch.cuda.synchronize()
    rows = []
    for i in fns:
        c = launchers[i][0]
        prof = profile_calls(fns[i], 200)
        err = max(float((x - r).abs().max()) for x, r in zip(outputs[i], ref))
        row = {"index": i, "name": c.name, "workspace": c.workspace, "host_us": statistics.median(host[i]),
               "api": prof["api"], "kernels": prof["kernels"],
               "kernel_us": sum(n * us for n, us in prof["kernels"].values()), "max_abs_diff": err,
               "heuristic": i == planned.heuristic_index}  # fmt: skip
        rows.append(row)
        memsets = sum(n for name, (n, _) in prof["api"].items() if "Memset" in name)
        print(f"[{i:3d}] {c.name:24s} ws {c.workspace:>8} B  host {row['host_us']:6.2f} us  memsets/call {memsets:.2f}  "
              f"kernels {row['kernel_us']:6.2f} us  diff {err:.3g}{'  (heuristic)' if row['heuristic'] else ''}")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "problem": f"b={b} h={h} s={s} d={d} bf16 bshd no_mask fwd",
                       "rows": rows}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
