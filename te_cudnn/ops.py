"""``fused_attn_fwd`` / ``fused_attn_bwd``: TransformerEngine's interface over cached cuDNN plans.

Host path: the first call with a given signature (shapes, strides, dtypes, devices and
options) validates it, selects a sub-backend and looks up or builds the plan; the result is
remembered under the raw signature, so later calls do no validation, no selection and no key
construction, only allocation of the results and the launch. Nothing is copied: q, k, v are
handed to cuDNN as strided views, results are allocated in the layout's own format.

This module computes a call's signature and dispatches it. Below it, one concern each:
:mod:`te_cudnn.first_call` (the slow path: checks, description, selection, key),
:mod:`te_cudnn.prepared` (the prepared calls and their memos), :mod:`te_cudnn.launchers`
(results, operand binding and launch of a prepared call), :mod:`te_cudnn.rng` (dropout's seed
and offset), :mod:`te_cudnn.fp8_operands` (FP8 scaling operands) and
:mod:`te_cudnn.selection` (``explain`` / ``get_fused_attn_backend``). Below those,
:mod:`te_cudnn.launch` runs a plan on the caller's stream (workspaces, launch contexts, pointer
arrays) and :mod:`te_cudnn.varlen` computes and caches the per-call lengths and ragged offsets
of variable-length calls.
"""

from __future__ import annotations

import atexit
import inspect
from collections import namedtuple
from typing import Any, Optional, Sequence

import torch

from . import prepared as _prepared_calls
from .empty import empty_bwd
from .enums import META_DO, META_DP, META_DQKV, META_O, META_QKV, META_S
from .first_call import _prepare_bwd, _prepare_fwd
from .fp8_operands import _fp8_sig, fp8_bwd_scales
from .launchers import _empty_fwd, general_bwd, general_fwd, plain_bwd, plain_fwd
from .policy import token as _policy_token
from .ragged import bucket_batch, bucket_q_seqlen, bucket_seqlen, bucket_tokens
from .served import padded_bwd, padded_fwd
from .varlen import BatchLengths
from .varlen import clear as _clear_runtime_buffers

# Re-exported: the public names of the modules below, and the ones other modules, the tests and
# tools/ read from te_cudnn.ops.
from .first_call import _check_no_fp8_args, _check_result_buffer, _coerce_backend, _require_cuda  # noqa: F401
from .fp8_operands import fp8_bwd_operands, fp8_fwd_operands  # noqa: F401
from .launchers import _part_plan, _split_bwd  # noqa: F401
from .memo import SigMemo  # noqa: F401
from .plans import handle_for, handles, plan_cache  # noqa: F401
from .plans.split import chosen_split  # noqa: F401
from .prepared import _DENSE_TEMPLATE_BYTES, _Prepared, _dependent_caches  # noqa: F401
from .prepared import _template, forget_prepared  # noqa: F401
from .rng import _check_rng_state, _device_rng_state, _rng_state  # noqa: F401
from .selection import Explanation, explain, get_fused_attn_backend
from .launch import FWD_NAMES as _FWD_NAMES  # noqa: F401
from .launch import execute as _execute  # noqa: F401
from .launch import is_capturing as _is_capturing  # noqa: F401
from .launch import launch as _launch  # noqa: F401
from .launch import release_workspaces
from .launch import seed_offset as _seed_offset  # noqa: F401

__all__ = ["fused_attn_fwd", "fused_attn_bwd", "get_fused_attn_backend", "explain", "Explanation", "release_workspaces"]

#: The memos of prepared calls (te_cudnn.prepared), bound by assignment rather than imported:
#: CPython compiles ``_fwd_memo.find(sig)`` on a name bound by an import to an attribute load and
#: a bound-method call, on any other global to a direct method call (the per-call lookup below).
_fwd_memo = _prepared_calls._fwd_memo
_bwd_memo = _prepared_calls._bwd_memo


#: Parameters of :func:`fused_attn_fwd` that are per-call data, never part of its call
#: signature (a repeated signature skips validation; everything else is keyed). What each
#: one's values do, and what is checked on every call.
FWD_PER_CALL = {
    "cu_seqlens_q": "values: the lengths are derived from them on the device by every call (or taken from "
                    "lengths=); whether it is given is keyed; dtype, device and size checked per call where read",
    "cu_seqlens_kv": "as cu_seqlens_q",
    "cu_seqlens_q_padded": "as cu_seqlens_q (token offsets of THD tensors)",
    "cu_seqlens_kv_padded": "as cu_seqlens_q_padded",
    "page_table_k": "values read by every launch; its shape is keyed; dtype, device and contiguity checked per call",
    "page_table_v": "as page_table_k",
    "rng_gen": "the generator dropout draws from, read by every call",
    "rng_state": "dropout's seed and offset, read by every call; dtype, shape and device checked per call",
    "fast_zero_fill": "accepted for TransformerEngine compatibility; results are zero where promised either way",
    "lengths": "a BatchLengths of this call's cu_seqlens tensors, checked by identity on every call",
}

#: Parameters of :func:`fused_attn_bwd` that are per-call data (see :data:`FWD_PER_CALL`).
BWD_PER_CALL = {name: FWD_PER_CALL[name] for name in (
    "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "fast_zero_fill", "lengths")}


def _meta(t: Optional[torch.Tensor]) -> Any:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


def _sink_sig(t: torch.Tensor) -> tuple:
    """What a call signature keeps of ``softmax_offset`` (checked once per signature)."""
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15)


def _thd_sizes(qs, ks, vs, max_seqlen_q, max_seqlen_kv, cu_q, cu_kv) -> tuple:
    """Signature sizes of a call with THD tensors: only the buckets a plan sees (token counts,
    batch and max sequence lengths vary per batch and are runtime data), plus the equalities
    the first validation relied on. Memoised on the shapes and maxima they are computed from
    (maxima that are ints: the memo holds nothing else)."""
    if max_seqlen_q.__class__ is not int or max_seqlen_kv.__class__ is not int:
        return _thd_buckets(qs, ks, vs, max_seqlen_q, max_seqlen_kv, cu_q, cu_kv)
    key = (qs, ks, vs, max_seqlen_q, max_seqlen_kv, None if cu_q is None else cu_q.shape,
           None if cu_kv is None else cu_kv.shape)  # fmt: skip
    sizes = _thd_memo.get(key)
    if sizes is None:
        if len(_thd_memo) >= _THD_MEMO_SIZE:
            _thd_memo.clear()
        sizes = _thd_memo[key] = _thd_buckets(qs, ks, vs, max_seqlen_q, max_seqlen_kv, cu_q, cu_kv)
    return sizes


#: shapes and maxima -> _thd_buckets' tuple; tuples of ints only, at most this many (a few
#: hundred bytes each), cleared when full
_THD_MEMO_SIZE = 1024
_thd_memo: dict[tuple, tuple] = {}


def _thd_buckets(qs, ks, vs, max_seqlen_q, max_seqlen_kv, cu_q, cu_kv) -> tuple:
    return (
        bucket_tokens(qs[0]) if len(qs) == 3 else qs, qs[1:], bucket_tokens(ks[0]) if len(ks) == 3 else ks, ks[1:],
        vs[1:], ks[0] == vs[0], bucket_q_seqlen(max_seqlen_q) if len(qs) == 3 else max_seqlen_q,
        bucket_seqlen(max_seqlen_kv) if len(ks) == 3 else max_seqlen_kv,
        None if cu_q is None else bucket_batch(cu_q.shape[0] - 1), None if cu_kv is None else cu_kv.shape == cu_q.shape,
        cu_q.shape if cu_q is not None and (len(qs) == 4 or len(ks) == 4) else None,
        # zero-size calls (answered without cuDNN) share no signature with the others of their bucket
        0 in (qs[0], ks[0], max_seqlen_q, max_seqlen_kv) or (cu_q is not None and cu_q.shape[0] < 2),
    )  # fmt: skip


# ================================================================================ forward


def fused_attn_fwd(
    is_training: bool,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_kv: Optional[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qkv_dtype: Optional[torch.dtype],
    fused_attention_backend: Any = None,
    attn_bias: Optional[torch.Tensor] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    page_table_k: Optional[torch.Tensor] = None,
    page_table_v: Optional[torch.Tensor] = None,
    d_scale_qkv: Optional[torch.Tensor] = None,
    d_scale_qkv_offset: int = META_QKV,
    d_scale_s: Optional[torch.Tensor] = None,
    d_scale_s_offset: int = META_S,
    q_scale_s: Optional[torch.Tensor] = None,
    q_scale_s_offset: int = META_S,
    q_scale_o: Optional[torch.Tensor] = None,
    q_scale_o_offset: int = META_O,
    amax_s: Optional[torch.Tensor] = None,
    amax_s_offset: int = META_S,
    amax_o: Optional[torch.Tensor] = None,
    amax_o_offset: int = META_O,
    attn_scale: Optional[float] = None,
    dropout: float = 0.0,
    fast_zero_fill: bool = True,
    qkv_layout: str = "sbh3d",
    attn_bias_type: str = "no_bias",
    attn_mask_type: str = "padding",
    softmax_type: str = "vanilla",
    window_size: Sequence[int] = (-1, -1),
    bottom_right_diagonal: Optional[bool] = None,
    rng_gen: Optional[torch.Generator] = None,
    softmax_offset: Optional[torch.Tensor] = None,
    return_max_logit: bool = False,
    cuda_graph: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
    softmax_lse: Optional[torch.Tensor] = None,
    rng_state: Optional[torch.Tensor] = None,
    lengths: Optional[BatchLengths] = None,
    softmax_stats: bool = True,
    _prepared: Optional[list] = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Fused scaled-dot-product attention forward (TransformerEngine's ``fused_attn_fwd``).

    Shapes follow ``qkv_layout``: for ``bshd_*`` layouts q is ``[b, sq, h, d_qk]`` and k/v are
    ``[b, skv, hg, d]``; for ``sbhd_*`` the first two dims swap; packed layouts (``sb3hd``,
    ``bsh3d``, ``*_2hd``, ``*_h2d``) take q, k, v as views into one buffer. ``hg`` must divide
    ``h`` (GQA/MQA). Equivalent PyTorch, in BHSD::

        s = attn_scale * q @ k.transpose(-2, -1) + bias   # attn_scale defaults to d_qk ** -0.5
        out = dropout(softmax(mask(s))) @ v

    Returns ``(out, aux_ctx_tensors)``: ``out`` in q's format with head dim ``d_v``;
    ``aux_ctx_tensors = [softmax_lse (fp32 [b, h, sq, 1], natural-log logsumexp), rng_state
    (int64 [2] = Philox seed, offset; a shared all-zero tensor when dropout is off), bias
    (post_scale_bias only)]``, which ``fused_attn_bwd`` takes back.

    ``fused_attention_backend=None`` selects the sub-backend; naming one checks it and never
    falls back. Masks: ``no_mask``, ``causal`` (top-left), ``causal_bottom_right`` and the
    padding masks ``padding``, ``padding_causal``, ``padding_causal_bottom_right`` (TE's
    default), whose per-sequence lengths come from ``cu_seqlens_q/kv`` (int32 ``[b + 1]``,
    checked on every call); THD and paged layouts as in the README. ``window_size=(left, right)``
    lets query i see keys
    ``[i + skv - sq - left, i + skv - sq + right]`` (bottom-right aligned; top-left drops the
    ``skv - sq``); -1 is unbounded. Dropout draws its Philox seed/offset from ``rng_gen``
    (default: the device's CUDA generator), advancing it by 16 as TE does.

    Beyond TransformerEngine: keyword-only ``out`` and ``softmax_lse`` take preallocated,
    contiguous result tensors (for static buffers and CUDA graphs); they are written and
    returned instead of new tensors. Keyword-only ``rng_state`` (int64 ``[2]`` on the device:
    Philox seed, offset) is used for dropout instead of drawing from ``rng_gen``, and returned
    as ``aux_ctx_tensors[1]`` (te_cudnn's custom ops pass one drawn on the device).
    Keyword-only ``lengths`` (a :class:`te_cudnn.BatchLengths` of this call's ``cu_seqlens*``)
    reuses the lengths and offsets that an earlier call of the same batch derived; without it,
    a padding-mask or THD call derives them on the device from ``cu_seqlens*`` on every call,
    so the answer never depends on how the caller wrote them.
    Keyword-only ``softmax_stats=False`` says the caller takes no softmax stats (no backward
    follows): dense F16 calls that F16_arbitrary_seqlen serves then run a graph that does not
    write them, and ``aux_ctx_tensors[0]`` is None; other calls write and return them as usual.
    te_cudnn's doors pass it for calls that record no gradient.

    CUDA graphs: inside a capture, dropout draws its seed and offset on the device from
    ``rng_gen``'s graph-safe state, so every replay uses a fresh mask and the backward replays
    the forward's. A call whose plan is not built yet raises :class:`CaptureMissError`: run
    one eager step first.

    Zero-size calls (a batch, sequence or token count of 0, or a ``max_seqlen_*`` of 0) return
    results of the right shapes without calling cuDNN: ``out`` zeros, fp32 stats ``-inf``; the
    generator advances as usual (see :mod:`te_cudnn.empty`). A post-scale bias cuDNN cannot read
    in place (rows not a multiple of 16 bytes, e.g. ``skv = 100`` in bf16, or an unaligned
    start) is copied into an aligned buffer, the one copy on the fused path (logged at debug
    level on the ``te_cudnn`` logger); aligned biases are read where they are.

    Raises:
        TypeError / ValueError: malformed input, naming the argument and its value.
        UnsupportedConfigError: valid input no sub-backend serves; lists every reason.
        GraphBuildError: cuDNN declined to plan the graph.
    """
    try:
        qs, ks, vs = q.shape, k.shape, v.shape
        sizes = (
            (qs, ks, vs, max_seqlen_q, max_seqlen_kv) if len(qs) == 4 and len(ks) == 4
            else _thd_sizes(qs, ks, vs, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv)
        )  # fmt: skip
        extra = None  # the optional tensors, described only when one is given (most calls pass none)
        if not (attn_bias is None and page_table_k is None and page_table_v is None and out is None
                and softmax_lse is None and softmax_offset is None and d_scale_qkv is None and d_scale_s is None
                and q_scale_s is None and q_scale_o is None and amax_s is None and amax_o is None):
            extra = (
                None if attn_bias is None else (attn_bias.shape, attn_bias.stride(), attn_bias.dtype,
                                                attn_bias.get_device(),
                                                attn_bias.data_ptr() & 15),  # an unaligned start is copied (bias_copy)
                None if page_table_k is None else page_table_k.shape, None if page_table_v is None else page_table_v.shape,
                _meta(out), _meta(softmax_lse), None if softmax_offset is None else _sink_sig(softmax_offset),
                None if d_scale_qkv is None and d_scale_s is None and q_scale_s is None and q_scale_o is None
                and amax_s is None and amax_o is None else _fp8_sig(
                    (d_scale_qkv, d_scale_s, q_scale_s, q_scale_o, amax_s, amax_o),
                    (d_scale_qkv_offset, d_scale_s_offset, q_scale_s_offset, q_scale_o_offset, amax_s_offset,
                     amax_o_offset)),
            )  # fmt: skip
        sig: Optional[tuple] = (
            sizes, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(),
            v.get_device(), is_training, qkv_dtype, fused_attention_backend, attn_scale, dropout, qkv_layout,
            attn_bias_type, attn_mask_type, softmax_type,
            window_size if window_size.__class__ is tuple else tuple(window_size), bottom_right_diagonal,
            # cu_seqlens are validated when a signature is first seen; dense non-padding masks never
            # read them, so later calls only note whether they are given (two fewer C calls each).
            cu_seqlens_q is None, cu_seqlens_kv is None, cu_seqlens_q_padded is None and cu_seqlens_kv_padded is None,
            extra, return_max_logit, cuda_graph, softmax_stats,
            _policy_token(),  # te_cudnn.backend_policy in force: another policy prepares its own call
        )  # fmt: skip
        prep = _fwd_memo.find(sig)
    except (AttributeError, TypeError, IndexError, RuntimeError):  # not tensors (or 0-d, nested ones; tensors in
        # scalar places), unhashable options: the slow path says what is wrong
        sig = prep = None
    if prep is None:  # the first call of this signature: validate, select, key (the slow path)
        prep = _prepare_fwd(sig, FwdArgs(
            is_training=is_training, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, q=q, k=k, v=v, qkv_dtype=qkv_dtype,
            fused_attention_backend=fused_attention_backend, attn_bias=attn_bias,
            cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            page_table_k=page_table_k, page_table_v=page_table_v, d_scale_qkv=d_scale_qkv,
            d_scale_qkv_offset=d_scale_qkv_offset, d_scale_s=d_scale_s, d_scale_s_offset=d_scale_s_offset,
            q_scale_s=q_scale_s, q_scale_s_offset=q_scale_s_offset, q_scale_o=q_scale_o, q_scale_o_offset=q_scale_o_offset,
            amax_s=amax_s, amax_s_offset=amax_s_offset, amax_o=amax_o, amax_o_offset=amax_o_offset,
            attn_scale=attn_scale, dropout=dropout, fast_zero_fill=fast_zero_fill, qkv_layout=qkv_layout,
            attn_bias_type=attn_bias_type, attn_mask_type=attn_mask_type, softmax_type=softmax_type,
            window_size=window_size, bottom_right_diagonal=bottom_right_diagonal, rng_gen=rng_gen,
            softmax_offset=softmax_offset, return_max_logit=return_max_logit, cuda_graph=cuda_graph, out=out,
            softmax_lse=softmax_lse, rng_state=rng_state, lengths=lengths, softmax_stats=softmax_stats,
        ))  # fmt: skip
    if _prepared is not None:
        _prepared.append(prep)
    if prep.plain:  # dense F16, no bias, FP8, paging or sink: the shortest path
        return plain_fwd(prep, q, k, v, out, softmax_lse, rng_state, rng_gen)
    if prep.head_pad is not None:  # head dims not a multiple of 8: on padded copies (te_cudnn.served)
        given = locals()
        return padded_fwd(prep.head_pad, FwdArgs(**{n: given[n] for n in FwdArgs._fields}), fused_attn_fwd)
    if prep.empty:
        return _empty_fwd(prep, q, out, softmax_lse, attn_bias, rng_gen, ((amax_s, amax_s_offset), (amax_o, amax_o_offset)),
                          softmax_offset)  # fmt: skip
    fp8 = None
    if prep.fp8:
        fp8 = (d_scale_qkv, d_scale_qkv_offset, d_scale_s, d_scale_s_offset, q_scale_s, q_scale_s_offset, q_scale_o,
               q_scale_o_offset, amax_s, amax_s_offset, amax_o, amax_o_offset)  # fmt: skip
    return general_fwd(prep, q, k, v, out, softmax_lse, rng_state, rng_gen, attn_bias,
                       (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded),
                       page_table_k, page_table_v, softmax_offset, fp8, lengths)  # fmt: skip


def _call_record(name: str, fn: Any) -> type:
    """A named tuple of ``fn``'s public parameters, in its order and with no defaults: what the
    slow path of a call reads (:func:`_prepare_fwd` / :func:`_prepare_bwd`). Built from the
    signature, so the two cannot drift apart; having no defaults, a record that leaves a
    parameter out fails when it is made, not later."""
    fields = [n for n in inspect.signature(fn).parameters if not n.startswith("_")]
    record = namedtuple(name, fields)  # type: ignore[misc]  # noqa: PYI024
    record.__doc__ = f"The arguments of one ``{fn.__name__}`` call, by name ({len(fields)} fields)."
    return record


#: One forward call's arguments (see _call_record).
FwdArgs = _call_record("FwdArgs", fused_attn_fwd)


def _public_signature(fn: Any) -> None:
    """Show ``fn``'s signature without its internal parameters (``_prepared``: a list that
    receives the call's prepared description, which the custom ops keep to launch later calls
    of the same kind directly) in ``help()`` and ``inspect.signature``."""
    sig = inspect.signature(fn)
    fn.__signature__ = sig.replace(parameters=[p for n, p in sig.parameters.items() if not n.startswith("_")])


_public_signature(fused_attn_fwd)
_FWD_PARAMETERS = {n: p for n, p in inspect.signature(fused_attn_fwd).parameters.items() if n in FwdArgs._fields}


def fwd_call_args(**given: Any) -> FwdArgs:
    """A forward call's arguments as :func:`_prepare_fwd` reads them: ``fused_attn_fwd``'s
    defaults, then ``given`` (which must name its parameters and give the ones without a
    default). For entry points that prepare a forward of their own (``te_cudnn.decode``)."""
    unknown = given.keys() - _FWD_PARAMETERS.keys()
    missing = [n for n, p in _FWD_PARAMETERS.items() if p.default is inspect.Parameter.empty and n not in given]
    if unknown:
        raise TypeError(f"fused_attn_fwd has no parameters {sorted(unknown)}")
    if missing:
        raise TypeError(f"fused_attn_fwd needs {missing}")
    return FwdArgs(**{**{n: p.default for n, p in _FWD_PARAMETERS.items()}, **given})


# ================================================================================ backward


def fused_attn_bwd(
    max_seqlen_q: int,
    max_seqlen_kv: int,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_kv: Optional[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    d_o: torch.Tensor,
    qkv_dtype: Optional[torch.dtype],
    aux_ctx_tensors: list[torch.Tensor],
    fused_attention_backend: Any = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    d_scale_qkv: Optional[torch.Tensor] = None,
    d_scale_qkv_offset: int = META_QKV,
    d_scale_s: Optional[torch.Tensor] = None,
    d_scale_s_offset: int = META_S,
    d_scale_o: Optional[torch.Tensor] = None,
    d_scale_o_offset: int = META_O,
    d_scale_do: Optional[torch.Tensor] = None,
    d_scale_do_offset: int = META_DO,
    d_scale_dp: Optional[torch.Tensor] = None,
    d_scale_dp_offset: int = META_DP,
    q_scale_s: Optional[torch.Tensor] = None,
    q_scale_s_offset: int = META_S,
    q_scale_dp: Optional[torch.Tensor] = None,
    q_scale_dp_offset: int = META_DP,
    q_scale_dqkv: Optional[torch.Tensor] = None,
    q_scale_dqkv_offset: int = META_DQKV,
    amax_dp: Optional[torch.Tensor] = None,
    amax_dp_offset: int = META_DP,
    amax_dqkv: Optional[torch.Tensor] = None,
    amax_dqkv_offset: int = META_DQKV,
    attn_scale: Optional[float] = None,
    dropout: float = 0.0,
    fast_zero_fill: bool = True,
    qkv_layout: str = "sbh3d",
    attn_bias_type: str = "no_bias",
    attn_mask_type: str = "padding",
    softmax_type: str = "vanilla",
    window_size: Sequence[int] = (-1, -1),
    bottom_right_diagonal: Optional[bool] = None,
    deterministic: bool = False,
    cuda_graph: bool = False,
    *,
    lengths: Optional[BatchLengths] = None,
    _prepared: Optional[list] = None,
) -> list[Optional[torch.Tensor]]:
    """Fused attention backward (TransformerEngine 2.x's ``fused_attn_bwd``).

    Takes the forward's inputs, its output ``o``, the output gradient ``d_o`` (any strides
    with a unit-stride last dim) and the forward's ``aux_ctx_tensors`` (with a sink, its last
    entry is the ``softmax_offset`` the forward used); the options must match the forward's.
    Returns ``[dq, dk, dv, dbias, d_softmax_offset]`` in the layout's own format (for
    packed layouts dq/dk/dv are views of one buffer, as in TE); ``dbias`` is None without a
    post-scale bias or when the bias broadcasts over b, h and sq; ``d_softmax_offset`` (fp32
    ``[1, h, 1, 1]``) is None unless ``softmax_type="learnable"``. ``deterministic=True``
    asks cuDNN for a bit-reproducible backward (on Hopper its workspace grows as sq x skv).
    Keyword-only ``lengths``: as in :func:`fused_attn_fwd`; pass the forward's to use the
    lengths the forward used.

    Raises the same errors as :func:`fused_attn_fwd`.
    """
    try:
        n_aux = len(aux_ctx_tensors)
        extra = None  # what most calls leave out (a bias, a sink, FP8 scaling tensors), described only when given
        if not (n_aux == 2 and d_scale_qkv is None and d_scale_s is None and d_scale_o is None and d_scale_do is None
                and d_scale_dp is None and q_scale_s is None and q_scale_dp is None and q_scale_dqkv is None
                and amax_dp is None and amax_dqkv is None):
            extra = (
                *(_meta(t) for t in aux_ctx_tensors[2:4]),
                # an unaligned bias is copied; an unaligned softmax_offset is refused
                *(t.data_ptr() & 15 for t in aux_ctx_tensors[2:4]),
                None if d_scale_qkv is None and d_scale_s is None and d_scale_o is None and d_scale_do is None
                and d_scale_dp is None and q_scale_s is None and q_scale_dp is None and q_scale_dqkv is None
                and amax_dp is None and amax_dqkv is None else _fp8_sig(
                    (d_scale_qkv, d_scale_s, d_scale_o, d_scale_do, d_scale_dp, q_scale_s, q_scale_dp, q_scale_dqkv,
                     amax_dp, amax_dqkv),
                    (d_scale_qkv_offset, d_scale_s_offset, d_scale_o_offset, d_scale_do_offset, d_scale_dp_offset,
                     q_scale_s_offset, q_scale_dp_offset, q_scale_dqkv_offset, amax_dp_offset, amax_dqkv_offset)),
            )  # fmt: skip
        stats, rng = aux_ctx_tensors[0], aux_ctx_tensors[1]
        sig: Optional[tuple] = (
            (q.shape, k.shape, v.shape, max_seqlen_q, max_seqlen_kv) if q.dim() == 4 and k.dim() == 4
            else _thd_sizes(q.shape, k.shape, v.shape, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv),
            q.stride(), k.stride(), v.stride(), o.shape, o.stride(), d_o.shape, d_o.stride(), q.dtype, k.dtype, v.dtype, o.dtype,
            d_o.dtype, q.get_device(), k.get_device(), v.get_device(), o.get_device(), d_o.get_device(), qkv_dtype,
            fused_attention_backend, attn_scale, dropout, qkv_layout, attn_bias_type, attn_mask_type, softmax_type,
            window_size if window_size.__class__ is tuple else tuple(window_size), bottom_right_diagonal,
            deterministic,
            # as in fused_attn_fwd: cu_seqlens are validated when a signature is first seen and, where a
            # padding mask or THD reads them, on every call (_check_runtime_tensors)
            cu_seqlens_q is None, cu_seqlens_kv is None,
            n_aux, stats.shape, stats.stride(), stats.dtype, stats.get_device(), _meta(rng), extra, cuda_graph,
            cu_seqlens_q_padded is None and cu_seqlens_kv_padded is None,
            _policy_token(),  # te_cudnn.backend_policy in force: another policy prepares its own call
        )  # fmt: skip
        prep = _bwd_memo.find(sig)
    except (AttributeError, TypeError, IndexError, RuntimeError):  # not tensors (or 0-d, nested ones; tensors in
        # scalar places), unhashable options: the slow path says what is wrong
        sig = prep = None
    if prep is None:  # the first call of this signature: validate, select, key (the slow path)
        prep = _prepare_bwd(sig, BwdArgs(
            max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, q=q, k=k, v=v, o=o, d_o=d_o, qkv_dtype=qkv_dtype,
            aux_ctx_tensors=aux_ctx_tensors, fused_attention_backend=fused_attention_backend,
            cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            d_scale_qkv=d_scale_qkv, d_scale_qkv_offset=d_scale_qkv_offset, d_scale_s=d_scale_s,
            d_scale_s_offset=d_scale_s_offset, d_scale_o=d_scale_o, d_scale_o_offset=d_scale_o_offset,
            d_scale_do=d_scale_do, d_scale_do_offset=d_scale_do_offset, d_scale_dp=d_scale_dp,
            d_scale_dp_offset=d_scale_dp_offset, q_scale_s=q_scale_s, q_scale_s_offset=q_scale_s_offset,
            q_scale_dp=q_scale_dp, q_scale_dp_offset=q_scale_dp_offset, q_scale_dqkv=q_scale_dqkv,
            q_scale_dqkv_offset=q_scale_dqkv_offset, amax_dp=amax_dp, amax_dp_offset=amax_dp_offset,
            amax_dqkv=amax_dqkv, amax_dqkv_offset=amax_dqkv_offset, attn_scale=attn_scale, dropout=dropout,
            fast_zero_fill=fast_zero_fill, qkv_layout=qkv_layout, attn_bias_type=attn_bias_type,
            attn_mask_type=attn_mask_type, softmax_type=softmax_type, window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal, deterministic=deterministic, cuda_graph=cuda_graph,
            lengths=lengths,
        ))  # fmt: skip
    if _prepared is not None:
        _prepared.append(prep)
    if prep.plain:  # dense F16, no bias, FP8 or sink: the shortest path
        return plain_bwd(prep, q, k, v, o, d_o, aux_ctx_tensors[0], aux_ctx_tensors[1])
    if prep.head_pad is not None:  # head dims not a multiple of 8: on padded copies (te_cudnn.served)
        given = locals()
        return padded_bwd(prep.head_pad, BwdArgs(**{n: given[n] for n in BwdArgs._fields}), fused_attn_bwd)
    if prep.empty:
        return empty_bwd(prep.cfg, q, k, v, aux_ctx_tensors[2] if prep.cfg.has_dbias else None,
                         ((amax_dp, amax_dp_offset), (amax_dqkv, amax_dqkv_offset)) if prep.fp8 else ())  # fmt: skip
    fp8 = None
    if prep.fp8:
        fp8 = (fp8_bwd_scales(d_scale_qkv, d_scale_qkv_offset, d_scale_o, d_scale_o_offset, d_scale_do, d_scale_do_offset,
                              d_scale_s, d_scale_s_offset, d_scale_dp, d_scale_dp_offset, q_scale_s, q_scale_s_offset,
                              q_scale_dqkv, q_scale_dqkv_offset, q_scale_dp, q_scale_dp_offset),
               amax_dp.narrow(0, amax_dp_offset, 1), amax_dqkv.narrow(0, amax_dqkv_offset, 1))  # fmt: skip
    return general_bwd(prep, q, k, v, o, d_o, aux_ctx_tensors,
                       (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded), fp8, lengths)


#: One backward call's arguments (see _call_record).
BwdArgs = _call_record("BwdArgs", fused_attn_bwd)
_public_signature(fused_attn_bwd)


def _drop_cudnn_objects() -> None:
    """At interpreter exit (before modules are torn down): drop te_cudnn's references to cuDNN
    frontend objects (prepared calls, plans, launch contexts, handles). torch.library keeps the
    custom ops' Python functions, and through them te_cudnn's module state, alive to the end;
    plans still alive when the frontend's native module is finalized make it report "leaked"
    instances on stderr."""
    try:
        forget_prepared()
        _clear_runtime_buffers()
        release_workspaces()
        plan_cache.clear()
        handles._idle.clear()
    except Exception:  # pragma: no cover - exiting anyway; never turn an exit into a traceback
        pass


atexit.register(_drop_cudnn_objects)
