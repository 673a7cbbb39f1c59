"""Shared pieces of the CPU plan-store and CLI tests: machine facts and plan keys from sizes."""

from __future__ import annotations

from typing import Any

import torch

from te_cudnn.backends.base import Direction
from te_cudnn.config import AttnConfig, describe_shapes
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.plans import PlanKey, make_key
from te_cudnn.plans.store import PLAN_FORMAT_VERSION

#: Machine facts as ``te_cudnn.plans.cache._machine_facts`` gives them on an H100.
FACTS = {"gpu": "NVIDIA H100 80GB HBM3", "sm": 90, "sm_count": 132, "cudnn": 91900, "frontend": "1.32.0",
         "te_cudnn": "0.1.0", "plan_format": PLAN_FORMAT_VERSION}  # fmt: skip


def sizes_config(**over: Any) -> AttnConfig:
    """A bf16 causal bshd config (b=2, h=16, s=512, d=64) with ``over`` replacing any field."""
    a: dict[str, Any] = dict(
        is_training=True, dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias",
        attn_mask_type="causal", softmax_type="vanilla", dropout=0.0, num_attn_heads=16, num_gqa_groups=16,
        max_seqlen_q=512, max_seqlen_kv=512, head_dim_qk=64, head_dim_v=64, window_size=(-1, -1), batch_size=2, device=0,
    )  # fmt: skip
    a.update(over)
    return describe_shapes(**a)


def sizes_key(direction: Direction = Direction.FWD, **over: Any) -> PlanKey:
    return make_key(FusedAttnBackend.F16_arbitrary_seqlen, direction, sizes_config(**over), 91900, "1.32.0")
