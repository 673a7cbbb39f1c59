"""A call described from sizes alone (:func:`describe_shapes`): tensors laid out as the layout
names them, for :func:`te_cudnn.explain` / :func:`te_cudnn.get_fused_attn_backend` and for
building and validating graphs without tensors."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from ..enums import AttnBiasType, AttnMaskType, QKVFormat, QKVLayout, SoftmaxType
from ..layouts import layout_info, layout_strides
from ..ragged import bucket_batch, bucket_q_seqlen, bucket_seqlen, bucket_tokens
from .checks import _scalar, _value, _window
from .description import F16_DTYPES, FP8_DTYPES, AttnConfig
from .geometry import aligned_contiguous_strides


def _bias_shape(bias_shape: Any, b: int, h: int, sq: int, skv: int) -> tuple[int, ...]:
    """The bias shape a sizes-only description names: [1 or b, 1 or h, 1 or sq, skv] (default 1hss)."""
    if bias_shape is None:
        return (1, h, sq, skv)
    if not isinstance(bias_shape, (tuple, list)) or any(isinstance(n, bool) or not isinstance(n, int) for n in bias_shape):
        raise TypeError(f"bias_shape must be a sequence of 4 ints, got {_value(bias_shape)}")
    shape = tuple(bias_shape)
    if len(shape) != 4 or shape[0] not in (1, b) or shape[1] not in (1, h) or shape[2] not in (1, sq) or shape[3] != skv:
        raise ValueError(f"bias_shape={list(shape)}; expected [1 or b, 1 or h, 1 or sq, skv] = [1|{b}, 1|{h}, 1|{sq}, {skv}]")
    return shape


def _attn_scale(attn_scale: Any, d_qk: int) -> float:
    """``attn_scale``, default ``1 / sqrt(d_qk)``; a finite number."""
    if attn_scale is None:
        return 1.0 / math.sqrt(d_qk)
    attn_scale = _scalar("attn_scale", attn_scale, float)
    if not math.isfinite(attn_scale):
        raise ValueError(f"attn_scale={attn_scale} must be finite")
    return attn_scale


def describe_shapes(
    *,
    is_training: bool,
    dtype: torch.dtype,
    qkv_layout: Any,
    attn_bias_type: Any,
    attn_mask_type: Any,
    softmax_type: Any,
    dropout: float,
    num_attn_heads: int,
    num_gqa_groups: int,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    head_dim_qk: int,
    head_dim_v: int,
    window_size: tuple[int, int],
    deterministic: bool = False,
    batch_size: int = 1,
    bias_shape: Optional[Sequence[int]] = None,
    attn_scale: Optional[float] = None,
    device: int = -1,
    return_max_logit: bool = False,
    cuda_graph: bool = False,
) -> AttnConfig:
    """Describe a call from sizes alone (tensors laid out as ``qkv_layout`` names them).

    Used by :func:`te_cudnn.get_fused_attn_backend` / :func:`te_cudnn.explain` and to build
    and validate graphs without tensors. Malformed sizes raise ``ValueError``.
    """

    layout = QKVLayout.coerce(qkv_layout, argument="qkv_layout")
    info = layout_info(layout)
    if layout.value >= 15:
        raise ValueError(f"qkv_layout={layout.name}: sizes-only descriptions cover the 15 core layouts")
    if not isinstance(dtype, torch.dtype) or dtype not in F16_DTYPES + FP8_DTYPES:
        raise TypeError(f"q_dtype={dtype if isinstance(dtype, torch.dtype) else _value(dtype)}: fused attention takes "
                        "torch.float16, torch.bfloat16, torch.float8_e4m3fn or torch.float8_e5m2")  # fmt: skip
    for name, flag in (("is_training", is_training), ("deterministic", deterministic),
                       ("return_max_logit", return_max_logit), ("cuda_graph", cuda_graph)):  # fmt: skip
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {_value(flag)}")
    ragged = info.q_format == QKVFormat.thd
    b, h, hg = (_scalar(n, x, int) for n, x in (("batch_size", batch_size), ("num_attn_heads", num_attn_heads), ("num_gqa_groups", num_gqa_groups)))
    sq, skv = _scalar("max_seqlen_q", max_seqlen_q, int), _scalar("max_seqlen_kv", max_seqlen_kv, int)
    d_qk, d_v = _scalar("head_dim_qk", head_dim_qk, int), _scalar("head_dim_v", head_dim_v, int)
    for name, value in (("num_attn_heads", h), ("num_gqa_groups", hg), ("head_dim_qk", d_qk), ("head_dim_v", d_v)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    for name, value in (("batch_size", b), ("max_seqlen_q", sq), ("max_seqlen_kv", skv)):
        if value < 0:
            raise ValueError(f"{name}={value} must be >= 0 (0 describes an empty call)")
    empty = 0 in (b, sq, skv)
    if h % hg:
        raise ValueError(f"num_gqa_groups={hg} does not divide num_attn_heads={h}")
    if (info.packs_qkv or info.packs_kv) and d_qk != d_v:
        raise ValueError(f"qkv_layout={layout.name} packs k and v, so head_dim_qk={d_qk} must equal head_dim_v={d_v}")
    if info.packs_qkv and (sq != skv or h != hg):
        raise ValueError(
            f"qkv_layout={layout.name} packs q, k and v, so it needs max_seqlen_q == max_seqlen_kv and num_attn_heads == "
            f"num_gqa_groups, got {sq}, {skv} and {h}, {hg}"
        )
    mask = AttnMaskType.coerce(attn_mask_type, argument="attn_mask_type")
    bias_type = AttnBiasType.coerce(attn_bias_type, argument="attn_bias_type")
    if bias_type in (AttnBiasType.post_scale_bias, AttnBiasType.pre_scale_bias):
        shape = _bias_shape(bias_shape, b, h, sq, skv)
        stride = aligned_contiguous_strides(shape, torch.empty((), dtype=dtype).element_size())  # a contiguous
        copy = stride[-2] != shape[-1]  # bias whose rows are not 16-byte multiples is copied into this buffer
    else:
        shape = stride = None
        copy = False
    total_q, total_kv = b * sq, b * skv  # THD token counts assumed from the sizes
    if ragged:  # graph sizes are buckets; see te_cudnn.ragged
        b, sq, skv = bucket_batch(b), bucket_q_seqlen(sq), bucket_seqlen(skv)
    st = layout_strides(layout, b, h, hg, sq, skv, d_qk, d_v)
    dropout = _scalar("dropout", dropout, float)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout={dropout} must be in [0, 1)")
    if dropout > 0 and not is_training:
        raise ValueError(f"dropout={dropout} during inference (is_training=False); dropout must be 0 in inference")
    return AttnConfig(
        dtype=dtype, layout=layout, b=b, h=h, hg=hg, sq=sq, skv=skv, d_qk=d_qk, d_v=d_v,
        q_stride=st["q"], k_stride=st["k"], v_stride=st["v"], o_stride=st["o"],
        mask=mask, bias_type=bias_type, bias_shape=shape, bias_stride=stride, bias_copy=copy,
        softmax_type=SoftmaxType.coerce(softmax_type, argument="softmax_type"),
        dropout=dropout, is_training=bool(is_training), window=_window(window_size, mask),
        bottom_right_diagonal=mask.is_bottom_right,
        attn_scale=_attn_scale(attn_scale, d_qk), deterministic=deterministic, device=device,
        ragged_q=ragged, ragged_kv=ragged,
        max_total_q=bucket_tokens(total_q) if ragged else 0, max_total_kv=bucket_tokens(total_kv) if ragged else 0,
        stats_stride=(sq * h, 1, h, 1) if ragged else (h * sq, sq, 1, 1),
        grad_strides=(st["q"], st["k"], st["v"]), empty=empty, return_max_logit=return_max_logit,
        cuda_graph=cuda_graph,
    )  # fmt: skip
