"""The :class:`AttnConfig` dataclass: a validated fused-attention call (built by
te_cudnn.config's ``describe_*`` functions), and the dtypes fused attention takes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from ..enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType


F16_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = tuple(d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d)


@dataclass(frozen=True)
class AttnConfig:
    """A validated fused-attention call. Dims are logical BHSD; strides are in elements."""

    dtype: torch.dtype
    layout: QKVLayout
    b: int
    h: int
    hg: int
    sq: int
    skv: int
    d_qk: int
    d_v: int
    q_stride: tuple[int, ...]
    k_stride: tuple[int, ...]
    v_stride: tuple[int, ...]
    o_stride: tuple[int, ...]
    mask: AttnMaskType
    bias_type: AttnBiasType
    bias_shape: Optional[tuple[int, ...]]
    bias_stride: Optional[tuple[int, ...]]
    softmax_type: SoftmaxType
    dropout: float
    is_training: bool
    window: tuple[int, int]
    bottom_right_diagonal: bool
    attn_scale: float
    deterministic: bool
    device: int  # CUDA device index; -1 for CPU/meta tensors (describe and validate only)
    do_stride: Optional[tuple[int, ...]] = None  # backward only
    # Variable-length (THD) sides: b, sq/skv above are then buckets (see te_cudnn.ragged), the
    # batch stride is a placeholder and ragged offsets address the tokens.
    ragged_q: bool = False
    ragged_kv: bool = False
    max_total_q: int = 0  # token-capacity bucket of a ragged q side
    max_total_kv: int = 0
    stats_stride: tuple[int, ...] = ()
    grad_strides: tuple[tuple[int, ...], ...] = ()  # dq, dk, dv as allocated, BHSD
    # Paged KV cache: (num_pages, page_size, max_pages_per_seq); k/v strides are the caches'
    # ([num_pages, hg, page_size, d] in BHSD order) and skv is max_seqlen_kv.
    paged: Optional[tuple[int, int, int]] = None
    do_dtype: Optional[torch.dtype] = None  # backward: dO (and, for FP8, dQ/dK/dV) dtype when it differs
    # backward: aux_ctx_tensors[0] is the full softmax S [b, h, sq, skv] a max512 forward saved
    # (io dtype), not the fp32 softmax stats the flash sub-backends save
    saved_softmax: bool = False
    # A zero-size call (a batch, sequence, token count or max_seqlen of 0): answered without
    # cuDNN (see te_cudnn.empty); such a configuration never reaches a graph.
    empty: bool = False
    # The caller's post-scale bias has strides (or a start address) cuDNN cannot take: it is
    # copied into an aligned buffer with ``bias_stride`` (the one place the fused path copies).
    bias_copy: bool = False
    # Forward: also output the per-row maximum logit (TE 2.x ``return_max_logit``, for QK-clip).
    return_max_logit: bool = False
    # TE 2.x ``cuda_graph``: the call runs in a CUDA graph. Changes eligibility only (cuDNN bug
    # workarounds), never the graph; plan keys drop it.
    cuda_graph: bool = False
    # Forward: cuDNN writes the softmax stats. False for a call whose caller takes no stats (no
    # backward follows: ``fused_attn_fwd(softmax_stats=False)``, the doors without a gradient).
    writes_stats: bool = True

    @property
    def is_ragged(self) -> bool:
        return self.ragged_q or self.ragged_kv

    @property
    def is_gqa(self) -> bool:
        return self.h != self.hg

    @property
    def has_window(self) -> bool:
        """A band beyond what the mask itself implies (left bound set, or right > 0)."""
        return self.window[0] >= 0 or self.window[1] > 0

    @property
    def has_dropout(self) -> bool:
        return self.is_training and self.dropout > 0.0

    @property
    def has_sink(self) -> bool:
        """A sink logit in the softmax denominator (off_by_one: 0, learnable: the offset)."""
        return self.softmax_type != SoftmaxType.vanilla

    @property
    def has_dsink(self) -> bool:
        """The backward produces d_softmax_offset (learnable sinks only)."""
        return self.softmax_type == SoftmaxType.learnable

    @property
    def dsink_in_graph(self) -> bool:
        """cuDNN's backward graph computes d_softmax_offset (``dSink_token``) itself. Only for THD
        and FP8: for dense F16 tensors te_cudnn computes it after the graph (te_cudnn.sink_grad:
        cuDNN 9.19's in-graph dSink slows the backward and is not bit-reproducible under
        ``deterministic=True``)."""
        return self.has_dsink and (self.ragged_q or self.dtype in FP8_DTYPES)

    @property
    def has_dbias(self) -> bool:
        """cuDNN produces dBias unless the bias broadcasts over b, h and sq (TE's 111s rule)."""
        return self.bias_type == AttnBiasType.post_scale_bias and self.bias_shape is not None and self.bias_shape[:3] != (1, 1, 1)

    def for_backward(self, do_stride: tuple[int, ...], deterministic: bool) -> "AttnConfig":
        return replace(self, is_training=True, do_stride=do_stride, deterministic=deterministic, return_max_logit=False,
                       writes_stats=True)

    def summary(self) -> str:
        """One line for error messages."""
        parts = [
            f"{self.layout.name} {str(self.dtype).removeprefix('torch.')}",
            f"b={self.b} h={self.h} hg={self.hg} sq={self.sq} skv={self.skv} d_qk={self.d_qk} d_v={self.d_v}",
            f"mask={self.mask.name} bias={self.bias_type.name}"
            + (f"{list(self.bias_shape)}" if self.bias_shape else ""),
        ]
        if self.has_window:
            parts.append(f"window={self.window}")
        if self.has_dropout:
            parts.append(f"dropout={self.dropout}")
        if self.softmax_type != SoftmaxType.vanilla:
            parts.append(f"softmax={self.softmax_type.name}")
        if self.return_max_logit:
            parts.append("return_max_logit")
        if self.deterministic:
            parts.append("deterministic")
        if not self.writes_stats:
            parts.append("no stats")
        parts.append("training" if self.is_training else "inference")
        return ", ".join(parts)
