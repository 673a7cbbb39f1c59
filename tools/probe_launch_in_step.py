"""How long te_cudnn's cuDNN launches take inside a training step of ``examples/train_gpt.py``:
every ``PlanLauncher.raw`` call (the one C call into the frontend's pointer-array execute) is
timed with the host clock, by direction (forward / backward), thread and mode, beside the same
launches in a plain loop.

    python tools/probe_launch_in_step.py [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    a = p.parse_args(argv)
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import train_gpt  # noqa: PLC0415

    from te_cudnn.plans import execute  # noqa: PLC0415

    samples: dict[tuple, list[float]] = defaultdict(list)
    label = {"mode": None}
    real = execute.PlanLauncher.raw

    def timed(self, ptrs, ws, handle):
        t0 = time.perf_counter()
        real(self, ptrs, ws, handle)
        dt = time.perf_counter() - t0
        if label["mode"] is not None:
            kind = "bwd" if len(ptrs) >= 9 else "fwd"
            where = "main" if threading.current_thread() is threading.main_thread() else "autograd thread"
            samples[(label["mode"], kind, where)].append(dt * 1e6)

    execute.PlanLauncher.raw = timed
    args = train_gpt.parse_args([])
    for mode in ("eager", "compile"):
        torch._dynamo.reset()
        model = train_gpt.GPT("te_cudnn", args.vocab, args.seq, args.layers, args.width, args.heads, args.dropout)
        model.init_weights(args.seed, args.layers)
        model.cuda().train()
        opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3, device="cuda"), capturable=True)

        def loss_fn(x, y):
            with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
                logits = model(x)
            return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

        fwd = torch.compile(loss_fn, fullgraph=True) if mode == "compile" else loss_fn
        x = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
        y = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
        for i in range(args.steps + 10):
            label["mode"] = mode if i >= 10 else None
            opt.zero_grad(set_to_none=True)
            loss = fwd(x, y)
            loss.backward()
            opt.step()
        label["mode"] = None
        torch.cuda.synchronize()
        # the same launches in a loop: one layer's attention forward and backward, eager
        q, k, v = (torch.randn(args.batch, args.seq, args.heads, args.width // args.heads, device="cuda",
                               dtype=torch.bfloat16, requires_grad=True) for _ in range(3))  # fmt: skip
        import te_cudnn  # noqa: PLC0415

        label["mode"] = f"{mode} loop"
        for _ in range(args.steps):
            out = te_cudnn.fused_attention(q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", dropout=0.1)
            out.backward(torch.ones_like(out))
        label["mode"] = None
        torch.cuda.synchronize()
    for key in sorted(samples):
        xs = samples[key]
        print(f"{key[0]:13s} {key[1]} on {key[2]:16s}: {len(xs):5d} launches, median {statistics.median(xs):7.1f} us, "
              f"p90 {statistics.quantiles(xs, n=10)[-1]:7.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
