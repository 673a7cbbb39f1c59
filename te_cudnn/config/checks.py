"""Argument checks of the ``describe_*`` functions: each raises ``ValueError`` / ``TypeError``
naming the argument and describing the wrong value (never an array's elements)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..enums import AttnMaskType, SoftmaxType
from .geometry import _ALIGN_BYTES


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
