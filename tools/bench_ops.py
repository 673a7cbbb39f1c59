"""Host cost of the custom-op path vs direct calls (the dispatcher must not tax eager users).

Times back-to-back cached calls on a small problem where the host path is the speed, for:
the direct ``fused_attn_fwd``; ``fused_attention`` in eager mode (the direct path it takes by
default); the same through the custom op (``te_cudnn.torch_ops.attention``, what compiling or
capturing uses); and the raw ``torch.ops.te_cudnn.fwd`` call. Forward only under no_grad, and
forward + backward with autograd. Interleaved rounds, medians of host microseconds per call
(perf_counter over many calls, then one synchronize), and the same contenders as GPU time
per call with CUDA events.

    python tools/bench_ops.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

import te_cudnn as tc
from te_cudnn import torch_ops
from te_cudnn.autograd import AttnOptions, FusedAttnFunc
from te_cudnn.timing import host_medians


def compiled_layer(b: int = 2, s: int = 512, h: int = 8, d: int = 64):
    """One attention layer (causal, dropout 0.1) compiled with fullgraph, te_cudnn's module and
    torch's SDPA: ``(q, k, v, grad, {name: compiled fn})``."""
    import torch.nn.functional as F  # noqa: PLC0415

    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16)
    attn = tc.DotProductAttention(h, d, attention_dropout=0.1, qkv_format="bshd", attn_mask_type="causal").train()

    def sdpa(q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=0.1,
                                           is_causal=True)  # fmt: skip
        return o.transpose(1, 2).reshape(b, s, h * d)

    fns = {"te_cudnn compiled": torch.compile(attn, fullgraph=True),
           "torch SDPA compiled (default backend)": torch.compile(sdpa, fullgraph=True)}  # fmt: skip
    return q, k, v, g, fns, sdpa


def compiled_section(a) -> dict:
    """Host time of a compiled attention layer's forward + backward (the op path inside an
    inductor graph) against torch's compiled SDPA, b=2, h=8, s=512, d=64, causal, dropout 0.1."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    q, k, v, g, fns, sdpa = compiled_layer()
    out = {}
    for name, fn in fns.items():
        def step(fn=fn):
            fn(q, k, v).backward(g)
        out[name] = host_medians({name: step}, a.rounds, max(a.calls // 5, 50), warmup=200)[name]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        f = torch.compile(sdpa, fullgraph=True)
        out["torch SDPA compiled (cuDNN backend)"] = host_medians({"x": lambda: f(q, k, v).backward(g)}, a.rounds,
                                                                  max(a.calls // 5, 50), warmup=200)["x"]  # fmt: skip
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
            config = torch_ops.op_config(False, layout, mask, "no_bias", -1, 0, None, None, "vanilla", False)
            return torch.ops.te_cudnn.fwd(q, k, v, None, None, None, None, None, None, None, None, None, s_, s_, None, 0.0,
                                          config)  # fmt: skip

        fwd = {"fused_attn_fwd (direct)": direct, "FusedAttnFunc.apply": func_apply,
               "fused_attention (eager: direct path)": eager_fn, "custom op path (torch_ops.attention)": op_path,
               "torch.ops.te_cudnn.fwd (raw)": raw_op}  # fmt: skip
        with torch.no_grad():
            host = host_medians(fwd, a.rounds, a.calls, warmup=200)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        g = torch.randn_like(q)

        def train_direct():
            FusedAttnFunc.apply(True, s_, s_, None, None, qg, kg, vg, None, None, opts).backward(g)

        def train_ops():
            torch_ops.attention(qg, kg, vg, None, None, None, s_, s_, True, **kw).backward(g)

        train = host_medians({"fwd+bwd direct (FusedAttnFunc)": train_direct, "fwd+bwd custom ops": train_ops},
                             a.rounds, max(a.calls // 5, 50), warmup=200)  # fmt: skip
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
