"""Probe (GPU): does cuDNN's SDPA graph take a post-scale bias broadcast over queries ([1, 1, 1, skv],
TE's "111s"), forward and backward without dBias? te_cudnn declines it today; this measures
whether it could be served. Prints one line per direction: built (engine) / declined (why), and
the forward's relative error against the fp32 reference. (Measured on H100, cuDNN 9.19: both
plan; the forward is right, 2.1e-3; the backward, run by tests/test_reliability_gpu.py, gave dQ
with relative error 0.78, so te_cudnn serves 111s in inference only.)

    python tools/probe_bias_111s.py
"""

from __future__ import annotations

from dataclasses import replace

import torch

from te_cudnn.backends import REGISTRY, Direction
from te_cudnn.config import describe_shapes
from te_cudnn.plans import handle_for
from te_cudnn.plans.cache import build_plan
from te_cudnn.reference import attention_reference
from te_cudnn.testing import rel_error


def main() -> None:
    b, h, s, d = 2, 4, 128, 64
    base = describe_shapes(is_training=True, dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd",
                           attn_bias_type="post_scale_bias", attn_mask_type="no_mask", softmax_type="vanilla",
                           dropout=0.0, num_attn_heads=h, num_gqa_groups=h, max_seqlen_q=s, max_seqlen_kv=s,
                           head_dim_qk=d, head_dim_v=d, window_size=(-1, -1), batch_size=b, bias_shape=(1, 1, s, s),
                           device=0)  # fmt: skip
    cfg = replace(base, bias_shape=(1, 1, 1, s), bias_stride=(s, s, s, 1))
    backend = REGISTRY[0]
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(1, 1, 1, s, device="cuda", dtype=torch.bfloat16)
    for direction in Direction:
        try:
            plan = build_plan(f"probe-111s-{direction.value}", lambda: backend.build(cfg, direction, handle_for(0)))
        except Exception as exc:  # the probe reports cuDNN's answer
            print(f"111s {direction.value}: declined: {str(exc).splitlines()[0][:300]}")
            continue
        line = f"111s {direction.value}: built ({plan.plan_name})"
        if direction == Direction.FWD:
            out = torch.empty_like(q)
            stats = torch.empty(b, h, s, 1, device="cuda", dtype=torch.float32)
            ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
            plan.graph.execute(dict(zip(plan.uids, [q, k, v, out, stats, bias])), ws, handle=handle_for(0))
            ref = attention_reference(*(t.permute(0, 2, 1, 3).float() for t in (q, k, v)), attn_mask_type="no_mask",
                                      attn_bias_type="post_scale_bias", attn_bias=bias.float())  # fmt: skip
            line += f", rel. error of O vs fp32: {rel_error(out.permute(0, 2, 1, 3), ref.out):.2e}"
        print(line)


if __name__ == "__main__":
    main()
