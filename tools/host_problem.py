"""The benchmark's host problem, set up once for the host-path probes.

b=1, h=1, s=64, d=64, bf16, bshd, no mask, forward (``te_cudnn.benchmark.runner.host_section``):
q, k, v, the int32 ``cu_seqlens``, the call's keywords, and te_cudnn's prepared call and plan
after one call (``probe_host_breakdown.py``, ``probe_host_api_calls.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

import te_cudnn as tc
from te_cudnn import ops

B, H, D = 1, 1, 64


@dataclass
class HostProblem:
    s: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu: torch.Tensor
    kw: dict
    out: torch.Tensor  # the first call's O and softmax stats
    stats: torch.Tensor
    prep: Any  # te_cudnn's prepared call (ops._Prepared)
    plan: Any  # its cached plan (CompiledPlan)

    def fwd(self, **extra: Any) -> Any:
        """``fused_attn_fwd`` of the problem (time your own lambda: this adds a frame)."""
        s = self.s
        return tc.fused_attn_fwd(False, s, s, self.cu, self.cu, self.q, self.k, self.v, self.q.dtype, None, **self.kw,
                                 **extra)  # fmt: skip


def host_problem(s: int = 64, seed: int = 0) -> HostProblem:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, s, H, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, (B + 1) * s, s, dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
    out, aux = tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    prep = next(p for p in ops._fwd_memo.values() if p.cfg.sq == s and p.cfg.h == H and p.cfg.b == B)
    return HostProblem(s, q, k, v, cu, kw, out, aux[0], prep, prep.get_plan())
