"""Per-call runtime buffers of variable-length calls: sequence lengths and ragged offsets.

A padding mask or a THD layout binds, besides q, k, v and the results, device tensors derived
from the caller's ``cu_seqlens*`` (``te_cudnn.ragged``: ``[B, 1, 1, 1]`` lengths, ``[B + 1, 1,
1, 1]`` element offsets; ``te_cudnn.row_fill``: the lengths remapped so cuDNN writes every
row). They are a handful of tiny kernels on the caller's stream, with no host sync.

Where they come from (:func:`buffers_for`):

* by default, from the ``cu_seqlens*`` of the call itself, derived on every call: the answer
  never depends on how the caller wrote them (``.data``, DLPack, numpy, custom kernels, NCCL,
  a CUDA-graph replay into a static buffer). From the second call with the same tensors (same
  address, length and stride) on, the kernels run as one replayed CUDA graph, which reads the
  tensors' memory when it runs (``te_cudnn.replayed``);
* from a :class:`BatchLengths` the caller builds once per batch and passes to every layer
  (``lengths=``): derived at the first call that needs them, reused by the later ones (and by
  te_cudnn's autograd functions from the forward to its backward);
* under :func:`reuse_lengths`, an explicit opt-in: reused while the same tensor objects come
  back with the same version counter, which only sees writes made by torch operations.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import torch

from .config import AttnConfig, _check_cu_seqlens
from .launch import capture_id, current_raw_stream, data_ptr, is_capturing, kept
from .ragged import every_key_lens
from .plans.padded_rows import fills_grads, fills_out
from .replayed import replayed
from .row_fill import Lengths, length_remap

if TYPE_CHECKING:
    from .prepared import _Prepared

__all__ = ["BatchLengths", "buffers_for", "reuse_lengths", "check_runtime_tensors", "cached_runtime_buffers",
           "runtime_buffers", "derived_runtime_buffers", "runtime_kind", "length_fields", "mult_fields", "clear", "RUNTIME_CACHE_SIZE"]  # fmt: skip

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
    checked = None  # the tensor checked last: one tensor passed twice (cu_seqlens_kv is cu_seqlens_q) is checked once
    for name, t in zip(names, cu_seqlens):
        if t is None or t is checked:
            continue
        checked = t
        if t.dtype is not _INT32 or t.device != device or t.dim() != 1 or t.shape[0] != n:
            _check_cu_seqlens(name, t, n - 1, q, True)
            raise ValueError(f"{name} must be int32 [b+1] = [{n}] on {device} like cu_seqlens_q, got "
                             f"{t.dtype} {list(t.shape)} on {t.device}")  # fmt: skip
    for name, t in zip(("page_table_k", "page_table_v"), page_tables):
        if t.dtype is not _INT32 or t.device != device or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int32 [b, max_pages_per_seq] tensor on {device}, got "
                             f"{t.dtype} {list(t.shape)} stride {tuple(t.stride())} on {t.device}")  # fmt: skip



#: Under :func:`reuse_lengths` only: runtime buffers (lengths, ragged offsets) computed from
#: cu_seqlens tensors, reused while the same tensor objects are passed with the same version
#: counter. Torch's in-place operations bump it (through any view); writes through ``.data``,
#: DLPack, numpy, custom kernels, NCCL or a CUDA-graph replay do not, which is why this is an
#: opt-in. Keyed by the tensors' identity and version counter, the stream and the CUDA-graph
#: capture (None outside one); the entry holds the tensors, so their identity cannot pass to a
#: new tensor while it is cached. A capture's entries hold buffers from its graph's pool, which every
#: replay recomputes where the first call computed them; no other capture, and no eager call,
#: matches them (capture ids are never reused). They are dropped when a call outside that
#: capture comes (an eager call or another capture): freed like any temporary of a captured
#: region, their memory goes back to the graph's pool instead of being held by te_cudnn.
RUNTIME_CACHE_SIZE = 16
runtime_cache: dict[tuple, tuple] = {}
_capture_keys: list[tuple] = []  # the keys of the entries made during the latest capture


_reuse_by_version = [False]  # reuse_lengths() in force (a list: read on every varlen call, set rarely)


@contextlib.contextmanager
def reuse_lengths(enabled: bool = True) -> Iterator[None]:
    """Opt in to reusing the lengths derived from ``cu_seqlens*`` across calls that pass the
    same tensor objects with the same version counter, for a block of code (process-wide).

    Contract: inside the block, every write to a ``cu_seqlens*`` tensor that calls pass goes
    through a torch operation that bumps its version counter (in-place torch ops, through any
    view). Writes through ``.data``, a DLPack alias, numpy, Triton or custom kernels, NCCL or
    the replay of a CUDA graph into a static buffer are not seen: a call after such a write
    would use the old lengths. Prefer :class:`BatchLengths`, which says what is reused where
    it is passed. Without the opt-in, lengths are derived on every call."""
    before = _reuse_by_version[0]
    _reuse_by_version[0] = bool(enabled)
    if not enabled:
        clear()
    try:
        yield
    finally:
        _reuse_by_version[0] = before
        if not before:
            clear()


class BatchLengths:
    """The per-sequence lengths and token offsets of one batch, derived on the device from its
    ``cu_seqlens*`` once and reused by every call given it (``lengths=``): build one per batch
    and pass it to every layer's call, as flash-attention's ``seqused_k`` or TransformerEngine's
    inference parameters are built once per step.

    ``BatchLengths(cu_seqlens_q, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
    cu_seqlens_kv_padded=None)``: the same tensors the calls pass (checked by identity on every
    call; ``cu_seqlens_kv=None`` means ``cu_seqlens_q``). The buffers are derived by the first
    call that needs them, on that call's stream (per stream and per CUDA-graph capture), from
    the values the tensors hold then. After writing new values into the tensors, call
    :meth:`refresh` or build a new object; te_cudnn cannot see such writes.

    te_cudnn's autograd functions hand the forward's lengths to the backward this way, so a
    backward always uses the lengths its forward used."""

    __slots__ = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "_derived")

    def __init__(self, cu_seqlens_q: torch.Tensor, cu_seqlens_kv: Optional[torch.Tensor] = None,
                 cu_seqlens_q_padded: Optional[torch.Tensor] = None,
                 cu_seqlens_kv_padded: Optional[torch.Tensor] = None) -> None:  # fmt: skip
        for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv),
                        ("cu_seqlens_q_padded", cu_seqlens_q_padded), ("cu_seqlens_kv_padded", cu_seqlens_kv_padded)):  # fmt: skip
            if t is not None and not isinstance(t, torch.Tensor):
                raise TypeError(f"BatchLengths: {name} must be an int32 [b + 1] torch.Tensor or None, got "
                                f"{type(t).__name__}")  # fmt: skip
        if cu_seqlens_q is None:
            raise TypeError("BatchLengths needs cu_seqlens_q (int32 [b + 1], the calls' cu_seqlens_q)")
        self.cu_seqlens_q = cu_seqlens_q
        self.cu_seqlens_kv = cu_seqlens_q if cu_seqlens_kv is None else cu_seqlens_kv
        self.cu_seqlens_q_padded = cu_seqlens_q_padded
        self.cu_seqlens_kv_padded = cu_seqlens_kv_padded
        self._derived: dict[tuple, list[torch.Tensor]] = {}

    def refresh(self) -> None:
        """Forget the derived buffers: the next call derives them again from the tensors' values."""
        self._derived.clear()

    def matches(self, cu_q, cu_kv, cu_q_padded, cu_kv_padded) -> bool:
        """Whether a call passes this batch's tensors (by identity)."""
        return (cu_q is self.cu_seqlens_q and cu_kv is self.cu_seqlens_kv and cu_q_padded is self.cu_seqlens_q_padded
                and cu_kv_padded is self.cu_seqlens_kv_padded)  # fmt: skip

    def buffers(self, prep: _Prepared) -> list[torch.Tensor]:
        """The buffers ``prep`` binds, derived once per (call kind, stream, capture)."""
        stream, capture = current_raw_stream(prep.index), None
        if stream and is_capturing():
            capture = capture_id(prep.index)
            if capture is None:  # the driver cannot say which capture this is: derived in every call
                return runtime_buffers(prep, self.cu_seqlens_q, self.cu_seqlens_kv, self.cu_seqlens_q_padded,
                                       self.cu_seqlens_kv_padded)  # fmt: skip
        key = (prep.runtime_kind, stream, capture)
        got = self._derived.get(key)
        if got is None:
            got = self._derived[key] = runtime_buffers(prep, self.cu_seqlens_q, self.cu_seqlens_kv,
                                                       self.cu_seqlens_q_padded, self.cu_seqlens_kv_padded)  # fmt: skip
        return got

    def __repr__(self) -> str:
        b = self.cu_seqlens_q.shape[0] - 1 if self.cu_seqlens_q.dim() == 1 else "?"
        return f"BatchLengths(b={b}, derived={len(self._derived)})"


def check_lengths(lengths: Any, cu_seqlens: Sequence[Optional[torch.Tensor]]) -> None:
    """A call's ``lengths`` must be a :class:`BatchLengths` of the call's own cu_seqlens tensors."""
    if not isinstance(lengths, BatchLengths):
        raise TypeError(f"lengths must be a te_cudnn.BatchLengths or None, got {type(lengths).__name__}")
    if not lengths.matches(*cu_seqlens):
        raise ValueError("lengths was built from other cu_seqlens tensors than the call passes (cu_seqlens_q, "
                         "cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded are compared by identity); "
                         "build BatchLengths from the tensors you pass, or pass lengths=None")  # fmt: skip


def buffers_for(prep: _Prepared, cu_seqlens: Sequence[Optional[torch.Tensor]],
                lengths: Optional[BatchLengths] = None) -> list[torch.Tensor]:  # fmt: skip
    """The runtime buffers a variable-length call binds: from ``lengths`` when given (checked
    against the call's cu_seqlens), from the version-keyed cache under :func:`reuse_lengths`,
    else derived now from ``cu_seqlens`` (q, kv, q_padded, kv_padded)."""
    if lengths is not None:
        if lengths.__class__ is not BatchLengths or not lengths.matches(*cu_seqlens):
            check_lengths(lengths, cu_seqlens)
        return lengths.buffers(prep)
    if _reuse_by_version[0]:
        return cached_runtime_buffers(prep, *cu_seqlens)
    return derived_runtime_buffers(prep, *cu_seqlens)


def _part(t: Optional[torch.Tensor], q: torch.Tensor) -> Any:
    """What a replayed derivation's key holds of one more cu_seqlens* tensor."""
    if t is None or t is q:
        return t is q
    return data_ptr(t), t.shape[0], t.stride(0)


def derived_runtime_buffers(prep: _Prepared, cu_q, cu_kv, cu_q_padded, cu_kv_padded) -> list[torch.Tensor]:
    """:func:`runtime_buffers` of this call's values: replayed from a CUDA graph keyed by the
    tensors' addresses, lengths and strides (``te_cudnn.replayed``) outside captures on a GPU,
    else by launching the kernels."""
    index = prep.index
    stream = current_raw_stream(index) if index >= 0 else 0
    if index < 0 or (stream and is_capturing()):
        return runtime_buffers(prep, cu_q, cu_kv, cu_q_padded, cu_kv_padded)
    if cu_kv is cu_q and cu_q_padded is None and cu_kv_padded is None:  # self-attention, no padding
        key: tuple = (id(prep), stream, data_ptr(cu_q), cu_q.shape[0], cu_q.stride(0))
    else:
        key = (id(prep), stream, data_ptr(cu_q), cu_q.shape[0], cu_q.stride(0), _part(cu_kv, cu_q),
               _part(cu_q_padded, cu_q), _part(cu_kv_padded, cu_q_padded))  # fmt: skip
    return replayed(key, index, stream,
                    lambda reads: runtime_buffers(prep, cu_q, cu_kv, cu_q_padded, cu_kv_padded, reads), prep)


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


#: (entries of cu_seqlens, bucket batch, device) -> the gather index that continues cu_seqlens
#: with its last value over the bucket's empty sequences (int64 [batch + 1, 1, 1, 1]).
_extend_index: dict[tuple, torch.Tensor] = {}
_EXTEND_INDEX_LIMIT = 256


def _extended(cu: torch.Tensor, batch: int, reads: Optional[list] = None) -> torch.Tensor:
    """``cu`` ([n] = [b + 1], any stride) as ``[batch + 1, 1, 1, 1]``, continued with its last
    value (``te_cudnn.ragged.extend``): a view when it has ``batch + 1`` entries, else one
    gather kernel (its cached index is appended to ``reads``)."""
    n = cu.shape[0]
    if n == batch + 1:
        return cu.view(n, 1, 1, 1)
    key = (n, batch, cu.device)
    idx = _extend_index.get(key)
    if idx is None:
        def make() -> torch.Tensor:
            return torch.arange(batch + 1, device=cu.device).clamp_(max=n - 1).view(batch + 1, 1, 1, 1)

        if is_capturing():  # never keep a tensor of a CUDA graph's private pool
            idx = make()
        else:
            idx = kept(make, cu.device)
            if len(_extend_index) >= _EXTEND_INDEX_LIMIT:
                _extend_index.clear()
            _extend_index[key] = idx
    if reads is not None:
        reads.append(idx)
    return torch.take(cu, idx)


def _offsets(ext: torch.Tensor, mult: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Element offsets ``ext * mult[j]`` (int64), one ``[batch + 1, 1, 1, 1]`` tensor per row of
    ``mult`` (te_cudnn.ragged.ragged_offsets): one multiply for every row."""
    return (ext * mult.view(-1, 1, 1, 1, 1)).unbind(0)


def runtime_buffers(prep: _Prepared, cu_q, cu_kv, cu_q_padded, cu_kv_padded,
                    reads: Optional[list] = None) -> list[torch.Tensor]:  # fmt: skip
    """Per-call sequence lengths and ragged offsets, in ``runtime_uids`` order: a few tiny
    kernels on the caller's stream, no host sync (the values are those of ``te_cudnn.ragged``'s
    functions, computed with as few torch calls as possible: each costs host time). Self-attention
    (the same cu_seqlens tensors for q and kv) computes them once. Device tensors read besides
    the cu_seqlens and ``prep``'s are appended to ``reads`` (for a replayed graph to hold)."""
    cfg, out = prep.cfg, []
    batch = cfg.b
    ext_q = _extended(cu_q, batch, reads)
    ext_kv = ext_q if cu_kv is cu_q else _extended(cu_kv, batch, reads)
    if cfg.mask.is_padding:  # te_cudnn.row_fill: the lengths as given, or remapped so cuDNN writes every row
        lens_q = torch.diff(ext_q, dim=0)
        lens_kv = lens_q if ext_kv is ext_q else torch.diff(ext_kv, dim=0)
        if prep.lengths is Lengths.ONE_QUERY:  # see te_cudnn.ragged.one_query_lens
            out += (prep.one_query, torch.bitwise_and(lens_kv, lens_q.neg()))
        elif prep.lengths is Lengths.EVERY_KEY:
            out += every_key_lens(lens_q, lens_kv)
        else:
            out += (lens_q, lens_kv)
    base_q = ext_q if cu_q_padded is None else _extended(cu_q_padded, batch, reads)
    same_tokens = cu_kv_padded is cu_q_padded and ext_kv is ext_q
    if cfg.ragged_q and cfg.ragged_kv and same_tokens:  # one multiply for all five offset rows
        return out + list(_offsets(base_q, prep.mult_all))
    if cfg.ragged_q:
        out += _offsets(base_q, prep.mult_q)
    if cfg.ragged_kv:
        out += _offsets(ext_kv if cu_kv_padded is None else _extended(cu_kv_padded, batch, reads), prep.mult_kv)
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
        prep.one_query = kept(lambda: torch.ones((cfg.b, 1, 1, 1), dtype=torch.int32, device=prep.device), prep.device)
    prep.runtime_kind = (*runtime_kind(cfg), prep.lengths)
    prep.fill_out = fills_out(cfg, backend)
    prep.fill_grads = fills_grads(cfg, backend)


def mult_fields(cfg: AttnConfig, device: torch.device) -> dict[str, Optional[torch.Tensor]]:
    """Elements per token of each THD tensor (its token stride), as device int64 vectors:
    q side [q, o, stats], kv side [k, v]."""
    def make() -> dict[str, Optional[torch.Tensor]]:
        mq = mkv = None
        if cfg.ragged_q:
            mq = torch.tensor([cfg.q_stride[2], cfg.h * cfg.d_v, cfg.h], dtype=torch.int64, device=device)
        if cfg.ragged_kv:
            mkv = torch.tensor([cfg.k_stride[2], cfg.v_stride[2]], dtype=torch.int64, device=device)
        mall = torch.cat((mq, mkv)) if mq is not None and mkv is not None else None
        return {"mult_q": mq, "mult_kv": mkv, "mult_all": mall}

    if not (cfg.ragged_q or cfg.ragged_kv):
        return {"mult_q": None, "mult_kv": None, "mult_all": None}
    return kept(make, device)

