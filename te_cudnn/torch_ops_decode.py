"""``te_cudnn::decode`` (``te_cudnn.torch_ops``): :func:`te_cudnn.fused_attn_decode` as a custom
operator (forward only, no autograd), what it traces to under torch.compile; its implementation
and fake."""

import torch

from .decode import fused_attn_decode


def _decode_impl(q, k_cache, v_cache, cache_seqlens, page_table, attn_scale, window_left):
    """``te_cudnn::decode``: :func:`te_cudnn.fused_attn_decode` into a fresh contiguous O (the
    fake's strides, whatever q's), returning ``(out, softmax_lse)``."""
    b, sq, h = q.shape[:3]
    out = torch.empty((b, sq, h, v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    window = (-1, -1) if window_left < 0 else (window_left, 0)
    _, lse = fused_attn_decode(q, k_cache, v_cache, cache_seqlens, page_table, attn_scale=attn_scale,
                               window_size=window, out=out, return_softmax_lse=True)  # fmt: skip
    return out, lse


def _decode_fake(q, k_cache, v_cache, cache_seqlens, page_table, attn_scale, window_left):
    b, sq, h = q.shape[:3]
    return q.new_empty((b, sq, h, v_cache.shape[-1])), q.new_empty((b, h, sq, 1), dtype=torch.float32)
