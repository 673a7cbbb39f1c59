"""Variable-length batches: shape buckets for plan keys, and per-call length/offset tensors.

Sequence lengths and token offsets are runtime data: they reach cuDNN as device tensors
(``seq_len_q/kv`` of ``[B, 1, 1, 1]`` and ragged offsets of ``[B + 1, 1, 1, 1]``), never as
part of a plan key. What the plan does see (the batch dimension B of a THD graph, its
maximum sequence length S and the total-token capacity) is rounded up to a bucket, so a
training loop over batches of varying composition settles on a handful of plans:

* batch: 32 up to 32 sequences, then the next power of two up to 512, then multiples of 512
  (TransformerEngine's ``get_max_batch_size``);
* tokens: 1024 up to 1024, then the next power of two up to 32768, then multiples of 32768
  (TE's ``get_max_tokens``);
* max sequence length: 1 stays 1 (decode), otherwise the next power of two, at least 64; THD
  queries are at least 64 (:func:`bucket_q_seqlen`).

Everything here runs on the caller's stream with no host-device synchronisation.

THD softmax stats (``aux_ctx_tensors[0]``) are stored token-major, ``[t_q, h, 1]`` float32,
row ``i`` holding the logsumexp of query token ``i`` (addressed with ``cu_seqlens_q_padded``),
the layout TransformerEngine uses with cuDNN >= 9.6; rows of padding tokens are undefined.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["bucket_batch", "bucket_tokens", "bucket_seqlen", "bucket_q_seqlen", "extend", "seq_lens", "seq_lens_pair", "ragged_offsets",
           "offsets_view"]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def bucket_batch(b: int) -> int:
    if b <= 32:
        return 32
    if b <= 512:
        return _next_pow2(b)
    return -(-b // 512) * 512


def bucket_tokens(t: int) -> int:
    if t <= 1024:
        return 1024
    if t <= 32768:
        return _next_pow2(t)
    return -(-t // 32768) * 32768


def bucket_seqlen(s: int) -> int:
    return 1 if s <= 1 else max(64, _next_pow2(s))


def bucket_q_seqlen(s: int) -> int:
    """:func:`bucket_seqlen` of THD queries: never 1. With one query row cuDNN picks engines
    that do not write token-major (ragged) softmax stats; a graph of 64 rows does."""
    return bucket_seqlen(s) if s < 1 else max(64, _next_pow2(s))


def extend(cu_seqlens: torch.Tensor, batch: int) -> torch.Tensor:
    """``cu_seqlens`` ([b + 1]) continued with its last value to ``[batch + 1]``: the bucket's
    extra sequences are empty and start where the last real one ends (one kernel, or none)."""
    extra = batch + 1 - cu_seqlens.shape[0]
    return torch.cat((cu_seqlens, cu_seqlens[-1:].expand(extra))) if extra else cu_seqlens


def seq_lens(cu_seqlens: torch.Tensor, batch: int, extended: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[batch, 1, 1, 1]`` int32 lengths ``cu[i+1] - cu[i]``, zero for the bucket's padding."""
    ext = extend(cu_seqlens, batch) if extended is None else extended
    return (ext[1:] - ext[:-1]).view(batch, 1, 1, 1)


def seq_lens_pair(cu_q: torch.Tensor, cu_kv: torch.Tensor, batch: int, ext_q: torch.Tensor,
                  ext_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`seq_lens` of both sides. Two different tensors take one ``torch._foreach_sub``:
    one kernel on CUDA instead of two (each call of a CUDA graph replays it; decode pays it
    on every step)."""
    if ext_kv is ext_q:
        lens = seq_lens(cu_q, batch, ext_q)
        return lens, lens
    lens_q, lens_kv = torch._foreach_sub([ext_q[1:], ext_kv[1:]], [ext_q[:-1], ext_kv[:-1]])
    return lens_q.view(batch, 1, 1, 1), lens_kv.view(batch, 1, 1, 1)


def one_query_lens(ext_q: torch.Tensor, ext_kv: torch.Tensor, batch: int,
                   ones: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The lengths to bind when every sequence has at most one query row (``max_seqlen_q = 1``,
    dense layouts, a padding mask): query lengths of 1 (``ones``, ``[batch, 1, 1, 1]``), and no
    keys for a sequence whose query length is 0 (``te_cudnn.row_fill``: cuDNN's one-row engines
    compute row 0 of every sequence; a row that sees no key is written as zeros).
    ``ext_q`` / ``ext_kv``: :func:`extend`'s cu_seqlens.

    The key lengths are ``len_kv & -len_q`` (one kernel after the subtraction that also gives
    ``-len_q``): ``len_kv`` for a query length of 1, 0 for 0, and never more than ``len_kv`` for
    malformed query lengths (a negative or a larger one), so no key past the caller's is read."""
    neg_q, lens_kv = torch._foreach_sub([ext_q[:-1], ext_kv[1:]], [ext_q[1:], ext_kv[:-1]])
    return ones, torch.bitwise_and(lens_kv, neg_q).view(batch, 1, 1, 1)


def every_key_lens(lens_q: torch.Tensor, lens_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The lengths to bind for longer queries when te_cudnn relies on cuDNN to write every row
    (``te_cudnn.row_fill``): key lengths of at least 1, and no query rows for a sequence without
    keys, so its rows are all past its end (written as zeros) instead of a sequence some engines
    skip. Other sequences keep their lengths. Three small kernels, where the lengths are computed."""
    return lens_q * lens_kv.clamp(0, 1), lens_kv.clamp(min=1)


def ragged_offsets(
    cu_seqlens_padded: torch.Tensor, multipliers: torch.Tensor, batch: int, extended: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Element offsets ``[len(multipliers), batch + 1]`` int64: row ``j`` is
    ``cu_seqlens_padded * multipliers[j]`` (tokens times elements per token), continued with
    its last value over the bucket's padding (empty sequences at the end). One kernel."""
    ext = extend(cu_seqlens_padded, batch) if extended is None else extended
    return ext.unsqueeze(0) * multipliers.unsqueeze(1)  # int32 x int64 -> int64


def offsets_view(offsets: torch.Tensor, row: int) -> torch.Tensor:
    """Row ``row`` of :func:`ragged_offsets` as the ``[B + 1, 1, 1, 1]`` tensor a graph declares."""
    return offsets[row].view(-1, 1, 1, 1)


def cu_or_padded(cu_seqlens: torch.Tensor, padded: Optional[torch.Tensor]) -> torch.Tensor:
    return cu_seqlens if padded is None else padded
