"""Attention sinks' cost: the gpt-oss-shaped layer (h=64, hg=8, d=64, causal, bf16, s=4K) with
learnable and off-by-one sinks against vanilla, for the full-causal layer and the 128-token
sliding-window layer gpt-oss alternates with it. Forward, backward and forward + backward,
median ms of back-to-back calls (CUDA events, warm-up, interleaved rounds so drift hits every
contender alike), and the ratio to vanilla.

    python tools/bench_sinks.py [--batch 1] [--seq 4096] [--rounds 7] [--iters 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import te_cudnn as tc
from te_cudnn.enums import QKVLayout
from te_cudnn.testing import make_qkv
from te_cudnn.timing import event_ms


def _contender(q, k, v, d_o, softmax: str, window: tuple[int, int]):
    h, s = q.shape[2], q.shape[1]
    offset = torch.randn(1, h, 1, 1, device="cuda") if softmax == "learnable" else None
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", softmax_type=softmax, window_size=window)
    out, aux = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, q.dtype, None, softmax_offset=offset, **kw)

    def fwd():
        tc.fused_attn_fwd(True, s, s, None, None, q, k, v, q.dtype, None, softmax_offset=offset, **kw)

    def bwd():
        tc.fused_attn_bwd(s, s, None, None, q, k, v, out, d_o, q.dtype, aux, None, **kw)

    def both():
        o, a = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, q.dtype, None, softmax_offset=offset, **kw)
        tc.fused_attn_bwd(s, s, None, None, q, k, v, o, d_o, q.dtype, a, None, **kw)

    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": both}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    h, hg, d = 64, 8, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, a.batch, h, hg, a.seq, a.seq, d, generator=gen)
    d_o = torch.randn(q.shape, generator=gen, device="cuda").to(q.dtype)
    results = []
    print(f"gpt-oss-shaped attention: b={a.batch} h={h} hg={hg} d={d} s={a.seq} causal bf16 "
          f"({torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()})")
    for window, layer in (((-1, 0), "full causal"), ((128, 0), "sliding window 128")):
        fns = {sm: _contender(q, k, v, d_o, sm, window) for sm in ("vanilla", "off_by_one", "learnable")}
        times: dict = {(sm, part): [] for sm in fns for part in fns[sm]}
        for sm in fns:  # warm-up
            for fn in fns[sm].values():
                event_ms(fn, 3)
        for _ in range(a.rounds):
            for sm in fns:
                for part, fn in fns[sm].items():
                    times[sm, part].append(event_ms(fn, a.iters))
        print(f"\n{layer}: median ms (ratio to vanilla)")
        print(f"  {'softmax':12s} {'fwd':>16s} {'bwd':>16s} {'fwd+bwd':>16s}")
        for sm in fns:
            row = {part: statistics.median(times[sm, part]) for part in fns[sm]}
            base = {part: statistics.median(times["vanilla", part]) for part in fns[sm]}
            cells = "".join(f" {row[p]:9.3f} ({row[p] / base[p]:.3f})" for p in ("fwd", "bwd", "fwd+bwd"))
            print(f"  {sm:12s}{cells}")
            results.append({"layer": layer, "window": list(window), "softmax_type": sm, **{f"{p}_ms": row[p] for p in row},
                            **{f"{p}_ratio": row[p] / base[p] for p in row}})  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version(),
                       "shape": dict(b=a.batch, h=h, hg=hg, d=d, s=a.seq), "results": results}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
