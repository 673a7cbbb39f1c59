"""The shapes of the custom operators' results (``te_cudnn.torch_ops``), shared by their fake
(meta) implementations and the checks of the real ones; the bwd op's packed gradients and their
views (:func:`unpack_grads`)."""

from typing import Optional, Sequence

import torch

from .enums import FusedAttnBackend, QKVFormat, QKVLayout, QKVLayoutGroup
from .layouts import layout_info, packed_qkv_views

__all__ = ["grads_like", "unpack_grads"]

_MAX512 = int(FusedAttnBackend.F16_max512_seqlen)

_infos: dict = {}


def _info(qkv_layout: str):
    info = _infos.get(qkv_layout)
    if info is None:  # parsed once per layout string (the ops get the layout as a string per call)
        info = _infos[qkv_layout] = layout_info(QKVLayout.coerce(qkv_layout, argument="qkv_layout"))
    return info


def _stats_like(q: torch.Tensor, k: torch.Tensor, qkv_layout: str, backend: Optional[int]) -> torch.Tensor:
    info = _info(qkv_layout)
    if info.q_format == QKVFormat.thd:
        return q.new_empty((q.shape[0], q.shape[1], 1), dtype=torch.float32)
    b, h, sq = (q.shape[i] for i in _BHS[info.q_format])
    if backend == _MAX512:  # the saved softmax S (max512 layouts are dense)
        skv = k.shape[_BHS[info.kv_format][2]]
        return q.new_empty((b, h, sq, skv))
    return q.new_empty((b, h, sq, 1), dtype=torch.float32)


#: where b, h and s sit in a 4-d tensor of each format
_BHS = {QKVFormat.sbhd: (1, 2, 0), QKVFormat.bshd: (0, 2, 1), QKVFormat.bhsd: (0, 1, 2)}


def _unpacked(qkv_layout: str) -> str:
    """The layout FP8 runs on: its casts turn packed views into separate q, k, v buffers."""
    info = _info(qkv_layout)
    return f"{info.q_format.name}_{info.kv_format.name}_{info.kv_format.name}"


def _has_dbias(bias: Optional[torch.Tensor]) -> bool:
    """cuDNN gives dBias unless the bias broadcasts over b, h and sq (AttnConfig.has_dbias)."""
    return bias is not None and not (bias.shape[0] == 1 and bias.shape[1] == 1 and bias.shape[2] == 1)


def _grad_buffers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: QKVLayoutGroup) -> tuple:
    none = q.new_empty(0)
    if group == QKVLayoutGroup.L_3HD:
        return q.new_empty((*q.shape[:-2], 3, *q.shape[-2:])), none, q.new_empty(0)
    if group == QKVLayoutGroup.L_H3D:
        return q.new_empty((*q.shape[:-1], 3, q.shape[-1])), none, q.new_empty(0)
    if group == QKVLayoutGroup.L_HD_2HD:
        return q.new_empty(q.shape), k.new_empty((*k.shape[:-2], 2, *k.shape[-2:])), none
    if group == QKVLayoutGroup.L_HD_H2D:
        return q.new_empty(q.shape), k.new_empty((*k.shape[:-1], 2, k.shape[-1])), none
    return grads_like(q), grads_like(k), grads_like(v)


def grads_like(t: torch.Tensor) -> torch.Tensor:
    """A separate tensor's gradient as ``te_cudnn.layouts.alloc_qkv_grads`` allocates it."""
    return torch.empty_like(t) if t.dim() == 4 else t.new_empty(t.shape)


def unpack_grads(qkv_layout: str, g0: torch.Tensor, g1: torch.Tensor, g2: torch.Tensor) -> tuple:
    """dq, dk, dv from the ``bwd`` op's buffers (views of the packed ones, as TE returns them)."""
    group = _info(qkv_layout).group
    if group in (QKVLayoutGroup.L_3HD, QKVLayoutGroup.L_H3D):
        return packed_qkv_views(g0, group)
    if group in (QKVLayoutGroup.L_HD_2HD, QKVLayoutGroup.L_HD_H2D):
        return (g0, *packed_qkv_views(g1, group))
    return g0, g1, g2


def _packed_base(views: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """The buffer packed views were taken from (stacked when they are not views of one)."""
    base = views[0]._base
    if base is not None and all(t._base is base for t in views) and base.dim() == views[0].dim() + 1:
        return base
    return torch.stack(tuple(views), dim=dim)
