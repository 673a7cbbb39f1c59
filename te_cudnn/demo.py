"""Demo: fused attention forward + backward on TransformerEngine's benchmark configurations.

    python -m te_cudnn.demo [--configs test_0,test_1] [--iters 20]

For each configuration (TE's ``benchmark_attention.py`` test_0..test_3: bf16, bshd, training)
it prints the sub-backend that serves it, and on a GPU runs forward and backward through
``fused_attn_fwd`` / ``fused_attn_bwd``, checks them against the fp32 reference (on one
batch entry and one group of heads, so the reference fits in memory) and times them with
CUDA events (median). It ends with the plan cache's statistics. Without a GPU it builds and
validates the same cuDNN graphs and says that executing them needs a GPU.
"""

from __future__ import annotations

import argparse
import sys

import torch

from .backends import BY_ENUM, Direction
from .config import describe_shapes
from .enums import FusedAttnBackend, QKVLayout
from .ops import fused_attn_bwd, fused_attn_fwd
from .pipes import quiet_broken_pipe
from .plans import plan_cache
from .reference import attention_reference
from .runtime import HOPPER_CUDNN_919, current_env, format_versions
from .selection import explain
from .testing import BENCHMARK_CONFIGS, BenchConfig, make_qkv, rel_error, to_bhsd
from .timing import median_ms

LAYOUT = QKVLayout.bshd_bshd_bshd


def _reference_errors(cfg: BenchConfig, q, k, v, bias, out, d_o, dq, dk, dv) -> tuple[float, float]:
    """Relative error of O and dQ on batch 0 and the first group of heads (exact for it)."""
    per_group = cfg.h // cfg.hg
    n_q = max(per_group, min(4, cfg.h))
    n_kv = n_q // per_group
    sl = lambda t, n: to_bhsd(t, LAYOUT)[:1, :n].float()  # noqa: E731
    leaves = [sl(q, n_q).requires_grad_(), sl(k, n_kv).requires_grad_(), sl(v, n_kv).requires_grad_()]
    b = bias[:, :n_q].float() if bias is not None else None
    ref = attention_reference(*leaves, attn_mask_type=cfg.mask, attn_bias_type=cfg.bias, attn_bias=b)
    # Run the reference backward on this thread. Autograd's own CUDA worker thread has no
    # current CUDA context until something makes one (torch skips cudaSetDevice there when the
    # device number already matches), and the reference's first backward op is a cuBLAS
    # matmul, so torch would warn "Attempting to run cuBLAS, but there was no current CUDA
    # context!" -- a warning about the demo's plumbing, not about anything the user did.
    with torch.autograd.set_multithreading_enabled(False):
        (gq,) = torch.autograd.grad(ref.out, leaves[:1], sl(d_o, n_q))
    return rel_error(sl(out, n_q), ref.out), rel_error(sl(dq, n_q), gq)


def run_gpu(cfg: BenchConfig, iters: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = make_qkv(LAYOUT, cfg.b, cfg.h, cfg.hg, cfg.sq, cfg.skv, cfg.d, generator=gen)
    bias = torch.randn(cfg.bias_shape, generator=gen, device="cuda").to(q.dtype) if cfg.bias_shape else None
    cu_q = torch.arange(0, (cfg.b + 1) * cfg.sq, cfg.sq, dtype=torch.int32, device="cuda")
    cu_kv = torch.arange(0, (cfg.b + 1) * cfg.skv, cfg.skv, dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout=LAYOUT.name, attn_mask_type=cfg.mask, attn_bias_type=cfg.bias)
    fwd = lambda: fused_attn_fwd(True, cfg.sq, cfg.skv, cu_q, cu_kv, q, k, v, q.dtype, None, attn_bias=bias, **kw)  # noqa: E731
    out, aux = fwd()
    d_o = torch.randn(out.shape, generator=gen, device="cuda").to(q.dtype)
    bwd = lambda: fused_attn_bwd(cfg.sq, cfg.skv, cu_q, cu_kv, q, k, v, out, d_o, q.dtype, aux, None, **kw)  # noqa: E731
    dq, dk, dv, _, _ = bwd()
    torch.cuda.synchronize()
    err_o, err_dq = _reference_errors(cfg, q, k, v, bias, out, d_o, dq, dk, dv)
    fwd_ms, bwd_ms = median_ms(fwd, rounds=iters), median_ms(bwd, rounds=iters)
    f_flops, b_flops = cfg.flops()
    return {
        "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "err_o": err_o, "err_dq": err_dq,
        "fwd_tflops": f_flops / fwd_ms / 1e9, "bwd_tflops": b_flops / bwd_ms / 1e9,
    }  # fmt: skip


def validate_only(cfg: BenchConfig, backend: FusedAttnBackend) -> str:
    desc = describe_shapes(
        is_training=True, dtype=torch.bfloat16, qkv_layout=LAYOUT, attn_bias_type=cfg.bias, attn_mask_type=cfg.mask,
        softmax_type="vanilla", dropout=0.0, num_attn_heads=cfg.h, num_gqa_groups=cfg.hg, max_seqlen_q=cfg.sq,
        max_seqlen_kv=cfg.skv, head_dim_qk=cfg.d, head_dim_v=cfg.d, window_size=(-1, -1), batch_size=cfg.b,
        bias_shape=cfg.bias_shape,
    )  # fmt: skip
    for direction in Direction:
        BY_ENUM[backend].build(desc, direction).graph.validate()
    return "fwd+bwd graphs built and validated by the cuDNN frontend"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m te_cudnn.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(BENCHMARK_CONFIGS), help="comma-separated names (default: all)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per direction (median reported)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARK_CONFIGS]
    if unknown:
        parser.error(f"unknown config(s) {unknown}; choose from {list(BENCHMARK_CONFIGS)}")

    env = current_env()
    on_gpu = env.can_execute
    print(f"te_cudnn demo: {format_versions()}")
    if not on_gpu:
        print("No CUDA device with cuDNN here: building and validating the graphs only; executing them needs a GPU.")
        print(f"Sub-backend choice below assumes the measured machine: {HOPPER_CUDNN_919.describe()}")
    print("configs: bf16, layout bshd_bshd_bshd, training (TransformerEngine benchmark_attention.py)\n")
    header = f"{'config':7} {'b,h,hg,d,sq,skv,mask,bias':44} {'sub-backend':21}"
    print(header + ("  fwd ms  bwd ms  fwd TF/s  bwd TF/s  relerr O  relerr dQ" if on_gpu else "  graphs"))
    status = 0
    for name in names:
        cfg = BENCHMARK_CONFIGS[name]
        shape = f"{cfg.b},{cfg.h},{cfg.hg},{cfg.d},{cfg.sq},{cfg.skv},{cfg.mask},{cfg.bias}"
        choice = explain(True, torch.bfloat16, torch.bfloat16, LAYOUT, cfg.bias, cfg.mask, "vanilla", 0.0, cfg.h, cfg.hg,
                         cfg.sq, cfg.skv, cfg.d, cfg.d, batch_size=cfg.b, bias_shape=cfg.bias_shape,
                         env=env if on_gpu else HOPPER_CUDNN_919)  # fmt: skip
        line = f"{name:7} {shape:44} {choice.backend.name:21}"
        if choice.backend == FusedAttnBackend.No_Backend:
            print(line + "\n" + str(choice))
            status = 1
            continue
        if on_gpu:
            r = run_gpu(cfg, args.iters)
            line += (
                f"  {r['fwd_ms']:6.3f}  {r['bwd_ms']:6.3f}  {r['fwd_tflops']:8.1f}  {r['bwd_tflops']:8.1f}"
                f"  {r['err_o']:8.1e}  {r['err_dq']:9.1e}"
            )
        else:
            line += "  " + validate_only(cfg, choice.backend)
        print(line)
    if on_gpu:
        s = plan_cache.stats()
        print(
            f"\nplan cache: {s.entries} plans, {s.hits} hits, {s.misses} misses, {s.builds} builds "
            f"({s.build_seconds:.2f} s building), {s.evictions} evictions"
        )
        for p in plan_cache.snapshot():
            k = p["key"]
            print(f"  {k['direction']} {k['backend']} sq={k['sq']} h={k['h']} d={k['d_qk']} {k['mask']} {k['bias_type']}: "
                  f"{p['plan_name']}, workspace {p['workspace_bytes'] / 2**20:.1f} MiB, built in {p['build_ms']:.0f} ms, {p['hits']} hits")  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(quiet_broken_pipe(main))  # quiet when the output is cut short (| head)
