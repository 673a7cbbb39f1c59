"""One frozen, validated description of a fused-attention call.

:class:`AttnConfig` holds everything that decides which cuDNN graph serves a call (shapes,
strides, dtypes, layout, mask, bias, dropout, window, scale, determinism, device) and
nothing that does not (tensor values, pointers). It is built once per distinct call
signature by :func:`describe_fwd` / :func:`describe_bwd`, which are also where malformed
input is rejected with ``ValueError`` / ``TypeError`` naming the argument and its value.
Strings become enums here, at the boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Optional, Sequence

import torch

from .enums import AttnBiasType, AttnMaskType, QKVFormat, QKVLayout, SoftmaxType
from .layouts import alloc_qkv_grads, bhsd_dims, get_qkv_layout, layout_info
from .ragged import bucket_batch, bucket_q_seqlen, bucket_seqlen, bucket_tokens

__all__ = ["AttnConfig", "describe_fwd", "describe_bwd", "describe_shapes", "check_softmax_offset", "F16_DTYPES", "FP8_DTYPES"]

F16_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = tuple(d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d)
_ALIGN_BYTES = 16  # cuDNN SDPA needs 16-byte aligned strides and pointers (frontend #1571)


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
        cuDNN 9.19's dSink made the gpt-oss backward 1.4-2.2x slower and was not bit-reproducible
        under ``deterministic=True``; measured on H100)."""
        return self.has_dsink and (self.ragged_q or self.dtype in FP8_DTYPES)

    @property
    def has_dbias(self) -> bool:
        """cuDNN produces dBias unless the bias broadcasts over b, h and sq (TE's 111s rule)."""
        return self.bias_type == AttnBiasType.post_scale_bias and self.bias_shape is not None and self.bias_shape[:3] != (1, 1, 1)

    def for_backward(self, do_stride: tuple[int, ...], deterministic: bool) -> "AttnConfig":
        return replace(self, is_training=True, do_stride=do_stride, deterministic=deterministic, return_max_logit=False)

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
        parts.append("training" if self.is_training else "inference")
        return ", ".join(parts)


# --------------------------------------------------------------------------------------------
# validation helpers: each raises ValueError/TypeError naming the argument
# --------------------------------------------------------------------------------------------


def _array_like(value: Any) -> bool:
    """An array of another library (numpy, cupy, jax, ...): it has a shape and a dtype."""
    return not isinstance(value, torch.Tensor) and hasattr(value, "shape") and hasattr(value, "dtype")


def _value(value: Any) -> str:
    """A short, one-line description of a wrong value for a message: its type and repr (an
    array's type, shape and dtype: never its elements)."""
    if isinstance(value, torch.Tensor):
        kind = "nested" if value.is_nested else str(value.layout).removeprefix("torch.")
        if kind != "strided":  # sparse and nested tensors have no (plain) shape
            return f"a {kind} {str(value.dtype).removeprefix('torch.')} tensor"
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)} on {value.device}"
    if _array_like(value):
        kind = type(value)
        module = kind.__module__.split(".")[0]
        try:
            shape = list(value.shape)
        except TypeError:
            shape = value.shape
        return f"{module}.{kind.__name__} of shape {shape} and dtype {value.dtype}"
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _tensor(name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        hint = f'; convert it with torch.as_tensor({name}, device="cuda")' if _array_like(t) else ""
        raise TypeError(f"{name} must be a torch.Tensor, got {_value(t)}{hint}")
    if t.is_nested or t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) torch.Tensor, got {_value(t)}")
    return t


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.type == "cuda" and t.device.index is not None else (0 if t.device.type == "cuda" else -1)


def _same_device(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all tensors must share one device")


def _cudnn_can_read(t: torch.Tensor) -> bool:
    """cuDNN reads ``t`` in place: unit-stride last dim, 16-byte multiples for the other
    strides (dims of size 1 excepted) and a 16-byte aligned start."""
    esize, stride = t.element_size(), t.stride()
    if t.shape[-1] > 1 and stride[-1] != 1:
        return False
    if any(n > 1 and (s * esize) % _ALIGN_BYTES for n, s in zip(t.shape[:-1], stride[:-1])):
        return False
    return t.device.type == "meta" or t.data_ptr() % _ALIGN_BYTES == 0


def aligned_contiguous_strides(shape: Sequence[int], element_size: int) -> tuple[int, ...]:
    """Contiguous strides for ``shape`` with the last dim padded to 16 bytes: the buffer an
    unaligned bias is copied into."""
    per = _ALIGN_BYTES // element_size
    row = -(-shape[-1] // per) * per
    out = [1, row]
    for n in reversed(shape[1:-1]):
        out.append(out[-1] * n)
    return tuple(reversed(out))


def _check_strides(name: str, t: torch.Tensor) -> None:
    """Unit-stride last dim; 16-byte multiples for the other strides. A head dim whose rows
    are not 16-byte multiples (d = 7 in bf16) is not a stride problem: it is left to the
    sub-backends' head-dim rule, which reports it as the head dimension."""
    stride = t.stride()
    if t.numel() == 0:  # an empty tensor (autograd hands zero-stride gradients for them) has no memory to read
        return
    if stride[-1] != 1:
        raise ValueError(
            f"{name} must have a unit-stride last dimension, got shape {tuple(t.shape)} stride {tuple(stride)}"
        )
    esize = t.element_size()
    if (t.shape[-1] * esize) % _ALIGN_BYTES:
        return
    bad = [s for n, s in zip(t.shape[:-1], stride[:-1]) if n > 1 and (s * esize) % _ALIGN_BYTES]
    if bad:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)} and strides {tuple(stride)} ({esize}-byte elements); cuDNN needs "
            f"every stride but the last to be a multiple of {_ALIGN_BYTES} bytes (stride {bad[0]} is "
            f"{bad[0] * esize} bytes): pass {name}.contiguous() or a view of a buffer with such strides"
        )


def _check_cu_seqlens(name: str, t: Optional[torch.Tensor], b: int, q: torch.Tensor, required: bool,
                      needed_by: str = "padding masks") -> None:  # fmt: skip
    if t is None:
        if required:
            raise ValueError(f"{name} is required for {needed_by} (int32 [b+1] = [{b + 1}])")
        return
    _tensor(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype} (an int32 [b+1] = [{b + 1}] tensor on q's device)")
    if t.dim() != 1 or t.shape[0] != b + 1:
        raise ValueError(f"{name} must have shape [b+1] = [{b + 1}], got {list(t.shape)}")
    _same_device(name, t, q)


def _scalar(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise TypeError(f"{name} must be {'a number' if kind is float else 'an int'}, got {_value(value)}")
    return kind(value)


def _window(window_size: Any, mask: AttnMaskType) -> tuple[int, int]:
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a (left, right) pair of ints, got {_value(window_size)}")
    if any(isinstance(w, bool) or not isinstance(w, int) for w in window_size):
        raise TypeError(f"window_size must hold two ints (-1 means unbounded), got ({', '.join(map(_value, window_size))})")
    left, right = (int(w) for w in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size={tuple(window_size)} entries must be >= -1 (-1 means unbounded)")
    if mask.is_causal:
        if right not in (-1, 0):
            raise ValueError(
                f"window_size={tuple(window_size)} has right={right} but attn_mask_type={mask.name} allows no keys "
                "right of the diagonal; use right=0 or -1"
            )
        right = 0
    return left, right


def _geometry(
    fmt: QKVFormat, name: str, t: torch.Tensor, b_graph: int, s_graph: Optional[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Logical BHSD dims and strides a graph declares for tensor ``t`` in format ``fmt``.

    THD tensors ``[t, h, d]`` become ``[b_graph, h, s_graph, d]`` with a placeholder batch
    stride; ragged offsets (tokens x token stride) place each sequence.
    """
    if fmt == QKVFormat.thd:
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-d [t, h, d] in format thd, got shape {list(t.shape)}")
        tok, head = t.stride(0), t.stride(1)
        return (b_graph, t.shape[1], s_graph, t.shape[2]), (s_graph * tok, head, tok, 1)
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-d in format {fmt.name}, got shape {list(t.shape)}")
    return bhsd_dims(fmt, t.shape, t.stride())


def _contiguous_bhsd(fmt: QKVFormat, b: int, h: int, s: int, d: int) -> tuple[int, ...]:
    """BHSD strides of a contiguous tensor in ``fmt`` (how results are allocated)."""
    if fmt == QKVFormat.sbhd:
        return (h * d, d, b * h * d, 1)
    return (s * h * d, d, h * d, 1)


def _layout_hint(layout: QKVLayout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, max_seqlen_q: int,
                 max_seqlen_kv: int) -> str:  # fmt: skip
    """For a message about sizes that contradict ``qkv_layout``: the reading of the 4-d q, k, v
    their sizes fit instead ("" when there is none). The first mistakes: TransformerEngine's
    default ``sbh3d`` kept for ``[b, s, h, d]`` tensors, and torch SDPA's ``[b, h, s, d]``."""
    info = layout_info(layout)
    if info.is_paged or info.q_format != info.kv_format or info.q_format == QKVFormat.thd:
        return ""
    if any(t.dim() != 4 for t in (q, k, v)):
        return ""

    def fits(dim: int) -> bool:  # the sequence lengths sit at dim ``dim`` of q, k and v
        return (q.shape[dim], k.shape[dim], v.shape[dim]) == (max_seqlen_q, max_seqlen_kv, max_seqlen_kv)

    default = layout == QKVLayout.sbh3d  # what a call that leaves qkv_layout out gets
    if info.q_format == QKVFormat.sbhd and fits(1):
        suggested = "bshd_bshd_bshd"
        if info.packs_qkv or info.packs_kv:  # views of one packed buffer keep their packing; separate tensors do not
            try:
                ptr = [t.untyped_storage().data_ptr() for t in ((q, k, v) if info.packs_qkv else (k, v))]
                same = q.device.type != "meta" and len(set(ptr)) == 1
            except (RuntimeError, NotImplementedError):  # tensors without storage (fake, functional)
                same = False
            if same:
                suggested = layout.name.replace("sb", "bs")
        which = " is TransformerEngine's default qkv_layout and" if default else ""
        return (f"; {layout.name}{which} reads q as [s, b, h, d], but the sizes fit [b, s, h, d]: "
                f'pass qkv_layout="{suggested}"')
    if info.q_format != QKVFormat.bhsd and fits(2) and not fits(0 if info.q_format == QKVFormat.sbhd else 1):
        which = " (sbh3d is TransformerEngine's default qkv_layout)" if default else ""
        return (f"; q, k and v look like [b, h, s, d] (torch SDPA's order){which}: pass q.transpose(1, 2), "
                'k.transpose(1, 2), v.transpose(1, 2) with qkv_layout="bshd_bshd_bshd" (or the tensors as they are '
                'with qkv_layout="bhsd_bhsd_bhsd")')
    return ""


class _Sizes(NamedTuple):
    """What :func:`_describe_sizes` reads off q, k, v: the batch (and the graph's bucketed one),
    BHSD sizes and strides, paging and whether the call is empty."""

    b: int
    b_graph: int
    bq: int  # the batch the graph is built for (b, or its bucket when every side is THD)
    sq_graph: Optional[int]
    skv_graph: Optional[int]
    h: int
    hg: int
    sq: int
    skv: int
    d_qk: int
    d_v: int
    q_stride: tuple
    k_stride: tuple
    v_stride: tuple
    paged: Optional[tuple]
    ragged_q: bool
    ragged_kv: bool
    empty: bool


def describe_fwd(
    *,
    is_training: Any,
    max_seqlen_q: Any,
    max_seqlen_kv: Any,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_kv: Optional[torch.Tensor],
    q: Any,
    k: Any,
    v: Any,
    qkv_dtype: Any,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    page_table_k: Optional[torch.Tensor] = None,
    page_table_v: Optional[torch.Tensor] = None,
    attn_bias: Optional[torch.Tensor],
    attn_scale: Optional[float],
    dropout: Any,
    qkv_layout: Any,
    attn_bias_type: Any,
    attn_mask_type: Any,
    softmax_type: Any,
    window_size: Any,
    bottom_right_diagonal: Optional[bool],
    deterministic: bool = False,
    softmax_offset: Optional[torch.Tensor] = None,
    return_max_logit: Any = False,
    cuda_graph: Any = False,
) -> AttnConfig:
    """Validate a forward call and describe it (dense, THD, mixed and paged layouts). One
    concern per helper: the tensors' kinds, the sizes, the strides and packing, the sequence
    tensors, the results' strides, the bias, the scalar options."""
    if isinstance(v, torch.dtype) and not isinstance(is_training, bool):  # every positional moved up by one
        raise TypeError(
            f"v must be a torch.Tensor, got the dtype {v} (and is_training={_value(is_training)}): is is_training "
            "missing? fused_attn_fwd's positional arguments are (is_training, max_seqlen_q, max_seqlen_kv, "
            "cu_seqlens_q, cu_seqlens_kv, q, k, v, qkv_dtype, ...)"
        )
    q, k, v = _tensor("q", q), _tensor("k", k), _tensor("v", v)
    layout = QKVLayout.coerce(qkv_layout, argument="qkv_layout")
    mask = AttnMaskType.coerce(attn_mask_type, argument="attn_mask_type")
    bias_type = AttnBiasType.coerce(attn_bias_type, argument="attn_bias_type")
    softmax = SoftmaxType.coerce(softmax_type, argument="softmax_type")
    if not isinstance(is_training, bool):
        raise TypeError(f"is_training must be a bool, got {_value(is_training)}")
    dtype = _check_dtypes(q, k, v, qkv_dtype)
    max_seqlen_q = _scalar("max_seqlen_q", max_seqlen_q, int)
    max_seqlen_kv = _scalar("max_seqlen_kv", max_seqlen_kv, int)
    z = _describe_sizes(layout, q, k, v, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, page_table_k, page_table_v)
    grad_strides = _check_strides_and_packing(layout, q, k, v, z)
    _check_sequence_tensors(layout, mask, q, z, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    o_stride, stats_stride = _result_strides(layout, z)
    bias_shape, bias_stride, bias_copy = _describe_bias(bias_type, attn_bias, q, z)
    attn_scale, dropout, window, bottom_right_diagonal = _describe_scalars(
        is_training, attn_scale, z.d_qk, dropout, window_size, mask, bottom_right_diagonal
    )
    check_softmax_offset(softmax, softmax_offset, z.h, q)
    for name, flag in (("return_max_logit", return_max_logit), ("cuda_graph", cuda_graph)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {_value(flag)}")

    return AttnConfig(
        dtype=dtype,
        layout=layout,
        b=z.bq,
        h=z.h,
        hg=z.hg,
        sq=z.sq,
        skv=z.skv,
        d_qk=z.d_qk,
        d_v=z.d_v,
        q_stride=z.q_stride,
        k_stride=z.k_stride,
        v_stride=z.v_stride,
        o_stride=o_stride,
        mask=mask,
        bias_type=bias_type,
        bias_shape=bias_shape,
        bias_stride=bias_stride,
        bias_copy=bias_copy,
        softmax_type=softmax,
        dropout=dropout if is_training else 0.0,
        is_training=is_training,
        window=window,
        bottom_right_diagonal=bool(bottom_right_diagonal),
        attn_scale=attn_scale,
        deterministic=bool(deterministic),
        device=_device_index(q),
        ragged_q=z.ragged_q,
        ragged_kv=z.ragged_kv,
        max_total_q=bucket_tokens(q.shape[0]) if z.ragged_q else 0,
        max_total_kv=bucket_tokens(k.shape[0]) if z.ragged_kv else 0,
        stats_stride=stats_stride,
        grad_strides=grad_strides,
        paged=z.paged,
        empty=z.empty,
        return_max_logit=return_max_logit,
        cuda_graph=cuda_graph,
    )


def _check_dtypes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qkv_dtype: Any) -> torch.dtype:
    """One supported dtype for q, k and v, on one device; ``qkv_dtype`` agrees (F16)."""
    dtype = q.dtype
    if dtype not in F16_DTYPES + FP8_DTYPES:
        raise TypeError(f"q.dtype={dtype}; fused attention takes float16, bfloat16 or float8 tensors")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != dtype:
            raise TypeError(f"{name}.dtype={t.dtype} differs from q.dtype={dtype}")
        _same_device(name, t, q)
    if qkv_dtype is not None and qkv_dtype != dtype and dtype in F16_DTYPES:
        raise TypeError(f"qkv_dtype={qkv_dtype if isinstance(qkv_dtype, torch.dtype) else _value(qkv_dtype)} does not "
                        f"match q.dtype={dtype} (pass q.dtype or None)")  # fmt: skip
    return dtype


def _describe_sizes(layout: QKVLayout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, max_seqlen_q: int,
                    max_seqlen_kv: int, cu_seqlens_q, page_table_k, page_table_v) -> _Sizes:  # fmt: skip
    """Ranks, batch, heads, sequence lengths and head dims of q, k, v, checked against each other."""
    info = layout_info(layout)
    ragged_q, ragged_kv = info.q_format == QKVFormat.thd, info.kv_format == QKVFormat.thd
    if not info.is_paged and (page_table_k is not None or page_table_v is not None):
        raise ValueError(f"page_table_k/page_table_v were given but qkv_layout={layout.name} is not a paged_kv_* layout")
    for name, t, ragged in (("q", q, ragged_q), ("k", k, ragged_kv), ("v", v, ragged_kv)):
        want = 3 if ragged else 4
        if t.dim() != want:
            fmt = info.q_format if name == "q" else info.kv_format
            raise ValueError(
                f"{name} must be {want}-d in format {fmt.name}, got shape {list(t.shape)} (qkv_layout={layout.name})"
            )
    # Batch size: from the dense side's tensors, else from cu_seqlens (THD tensors have no b).
    if info.is_paged:
        b = _paged_batch(layout, q, ragged_q, cu_seqlens_q, page_table_k, page_table_v)
    elif not ragged_q:
        b = q.shape[1] if info.q_format == QKVFormat.sbhd else q.shape[0]
    elif not ragged_kv:
        b = k.shape[1] if info.kv_format == QKVFormat.sbhd else k.shape[0]
    else:
        if cu_seqlens_q is None:
            raise ValueError(f"qkv_layout={layout.name} needs cu_seqlens_q (int32 [b+1]) to know the batch")
        _tensor("cu_seqlens_q", cu_seqlens_q)
        if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1:
            raise ValueError(f"cu_seqlens_q must have shape [b+1] (b >= 0), got {list(cu_seqlens_q.shape)}")
        b = cu_seqlens_q.shape[0] - 1
    # A graph's batch dim is a bucket only when every side is ragged (dense tensors fix b).
    b_graph = bucket_batch(b) if (ragged_q and ragged_kv) else b  # paged: kv is dense (pages), so b
    sq_graph = bucket_q_seqlen(max_seqlen_q) if ragged_q else None
    skv_graph = bucket_seqlen(max_seqlen_kv) if ragged_kv else None
    (bq, h, sq, d_qk), q_stride = _geometry(info.q_format, "q", q, b_graph, sq_graph)
    (bk, hg, skv, dk), k_stride = _geometry(info.kv_format, "k", k, b_graph, skv_graph)
    (bv, hv, sv, d_v), v_stride = _geometry(info.kv_format, "v", v, b_graph, skv_graph)
    paged = None
    if info.is_paged:  # k/v are page pools: [num_pages, hg, page_size, d] in BHSD order
        if (bk, sv) != (bv, skv):
            raise ValueError(
                f"k and v page pools differ: k {list(k.shape)}, v {list(v.shape)} (qkv_layout={layout.name})"
            )
        paged = (bk, skv, page_table_k.shape[1])
        if bk == 0 and max_seqlen_kv > 0:
            raise ValueError(
                f"k and v page pools hold no pages ({list(k.shape)}) but max_seqlen_kv={max_seqlen_kv} "
                f"(qkv_layout={layout.name})"
            )
        if max_seqlen_kv > paged[1] * paged[2]:
            raise ValueError(
                f"max_seqlen_kv={max_seqlen_kv} exceeds the page tables' capacity {paged[2]} pages x {paged[1]} tokens "
                f"(pools k {list(k.shape)} read as qkv_layout={layout.name})"
            )
        bk = bv = bq
        sv = skv = max_seqlen_kv
    for name, t, n, what in (("q", q, h, "heads"), ("k", k, hg, "heads"), ("q", q, d_qk, "a head dim"),
                             ("v", v, d_v, "a head dim")):  # fmt: skip
        if n == 0:
            raise ValueError(
                f"{name} has shape {list(t.shape)}, i.e. {what} of 0 (layout {layout.name}); fused attention needs "
                "at least one head and head dims >= 1 (a batch, sequence or token count of 0 is fine)"
            )
    if (bk, bv) != (bq, bq):
        raise ValueError(f"batch sizes differ: q has b={bq}, k has b={bk}, v has b={bv} (qkv_layout={layout.name})")
    if (hv, sv) != (hg, skv):
        raise ValueError(f"k has {hg} heads x {skv} keys but v has {hv} heads x {sv} keys (qkv_layout={layout.name})")
    if ragged_kv and k.shape[0] != v.shape[0]:
        raise ValueError(f"k holds {k.shape[0]} tokens but v holds {v.shape[0]} (qkv_layout={layout.name})")
    if dk != d_qk:
        raise ValueError(f"q head dim {d_qk} differs from k head dim {dk} (qkv_layout={layout.name})")
    if hg == 0 or h % hg:
        raise ValueError(
            f"k/v have {hg} heads, which does not divide q's {h} heads (GQA/MQA needs h % hg == 0; "
            f"qkv_layout={layout.name}){_layout_hint(layout, q, k, v, max_seqlen_q, max_seqlen_kv)}"
        )
    if not ragged_q and max_seqlen_q != sq:
        raise ValueError(f"max_seqlen_q={max_seqlen_q} but q holds {sq} positions (qkv_layout={layout.name})"
                         f"{_layout_hint(layout, q, k, v, max_seqlen_q, max_seqlen_kv)}")  # fmt: skip
    if not ragged_kv and not info.is_paged and max_seqlen_kv != skv:
        raise ValueError(f"max_seqlen_kv={max_seqlen_kv} but k holds {skv} positions (qkv_layout={layout.name})"
                         f"{_layout_hint(layout, q, k, v, max_seqlen_q, max_seqlen_kv)}")  # fmt: skip
    if ragged_q and max_seqlen_q < 0 or ragged_kv and max_seqlen_kv < 0:
        raise ValueError(f"max_seqlen_q={max_seqlen_q}, max_seqlen_kv={max_seqlen_kv} must be >= 0")
    # Nothing to attend: no batch, no queries or no keys (THD: no tokens, or a max_seqlen of 0)
    empty = 0 in (b, max_seqlen_q if ragged_q else sq, max_seqlen_kv if ragged_kv else skv) or (
        ragged_q and q.shape[0] == 0) or (ragged_kv and k.shape[0] == 0)  # fmt: skip
    return _Sizes(b, b_graph, bq, sq_graph, skv_graph, h, hg, sq, skv, d_qk, d_v, q_stride, k_stride, v_stride, paged,
                  ragged_q, ragged_kv, empty)  # fmt: skip


def _check_strides_and_packing(layout: QKVLayout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, z: _Sizes) -> tuple:
    """Strides cuDNN can read; packed layouts hold views of one buffer; THD tensors have the
    layout's own strides (dQ/dK/dV share their ragged offsets). Returns dQ, dK, dV's BHSD strides."""
    info = layout_info(layout)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_strides(name, t)
    if info.packs_qkv and not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"qkv_layout={layout.name} packs q, k and v in one buffer, so they need one shape; got "
            f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
        )
    if (info.packs_qkv or info.packs_kv) and q.numel() and k.numel():  # empty views carry no addresses to check
        actual = get_qkv_layout(q, k, v, info.q_format.name)
        if actual != layout.name:
            raise ValueError(
                f"qkv_layout={layout.name!r} but q, k, v are laid out as {actual!r}; pass views of one packed "
                "buffer or name the layout they have"
            )
    grads = alloc_qkv_grads(layout, *(t.to("meta") for t in (q, k, v)))  # paged: no backward, unused
    if z.ragged_q or z.ragged_kv:
        for name, t, g in zip("qkv", (q, k, v), grads):
            if t.dim() == 3 and t.numel() and t.stride() != g.stride():
                raise ValueError(
                    f"{name} has strides {tuple(t.stride())}; THD tensors of qkv_layout={layout.name} must have "
                    f"the layout's packed strides {tuple(g.stride())} (tokens contiguous)"
                )
    return tuple(
        _geometry(fmt, n, g, z.b_graph, s_graph)[1]
        for n, g, fmt, s_graph in zip(("dq", "dk", "dv"), grads, (info.q_format, info.kv_format, info.kv_format),
                                      (z.sq_graph, z.skv_graph, z.skv_graph))  # fmt: skip
    )


def _check_sequence_tensors(layout: QKVLayout, mask: AttnMaskType, q: torch.Tensor, z: _Sizes, cu_seqlens_q,
                            cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded) -> None:  # fmt: skip
    """cu_seqlens_* where padding masks or THD tensors need them, int32 [b + 1] on q's device."""
    for name, t, ragged in (("cu_seqlens_q", cu_seqlens_q, z.ragged_q), ("cu_seqlens_kv", cu_seqlens_kv, z.ragged_kv)):
        needed_by = f"attn_mask_type={mask.name}" if mask.is_padding else f"qkv_layout={layout.name} (THD tensors)"
        _check_cu_seqlens(name, t, z.b, q, mask.is_padding or ragged, needed_by)
    for name, t in (("cu_seqlens_q_padded", cu_seqlens_q_padded), ("cu_seqlens_kv_padded", cu_seqlens_kv_padded)):
        if t is not None:
            _check_cu_seqlens(name, t, z.b, q, False)


def _result_strides(layout: QKVLayout, z: _Sizes) -> tuple[tuple, tuple]:
    """BHSD strides of O and of the softmax stats as the functions allocate them."""
    if z.ragged_q:
        return (z.sq * z.h * z.d_v, z.d_v, z.h * z.d_v, 1), (z.sq * z.h, 1, z.h, 1)  # [t, h, d_v], [t, h, 1]
    return _contiguous_bhsd(layout_info(layout).q_format, z.b, z.h, z.sq, z.d_v), (z.h * z.sq, z.sq, 1, 1)


def _describe_bias(bias_type: AttnBiasType, attn_bias: Optional[torch.Tensor], q: torch.Tensor, z: _Sizes) -> tuple:
    """``(bias_shape, bias_stride, bias_copy)``: a post-scale bias broadcastable to [b, h, sq, skv]
    in q's dtype and device; ``bias_copy`` when cuDNN cannot read it in place (see ops)."""
    if bias_type not in (AttnBiasType.post_scale_bias, AttnBiasType.pre_scale_bias):
        if attn_bias is not None:
            raise ValueError(f"attn_bias was given but attn_bias_type={bias_type.name}; pass attn_bias_type='post_scale_bias'")
        return None, None, False
    if attn_bias is None:
        raise ValueError(f"attn_bias_type={bias_type.name} needs attn_bias, got None")
    _tensor("attn_bias", attn_bias)
    if attn_bias.dtype != q.dtype:
        raise TypeError(f"attn_bias.dtype={attn_bias.dtype} must equal q.dtype={q.dtype}")
    _same_device("attn_bias", attn_bias, q)
    shape, (b, h, sq, skv) = tuple(attn_bias.shape), (z.b, z.h, z.sq, z.skv)
    ok = len(shape) == 4 and shape[0] in (1, b) and shape[1] in (1, h) and shape[2] in (1, sq) and shape[3] == skv
    if not ok:
        raise ValueError(
            f"attn_bias has shape {list(shape)}; expected [1 or b, 1 or h, sq, skv] = "
            f"[1|{b}, 1|{h}, {sq}, {skv}] (or [1, 1, 1, {skv}])"
        )
    if _cudnn_can_read(attn_bias):
        return shape, tuple(attn_bias.stride()), False
    # ops copies it into a buffer with these (aligned) strides; dBias comes back in the caller's
    return shape, aligned_contiguous_strides(shape, attn_bias.element_size()), True


def _describe_scalars(is_training: bool, attn_scale: Any, d_qk: int, dropout: Any, window_size: Any,
                      mask: AttnMaskType, bottom_right_diagonal: Any) -> tuple:  # fmt: skip
    """``(attn_scale, dropout, window, bottom_right_diagonal)``, checked and defaulted."""
    if attn_scale is None:
        attn_scale = 1.0 / math.sqrt(d_qk)
    attn_scale = _scalar("attn_scale", attn_scale, float)
    if not math.isfinite(attn_scale):
        raise ValueError(f"attn_scale={attn_scale} must be finite")
    dropout = _scalar("dropout", dropout, float)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout={dropout} must be in [0, 1)")
    if dropout > 0.0 and not is_training:
        raise ValueError(f"dropout={dropout} during inference (is_training=False); dropout must be 0 in inference")
    window = _window(window_size, mask)
    if bottom_right_diagonal is None:
        bottom_right_diagonal = mask.is_bottom_right
    elif not isinstance(bottom_right_diagonal, bool):
        raise TypeError(f"bottom_right_diagonal must be a bool or None, got {type(bottom_right_diagonal).__name__}")
    return attn_scale, dropout, window, bottom_right_diagonal


def check_softmax_offset(softmax: SoftmaxType, offset: Any, h: int, q: torch.Tensor, name: str = "softmax_offset") -> None:
    """TE 2.x's sink tensor: fp32 ``[1, h, 1, 1]`` (contiguous, 16-byte aligned, on q's device);
    required for ``learnable``, optional for ``off_by_one`` (zeros), refused for ``vanilla``."""
    if offset is None:
        if softmax == SoftmaxType.learnable:
            raise ValueError(f"softmax_type='learnable' needs {name}: the per-head sink logits, float32 [1, {h}, 1, 1]")
        return
    if softmax == SoftmaxType.vanilla:
        raise ValueError(f"{name} was given but softmax_type='vanilla'; pass softmax_type='learnable' (or "
                         "'off_by_one', whose offset is zeros) to use attention sinks")  # fmt: skip
    _tensor(name, offset)
    if offset.dtype != torch.float32 or tuple(offset.shape) != (1, h, 1, 1):
        raise ValueError(f"{name} must be a float32 [1, {h}, 1, 1] tensor (one sink logit per query head), got "
                         f"{str(offset.dtype).removeprefix('torch.')} {list(offset.shape)}")  # fmt: skip
    _same_device(name, offset, q)
    if not offset.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got stride {tuple(offset.stride())}")
    if offset.device.type == "cuda" and offset.data_ptr() % 16:
        raise ValueError(f"{name} must start on a 16-byte boundary (cuDNN reads it as a tensor), got data_ptr % 16 = "
                         f"{offset.data_ptr() % 16}")  # fmt: skip


def _paged_batch(layout, q, ragged_q, cu_seqlens_q, page_table_k, page_table_v) -> int:
    """Batch size of a paged-KV call, after checking the page tables (int32 [b, pages])."""
    for name, t in (("page_table_k", page_table_k), ("page_table_v", page_table_v)):
        if t is None:
            raise ValueError(f"qkv_layout={layout.name} needs {name} (int32 [b, max_pages_per_seq])")
        _tensor(name, t)
        if t.dtype != torch.int32 or t.dim() != 2 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int32 [b, max_pages_per_seq] tensor, got {t.dtype} "
                             f"{list(t.shape)} stride {tuple(t.stride())}")  # fmt: skip
        _same_device(name, t, q)
    if page_table_k.shape != page_table_v.shape:
        raise ValueError(f"page_table_k {list(page_table_k.shape)} and page_table_v {list(page_table_v.shape)} differ")
    b = page_table_k.shape[0]
    if not ragged_q:
        qb = q.shape[1] if layout_info(layout).q_format == QKVFormat.sbhd else q.shape[0]
        if qb != b:
            raise ValueError(f"q {list(q.shape)} has b={qb} as qkv_layout={layout.name} reads it, but the page tables "
                             f"have {b} rows")  # fmt: skip
    elif cu_seqlens_q is None:
        raise ValueError(f"qkv_layout={layout.name} needs cu_seqlens_q (int32 [b+1] = [{b + 1}] for {b} page-table rows)")
    elif _tensor("cu_seqlens_q", cu_seqlens_q).dim() != 1 or cu_seqlens_q.shape[0] != b + 1:
        raise ValueError(
            f"cu_seqlens_q must have shape [b+1] = [{b + 1}] for {b} page-table rows, got {list(cu_seqlens_q.shape)}"
        )
    return b


def describe_bwd(
    fwd: AttnConfig,
    *,
    q: torch.Tensor,
    o: Any,
    d_o: Any,
    aux_ctx_tensors: Any,
    deterministic: Any,
) -> tuple[AttnConfig, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Validate the backward-only arguments; returns (config, stats, rng_state, bias)."""
    o, d_o = _tensor("o", o), _tensor("d_o", d_o)
    info = layout_info(fwd.layout)
    for name, t in (("o", o), ("d_o", d_o)):
        # FP8 recipes may carry dO in E5M2 while q/k/v/o are E4M3 (TE's HYBRID format)
        if t.dtype != fwd.dtype and not (name == "d_o" and fwd.dtype in FP8_DTYPES and t.dtype in FP8_DTYPES):
            raise TypeError(f"{name}.dtype={t.dtype} differs from q.dtype={fwd.dtype}")
        expected = (*q.shape[:-1], fwd.d_v)
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} must have shape {list(expected)} (q's with head dim d_v), got {list(t.shape)}")
        _same_device(name, t, q)
        _check_strides(name, t)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if not isinstance(aux_ctx_tensors, (list, tuple)):
        raise TypeError(f"aux_ctx_tensors must be the list fused_attn_fwd returned, got {type(aux_ctx_tensors).__name__}")
    has_bias = fwd.bias_type == AttnBiasType.post_scale_bias
    want = 2 + has_bias + fwd.has_sink
    if len(aux_ctx_tensors) < want:
        names = "softmax_stats, rng_state" + (", bias" if has_bias else "") + (", softmax_offset" if fwd.has_sink else "")
        raise ValueError(f"aux_ctx_tensors must hold [{names}] as returned by fused_attn_fwd; got "
                         f"{len(aux_ctx_tensors)} tensor(s)")  # fmt: skip
    stats, rng_state = _tensor("aux_ctx_tensors[0]", aux_ctx_tensors[0]), _tensor("aux_ctx_tensors[1]", aux_ctx_tensors[1])
    stats_shape = (q.shape[0], fwd.h, 1) if fwd.ragged_q else (fwd.b, fwd.h, fwd.sq, 1)
    softmax_shape = (fwd.b, fwd.h, fwd.sq, fwd.skv)
    # F16_max512_seqlen saves the full softmax S (io dtype) instead of the fp32 stats
    saved_softmax = (not fwd.ragged_q and stats.dtype == fwd.dtype and tuple(stats.shape) == softmax_shape
                     and (fwd.skv > 1 or fwd.empty))  # fmt: skip
    if not saved_softmax and (stats.dtype != torch.float32 or tuple(stats.shape) != stats_shape) or not stats.is_contiguous():
        raise ValueError(
            f"aux_ctx_tensors[0] (softmax stats) must be a contiguous float32 {list(stats_shape)} tensor "
            f"(or, from an F16_max512_seqlen forward, the {str(fwd.dtype).removeprefix('torch.')} softmax "
            f"{list(softmax_shape)}), got {stats.dtype} {list(stats.shape)} stride {tuple(stats.stride())}"
        )
    if rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,):
        raise ValueError(f"aux_ctx_tensors[1] (rng_state) must be int64 [2], got {rng_state.dtype} {list(rng_state.shape)}")
    _same_device("aux_ctx_tensors[0]", stats, q)
    _same_device("aux_ctx_tensors[1]", rng_state, q)
    bias = None
    if fwd.has_sink:
        check_softmax_offset(fwd.softmax_type, aux_ctx_tensors[want - 1], fwd.h, q, f"aux_ctx_tensors[{want - 1}] (softmax_offset)")
    if has_bias:
        bias = _tensor("aux_ctx_tensors[2]", aux_ctx_tensors[2])
        if tuple(bias.shape) != fwd.bias_shape:  # its strides: read in place, or copied (fwd.bias_copy)
            raise ValueError(f"aux_ctx_tensors[2] (bias) must match the forward's attn_bias {list(fwd.bias_shape or ())}")
    _, do_stride = _geometry(info.q_format, "d_o", d_o, fwd.b, fwd.sq)
    _, o_stride = _geometry(info.q_format, "o", o, fwd.b, fwd.sq)
    if fwd.ragged_q and (tuple(o.stride()) != (fwd.h * fwd.d_v, fwd.d_v, 1) or tuple(d_o.stride()) != tuple(o.stride())):
        raise ValueError(
            f"o and d_o of a THD layout must be contiguous [t, h, d_v] (they share ragged offsets); got strides "
            f"{tuple(o.stride())} and {tuple(d_o.stride())}"
        )
    cfg = replace(fwd.for_backward(do_stride, deterministic), o_stride=o_stride,
                  do_dtype=d_o.dtype if d_o.dtype != fwd.dtype else None, saved_softmax=saved_softmax)
    return cfg, stats, rng_state, bias


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
    from .layouts import layout_strides  # noqa: PLC0415 - sibling module, avoid a cycle at import

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
