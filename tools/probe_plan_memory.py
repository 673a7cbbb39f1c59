"""Device memory held outside PyTorch's allocator (cuDNN plans, their compiled kernels, handles,
CUDA graphs' native state) as te_cudnn and torch's cuDNN SDPA build plans: what the full
benchmark's late "CUDA out of memory" came from (79 GiB in use, 4 GiB of it PyTorch's).

Non-PyTorch memory = (total - free, from cudaMemGetInfo) - torch.cuda.memory_reserved(), read after
a synchronize and torch.cuda.empty_cache(). Steps: te_cudnn fwd+bwd on several training shapes
(heuristic plans), the same keys autotuned, FP8 autotuned (every engine configuration built and
timed, backward splits), torch SDPA cuDNN on the same shapes, then te_cudnn's plan cache cleared
and the autotuner's candidates released.

    python tools/probe_plan_memory.py [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json

import torch

import te_cudnn as tc
from te_cudnn.plans.tune import autotuning


def outside_mib() -> tuple[float, float]:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    return (total - free - reserved) / 2**20, reserved / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    rows = []

    def note(step: str) -> None:
        out, res = outside_mib()
        n = len(tc.plan_cache.plans())
        rows.append(dict(step=step, outside_pytorch_mib=out, pytorch_reserved_mib=res, te_plans=n))
        print(f"{step:58s} outside PyTorch {out:9.1f} MiB  PyTorch reserved {res:8.1f} MiB  te plans {n}", flush=True)

    torch.zeros(1, device="cuda")
    note("start (CUDA context, torch)")
    shapes = [(2, 32, 8, 4096), (1, 32, 8, 8192), (2, 16, 16, 2048), (1, 64, 8, 8192)]
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")

    def run(b, h, hg, s, dtype=torch.bfloat16):
        q = torch.randn(b, s, h, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, hg, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        out, aux = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, q.dtype, None, **kw)
        tc.fused_attn_bwd(s, s, None, None, q, k, v, out, out, q.dtype, aux, None, **kw)

    for shp in shapes:
        run(*shp)
    note(f"te_cudnn fwd+bwd, {len(shapes)} shapes, heuristic plans")
    with autotuning(True):
        for shp in shapes:
            run(*shp)
    note("the same keys autotuned")
    from te_cudnn.benchmark.cases import Case  # noqa: PLC0415
    from te_cudnn.benchmark.contenders import select_contenders  # noqa: PLC0415
    from te_cudnn.benchmark.inputs import make_inputs  # noqa: PLC0415

    case = Case(name="fp8_b1_h64_s8k", group="fp8", b=1, h=64, hg=8, d=128, sq=8192, skv=8192, mask="causal",
                layout="bshd_bshd_bshd", training=True)  # fmt: skip
    inputs = make_inputs(case)
    fp8 = select_contenders("te_cudnn fp8 autotuned")[0]
    r = fp8.prepare(case, inputs)
    r.first()
    r.fwd_bwd()
    del r
    inputs.release()
    note("FP8 b=1 h=64 8K causal fwd+bwd autotuned (backward splits)")
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    for b, h, hg, s in shapes:
        q = torch.randn(b, h, s, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, hg, s, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
    note("torch SDPA cuDNN fwd+bwd on the same shapes")
    tc.plan_cache.clear()
    tc.ops.forget_prepared()
    note("te_cudnn plan cache cleared, prepared calls forgotten")
    tc.release_workspaces()
    note("te_cudnn workspaces released")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
