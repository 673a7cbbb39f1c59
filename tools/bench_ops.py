"""Host cost of the custom-op path vs direct calls (issue 13: the dispatcher must not tax eager users).

Times back-to-back cached calls on a small problem where the host path is the speed, for:
the direct ``fused_attn_fwd``; ``fused_attention`` in eager mode (the direct path it takes by
default); the same through the custom op (``te_cudnn.torch_ops.attention``, what compiling or
capturing uses); and the raw ``torch.ops.te_cudnn.fwd`` call. Forward only under no_grad, and
forward + backward with autograd. Interleaved rounds, medians of host microseconds per call
(perf_counter over many calls, then one synchronize), and the same contenders as device time
per call with CUDA events.

    python tools/bench_ops.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import te_cudnn as tc
from te_cudnn import torch_ops
from te_cudnn.autograd import AttnOptions, FusedAttnFunc


def host_medians(fns: dict, rounds: int, calls: int) -> dict:
    for fn in fns.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    reps: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            reps[name].append((t1 - t0) / calls * 1e6)
    return {name: statistics.median(r) for name, r in reps.items()}


def compiled_section(a) -> dict:
    """Host time of a compiled attention layer's forward + backward (the op path inside an
    inductor graph) against torch's compiled SDPA, b=2, h=8, s=512, d=64, causal, dropout 0.1."""
    import torch.nn.functional as F  # noqa: PLC0415

    b, s, h, d = 2, 512, 8, 64
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16)
    attn = tc.DotProductAttention(h, d, attention_dropout=0.1, qkv_format="bshd", attn_mask_type="causal").train()

    def sdpa(q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=0.1,
                                           is_causal=True)  # fmt: skip
        return o.transpose(1, 2).reshape(b, s, h * d)

    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    fns = {"te_cudnn compiled": torch.compile(attn, fullgraph=True), "torch SDPA compiled (default backend)":
           torch.compile(sdpa, fullgraph=True)}  # fmt: skip
    out = {}
    for name, fn in fns.items():
        def step(fn=fn):
            fn(q, k, v).backward(g)
        out[name] = host_medians({name: step}, a.rounds, max(a.calls // 5, 50))[name]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        f = torch.compile(sdpa, fullgraph=True)
        out["torch SDPA compiled (cuDNN backend)"] = host_medians({"x": lambda: f(q, k, v).backward(g)}, a.rounds,
                                                                  max(a.calls // 5, 50))["x"]  # fmt: skip
    print("\n== compiled fwd+bwd of one attention layer (b=2 h=8 s=512 d=64 causal dropout 0.1): host us per step")
    for name, us in out.items():
        print(f"  {name:45s} {us:8.2f}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="2,16,512,64", help="b,h,s,d (default: TE's test_0)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    b, h, s, d = (int(x) for x in a.shape.split(","))
    results = {"shape": dict(b=b, h=h, s=s, d=d)}
    for label, (b_, h_, s_, d_) in (("tiny b=1,h=1,s=64,d=64", (1, 1, 64, 64)), (f"b={b},h={h},s={s},d={d}", (b, h, s, d))):
        q, k, v = (torch.randn(b_, s_, h_, d_, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        layout, mask = "bshd_bshd_bshd", "causal"
        opts = AttnOptions(qkv_layout=layout, attn_mask_type=mask)
        kw = dict(qkv_layout=layout, attn_mask_type=mask, attn_bias_type="no_bias", attn_scale=None, dropout=0.0,
                  window_size=(-1, 0), bottom_right_diagonal=None, backend=None, softmax_type="vanilla",
                  deterministic=False)  # fmt: skip

        def direct():
            return tc.fused_attn_fwd(False, s_, s_, None, None, q, k, v, q.dtype, None, qkv_layout=layout,
                                     attn_mask_type=mask)  # fmt: skip

        def eager_fn():
            return tc.fused_attention(q, k, v, qkv_layout=layout, attn_mask_type=mask, is_training=False)

        def func_apply():
            return FusedAttnFunc.apply(False, s_, s_, None, None, q, k, v, None, None, opts)

        def op_path():
            return torch_ops.attention(q, k, v, None, None, None, s_, s_, False, **kw)

        def raw_op():
            return torch.ops.te_cudnn.fwd(q, k, v, None, None, None, None, None, None, None, None, False, s_, s_,
                                          layout, mask, "no_bias", None, 0.0, -1, 0, None, None, "vanilla", False)  # fmt: skip

        fwd = {"fused_attn_fwd (direct)": direct, "FusedAttnFunc.apply": func_apply,
               "fused_attention (eager: direct path)": eager_fn, "custom op path (torch_ops.attention)": op_path,
               "torch.ops.te_cudnn.fwd (raw)": raw_op}  # fmt: skip
        with torch.no_grad():
            host = host_medians(fwd, a.rounds, a.calls)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        g = torch.randn_like(q)

        def train_direct():
            FusedAttnFunc.apply(True, s_, s_, None, None, qg, kg, vg, None, None, opts).backward(g)

        def train_ops():
            torch_ops.attention(qg, kg, vg, None, None, None, s_, s_, True, **kw).backward(g)

        train = host_medians({"fwd+bwd direct (FusedAttnFunc)": train_direct, "fwd+bwd custom ops": train_ops},
                             a.rounds, max(a.calls // 5, 50))  # fmt: skip
        base = host["fused_attn_fwd (direct)"]
        results[label] = {"forward_host_us": host, "fwd_bwd_host_us": train,
                          "op_path_minus_direct_us": host["custom op path (torch_ops.attention)"] - base,
                          "eager_fused_attention_minus_direct_us": host["fused_attention (eager: direct path)"] - base}  # fmt: skip
        print(f"\n== {label}: host microseconds per call (median of {a.rounds} rounds x {a.calls} calls)")
        for name, us in {**host, **train}.items():
            print(f"  {name:45s} {us:8.2f}")
        print(f"  op path - direct fused_attn_fwd: {results[label]['op_path_minus_direct_us']:+.2f} us; "
              f"eager fused_attention - direct: {results[label]['eager_fused_attention_minus_direct_us']:+.2f} us")  # fmt: skip
    results["compiled"] = compiled_section(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
