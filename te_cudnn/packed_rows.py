"""One query row over a growing key/value cache, run as a packed (THD) call.

A decode step through Hugging Face's ``DynamicCache`` (or any loop that concatenates each new
key onto contiguous ``[b, hg, s_kv, d]`` tensors) hands attention keys and values whose head
stride ``s_kv * d`` changes every step. A dense graph describes that stride, so each new key
length would need a cuDNN plan of its own (about 0.1 s to build).

With one query row the same call is exactly a variable-length one: take each (batch, KV head)
pair as a sequence of its own, with one KV head and the ``h / hg`` query heads it serves.

* keys and values: THD ``[b * hg * s_kv, 1, d]``, sequence ``i`` starting at token
  ``i * s_kv`` (``cu_seqlens_kv = [0, s_kv, 2 s_kv, ...]``): a view, since the cache is
  contiguous;
* queries: THD ``[b * hg, h / hg, d]``, one token per sequence (``cu_seqlens_q = [0, 1, 2,
  ...]``): a view of ``[b, h, 1, d]`` whose heads are ``d`` apart and batches ``h * d``
  (``[b, 1, h, d]`` memory, as the projections leave it);
* the output, THD ``[b * hg, h / hg, d_v]``, is ``[b, 1, h, d_v]`` memory.

A THD plan sees only buckets of the token counts and of the longest sequence (see
:mod:`te_cudnn.ragged`), so a decode loop settles on one plan per doubling of ``s_kv``. The
key offsets are runtime data: ``cu_seqlens_kv`` lives in a buffer of this module (one per
batch size, device and stream), rewritten in place (one small kernel) only when ``s_kv``
changes, so every layer of a step reuses it and te_cudnn's derivation of lengths and offsets
replays from a CUDA graph (:mod:`te_cudnn.replayed`). The first call of a bucket goes through
:func:`te_cudnn.fused_attn_fwd`, with all its checks; later calls of that bucket go straight to
its launcher (``te_cudnn.launchers.general_fwd``, which checks the per-call tensors), keyed by
what the forward's signature would hold of them: the views' shapes (their strides follow),
dtype, device, scale, backend policy and the buckets of the token counts, batch and length.

Only inference calls qualify: no gradient, no mask, no dropout, not causal (with one row,
torch's top-left causal mask would hide every key but the first), not while compiling or
capturing a CUDA graph (those keep their dense graphs: a static cache has one length). The
Hugging Face attention function and the SDPA drop-in try this path first for such calls when
:func:`packed_one_row` is on (before their remembered dense signatures). Where cuDNN declines
the packed graph (remembered per shape and bucket), the call goes to the door's dense path,
which computes the same attention or raises its own reasons.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from .enums import FusedAttnBackend
from .errors import UnsupportedConfigError
from .launch import is_capturing, kept
from .launchers import general_fwd
from .memo import SigMemo
from .ops import fused_attn_fwd
from .plans.handles import current_raw_stream as _raw_stream
from .policy import token as policy_token
from .prepared import _dependent_caches
from .ragged import bucket_batch, bucket_seqlen, bucket_tokens

__all__ = ["attend_one_row", "packed_views", "packed_one_row", "signature", "BUFFER_LIMIT"]

_INT32 = torch.int32
_F16 = (torch.float16, torch.bfloat16)
_ARBITRARY = FusedAttnBackend.F16_arbitrary_seqlen

#: At most this many ``cu_seqlens`` buffers are kept (a few bytes each); beyond it they are all
#: dropped and made again as calls come.
BUFFER_LIMIT = 256

# (device index, sequences) -> int32 [0, 1, ..., n]: the queries' cu_seqlens, never written again
_steps: dict[tuple[int, int], torch.Tensor] = {}
# (device index, sequences, stream) -> [int32 buffer of the keys' cu_seqlens, the s_kv it holds]
_kv: dict[tuple[int, int, int], list] = {}

# (dtype, q's THD shape, d, d_v, bucket of s_kv) of packed calls cuDNN declined
_declined: set[tuple] = set()
# the buckets of a packed call -> its prepared forward (forgotten with te_cudnn's other memos)
_memo = SigMemo(max_entries=256)
_dependent_caches.append(_memo)

_on = [os.environ.get("TE_CUDNN_PACKED_ONE_ROW", "0") == "1"]


def packed_one_row(on: Optional[bool] = None) -> bool:
    """Whether the Hugging Face attention function and the SDPA drop-in run one-row inference
    calls over contiguous caches packed; pass ``on`` to change it. Off unless
    ``TE_CUDNN_PACKED_ONE_ROW=1`` was in the environment at import. Returns the setting in
    force before the call."""
    was = _on[0]
    if on is not None:
        _on[0] = bool(on)
    return was


def attend_one_row(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   scale: Optional[float]) -> Optional[torch.Tensor]:  # fmt: skip
    """Attention of one query row per sequence over contiguous keys and values, unmasked, as a
    packed call; None when the call does not have that form (the caller's dense path runs it).

    ``query``: ``[b, h, 1, d]`` with head stride ``d`` and batch stride ``h * d``; ``key`` /
    ``value``: contiguous ``[b, hg, s_kv, d]`` / ``[b, hg, s_kv, d_v]`` with ``hg`` dividing
    ``h``, on query's CUDA device, all bf16 or fp16. ``scale`` defaults to ``d ** -0.5``.
    Returns ``[b, 1, h, d_v]`` (contiguous), the attention of each query head over its KV head's
    keys. The caller makes sure that no gradient is wanted; nothing here is recorded by autograd."""
    if not _on[0] or query.__class__ is not torch.Tensor or key.__class__ is not torch.Tensor \
            or value.__class__ is not torch.Tensor or not query.is_cuda or query.dtype not in _F16 \
            or not (scale is None or scale.__class__ is float):  # fmt: skip
        return None
    if key.dtype != query.dtype or value.dtype != query.dtype or key.device != query.device \
            or value.device != query.device or is_capturing():  # fmt: skip
        return None
    views = packed_views(query, key, value)
    if views is None:
        return None
    q, k, v = views
    skv = key.shape[2]
    shape = (query.dtype, q.shape, k.shape[2], v.shape[2], bucket_seqlen(skv))
    if shape in _declined:
        return None
    index = query.get_device()
    cu_q, cu_kv = _seqlens(index, q.shape[0], skv)
    sig = signature(shape, skv, index, scale)
    prep = _memo.find(sig)
    if prep is not None:
        return general_fwd(prep, q, k, v, None, None, None, None, None, (cu_q, cu_kv, None, None), None, None, None,
                           None)[0].view(query.shape[0], 1, query.shape[1], v.shape[2])  # fmt: skip
    prepared: list = []
    try:
        out, _ = fused_attn_fwd(
            False, 1, skv, cu_q, cu_kv, q, k, v, None, _ARBITRARY, attn_scale=scale, qkv_layout="thd_thd_thd",
            attn_mask_type="padding", softmax_stats=False, _prepared=prepared,
        )  # fmt: skip
    except UnsupportedConfigError:  # the same call, dense, may be served: the caller's path decides
        if len(_declined) >= BUFFER_LIMIT:
            _declined.clear()
        _declined.add(shape)
        return None
    if len(prepared) == 1 and not (prepared[0].plain or prepared[0].empty or prepared[0].head_pad is not None):
        _memo.remember(sig, prepared[0])  # later calls of these buckets go straight to the launcher
    b, h = query.shape[:2]
    return out.view(b, 1, h, out.shape[-1])


def signature(shape: tuple, skv: int, index: int, scale: Optional[float]) -> tuple:
    """What :func:`te_cudnn.fused_attn_fwd`'s signature of a packed call holds, as a key of its
    prepared forward: ``shape`` (dtype, q's THD shape, d, d_v, the length's bucket; the views'
    strides follow from it), the token counts' and batch's buckets (``te_cudnn.ops._thd_buckets``),
    the device, the scale and the backend policy; the options are constants."""
    n = shape[1][0]
    return (shape, bucket_tokens(n), bucket_tokens(n * skv), bucket_batch(n), index, scale, policy_token())


def packed_views(query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:  # fmt: skip
    """The THD views ``(q [b*hg, h/hg, d], k [b*hg*s_kv, 1, d], v [b*hg*s_kv, 1, d_v])`` of a
    one-row call (see the module's description), or None when the tensors do not have that
    geometry. Sequence ``i`` (batch ``i // hg``, KV head ``i % hg``) has one query token at
    token ``i`` and ``s_kv`` keys from token ``i * s_kv``."""
    qs, ks, vs = query.shape, key.shape, value.shape
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4 or qs[2] != 1:
        return None
    b, h, _, d = qs
    hg, skv = ks[1], ks[2]
    if b < 1 or ks[0] != b or tuple(vs[:3]) != tuple(ks[:3]) or ks[3] != d or hg < 1 or h % hg or skv < 1:
        return None
    qst = query.stride()
    if qst[3] != 1 or (h > 1 and qst[1] != d) or (b > 1 and qst[0] != h * d):
        return None
    if not (key.is_contiguous() and value.is_contiguous()):
        return None
    n, rep = b * hg, h // hg
    return (query.as_strided((n, rep, d), (rep * d, d, 1)), key.view(n * skv, 1, d), value.view(n * skv, 1, vs[3]))


def _seqlens(index: int, n: int, skv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries' and keys' ``cu_seqlens`` for ``n`` sequences of one query and ``skv`` keys
    each, on device ``index``; the keys' buffer is this stream's and is rewritten (on this
    stream, so after every launch that read its previous values) only when ``skv`` changed.
    Both are made by :func:`te_cudnn.launch.kept`: never in a CUDA-graph pool, and never
    inference tensors (a buffer made under ``torch.inference_mode`` could not be rewritten
    outside it)."""
    steps = _steps.get((index, n))
    if steps is None:
        if len(_steps) >= BUFFER_LIMIT:
            _steps.clear()
        device = torch.device("cuda", index)
        steps = _steps[(index, n)] = kept(lambda: torch.arange(n + 1, dtype=_INT32, device=device), device)
    key = (index, n, _raw_stream(index))
    held = _kv.get(key)
    if held is None:
        if len(_kv) >= BUFFER_LIMIT:
            _kv.clear()
        held = _kv[key] = [kept(lambda: torch.empty_like(steps), steps.device), 0]
    if held[1] != skv:
        torch.mul(steps, skv, out=held[0])
        held[1] = skv
    return steps, held[0]

