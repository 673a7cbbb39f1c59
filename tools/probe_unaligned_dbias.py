"""Probe (GPU): which post-scale bias / dBias strides cuDNN 9.19's SDPA backward takes when skv is
not a multiple of 8 (bf16 rows that are not 16-byte multiples). Builds the backward graph in a
few variants and prints whether cuDNN planned it.

    python tools/probe_unaligned_dbias.py
"""

from __future__ import annotations

from dataclasses import replace

import torch

from te_cudnn.backends import REGISTRY, Direction
from te_cudnn.backends import f16_arbitrary
from te_cudnn.config import AttnConfig, aligned_contiguous_strides, describe_shapes
from te_cudnn.plans import handle_for
from te_cudnn.plans.cache import build_plan


def _cfg(skv: int, bias_stride) -> AttnConfig:
    cfg = describe_shapes(is_training=True, dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd",
                          attn_bias_type="post_scale_bias", attn_mask_type="no_mask", softmax_type="vanilla",
                          dropout=0.0, num_attn_heads=4, num_gqa_groups=4, max_seqlen_q=64, max_seqlen_kv=skv,
                          head_dim_qk=64, head_dim_v=64, window_size=(-1, -1), batch_size=2,
                          bias_shape=(1, 4, 64, skv), device=0)  # fmt: skip
    return replace(cfg, bias_stride=bias_stride)


def _try(name: str, cfg: AttnConfig, dbias_strides=None, no_dbias=False) -> None:
    saved_strides, saved_prop = f16_arbitrary.aligned_contiguous_strides, AttnConfig.has_dbias
    try:
        if dbias_strides is not None:
            f16_arbitrary.aligned_contiguous_strides = lambda shape, esize: dbias_strides
        if no_dbias:
            AttnConfig.has_dbias = property(lambda self: False)
        plan = build_plan(name, lambda: REGISTRY[0].build(cfg, Direction.BWD, handle_for(0)))
        print(f"{name}: planned ({plan.plan_name})")
    except Exception as exc:  # the probe reports cuDNN's answer
        print(f"{name}: declined ({type(exc).__name__})")
    finally:
        f16_arbitrary.aligned_contiguous_strides, AttnConfig.has_dbias = saved_strides, saved_prop


def main() -> None:
    skv = 100
    padded = aligned_contiguous_strides((1, 4, 64, skv), 2)
    contiguous = (4 * 64 * skv, 64 * skv, skv, 1)
    _try("skv=100 padded bias, padded dBias", _cfg(skv, padded))
    _try("skv=100 padded bias, contiguous dBias", _cfg(skv, padded), dbias_strides=contiguous)
    _try("skv=100 contiguous bias, contiguous dBias", _cfg(skv, contiguous), dbias_strides=contiguous)
    _try("skv=100 padded bias, no dBias", _cfg(skv, padded), no_dbias=True)
    _try("skv=100 contiguous bias, no dBias", _cfg(skv, contiguous), no_dbias=True)
    for s in (96, 104, 112, 128):
        _try(f"skv={s} contiguous bias, contiguous dBias", _cfg(s, aligned_contiguous_strides((1, 4, 64, s), 2)))
    cfg = describe_shapes(is_training=True, dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias",
                          attn_mask_type="no_mask", softmax_type="vanilla", dropout=0.0, num_attn_heads=4,
                          num_gqa_groups=4, max_seqlen_q=64, max_seqlen_kv=skv, head_dim_qk=64, head_dim_v=64,
                          window_size=(-1, -1), batch_size=2, device=0)  # fmt: skip
    _try("skv=100 no bias", cfg)


if __name__ == "__main__":
    main()
