"""Per-call runtime buffers of variable-length calls: sequence lengths and ragged offsets.

A padding mask or a THD layout binds, besides q, k, v and the results, device tensors derived
from the caller's ``cu_seqlens*`` (``te_cudnn.ragged``: ``[B, 1, 1, 1]`` lengths, ``[B + 1, 1,
1, 1]`` element offsets; ``te_cudnn.row_fill``: the lengths remapped so cuDNN writes every
row). They are a handful of tiny kernels on the caller's stream, computed once per set of
``cu_seqlens`` tensors and reused (:func:`cached_runtime_buffers`):

* eagerly, while the same tensor objects come back with unchanged contents (every layer of a
  model, and the backward);
* inside one CUDA-graph capture likewise, keyed by the driver's capture id: the graph
  computes them once per replay, in the first call that needs them, and every later call of
  the same capture reads them. Another capture never sees them.

The functions read the prepared call (``te_cudnn.ops._Prepared``) by attribute: ``cfg``,
``lengths``, ``one_query``, ``mult_*``, ``runtime_kind``, ``device``, ``index``, ``cu_len``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import torch

from .config import AttnConfig, _check_cu_seqlens
from .launch import capture_id, current_raw_stream, is_capturing
from .ragged import every_key_lens, extend, offsets_view, one_query_lens, ragged_offsets, seq_lens_pair
from .row_fill import Lengths, fills_grads, fills_out, length_remap

if TYPE_CHECKING:
    from .ops import _Prepared

__all__ = ["check_runtime_tensors", "cached_runtime_buffers", "runtime_buffers", "runtime_kind", "length_fields",
           "mult_fields", "clear", "RUNTIME_CACHE_SIZE"]  # fmt: skip

_INT32 = torch.int32


def check_runtime_tensors(prep: _Prepared, q: torch.Tensor, cu_seqlens: Sequence[Optional[torch.Tensor]],
                           page_tables: Sequence[Optional[torch.Tensor]] = ()) -> None:  # fmt: skip
    """Per call, what the call signature does not key on: the cu_seqlens* and page tables
    are runtime data (their values vary per batch), so their dtype, device and length are
    checked here; a mismatch gets the first call's full message. Variable-length calls only."""
    device, n = prep.device, prep.cu_len
    if n is None and cu_seqlens[0] is not None:  # THD: every cu_seqlens* has cu_seqlens_q's length
        n = cu_seqlens[0].shape[0]
    names = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")
    for name, t in zip(names, cu_seqlens):
        if t is not None and (t.dtype is not _INT32 or t.device != device or t.dim() != 1 or t.shape[0] != n):
            _check_cu_seqlens(name, t, n - 1, q, True)
            raise ValueError(f"{name} must be int32 [b+1] = [{n}] on {device} like cu_seqlens_q, got "
                             f"{t.dtype} {list(t.shape)} on {t.device}")  # fmt: skip
    for name, t in zip(("page_table_k", "page_table_v"), page_tables):
        if t.dtype is not _INT32 or t.device != device or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int32 [b, max_pages_per_seq] tensor on {device}, got "
                             f"{t.dtype} {list(t.shape)} stride {tuple(t.stride())} on {t.device}")  # fmt: skip



#: Runtime buffers (lengths, ragged offsets) computed from cu_seqlens tensors, reused while the
#: same tensor objects are passed with unchanged contents: every layer of a model, and the
#: backward, reuse the first layer's. Keyed by the tensors' identity and version counter (any
#: in-place write, through any view, bumps it), the stream and the CUDA-graph capture (None
#: outside one); the entry holds the tensors, so their identity cannot pass to a new tensor
#: while it is cached. A capture's entries hold buffers from its graph's pool, which every
#: replay recomputes where the first call computed them; no other capture, and no eager call,
#: matches them (capture ids are never reused). They are dropped when a call outside that
#: capture comes (an eager call or another capture): freed like any temporary of a captured
#: region, their memory goes back to the graph's pool instead of being held by te_cudnn.
RUNTIME_CACHE_SIZE = 16
runtime_cache: dict[tuple, tuple] = {}
_capture_keys: list[tuple] = []  # the keys of the entries made during the latest capture


def clear() -> None:
    """Forget every cached runtime buffer."""
    runtime_cache.clear()
    _capture_keys.clear()


def _drop_capture_entries() -> None:
    for key in _capture_keys:
        runtime_cache.pop(key, None)
    _capture_keys.clear()


def cached_runtime_buffers(prep: _Prepared, cu_q, cu_kv, cu_q_padded, cu_kv_padded) -> list[torch.Tensor]:
    """:func:`runtime_buffers`, from the cache when the same cu_seqlens tensors, unchanged,
    were seen on this stream (in this capture) before."""
    stream, capture = current_raw_stream(prep.index), None
    if stream and is_capturing():  # the default stream (0) never captures (te_cudnn.launch)
        capture = capture_id(prep.index)
        if capture is None:  # the driver cannot say which capture this is: computed in every call
            return runtime_buffers(prep, cu_q, cu_kv, cu_q_padded, cu_kv_padded)
        if _capture_keys and _capture_keys[0][2] != capture:
            _drop_capture_entries()
    elif _capture_keys:
        _drop_capture_entries()
    try:
        key = (
            prep.runtime_kind, stream, capture,
            id(cu_q), cu_q._version, None if cu_kv is None else (id(cu_kv), cu_kv._version),
            None if cu_q_padded is None else (id(cu_q_padded), cu_q_padded._version),
            None if cu_kv_padded is None else (id(cu_kv_padded), cu_kv_padded._version),
        )  # fmt: skip
    except RuntimeError:  # an inference-mode tensor keeps no version counter: computed every call
        return runtime_buffers(prep, cu_q, cu_kv, cu_q_padded, cu_kv_padded)
    entry = runtime_cache.get(key)
    if entry is not None:
        return entry[1]
    buffers = runtime_buffers(prep, cu_q, cu_kv, cu_q_padded, cu_kv_padded)
    if len(runtime_cache) >= RUNTIME_CACHE_SIZE:
        clear()
    runtime_cache[key] = ((cu_q, cu_kv, cu_q_padded, cu_kv_padded), buffers)
    if capture is not None:
        _capture_keys.append(key)
    return buffers


def runtime_buffers(prep: _Prepared, cu_q, cu_kv, cu_q_padded, cu_kv_padded) -> list[torch.Tensor]:
    """Per-call sequence lengths and ragged offsets, in ``runtime_uids`` order: a handful of
    tiny kernels on the caller's stream, no host sync. Self-attention (the same cu_seqlens
    tensors for q and kv) computes them once."""
    cfg, out = prep.cfg, []
    batch = cfg.b
    ext_q = extend(cu_q, batch)
    ext_kv = ext_q if cu_kv is cu_q else extend(cu_kv, batch)
    if cfg.mask.is_padding:  # te_cudnn.row_fill: the lengths as given, or remapped so cuDNN writes every row
        if prep.lengths is Lengths.ONE_QUERY:
            out += one_query_lens(ext_q, ext_kv, batch, prep.one_query)
        elif prep.lengths is Lengths.EVERY_KEY:
            out += every_key_lens(*seq_lens_pair(cu_q, cu_kv, batch, ext_q, ext_kv))
        else:
            out += seq_lens_pair(cu_q, cu_kv, batch, ext_q, ext_kv)
    base_q = ext_q if cu_q_padded is None else extend(cu_q_padded, batch)
    same_tokens = cu_kv_padded is cu_q_padded and ext_kv is ext_q
    if cfg.ragged_q and cfg.ragged_kv and same_tokens:  # one multiply for all five offset rows
        off = ragged_offsets(cu_q, prep.mult_all, batch, base_q)
        return out + [offsets_view(off, i) for i in range(5)]
    if cfg.ragged_q:
        off = ragged_offsets(cu_q, prep.mult_q, batch, base_q)
        out += [offsets_view(off, 0), offsets_view(off, 1), offsets_view(off, 2)]
    if cfg.ragged_kv:
        base_kv = ext_kv if cu_kv_padded is None else extend(cu_kv_padded, batch)
        off = ragged_offsets(cu_kv, prep.mult_kv, batch, base_kv)
        out += [offsets_view(off, 0), offsets_view(off, 1)]
    return out


def runtime_kind(cfg: AttnConfig) -> tuple:
    """Everything besides the cu_seqlens tensors that :func:`runtime_buffers` reads (see :func:`mult_fields`)."""
    return (cfg.mask.is_padding, cfg.ragged_q, cfg.ragged_kv, cfg.b, cfg.h, cfg.d_v, cfg.q_stride, cfg.k_stride,
            cfg.v_stride, cfg.device)  # fmt: skip


def length_fields(prep: "_Prepared") -> None:
    """The lengths the call binds and what it zero-fills (te_cudnn.row_fill)."""
    cfg, backend = prep.cfg, prep.backend
    prep.lengths = length_remap(cfg, backend)
    if prep.lengths is Lengths.ONE_QUERY:
        prep.one_query = torch.ones((cfg.b, 1, 1, 1), dtype=torch.int32, device=prep.device)
    prep.runtime_kind = (*runtime_kind(cfg), prep.lengths)
    prep.fill_out = fills_out(cfg, backend)
    prep.fill_grads = fills_grads(cfg, backend)


def mult_fields(cfg: AttnConfig, device: torch.device) -> dict[str, Optional[torch.Tensor]]:
    """Elements per token of each THD tensor (its token stride), as device int64 vectors:
    q side [q, o, stats], kv side [k, v]."""
    mq = mkv = None
    if cfg.ragged_q:
        mq = torch.tensor([cfg.q_stride[2], cfg.h * cfg.d_v, cfg.h], dtype=torch.int64, device=device)
    if cfg.ragged_kv:
        mkv = torch.tensor([cfg.k_stride[2], cfg.v_stride[2]], dtype=torch.int64, device=device)
    mall = torch.cat((mq, mkv)) if mq is not None and mkv is not None else None
    return {"mult_q": mq, "mult_kv": mkv, "mult_all": mall}

