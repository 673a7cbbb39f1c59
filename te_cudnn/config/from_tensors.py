"""A call described from its tensors and options: :func:`describe_fwd` validates a forward
call (dense, THD, mixed and paged layouts), :func:`describe_bwd` the backward-only arguments
on top of the forward's description. One concern per helper: the tensors' kinds, the sizes,
the strides and packing, the sequence tensors, the results' strides, the bias, the scalar
options."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, NamedTuple, Optional

import torch

from ..enums import AttnBiasType, AttnMaskType, QKVFormat, QKVLayout, SoftmaxType
from ..layouts import alloc_qkv_grads, get_qkv_layout, layout_info
from ..ragged import bucket_batch, bucket_q_seqlen, bucket_seqlen, bucket_tokens
from .checks import (
    _check_cu_seqlens,
    _check_strides,
    _device_index,
    _same_device,
    _scalar,
    _tensor,
    _value,
    _window,
    check_softmax_offset,
)
from .description import F16_DTYPES, FP8_DTYPES, AttnConfig
from .geometry import _contiguous_bhsd, _cudnn_can_read, _geometry, aligned_contiguous_strides


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
    grads = alloc_qkv_grads(layout, q, k, v, device="meta")  # paged: no backward, unused
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
    in q's dtype and device; ``bias_copy`` when cuDNN cannot read it in place (see te_cudnn.launchers)."""
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
    # launchers copies it into a buffer with these (aligned) strides; dBias comes back in the caller's
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
    if aux_ctx_tensors[0] is None:
        raise ValueError("aux_ctx_tensors[0] is None: its forward ran with softmax_stats=False, which writes no "
                         "softmax stats for a backward; run the forward with softmax_stats=True (the default)")
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
