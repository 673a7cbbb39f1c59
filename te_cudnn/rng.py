"""Dropout's Philox seed and offset.

Drawn from a generator on the host and advanced as TransformerEngine does, drawn on the device
(inside CUDA-graph captures and for torch.compile), or the caller's own (checked); calls without
dropout share one all-zero state per device.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import torch

from .config import _value
from .launch import is_capturing as _is_capturing
from .launch import kept as _kept
from .prepared import _Prepared

#: device index -> the all-zero state that calls without dropout share (never written)
_zero_rng: dict[int, torch.Tensor] = {}
_rng_lock = threading.Lock()


def zero_rng_state(device: torch.device) -> torch.Tensor:
    """The all-zero [seed, offset] that calls without dropout on ``device`` share (never written)."""
    state = _zero_rng.get(device.index)
    if state is None:
        state = _zero_rng[device.index] = _kept(lambda: torch.zeros(2, dtype=torch.int64, device=device), device)
    return state


def _rng_state(prep: _Prepared, rng_gen: Optional[torch.Generator]) -> torch.Tensor:
    """[seed, offset] for cuDNN's Philox dropout; advances the generator like TE."""
    device = prep.device.index
    if prep.rng_increment == 0:  # no dropout
        return zero_rng_state(prep.device)
    gen = rng_gen if rng_gen is not None else torch.cuda.default_generators[device]
    if _is_capturing():
        return _device_rng_state(prep.device, gen)
    seed = gen.initial_seed()
    with _rng_lock:  # read-and-advance as one step: two threads never draw the same offset
        offset = gen.get_offset()
        gen.set_offset(offset + (prep.rng_increment + 3) // 4 * 4)  # torch keeps offsets 4-aligned
    if seed >= 1 << 63:  # the uint64 seed travels bit-for-bit in an int64 tensor
        seed -= 1 << 64
    return torch.tensor([seed, offset], dtype=torch.int64).to(prep.device, non_blocking=True)


#: Seeds and offsets drawn on the device stay below 2**62 (offsets well away from wrapping).
_DEVICE_RNG_BOUND = 1 << 62


def _device_rng_state(device: torch.device, gen: Optional[torch.Generator] = None) -> torch.Tensor:
    """A fresh [seed, offset] drawn by a torch RNG kernel on the device: graph-safe (inside a
    CUDA-graph capture every replay draws new values from the generator's graph-safe Philox
    state, so every replay gets a fresh dropout mask) and traceable by torch.compile. The
    backward reads the same tensor, so it replays the forward's mask. A generator other than
    the default must be registered with the graph (``CUDAGraph.register_generator_state``)."""
    return torch.randint(0, _DEVICE_RNG_BOUND, (2,), dtype=torch.int64, device=device, generator=gen)


def _check_rng_state(rng_state: Any, device: torch.device) -> None:
    if not isinstance(rng_state, torch.Tensor):
        raise TypeError(f"rng_state must be a torch.Tensor (int64 [2] = Philox seed, offset) or None, got {_value(rng_state)}")
    if rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,) or rng_state.device != device or rng_state.stride() != (1,):
        raise ValueError(f"rng_state must be a contiguous int64 [2] tensor (Philox seed, offset) on {device}, got "
                         f"{rng_state.dtype} {list(rng_state.shape)} stride {tuple(rng_state.stride())} on {rng_state.device}")  # fmt: skip
