"""Host microseconds of one attention layer's forward + backward, peeled layer by layer: the
compiled layer, the custom ops called directly, their Python bodies without the dispatcher,
``fused_attn_fwd``/``bwd``, and torch's cuDNN SDPA ops for comparison. Interleaved rounds.

    python tools/probe_op_layers.py [--p 0.0]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import te_cudnn as tc
from te_cudnn import torch_ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--p", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args(argv)
    b, s, h, d = 1, 128, 8, 64
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.detach() for t in qkv.unbind(2))
    d_o = g.view(b, s, h, d)
    attn = tc.DotProductAttention(h, d, attention_dropout=a.p, qkv_format="bshd", attn_mask_type="causal").train()

    def sd(q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=a.p, is_causal=True)
        return o.transpose(1, 2).reshape(b, s, h * d)

    def te_fn(q, k, v):  # the custom-op wrapper without the module
        o = torch_ops.attention(q, k, v, None, None, None, s, s, True, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal",
                                attn_bias_type="no_bias", attn_scale=None, dropout=a.p, window_size=(-1, 0),
                                bottom_right_diagonal=None, backend=None, softmax_type="vanilla", deterministic=False)
        return o.view(b, s, h * d)

    te_c, sd_c = torch.compile(attn, fullgraph=True), torch.compile(sd, fullgraph=True)
    te_f = torch.compile(te_fn, fullgraph=True)
    rng = torch.zeros(2, dtype=torch.int64, device="cuda") if a.p else None
    tail = (s, s, None, a.p, torch_ops.op_config(True, "bshd_bshd_bshd", "causal", "no_bias", -1, 0, None, None, "vanilla", False))
    fo = (q, k, v, None, None, None, None, None, None, None, rng, None) + tail
    out, stats = torch.ops.te_cudnn.fwd(*fo)
    bo = (q, k, v, out, d_o, stats, rng, None, None, None, None, None, None) + tail
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", dropout=a.p, window_size=(-1, 0))
    o2, aux = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, torch.bfloat16, rng_state=rng, **kw)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(qt, kt, vt, None, True, a.p, True, False)
    cout, clse, cq, ck, mq, mk, seed, off, _ = res

    def cudnn_ops():
        torch.ops.aten._scaled_dot_product_cudnn_attention(qt, kt, vt, None, True, a.p, True, False)
        torch.ops.aten._scaled_dot_product_cudnn_attention_backward(d_o.transpose(1, 2), qt, kt, vt, cout, clse, seed, off,
                                                                    None, cq, ck, mq, mk, a.p, True)

    fns = {
        "te_cudnn compiled layer fwd+bwd": lambda: te_c(*qkv.unbind(2)).backward(g),
        "sdpa compiled layer fwd+bwd": lambda: sd_c(*qkv.unbind(2)).backward(g),
        "te_cudnn compiled attention() layer fwd+bwd": lambda: te_f(*qkv.unbind(2)).backward(g),
        "te_cudnn eager layer fwd+bwd": lambda: attn(*qkv.unbind(2)).backward(g),
        "sdpa eager layer fwd+bwd": lambda: sd(*qkv.unbind(2)).backward(g),
        "te ops fwd+bwd (dispatcher)": lambda: (torch.ops.te_cudnn.fwd(*fo), torch.ops.te_cudnn.bwd(*bo)),
        "te op bodies fwd+bwd (no dispatcher)": lambda: (torch_ops._fwd_impl(*fo), torch_ops._bwd_impl(*bo)),
        "fused_attn_fwd+bwd": lambda: (tc.fused_attn_fwd(True, s, s, None, None, q, k, v, torch.bfloat16, rng_state=rng, **kw),
                                       tc.fused_attn_bwd(s, s, None, None, q, k, v, o2, d_o, torch.bfloat16, aux, **kw)),
        "aten cuDNN SDPA ops fwd+bwd": cudnn_ops,
    }
    for n, fn in list(fns.items()):
        try:
            with torch.set_grad_enabled("layer" in n):
                for _ in range(30):
                    fn()
        except Exception as exc:  # e.g. another torch's aten signature: leave that row out
            print(f"  {n}: left out ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
            del fns[n]
    torch.cuda.synchronize()
    reps = {n: [] for n in fns}
    for _ in range(a.rounds):
        for n, fn in fns.items():
            grad = "layer" in n
            with torch.set_grad_enabled(grad):
                t0 = time.perf_counter()
                for _ in range(a.calls):
                    fn()
                t1 = time.perf_counter()
            torch.cuda.synchronize()
            reps[n].append((t1 - t0) / a.calls * 1e6)
    print(f"b={b} s={s} h={h} d={d} causal p={a.p}: host us, median of {a.rounds} interleaved rounds x {a.calls}")
    for n, r in reps.items():
        print(f"  {n:40s} {statistics.median(r):8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
