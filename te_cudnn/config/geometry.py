"""BHSD geometry of a call's tensors: the logical dims and strides a graph declares for a
tensor in its format, the strides of results as they are allocated, and cuDNN's 16-byte
alignment rule for strides and pointers."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..enums import QKVFormat
from ..layouts import bhsd_dims


_ALIGN_BYTES = 16  # cuDNN SDPA needs 16-byte aligned strides and pointers (frontend #1571)


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
