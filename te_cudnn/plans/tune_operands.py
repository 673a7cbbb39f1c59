"""The operands the autotuner runs candidate plans on, synthesized from a planned graph.

:func:`make_operands` allocates a buffer for every operand uid with the graph's own dims,
strides and dtypes, and fills the operands cuDNN reads as data with valid contents (full
sequence lengths, dense ragged offsets, identity page tables, a fixed dropout seed, FP8 scales);
:func:`length_operands` makes only the lengths and ragged offsets (``te_cudnn.plans.padded_rows``
binds partial lengths with it). :mod:`te_cudnn.plans.tune` re-exports both.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from ..backends.base import Uid
from ..runtime import torch_dtype_to_cudnn

__all__ = ["FP8_SOFTMAX_SCALE", "length_operands", "make_operands"]

#: The FP8 softmax scale of the operands tuning runs with (the E4M3 maximum over amax 1).
FP8_SOFTMAX_SCALE = 448.0


def _torch_dtypes() -> dict[Any, Any]:
    out = {}
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64,
               getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):  # fmt: skip
        if dt is not None:
            out[torch_dtype_to_cudnn(dt)] = dt
    return out


def _lengths(cfg: Any) -> tuple[list[int], list[int]]:
    """Per-sequence lengths for timing: every sequence full; THD sides fill their token
    capacity (the bucket) with full sequences first, the rest empty."""

    def fill(full: int, ragged: bool, capacity: int) -> list[int]:
        if not ragged:
            return [full] * cfg.b
        out, left = [], capacity
        for _ in range(cfg.b):
            n = min(full, left)
            out.append(n)
            left -= n
        return out

    return fill(cfg.sq, cfg.ragged_q, cfg.max_total_q), fill(cfg.skv, cfg.ragged_kv, cfg.max_total_kv)


def _multipliers(cfg: Any) -> dict[int, int]:
    """Elements per token of each THD tensor, by its ragged-offset uid (``te_cudnn.varlen``'s)."""
    return {Uid.RAGGED_Q: cfg.q_stride[2], Uid.RAGGED_O: cfg.h * cfg.d_v, Uid.RAGGED_STATS: cfg.h,
            Uid.RAGGED_K: cfg.k_stride[2], Uid.RAGGED_V: cfg.v_stride[2]}  # fmt: skip


def length_operands(graph: Any, uids: Sequence[int], cfg: Any, device: Any, *,
                    lengths: Optional[tuple[Sequence[int], Sequence[int]]] = None,
                    cu_tokens: Optional[tuple[Optional[Sequence[int]], Optional[Sequence[int]]]] = None,
                    ) -> dict[int, Any]:  # fmt: skip
    """The operands of ``uids`` that say where sequences are: lengths (``[b, 1, 1, 1]`` int32)
    and THD ragged offsets (``[b + 1, 1, 1, 1]`` int64 elements), in the graph's own dtypes.
    ``lengths``: (q, kv) per-sequence lengths as bound (default: :func:`_lengths`);
    ``cu_tokens``: (q, kv) token offsets ``[b + 1]`` where each side's sequences start, for THD
    sides (None: packed one after another, the cumulative lengths)."""
    device = torch.device(device)
    dtypes = _torch_dtypes()
    lens_q, lens_kv = _lengths(cfg) if lengths is None else (list(lengths[0]), list(lengths[1]))
    cu_q, cu_kv = (None, None) if cu_tokens is None else cu_tokens
    multipliers = _multipliers(cfg)
    ops: dict[int, Any] = {}
    for uid in uids:
        if uid not in (Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV) and uid not in multipliers:
            continue
        t = graph.find_tensor(uid)
        if t is None:
            raise ValueError(f"the graph has no tensor with uid {uid} ({Uid.NAMES.get(uid, '?')})")
        dtype = dtypes[t.data_type]
        if uid in (Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV):
            values = lens_q if uid == Uid.SEQ_LEN_Q else lens_kv
        else:
            q_side = uid in (Uid.RAGGED_Q, Uid.RAGGED_O, Uid.RAGGED_STATS)
            cum = cu_q if q_side else cu_kv
            if cum is None:
                cum = [0]
                for n in lens_q if q_side else lens_kv:
                    cum.append(cum[-1] + n)
            values = [c * multipliers[uid] for c in cum]
        flat = torch.tensor(list(values), dtype=dtype, device=device)
        dims, strides = [int(x) for x in t.dim], [int(x) for x in t.stride]
        extent = 1 + sum((d - 1) * s for d, s in zip(dims, strides)) if all(dims) else 0
        ops[uid] = flat if flat.numel() != extent else flat.as_strided(dims, strides)
    return ops


def make_operands(graph: Any, uids: Sequence[int], cfg: Any, device: Any, *, seed: int = 0,
                  lengths: Optional[tuple[Sequence[int], Sequence[int]]] = None,
                  cu_tokens: Optional[tuple[Optional[Sequence[int]], Optional[Sequence[int]]]] = None,
                  ) -> dict[int, Any]:  # fmt: skip
    """A buffer for every operand uid of a planned (or validated) graph, with the graph's own
    dims, strides and dtypes: dense tensors as strided views, THD (ragged) tensors as flat
    buffers sized for their token capacity. Inputs are random normal (FP8: cast from bf16);
    outputs are zeros; operands cuDNN reads as data are valid: sequence lengths full (THD:
    as :func:`_lengths`; or ``lengths``), ragged offsets dense (``te_cudnn.ops``' multipliers;
    or starting at ``cu_tokens``: :func:`length_operands`), page tables the
    identity (sequence ``i`` owns pages ``i * n ... i * n + n - 1``, modulo the pool), dropout
    seed 1234 and offset 0, FP8 scales and descales 1 except the softmax's (``scale_s`` = 448,
    the E4M3 maximum, ``descale_s`` = 1/448: probabilities are at most 1, as delayed scaling
    settles them), the backward's softmax stats
    ``log(skv) + 1`` (at least every row's true logsumexp for inputs of this scale, so the
    backward's probabilities stay finite)."""
    device = torch.device(device)
    dtypes = _torch_dtypes()
    outputs = {t.uid for t in graph.get_outputs()}
    gen = torch.Generator(device=device).manual_seed(seed)
    where = length_operands(graph, uids, cfg, device, lengths=lengths, cu_tokens=cu_tokens)
    q_side = {Uid.Q, Uid.O, Uid.STATS, Uid.DO, Uid.DQ, Uid.MAX}
    scales = set(range(Uid.DESCALE_Q, Uid.SCALE_O + 1)) | {Uid.DESCALE_O, Uid.DESCALE_DO, Uid.DESCALE_DP, Uid.SCALE_DQ,
                                                           Uid.SCALE_DK, Uid.SCALE_DV, Uid.SCALE_DP}  # fmt: skip
    fp8 = {d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d is not None}
    ops: dict[int, Any] = {}
    for uid in uids:
        t = graph.find_tensor(uid)
        if t is None:
            raise ValueError(f"the graph has no tensor with uid {uid} ({Uid.NAMES.get(uid, '?')})")
        dims, strides, dtype = [int(x) for x in t.dim], [int(x) for x in t.stride], dtypes[t.data_type]
        ragged = t.ragged_offset is not None
        if ragged:  # [t, h, d] tokens placed by offsets: capacity x token stride
            tokens = cfg.max_total_q if uid in q_side else cfg.max_total_kv
            extent = max(tokens - 1, 0) * strides[2] + (dims[1] - 1) * strides[1] + (dims[3] - 1) * strides[3] + 1
        else:
            extent = 1 + sum((d - 1) * s for d, s in zip(dims, strides)) if all(dims) else 0
        if uid in where:  # lengths and ragged offsets: already the graph's dims
            ops[uid] = where[uid]
            continue
        if uid in outputs:
            flat = torch.zeros(extent, dtype=dtype, device=device)
        elif uid in (Uid.PAGE_TABLE_K, Uid.PAGE_TABLE_V):
            pages, per_seq = cfg.paged[0], dims[2]
            flat = (torch.arange(dims[0] * per_seq, dtype=torch.int64, device=device) % pages).to(dtype)
        elif uid == Uid.SEED:
            flat = torch.full((extent,), 1234, dtype=dtype, device=device)
        elif uid == Uid.OFFSET:
            flat = torch.zeros(extent, dtype=dtype, device=device)
        elif uid in scales:
            value = {Uid.SCALE_S: FP8_SOFTMAX_SCALE, Uid.DESCALE_S: 1.0 / FP8_SOFTMAX_SCALE}.get(uid, 1.0)
            flat = torch.full((extent,), value, dtype=dtype, device=device)
        elif uid == Uid.STATS:  # the backward's input
            flat = torch.full((extent,), math.log(max(cfg.skv, 1)) + 1.0, dtype=dtype, device=device)
        elif dtype.is_floating_point:
            gen_dtype = torch.bfloat16 if dtype in fp8 else dtype
            flat = torch.randn(extent, generator=gen, dtype=gen_dtype, device=device).to(dtype)
        else:
            raise ValueError(f"no contents defined for operand uid {uid} ({Uid.NAMES.get(uid, '?')}, {dtype})")
        ops[uid] = flat if ragged or flat.numel() != extent else flat.as_strided(dims, strides)
    return ops

