"""``FusedAttnFunc``: a thin ``torch.autograd.Function`` over fused_attn_fwd / fused_attn_bwd.

The forward picks the sub-backend once and the backward reuses it (PyTorch only lets us
decide during the forward). Only tensors are saved; the options travel as one frozen
:class:`AttnOptions`. The output gradient is used as-is when cuDNN can read it (unit-stride
last dim, 16-byte aligned strides) and made contiguous otherwise, since autograd may hand
over expanded or transposed gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .enums import FusedAttnBackend
from .ops import fused_attn_bwd, fused_attn_fwd

__all__ = ["AttnOptions", "FusedAttnFunc", "fused_attention", "Fp8FusedAttnFunc", "fp8_attention"]


@dataclass(frozen=True)
class AttnOptions:
    """The non-tensor arguments shared by the forward and the backward."""

    qkv_layout: str = "bshd_bshd_bshd"
    attn_mask_type: str = "no_mask"
    attn_bias_type: str = "no_bias"
    attn_scale: Optional[float] = None
    dropout: float = 0.0
    window_size: tuple[int, int] = (-1, -1)
    bottom_right_diagonal: Optional[bool] = None
    deterministic: bool = False
    fused_attention_backend: Optional[FusedAttnBackend] = None
    softmax_type: str = "vanilla"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def _readable_grad(g: torch.Tensor) -> torch.Tensor:
    esize = g.element_size()
    if g.stride(-1) == 1 and all(s * esize % 16 == 0 for n, s in zip(g.shape[:-1], g.stride()[:-1]) if n > 1):
        return g
    return g.contiguous()


class FusedAttnFunc(torch.autograd.Function):
    """``out = FusedAttnFunc.apply(is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q,
    cu_seqlens_kv, q, k, v, attn_bias, rng_gen, options)``; differentiable in q, k, v and a
    post-scale ``attn_bias`` (when cuDNN produces dBias)."""

    @staticmethod
    def forward(ctx, is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, attn_bias, rng_gen, options):
        out, aux = fused_attn_fwd(
            is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, q.dtype,
            options.fused_attention_backend, attn_bias=attn_bias, attn_scale=options.attn_scale,
            dropout=options.dropout, qkv_layout=options.qkv_layout, attn_bias_type=options.attn_bias_type,
            attn_mask_type=options.attn_mask_type, softmax_type=options.softmax_type,
            window_size=options.window_size, bottom_right_diagonal=options.bottom_right_diagonal, rng_gen=rng_gen,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, cu_seqlens_q, cu_seqlens_kv, *aux)
        ctx.max_seqlens = (max_seqlen_q, max_seqlen_kv)
        ctx.options = options
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, cu_q, cu_kv, *aux = ctx.saved_tensors
        o = ctx.options
        dq, dk, dv, dbias = fused_attn_bwd(
            *ctx.max_seqlens, cu_q, cu_kv, q, k, v, out, _readable_grad(d_out), q.dtype, aux,
            o.fused_attention_backend, attn_scale=o.attn_scale, dropout=o.dropout, qkv_layout=o.qkv_layout,
            attn_bias_type=o.attn_bias_type, attn_mask_type=o.attn_mask_type, softmax_type=o.softmax_type,
            window_size=o.window_size, bottom_right_diagonal=o.bottom_right_diagonal, deterministic=o.deterministic,
        )  # fmt: skip
        return None, None, None, None, None, dq, dk, dv, dbias, None, None


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_bias: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    rng_gen: Optional[torch.Generator] = None,
    is_training: Optional[bool] = None,
    **options: Any,
) -> torch.Tensor:
    """Differentiable fused attention with keyword options (see :class:`AttnOptions`).

    Sequence lengths are read off q and k for the layout's format; ``is_training`` defaults
    to ``torch.is_grad_enabled()``.
    """
    opts = AttnOptions(**options)
    from .enums import QKVFormat, QKVLayout  # noqa: PLC0415
    from .layouts import layout_info  # noqa: PLC0415

    info = layout_info(QKVLayout.coerce(opts.qkv_layout, argument="qkv_layout"))
    s_dim = 0 if info.q_format == QKVFormat.sbhd else 1
    if is_training is None:
        is_training = torch.is_grad_enabled()
    return FusedAttnFunc.apply(
        is_training, q.shape[s_dim], k.shape[s_dim], cu_seqlens_q, cu_seqlens_kv, q, k, v, attn_bias, rng_gen, opts
    )


class Fp8FusedAttnFunc(torch.autograd.Function):
    """FP8 attention inside a higher-precision model: q, k, v (fp16/bf16) are cast to FP8 with
    ``meta``'s QKV scale, the fused FP8 kernels run, and O and the gradients come back
    dequantized in the inputs' dtype (straight-through for the casts). ``meta`` is an
    :class:`te_cudnn.fp8.Fp8AttentionMeta`; call its ``update()`` once per training step."""

    @staticmethod
    def forward(ctx, q, k, v, meta, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, options):
        q8, k8, v8 = (meta.quantize(t, "qkv") for t in (q, k, v))
        out8, aux = fused_attn_fwd(
            True, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q8, k8, v8, q8.dtype,
            options.fused_attention_backend, attn_scale=options.attn_scale, qkv_layout=options.qkv_layout,
            attn_mask_type=options.attn_mask_type, **meta.fwd_kwargs(),
        )  # fmt: skip
        ctx.save_for_backward(q8, k8, v8, out8, cu_seqlens_q, cu_seqlens_kv, *aux)
        ctx.meta, ctx.options, ctx.max_seqlens, ctx.dtype = meta, options, (max_seqlen_q, max_seqlen_kv), q.dtype
        return meta.dequantize(out8, "o").to(q.dtype)

    @staticmethod
    def backward(ctx, d_out):
        q8, k8, v8, out8, cu_q, cu_kv, *aux = ctx.saved_tensors
        meta, o = ctx.meta, ctx.options
        d_o8 = meta.quantize(_readable_grad(d_out), "do")
        dq8, dk8, dv8, _ = fused_attn_bwd(
            *ctx.max_seqlens, cu_q, cu_kv, q8, k8, v8, out8, d_o8, q8.dtype, aux, o.fused_attention_backend,
            attn_scale=o.attn_scale, qkv_layout=o.qkv_layout, attn_mask_type=o.attn_mask_type,
            deterministic=o.deterministic, **meta.bwd_kwargs(),
        )  # fmt: skip
        grads = (meta.dequantize(g, "dqkv").to(ctx.dtype) for g in (dq8, dk8, dv8))
        return (*grads, None, None, None, None, None, None)


def fp8_attention(q, k, v, meta, *, cu_seqlens_q=None, cu_seqlens_kv=None, **options: Any) -> torch.Tensor:
    """Differentiable FP8 fused attention for fp16/bf16 q, k, v (see :class:`Fp8FusedAttnFunc`)."""
    opts = AttnOptions(**options)
    from .enums import QKVFormat, QKVLayout  # noqa: PLC0415
    from .layouts import layout_info  # noqa: PLC0415

    info = layout_info(QKVLayout.coerce(opts.qkv_layout, argument="qkv_layout"))
    s_dim = 0 if info.q_format == QKVFormat.sbhd else 1
    return Fp8FusedAttnFunc.apply(q, k, v, meta, q.shape[s_dim], k.shape[s_dim], cu_seqlens_q, cu_seqlens_kv, opts)
