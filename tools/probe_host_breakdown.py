"""Where a cached ``fused_attn_fwd``'s host time goes, on the benchmark's host problem.

The benchmark's host section (b=1, h=1, s=64, d=64, bf16, bshd, no mask, forward) compares
te_cudnn with the bare ``graph.execute`` of a hand-built graph. This probe takes te_cudnn's call
apart in the same process, same interleaved rounds (host microseconds per call: perf_counter over
many back-to-back calls, one synchronize, medians):

* the yardsticks: the hand-built graph without stats (the benchmark's) and with stats (the same
  computation as te_cudnn's forward, which always writes the softmax stats as TE's does), each
  through the frontend's ``graph.execute(dict)`` into preallocated outputs;
* te_cudnn: the whole call, the call into preallocated ``out`` and ``softmax_lse``, te_cudnn's
  plan launched with pointers read beforehand (``PlanLauncher.raw``), the frontend's native
  execute of a pointer array built beforehand (the floor), the call with
  the launch replaced by a no-op (its Python alone), the signature lookup alone (the rest
  replaced by a no-op), and the two result allocations alone.

    python tools/probe_host_breakdown.py [--rounds 9] [--calls 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
from array import array
import json
import statistics
import time
from typing import Callable

import torch

import te_cudnn as tc
from te_cudnn import launch, launchers, ops
from te_cudnn.benchmark.handbuilt import HandGraphs

from host_problem import host_problem  # tools/ (on sys.path when run as a script)


def timed(fns: dict[str, tuple[Callable[[], object], Callable[[], None], Callable[[], None]]], rounds: int,
          calls: int) -> dict[str, float]:  # fmt: skip
    """``fns``: name -> (call, setup, teardown); setup/teardown run around each timed batch."""
    reps: dict[str, list[float]] = {n: [] for n in fns}
    for call, setup, teardown in fns.values():
        setup()
        for _ in range(300):
            call()
        teardown()
    torch.cuda.synchronize()
    names = list(fns)
    for r in range(rounds):
        for j in range(len(names)):
            name = names[(j + r) % len(names)]
            call, setup, teardown = fns[name]
            setup()
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            t1 = time.perf_counter()
            teardown()
            torch.cuda.synchronize()
            reps[name].append((t1 - t0) / calls * 1e6)
    return {n: statistics.median(r) for n, r in reps.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    hp = host_problem()
    b, h, s, d = 1, 1, hp.s, 64
    q, k, v, cu, kw, prep, plan = hp.q, hp.k, hp.v, hp.cu, hp.kw, hp.prep, hp.plan
    o_pre, st_pre = hp.out, torch.empty_like(hp.stats)
    print(f"plan {plan.plan_name}, launch mode {plan.launch.mode}, plain path {prep.plain}")
    qb, kb, vb = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    hand_inf = HandGraphs(qb, kb, vb, training=False, causal=False)
    hand_st = HandGraphs(qb, kb, vb, training=True, causal=False, d_o=torch.randn_like(q).permute(0, 2, 1, 3))
    ws = torch.empty(max(plan.workspace_size, 16), dtype=torch.uint8, device="cuda")
    handle = ops.handle_for(0)
    ptrs = [t.data_ptr() for t in (q, k, v, o_pre, st_pre)]
    raw_handle, ws_ptr = handle.backend_handle or 0, ws.data_ptr()
    native = plan.launch.native or (plan.launch._raw, len(ptrs), plan.launch._cpp_index)
    stream0 = launch.current_raw_stream(0)
    st_shape, st_stride, dev = tuple(st_pre.shape), st_pre.stride(), q.device
    print(f"plan workspace {plan.workspace_size} bytes")
    arr = array("Q", ptrs)  # kept alive: the lambda below reads its address
    arr_addr = arr.buffer_info()[0]
    nothing = lambda: None  # noqa: E731
    real_launch, real_plain = launchers._launch, ops.plain_fwd

    def patch(module: object, name: str, value: object) -> Callable[[], None]:
        """Set ``name`` where its caller looks it up: the launch in te_cudnn.launchers (plain_fwd's
        module), plain_fwd in te_cudnn.ops (fused_attn_fwd's)."""
        return lambda: setattr(module, name, value)

    fns = {
        "bare graph.execute(dict), no stats (benchmark yardstick)":
            (lambda: hand_inf.gf.execute(hand_inf.fpack, hand_inf.workspace, handle=hand_inf.handle), nothing, nothing),
        "bare graph.execute(dict), with stats (te_cudnn's graph)":
            (lambda: hand_st.gf.execute(hand_st.fpack, hand_st.workspace, handle=hand_st.handle), nothing, nothing),
        "te_cudnn plan, raw launch, pointers read before":
            (lambda: plan.launch.raw(ptrs, ws_ptr, raw_handle), nothing, nothing),
        "te_cudnn plan, native execute of a pointer array built before":
            (lambda: native[0](arr_addr, native[1], ws_ptr, raw_handle, native[2]), nothing, nothing),
        "te_cudnn fused_attn_fwd": (lambda: tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw),
                                    nothing, nothing),
        "te_cudnn fused_attn_fwd, out + softmax_lse given":
            (lambda: tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, out=o_pre, softmax_lse=st_pre, **kw),
             nothing, nothing),
        "te_cudnn fused_attn_fwd, launch a no-op":
            (lambda: tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw),
             patch(launchers, "_launch", lambda *x, **y: None), patch(launchers, "_launch", real_launch)),
        "te_cudnn fused_attn_fwd, signature lookup only":
            (lambda: tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw),
             patch(ops, "plain_fwd", lambda *x, **y: None), patch(ops, "plain_fwd", real_plain)),
        "two empty_like (O, stats)":
            (lambda: (torch.empty_like(q), torch.empty_like(prep.stats_template)), nothing, nothing),
        "te_cudnn _execute (buffers built before)":
            (lambda: ops._execute(plan, [q, k, v, o_pre, st_pre], prep.device, ops._FWD_NAMES), nothing, nothing),
        "te_cudnn _launch (pointer array built before)": (lambda: ops._launch(plan, arr, 0), nothing, nothing),
        # the pieces of te_cudnn.launch.launch and of plain_fwd, one by one
        "piece: launch.current_device()": (launch.current_device, nothing, nothing),
        "piece: launch.current_raw_stream(0)": (lambda: launch.current_raw_stream(0), nothing, nothing),
        "piece: launch.is_capturing()": (launch.is_capturing, nothing, nothing),
        "piece: launch context lookup": (lambda: launch._launch_local.ctx.get((0, stream0)), nothing, nothing),
        "piece: 5 data_ptr into array('Q', tuple)":
            (lambda: array("Q", (q.data_ptr(), k.data_ptr(), v.data_ptr(), o_pre.data_ptr(), st_pre.data_ptr())),
             nothing, nothing),
        # the allocation calls torch offers, for the stats' shape (which is cheapest on this host)
        "alloc: empty_like(q)": (lambda: torch.empty_like(q), nothing, nothing),
        "alloc: empty_like(stats template, expanded)": (lambda: torch.empty_like(prep.stats_template), nothing, nothing),
        "alloc: empty_like(contiguous stats)": (lambda: torch.empty_like(st_pre), nothing, nothing),
        "alloc: empty(shape, dtype=, device=)":
            (lambda: torch.empty(st_shape, dtype=torch.float32, device=dev), nothing, nothing),
        "alloc: empty_strided(shape, stride, dtype=, device=)":
            (lambda: torch.empty_strided(st_shape, st_stride, dtype=torch.float32, device=dev), nothing, nothing),
        "alloc: new_empty(shape)": (lambda: st_pre.new_empty(st_shape), nothing, nothing),
        "piece: plain_fwd, results given, launch a no-op":
            (lambda: ops.plain_fwd(prep, q, k, v, o_pre, st_pre), patch(launchers, "_launch", lambda *x, **y: None),
             patch(launchers, "_launch", real_launch)),
    }
    us = timed(fns, a.rounds, a.calls)
    width = max(map(len, us))
    print(f"host us per call, b={b} h={h} s={s} d={d} bf16 bshd no_mask forward ({a.rounds} rounds x {a.calls} calls)")
    for n, u in us.items():
        print(f"  {n:{width}s} {u:8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "us": us, "plan": plan.plan_name,
                       "launch": plan.launch.mode}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
