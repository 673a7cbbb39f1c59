"""A stand-in for ``te_cudnn.autograd.attend`` that records what a front door hands it.

The SDPA drop-in and the Hugging Face function translate their arguments into one ``attend``
call; tests replace ``te_cudnn.sdpa.attend`` with :class:`AttendRecorder` to inspect that call
(tensors, options). It computes nothing: it returns a tensor of the output's shape filled with
``fill`` and stands in for no cuDNN result.
"""

from __future__ import annotations

import torch


class AttendRecorder:
    def __init__(self, fill: float = 1.0):
        self.calls: list[tuple[tuple, dict]] = []
        self.fill = fill

    def __call__(self, q, k, v, attn_bias, cu_q, cu_kv, max_q, max_kv, is_training, rng_gen, opts, *_, **extra):
        # what the door asked for, as fused_attention's keyword options (those that differ from
        # the defaults, besides the ones every call sets)
        kw = {"attn_bias": attn_bias, "is_training": is_training, "qkv_layout": opts.qkv_layout,
              "attn_mask_type": opts.attn_mask_type, "attn_scale": opts.attn_scale, "dropout": opts.dropout}
        if opts.attn_bias_type != "no_bias":
            kw["attn_bias_type"] = opts.attn_bias_type
        if opts.window_size != (-1, -1):
            kw["window_size"] = opts.window_size
        if opts.softmax_type != "vanilla":
            kw["softmax_type"], kw["softmax_offset"] = opts.softmax_type, extra.get("softmax_offset")
        self.calls.append(((q, k, v), kw))
        b, s, h, _ = q.shape
        return torch.full((b, s, h, v.shape[-1]), self.fill, dtype=q.dtype)

    @property
    def last(self):
        return self.calls[-1]
