"""Q/K/V layouts: formats, per-tensor strides and zero-copy views.

Layout convention: cuDNN sees every tensor as logical ``[b, h, s, d]`` ("BHSD") and the
memory format is carried only by the strides. A layout name such as ``sbh3d`` says how
the caller's tensors are laid out: ``s``/``b``/``h``/``d`` give the dimension order of
each tensor and a ``3``/``2`` marks tensors that are interleaved slices of one buffer
(``sb3hd`` = one ``[s, b, 3, h, d]`` buffer, ``sbh3d`` = one ``[s, b, h, 3, d]`` buffer).

Nothing here copies data: :func:`bhsd_dims` turns a caller's tensor shape/strides into the
BHSD dims/strides cuDNN is given, and :func:`alloc_output` / :func:`alloc_qkv_grads`
allocate results in the layout's own format (packed gradients are views of one buffer,
exactly as TransformerEngine returns them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .enums import QKVFormat, QKVLayout, QKVLayoutGroup

__all__ = [
    "LayoutInfo",
    "TO_BHSD",
    "layout_info",
    "DENSE_LAYOUTS",
    "CORE_LAYOUTS",
    "bhsd_dims",
    "layout_strides",
    "alloc_output",
    "alloc_qkv_grads",
    "grad_like",
    "packed_qkv_views",
    "get_qkv_layout",
]

# Permutation from a 4-d tensor in the given format to logical BHSD.
TO_BHSD = {
    QKVFormat.sbhd: (1, 2, 0, 3),
    QKVFormat.bshd: (0, 2, 1, 3),
    QKVFormat.bhsd: (0, 1, 2, 3),
}


@dataclass(frozen=True)
class LayoutInfo:
    """What a layout name means: per-tensor formats, how k/v are packed, paging."""

    layout: QKVLayout
    group: QKVLayoutGroup
    q_format: QKVFormat  # sbhd, bshd, thd or bhsd
    kv_format: QKVFormat
    qkv_format: QKVFormat  # TE's combined format (e.g. thd_2bshd for mixed layouts)
    is_paged: bool

    @property
    def is_dense(self) -> bool:
        """True for layouts whose tensors are all 4-d sbhd/bshd (no THD, no paging)."""
        return (
            not self.is_paged
            and self.q_format in (QKVFormat.sbhd, QKVFormat.bshd)
            and self.kv_format == self.q_format
        )

    @property
    def packs_qkv(self) -> bool:
        return self.group in (QKVLayoutGroup.L_3HD, QKVLayoutGroup.L_H3D)

    @property
    def packs_kv(self) -> bool:
        return self.group in (QKVLayoutGroup.L_HD_2HD, QKVLayoutGroup.L_HD_H2D)


def _info(layout: QKVLayout) -> LayoutInfo:
    name = layout.name
    paged = name.startswith("paged_kv_")
    parts = name.removeprefix("paged_kv_").split("_")
    if len(parts) == 1:  # sb3hd, bsh3d, t3hd, ...
        fmt = parts[0].replace("3", "")
        q_fmt = kv_fmt = QKVFormat[fmt]
        group = QKVLayoutGroup.L_3HD if "3h" in parts[0] else QKVLayoutGroup.L_H3D
    elif len(parts) == 2:  # sbhd_sb2hd, thd_th2d, ...
        q_fmt = QKVFormat[parts[0]]
        kv_fmt = QKVFormat[parts[1].replace("2", "")]
        group = QKVLayoutGroup.L_HD_2HD if "2h" in parts[1] else QKVLayoutGroup.L_HD_H2D
    else:
        q_fmt, kv_fmt = QKVFormat[parts[0]], QKVFormat[parts[1]]
        if paged:
            group = QKVLayoutGroup.Paged_KV_HD_HD_HD
        elif q_fmt == QKVFormat.bhsd:
            group = QKVLayoutGroup.SD_SD_SD
        else:
            group = QKVLayoutGroup.L_HD_HD_HD
    if q_fmt == kv_fmt:
        qkv_fmt = q_fmt
    else:
        qkv_fmt = QKVFormat[f"{q_fmt.name}_2{kv_fmt.name}"]
    return LayoutInfo(layout, group, q_fmt, kv_fmt, qkv_fmt, paged)


_INFOS = {layout: _info(layout) for layout in QKVLayout}

#: The 15 layouts TransformerEngine has supported since v1.x.
CORE_LAYOUTS: tuple[QKVLayout, ...] = tuple(QKVLayout(i) for i in range(15))
#: The 10 sbhd/bshd layouts served on 4-d tensors (the dense path).
DENSE_LAYOUTS: tuple[QKVLayout, ...] = tuple(l for l in CORE_LAYOUTS if _INFOS[l].is_dense)


def layout_info(layout: QKVLayout) -> LayoutInfo:
    return _INFOS[layout]


def bhsd_dims(fmt: QKVFormat, shape: Sequence[int], stride: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Dims and strides of a 4-d ``fmt`` tensor, reordered to logical BHSD (no copy)."""
    perm = TO_BHSD[fmt]
    return tuple(shape[i] for i in perm), tuple(stride[i] for i in perm)


def layout_strides(
    layout: QKVLayout, b: int, h: int, hg: int, sq: int, skv: int, d_qk: int, d_v: int
) -> dict[str, tuple[int, ...]]:
    """BHSD element strides of q, k, v and o for a layout, as TransformerEngine derives them.

    This is TE's ``generateMatrixStrides`` table (K/V use hg heads; O is contiguous in q's
    format) for the 15 core layouts; THD layouts share the bshd rows (their batch stride is
    a placeholder: ragged offsets address the tokens). Used to allocate results and to check
    that views of packed buffers are what cuDNN expects.
    """
    info = _INFOS[layout]
    if layout not in CORE_LAYOUTS:
        raise ValueError(f"layout_strides covers the 15 core layouts, not {layout.name}")
    sb = info.q_format == QKVFormat.sbhd
    g = info.group

    def strides(n_pack: int, heads: int, s: int, d: int, pack_before_h: bool) -> tuple[int, ...]:
        # stride of one (s or b) row in elements, of one head, and of the d elements
        row = n_pack * heads * d
        h_stride = d if (pack_before_h or n_pack == 1) else n_pack * d
        if sb:  # [s, b, ...]: b-stride = row, s-stride = b*row
            return (row, h_stride, b * row, 1)
        return (s * row, h_stride, row, 1)

    if g == QKVLayoutGroup.L_3HD:
        q = strides(3, h, sq, d_qk, True)
        k = v = strides(3, hg, skv, d_qk, True)
    elif g == QKVLayoutGroup.L_H3D:
        q = strides(3, h, sq, d_qk, False)
        k = v = strides(3, hg, skv, d_qk, False)
    elif g == QKVLayoutGroup.L_HD_2HD:
        q = strides(1, h, sq, d_qk, True)
        k = v = strides(2, hg, skv, d_qk, True)
    elif g == QKVLayoutGroup.L_HD_H2D:
        q = strides(1, h, sq, d_qk, True)
        k = v = strides(2, hg, skv, d_qk, False)
    else:
        q = strides(1, h, sq, d_qk, True)
        k = strides(1, hg, skv, d_qk, True)
        v = strides(1, hg, skv, d_v, True)
    o = strides(1, h, sq, d_v, True)
    return {"q": q, "k": k, "v": v, "o": o}


def _empty(shape: Sequence[int], like: torch.Tensor, dtype: torch.dtype | None = None, zero: bool = False,
           device: torch.device | str | None = None) -> torch.Tensor:  # fmt: skip
    make = torch.zeros if zero else torch.empty
    return make(tuple(shape), dtype=dtype or like.dtype, device=device or like.device)


def alloc_output(q: torch.Tensor, d_v: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """O in q's own format: contiguous ``[..., h, d_v]`` with q's leading dims."""
    return _empty((*q.shape[:-1], d_v), q, dtype)


def packed_qkv_views(buffer: torch.Tensor, group: QKVLayoutGroup) -> tuple[torch.Tensor, ...]:
    """Slice a packed buffer into its tensors: ``[..., 3, h, d]`` (3HD), ``[..., h, 3, d]`` (H3D),
    ``[..., 2, h, d]`` (2HD) or ``[..., h, 2, d]`` (H2D)."""
    if group in (QKVLayoutGroup.L_3HD, QKVLayoutGroup.L_HD_2HD):
        return tuple(buffer.unbind(-3))
    if group in (QKVLayoutGroup.L_H3D, QKVLayoutGroup.L_HD_H2D):
        return tuple(buffer.unbind(-2))
    raise ValueError(f"layout group {group.name} is not packed")


def alloc_qkv_grads(
    layout: QKVLayout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, zero: bool = False,
    dtype: torch.dtype | None = None, device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv in the layout's own format: views of one packed buffer where it packs; separate
    4-d tensors get gradients in their own strides when dense (contiguous otherwise).
    ``zero=True`` zero-fills them (variable-length batches leave padding positions zero);
    ``dtype`` overrides the inputs' dtype (FP8 gradients in E5M2); ``device="meta"`` gives
    their geometry without memory (from the real tensors: torch computes it in C++, where
    meta inputs would go through its Python reference implementations)."""
    g = _INFOS[layout].group
    kw = {"zero": zero, "dtype": dtype, "device": device}
    if g == QKVLayoutGroup.L_3HD:
        buf = _empty((*q.shape[:-2], 3, *q.shape[-2:]), q, **kw)
        return packed_qkv_views(buf, g)  # type: ignore[return-value]
    if g == QKVLayoutGroup.L_H3D:
        buf = _empty((*q.shape[:-1], 3, q.shape[-1]), q, **kw)
        return packed_qkv_views(buf, g)  # type: ignore[return-value]
    dq = grad_like(q, **kw)
    if g == QKVLayoutGroup.L_HD_2HD:
        dk, dv = packed_qkv_views(_empty((*k.shape[:-2], 2, *k.shape[-2:]), k, **kw), g)
    elif g == QKVLayoutGroup.L_HD_H2D:
        dk, dv = packed_qkv_views(_empty((*k.shape[:-1], 2, k.shape[-1]), k, **kw), g)
    else:
        dk, dv = grad_like(k, **kw), grad_like(v, **kw)
    return dq, dk, dv


def grad_like(t: torch.Tensor, zero: bool = False, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> torch.Tensor:  # fmt: skip
    """The gradient of a separate 4-d tensor in its own strides when it is dense (``empty_like``'s
    rule, as torch's SDPA backends do): autograd then accumulates it into ``.grad`` with a
    vectorised add instead of a strided copy. THD tensors (3-d) keep the packed token-major
    strides their ragged offsets assume."""
    if t.dim() != 4:
        return _empty(t.shape, t, dtype, zero, device)
    return (torch.zeros_like if zero else torch.empty_like)(t, dtype=dtype or t.dtype, device=device or t.device)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


#: Where each per-tensor format keeps its batch and its sequence (token) dimension.
_BATCH_SEQ_DIMS = {QKVFormat.sbhd: (1, 0), QKVFormat.bshd: (0, 1), QKVFormat.thd: (None, 0)}
_DIMS_NAMES = {QKVFormat.sbhd: "[s, b, h, d]", QKVFormat.bshd: "[b, s, h, d]", QKVFormat.thd: "[t, h, d]"}


def _check_format(fmt: QKVFormat, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Reject q, k, v whose shapes contradict ``fmt`` (what a shape can tell: the number of
    dims, one batch size, k and v of one length), suggesting the format that would fit."""
    ndim = 3 if fmt == QKVFormat.thd else 4
    shapes = {name: list(t.shape) for name, t in (("q", q), ("k", k), ("v", v))}
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != ndim:
            raise ValueError(
                f"qkv_format={fmt.name!r} takes {ndim}-d tensors {_DIMS_NAMES[fmt]}, but {name} has shape "
                f"{shapes[name]} (q {shapes['q']}, k {shapes['k']}, v {shapes['v']})"
            )
    b_dim, s_dim = _BATCH_SEQ_DIMS[fmt]
    if b_dim is not None and not q.shape[b_dim] == k.shape[b_dim] == v.shape[b_dim]:
        other = QKVFormat.bshd if fmt == QKVFormat.sbhd else QKVFormat.sbhd
        o_dim = _BATCH_SEQ_DIMS[other][0]
        hint = (
            f"; they would fit qkv_format={other.name!r}"
            if q.shape[o_dim] == k.shape[o_dim] == v.shape[o_dim] else ""
        )  # fmt: skip
        raise ValueError(
            f"qkv_format={fmt.name!r} reads the batch size from dim {b_dim} of {_DIMS_NAMES[fmt]}, but q, k, v "
            f"have {q.shape[b_dim]}, {k.shape[b_dim]}, {v.shape[b_dim]} there (q {shapes['q']}, k {shapes['k']}, "
            f"v {shapes['v']}){hint}"
        )
    if k.shape[s_dim] != v.shape[s_dim]:
        what = "tokens" if fmt == QKVFormat.thd else "keys"
        raise ValueError(
            f"qkv_format={fmt.name!r}: k holds {k.shape[s_dim]} {what} (dim {s_dim}) but v holds {v.shape[s_dim]} "
            f"(k {shapes['k']}, v {shapes['v']})"
        )


def get_qkv_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qkv_format: str = "sbhd") -> str:
    """The layout name of given q, k, v (TransformerEngine's ``get_qkv_layout``).

    ``qkv_format`` is the per-tensor format (``"sbhd"``, ``"bshd"`` or ``"thd"``); as in
    TransformerEngine it defaults to ``"sbhd"``, so pass ``"bshd"`` for batch-first tensors: a
    shape cannot tell ``[s, b, h, d]`` from ``[b, s, h, d]``. Tensors that are equally spaced
    slices of one buffer give a packed name (``sb3hd``/``sbh3d`` for q, k and v;
    ``sbhd_sb2hd``/``sbhd_sbh2d`` for k and v); otherwise ``sbhd_sbhd_sbhd``.

    Raises ``ValueError`` when the tensors cannot be in ``qkv_format``: sbhd/bshd need 4-d and
    thd 3-d tensors, q, k and v need one batch size (dim 1 for sbhd, dim 0 for bshd), and k and
    v one sequence length (or token count); and when a tensor's last dimension is not
    unit-stride, since no layout fits. Cross-attention (``sq != skv``), GQA (``hg != h``) and
    ``d_v != d_qk`` are fine.
    """
    fmt = QKVFormat.coerce(qkv_format, argument="qkv_format")
    if fmt not in (QKVFormat.sbhd, QKVFormat.bshd, QKVFormat.thd):
        raise ValueError(f"qkv_format={qkv_format!r} must be one of 'sbhd', 'bshd', 'thd'")
    _check_format(fmt, q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a unit-stride last dimension, got stride {tuple(t.stride())}")
    f = fmt.name
    prefix = f[:-2]  # "sb", "bs" or "t"

    def interleave(tensors: Sequence[torch.Tensor]) -> str | None:
        """'hd' if packed before h, 'h' if packed after h, None if not one packed buffer."""
        first = tensors[0]
        if any(t.shape != first.shape or t.stride() != first.stride() or not _same_storage(t, first) for t in tensors):
            return None
        step = first.element_size()
        offsets = [t.data_ptr() - first.data_ptr() for t in tensors]
        n, h, d = len(tensors), first.shape[-2], first.shape[-1]
        if offsets == [i * h * d * step for i in range(n)] and first.stride(-2) == d:
            return "hd"
        if offsets == [i * d * step for i in range(n)] and first.stride(-2) == n * d:
            return "h"
        return None

    qkv = interleave((q, k, v))
    if qkv == "hd":
        return f"{prefix}3hd"
    if qkv == "h":
        return f"{prefix}h3d"
    kv = interleave((k, v))
    if kv == "hd":
        return f"{f}_{prefix}2hd"
    if kv == "h":
        return f"{f}_{prefix}h2d"
    return f"{f}_{f}_{f}"
