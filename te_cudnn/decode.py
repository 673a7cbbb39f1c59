"""``fused_attn_decode``: the new query token(s) of each sequence against a KV cache whose
lengths the caller already keeps (decode: one token; speculative decoding's verification step:
a few).

TransformerEngine's ``fused_attn_fwd`` describes a decode step with ``cu_seqlens_q/kv``
(offsets). cuDNN reads per-sequence *lengths*, so every such call derives them (small kernels)
and, inside a CUDA graph, derives them again on every replay.

A decode loop keeps the lengths anyway (flash-attention's ``cache_seqlens``, vLLM's
``seq_lens``). ``fused_attn_decode`` hands that int32 ``[b]`` tensor to cuDNN as the
key/value lengths (a view: no kernel; a strided or unaligned one is copied first), and the
query side's lengths are a constant vector (``s_q`` each) made once per shape. With one new
token and no window, O is not zero-filled where the engine was checked on this machine to
write every row itself, zeros where a sequence's cache is empty (``te_cudnn.plans.padded_rows``):
one call is then the allocation of O (and the softmax stats), the pointers, the launch. With
``s_q > 1`` the new tokens attend causally, aligned to the end of each sequence's cache
(bottom-right), as in speculative decoding; that mask leaves the rows that see no key
unwritten, so O is zero-filled first there, and under a window too (one kernel). The lengths
are read on the device when the kernel runs, so a captured CUDA graph replays correctly after
the loop updates ``cache_seqlens`` in place.

The cache is either paged (a page pool ``[num_pages, page_size, hg, d]`` and a page table
``[b, pages_per_seq]``; head-major pools are read through their strides) or dense
(``[b, s_max, hg, d]``, any strides, e.g. a ``[b, hg, s_max, d]`` buffer transposed).
Forward only, bf16/fp16, the F16 arbitrary-seqlen sub-backend; a sliding window
(``window_size=(left, 0)``, paged or dense caches).
No attention sinks: the sub-backend declines a sink with one query row (cuDNN's SDPA
takes none there; ``te_cudnn.explain`` gives the reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from .backends import Direction, Uid
from .config import _value
from .empty import empty_fwd
from .enums import FusedAttnBackend
from .errors import CaptureMissError
from .launch import FWD_NAMES as _FWD_NAMES
from .launch import execute as _execute
from .launch import is_capturing as _is_capturing
from .launch import kept
from .launch import neg_inf as _neg_inf
from .launch import zeroed as _zeroed
from .first_call import _prepare_fwd
from .ops import _meta, fwd_call_args
from .prepared import _Prepared, _dependent_caches
from .memo import SigMemo
from .plans.padded_rows import fills_out
from .plans.cache import next_tick
from .policy import token as _policy_token

__all__ = ["fused_attn_decode"]

_INT32 = torch.int32
_is_compiling = torch.compiler.is_compiling
_F16 = (torch.float16, torch.bfloat16)


@dataclass(eq=False)
class _Decode:
    """One decode call signature, prepared: the forward's prepared call and what decode binds."""

    prep: _Prepared
    b: int
    q_lens: torch.Tensor  # int32 [b, 1, 1, 1] = s_q: every sequence has s_q query tokens
    lens_shape: tuple[int, int, int, int]  # (b, 1, 1, 1): how cuDNN sees cache_seqlens
    pages_shape: Optional[tuple[int, int, int, int]]  # (b, 1, pages_per_seq, 1), or None for a dense cache
    out_like_q: bool
    masked: bool  # the causal / windowed masks: rows that see no key are left unwritten, O is always zeroed first
    fill: bool  # zero O first (masked, or an engine not checked to write the rows of empty caches)


#: Parameters of :func:`fused_attn_decode` that are per-call data, never part of its call
#: signature: their values are read on the device by every launch.
DECODE_PER_CALL = {
    "cache_seqlens": "values read by every launch; dtype, shape and device checked per call, a strided or "
                     "unaligned view copied into a dense buffer",
    "page_table": "values read by every launch (its shape is keyed); dtype, device, contiguity and alignment "
                  "checked per call",
    "return_softmax_lse": "what is returned, not what is computed (the stats are always written)",
}

_memo = SigMemo(max_entries=1024)
_dependent_caches.append(_memo)  # forgotten with the forward's memo (prepared.forget_prepared)


def binding_order(paged: bool) -> tuple[int, ...]:
    """The operands :func:`fused_attn_decode` binds, by uid, in its order: q, k, v, O, stats,
    the query and key/value lengths, (the page tables)."""
    uids = [Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS, Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV]
    if paged:
        uids += [Uid.PAGE_TABLE_K, Uid.PAGE_TABLE_V]
    return tuple(uids)


def fused_attn_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_table: Optional[torch.Tensor] = None,
    *,
    attn_scale: Optional[float] = None,
    window_size: Sequence[int] = (-1, -1),
    out: Optional[torch.Tensor] = None,
    return_softmax_lse: bool = False,
) -> Any:
    """Attention of each sequence's new query token(s) over its cached keys and values.

    Args:
        q: ``[b, s_q, h, d]``, bf16 or fp16: the step's queries, ``s_q`` tokens per sequence
            (1 in plain decode). With ``s_q > 1`` query ``i`` sees the keys up to position
            ``cache_seqlens - s_q + i`` (causal, bottom-right aligned).
        k_cache, v_cache: paged, ``[num_pages, page_size, hg, d]`` page pools (with
            ``page_table``); dense, ``[b, s_max, hg, d]``. Any strides with a unit last dim
            (head-major buffers through a transpose). ``hg`` divides ``h`` (GQA/MQA).
        cache_seqlens: int32 ``[b]`` on q's device: how many cached tokens each sequence
            attends to (the new tokens' K/V already written). Read on the device, never
            synchronised; values must lie in ``[0, capacity]`` (capacity ``s_max``, or
            ``pages_per_seq * page_size``), which is not checked (no host sync).
        page_table: int32 ``[b, pages_per_seq]`` (contiguous), the pages of each sequence in
            order; None for a dense cache.
        attn_scale: defaults to ``d ** -0.5``.
        window_size: ``(-1, -1)``, or ``(left, 0)``: each query sees at most its last
            ``left + 1`` keys.
        out: optional preallocated contiguous ``[b, s_q, h, d_v]`` result.
        return_softmax_lse: also return the fp32 ``[b, h, s_q, 1]`` logsumexp of each row.

    Returns ``out`` (``[b, s_q, h, d_v]`` in q's dtype), or ``(out, softmax_lse)``. A query row
    that sees no key (a sequence whose ``cache_seqlens`` is 0, an idle batch slot) is zero.

    Raises ``TypeError`` / ``ValueError`` for malformed input (naming the argument),
    ``UnsupportedConfigError`` with the sub-backend's reasons when cuDNN cannot run it,
    :class:`CaptureMissError` for a first call inside a CUDA-graph capture.

    Under ``torch.compile`` the call traces to the custom operator ``torch.ops.te_cudnn.decode``
    (no graph break; its fake gives the results' shapes); a given ``out`` is then written by a copy.
    """
    if _is_compiling():
        return _traced(q, k_cache, v_cache, cache_seqlens, page_table, attn_scale, window_size, out, return_softmax_lse)
    try:
        sig: Optional[tuple] = (
            q.shape, q.stride(), q.dtype, q.get_device(), k_cache.shape, k_cache.stride(), k_cache.dtype,
            k_cache.get_device(), v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.get_device(),
            None if page_table is None else page_table.shape, attn_scale,
            window_size if window_size.__class__ is tuple else tuple(window_size), _meta(out), _policy_token(),
        )  # fmt: skip
        dec = _memo.find(sig)
    except (AttributeError, TypeError, IndexError, RuntimeError):  # not tensors, unhashable options
        sig = dec = None
    if dec is None:
        dec = _prepare(sig, q, k_cache, v_cache, cache_seqlens, page_table, attn_scale, window_size, out)
    prep = dec.prep
    # runtime data, not in the signature: checked on every call (a few attribute reads)
    if (cache_seqlens.__class__ is not torch.Tensor or cache_seqlens.dtype is not _INT32
            or cache_seqlens.shape != (dec.b,) or cache_seqlens.device != prep.device
            or cache_seqlens.data_ptr() & 15 or not cache_seqlens.is_contiguous()):  # fmt: skip
        cache_seqlens = _seqlens_operand(cache_seqlens, dec.b, prep.device)
    if dec.pages_shape is not None and (
        page_table.dtype is not _INT32 or page_table.device != prep.device or not page_table.is_contiguous()
        or page_table.data_ptr() & 15
    ):  # fmt: skip
        _check_page_table(page_table, dec.b, prep.device)
    if prep.empty:
        o, st = empty_fwd(prep.cfg, q, out, None, prep.stats_shape, torch.float32)
        return (o, st) if return_softmax_lse else o
    plan = prep.plan
    if plan is None or plan.evicted:
        plan = prep.get_plan()
        # one query row and no window: cuDNN writes every row, zeros for an empty cache, where this
        # engine's check on this machine says so (te_cudnn.row_fill, te_cudnn.plans.padded_rows)
        dec.fill = dec.masked or fills_out(prep.cfg, prep.backend, plan)
    plan.hits += 1
    plan.last_used = next_tick()
    if out is None:
        out = torch.empty_like(q if dec.out_like_q else prep.out_template)
        if dec.fill:
            _zeroed(out, prep.index)
    elif dec.fill:
        out.zero_()
    # a row of an empty cache may be left unwritten: its logsumexp is -inf where it is returned
    stats = torch.empty_like(prep.stats_template)
    if return_softmax_lse:
        _neg_inf(stats, prep.index)
    buffers = [q, k_cache, v_cache, out, stats, dec.q_lens, cache_seqlens.view(dec.lens_shape)]
    if dec.pages_shape is not None:
        table = page_table.view(dec.pages_shape)
        buffers += (table, table)
    _execute(plan, buffers, prep.device, _FWD_NAMES)
    return (out, stats) if return_softmax_lse else out


def _traced(q, k_cache, v_cache, cache_seqlens, page_table, attn_scale, window_size, out, return_softmax_lse) -> Any:
    """The call as torch.compile sees it: one ``te_cudnn::decode`` node (validated when it runs)."""
    (left, _), _mask = _window(window_size, q.shape[1])
    # registered by te_cudnn.torch_ops (imported with the package), which sits above this module
    o, lse = torch.ops.te_cudnn.decode.default(q, k_cache, v_cache, cache_seqlens, page_table, attn_scale, left)
    if out is not None:
        out.copy_(o)
        o = out
    return (o, lse) if return_softmax_lse else o


def _check_seqlens(t: Any, b: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"cache_seqlens must be a torch.Tensor (int32 [b] = [{b}]), got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"cache_seqlens must be int32, got {t.dtype} (an int32 [b] = [{b}] tensor on {device})")
    if tuple(t.shape) != (b,):
        raise ValueError(f"cache_seqlens must have shape [b] = [{b}], got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"cache_seqlens is on {t.device} but q is on {device}")


def _seqlens_operand(t: Any, b: int, device: torch.device) -> torch.Tensor:
    """``cache_seqlens`` as cuDNN reads it: the tensor itself when it is a dense, 16-byte aligned
    int32 ``[b]``; a strided view (a column of a struct-of-arrays ``[b, n]`` table) or an
    unaligned one is copied into a dense buffer first (one small kernel on the caller's stream,
    captured into CUDA graphs like the launch, so a replay reads the table's current values)."""
    _check_seqlens(t, b, device)
    if t.is_contiguous() and not t.data_ptr() & 15:
        return t
    return torch.empty(b, dtype=torch.int32, device=device).copy_(t)


def _check_page_table(t: Any, b: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"page_table must be a torch.Tensor (int32 [b, pages_per_seq]) or None, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"page_table must be int32, got {t.dtype}")
    if t.dim() != 2 or t.shape[0] != b:
        raise ValueError(f"page_table must have shape [b, pages_per_seq] = [{b}, n], got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"page_table is on {t.device} but q is on {device}")
    if not t.is_contiguous():
        raise ValueError(f"page_table must be contiguous, got stride {tuple(t.stride())}")
    if t.data_ptr() % 16:
        raise ValueError(f"page_table must start on a 16-byte boundary, got data_ptr % 16 = {t.data_ptr() % 16}")


def _window(window_size: Any, sq: int = 1) -> tuple[tuple[int, int], str]:
    """The forward's window and mask: one query token and ``(-1, -1)`` is the padding mask
    alone; several query tokens attend causally, bottom-right aligned; ``(left, 0)`` (or
    ``(left, -1)``: no later keys exist) is a bottom-right window."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or any(
            isinstance(w, bool) or not isinstance(w, int) for w in window_size):  # fmt: skip
        raise ValueError(f"window_size must be a (left, right) pair of ints, got {_value(window_size)}")
    left, right = window_size
    if left < -1 or right not in (-1, 0):
        raise ValueError(f"window_size={tuple(window_size)}: decode takes (-1, -1) or (left, 0) with left >= 0 "
                         "(the new token is the last one; no key comes after it)")  # fmt: skip
    if left == -1:
        return (-1, -1), "padding" if sq == 1 else "padding_causal_bottom_right"
    return (left, 0), "padding_causal_bottom_right"


def _prepare(sig, q, k, v, cache_seqlens, page_table, attn_scale, window_size, out) -> _Decode:
    """Validate the first call of a signature and prepare the forward it runs (once)."""
    if _is_capturing():
        raise CaptureMissError("a decode call signature seen for the first time (shapes, strides or options)")
    for name, t in (("q", q), ("k_cache", k), ("v_cache", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {list(t.shape)}")
    if q.dtype not in _F16:
        raise TypeError(f"q.dtype must be bfloat16 or float16 for decode, got {q.dtype}")
    b = q.shape[0]
    _check_seqlens(cache_seqlens, b, q.device)
    paged = page_table is not None
    if paged:
        _check_page_table(page_table, b, q.device)
        capacity, layout = page_table.shape[1] * k.shape[1], "paged_kv_bshd_bshd_bshd"
    else:
        if k.shape[0] != b:
            raise ValueError(f"a dense k_cache must be [b, s_max, hg, d] with b = {b} (q's), got shape {list(k.shape)}; "
                             "pass page_table for a paged cache")  # fmt: skip
        capacity, layout = k.shape[1], "bshd_bshd_bshd"
    sq = q.shape[1]
    window, mask = _window(window_size, sq)
    # describe_fwd checks cu_seqlens by shape, dtype and device only (never their values):
    # placeholders stand in for the lengths decode binds itself
    cu = torch.arange(b + 1, dtype=torch.int32, device=q.device)
    args = fwd_call_args(
        is_training=False, max_seqlen_q=sq, max_seqlen_kv=capacity, cu_seqlens_q=cu, cu_seqlens_kv=cu, q=q, k=k, v=v,
        qkv_dtype=None, fused_attention_backend=FusedAttnBackend.F16_arbitrary_seqlen, attn_scale=attn_scale,
        page_table_k=page_table, page_table_v=page_table, qkv_layout=layout, attn_mask_type=mask, window_size=window,
        out=out,
    )  # fmt: skip
    prep = _prepare_fwd(None, args)
    cfg = prep.cfg
    order = binding_order(paged)
    if not prep.empty and prep.backend.operand_uids(cfg, Direction.FWD) != order:  # a builder changed its operands
        raise AssertionError(f"decode binds {order} but the {prep.backend.name} forward graph takes "
                             f"{prep.backend.operand_uids(cfg, Direction.FWD)}")  # fmt: skip
    dec = _Decode(
        prep=prep, b=b, q_lens=kept(lambda: torch.full((b, 1, 1, 1), sq, dtype=torch.int32, device=q.device), q.device),
        lens_shape=(b, 1, 1, 1),
        pages_shape=(b, 1, page_table.shape[1], 1) if paged else None, out_like_q=prep.out_like_q,
        masked=mask != "padding", fill=True,
    )  # fmt: skip
    _memo.remember(sig, dec)
    return dec

