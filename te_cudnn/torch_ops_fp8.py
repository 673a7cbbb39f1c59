"""``te_cudnn::fp8_fwd`` / ``te_cudnn::fp8_bwd`` (``te_cudnn.torch_ops``): FP8 attention in a
higher-precision model, casts and fused kernels in one op; their implementations, fakes and the
autograd formula of ``fp8_fwd`` (registered in ``te_cudnn.torch_ops``)."""

import torch

from .enums import META_DO, META_DQKV, META_O, META_QKV
from .fp8 import Fp8Table, bwd_kwargs, dequantize, fwd_kwargs, quantize
from .ops import fused_attn_bwd, fused_attn_fwd
from .torch_ops_fwd_bwd import _zero_rng
from .torch_ops_shapes import _stats_like, _unpacked


def _fp8_fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_kv, fwd_scale, fwd_scale_inv, fwd_amax_history, fwd_format,
                  bwd_scale, bwd_scale_inv, bwd_amax_history, bwd_format, max_seqlen_q, max_seqlen_kv, qkv_layout,
                  attn_mask_type, attn_scale, backend, deterministic):  # fmt: skip
    """The bwd_* tables are not read here: they travel to the backward (register_autograd).
    Functional: this step's amax row comes back as a result (``fp8_attention`` folds it into
    the history): an op with an autograd formula must be functional."""
    row = fwd_amax_history[0].clone()
    table = Fp8Table(fwd_scale, fwd_scale_inv, row.unsqueeze(0))
    q8, k8, v8 = (quantize(t, table, META_QKV, fwd_format) for t in (q, k, v))
    o8, aux = fused_attn_fwd(
        True, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q8, k8, v8, q8.dtype, backend,
        attn_scale=attn_scale, qkv_layout=_unpacked(qkv_layout), attn_mask_type=attn_mask_type, **fwd_kwargs(table),
    )  # fmt: skip
    return dequantize(o8, table, META_O).to(q.dtype), q8, k8, v8, o8, aux[0], row


def _fp8_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, fwd_scale, fwd_scale_inv, fwd_amax_history, fwd_format,
                  bwd_scale, bwd_scale_inv, bwd_amax_history, bwd_format, max_seqlen_q, max_seqlen_kv, qkv_layout,
                  attn_mask_type, attn_scale, backend, deterministic):  # fmt: skip
    out_shape = (*q.shape[:-1], v.shape[-1])
    q8, k8, v8 = (torch.empty_like(t, dtype=fwd_format) for t in (q, k, v))
    return (q.new_empty(out_shape), q8, k8, v8, q.new_empty(out_shape, dtype=fwd_format),
            _stats_like(q, k, qkv_layout, None), fwd_amax_history.new_empty(fwd_amax_history.shape[1:]))  # fmt: skip


def _fp8_bwd_impl(d_out, q8, k8, v8, o8, stats, cu_seqlens_q, cu_seqlens_kv, fwd_scale, fwd_scale_inv, bwd_scale,
                  bwd_scale_inv, bwd_amax_history, bwd_format, out_dtype, max_seqlen_q, max_seqlen_kv, qkv_layout,
                  attn_mask_type, attn_scale, backend, deterministic):  # fmt: skip
    fwd = Fp8Table(fwd_scale, fwd_scale_inv, None)  # the backward reads the forward's scales only
    row = bwd_amax_history[0].clone()
    bwd = Fp8Table(bwd_scale, bwd_scale_inv, row.unsqueeze(0))
    d_o8 = quantize(d_out, bwd, META_DO, bwd_format)
    dq8, dk8, dv8, _, _ = fused_attn_bwd(
        max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q8, k8, v8, o8, d_o8, q8.dtype,
        [stats, _zero_rng(q8.device)], backend, attn_scale=attn_scale, qkv_layout=_unpacked(qkv_layout),
        attn_mask_type=attn_mask_type, deterministic=deterministic, **bwd_kwargs(fwd, bwd),
    )  # fmt: skip
    return (*(dequantize(g, bwd, META_DQKV).to(out_dtype).contiguous() for g in (dq8, dk8, dv8)), row)


def _fp8_bwd_fake(d_out, q8, k8, v8, o8, stats, cu_seqlens_q, cu_seqlens_kv, fwd_scale, fwd_scale_inv, bwd_scale,
                  bwd_scale_inv, bwd_amax_history, bwd_format, out_dtype, max_seqlen_q, max_seqlen_kv, qkv_layout,
                  attn_mask_type, attn_scale, backend, deterministic):  # fmt: skip
    row = bwd_amax_history.new_empty(bwd_amax_history.shape[1:])
    return (*(t.new_empty(t.shape, dtype=out_dtype) for t in (q8, k8, v8)), row)


def _fp8_fwd_setup(ctx, inputs, output):
    q, _k, _v, cu_q, cu_kv, f_scale, f_scale_inv, _f_amax, _f_fmt, b_scale, b_scale_inv, b_amax, b_fmt, *opts = inputs
    _out, q8, k8, v8, o8, stats, row = output
    ctx.save_for_backward(q8, k8, v8, o8, stats, cu_q, cu_kv, f_scale, f_scale_inv, b_scale, b_scale_inv, b_amax)
    ctx.mark_non_differentiable(q8, k8, v8, o8, stats, row)
    ctx.out_dtype, ctx.bwd_format, ctx.opts = q.dtype, b_fmt, opts


def _fp8_fwd_backward(ctx, d_out, *_unused):
    q8, k8, v8, o8, stats, cu_q, cu_kv, f_scale, f_scale_inv, b_scale, b_scale_inv, b_amax = ctx.saved_tensors
    dq, dk, dv, row = torch.ops.te_cudnn.fp8_bwd(
        d_out.contiguous(), q8, k8, v8, o8, stats, cu_q, cu_kv, f_scale, f_scale_inv, b_scale, b_scale_inv, b_amax,
        ctx.bwd_format, ctx.out_dtype, *ctx.opts,
    )  # fmt: skip
    b_amax[0].copy_(row)  # this step's dO, dP, dQKV amaxes, as the direct path writes them
    return (dq, dk, dv) + (None,) * (13 + len(ctx.opts) - 3)

