"""Context parallelism: how a sequence is split across ``cp`` ranks (pure tensor helpers).

TransformerEngine's "dual chunk" load balancing for causal attention: the sequence is cut into
``2 * cp`` equal chunks and rank ``r`` holds chunks ``r`` and ``2 * cp - 1 - r``, in that order,
so every rank gets one early (cheap) and one late (expensive) chunk of the causal mask.

* Dense (``bshd``: sequence dim 1, ``sbhd``: dim 0): a global length ``S`` divisible by
  ``2 * cp`` gives chunks of ``c = S // (2 * cp)`` tokens and a local length of ``2 * c``.
  cp=2, S=8: rank 0 holds tokens [0, 1, 6, 7], rank 1 holds [2, 3, 4, 5].
* THD (packed variable-length, token dim 0): sequence ``i`` of valid length ``len_i`` (from
  ``cu_seqlens``, int32 ``[b + 1]``) is padded at its end to ``L_i``, ``len_i`` rounded up to a
  multiple of ``2 * cp``; ``cu_seqlens_padded`` (int32 ``[b + 1]``) is the cumulative sum of the
  ``L_i`` and the global padded tensor holds sequence ``i`` at rows ``[P_i, P_i + L_i)``,
  ``P = cu_seqlens_padded``. Every sequence is cut into ``2 * cp`` chunks of ``k_i = L_i // (2 * cp)``
  rows, and rank ``r`` holds, sequence after sequence, chunk ``r`` then chunk ``2 * cp - 1 - r``:
  its local padded offsets are ``cu_seqlens_padded // cp``. The valid tokens of a rank-local
  sequence form a prefix of it: ``v1 = clamp(len_i - r * k_i, 0, k_i)`` in the first half and
  ``v2 = clamp(len_i - (2 * cp - 1 - r) * k_i, 0, k_i)`` in the second.

Everything works on CPU and CUDA tensors alike. Functions documented "no host sync" read no
tensor values on the host and create no data-dependent shapes (they run inside the attention
every call); the others are data preparation and may synchronise where their docstring says so.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = [
    "group_heads",
    "dual_chunks",
    "seq_dim",
    "split_sequence",
    "gather_sequence",
    "pad_cu_seqlens",
    "thd_partition_index",
    "thd_valid_lengths",
    "thd_local_cu_seqlens",
    "pad_thd",
    "unpad_thd",
    "split_thd",
    "gather_thd",
    "shard",
    "unshard",
]

_SEQ_DIMS = {"bshd": 1, "sbhd": 0, "thd": 0}


# ----------------------------------------------------------------------------- validation
def _check_int(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {name}={value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")


def _check_cu(name: str, cu: torch.Tensor) -> None:
    """Metadata only (no host sync): a 1-D integer tensor of at least one element."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    integer = not (cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool)
    if cu.dim() != 1 or cu.numel() == 0 or not integer:
        raise ValueError(f"{name} must be a 1-D integer tensor [b + 1], got shape {tuple(cu.shape)}, {cu.dtype}")


def _check_parts(parts: Sequence[torch.Tensor]) -> int:
    """Number of ranks ``cp = len(parts)``; every part must have the same shape."""
    if len(parts) == 0:
        raise ValueError("parts must hold one tensor per rank, got len(parts)=0")
    shapes = {tuple(p.shape) for p in parts}
    if len(shapes) != 1:
        raise ValueError(f"parts must all have one shape, got len(parts)={len(parts)} with shapes {sorted(shapes)}")
    return len(parts)


def _dense_dim(qkv_format: str) -> int:
    if qkv_format == "thd":
        raise ValueError("qkv_format='thd' is packed: use split_thd / gather_thd (or shard / unshard)")
    return seq_dim(qkv_format)


# ----------------------------------------------------------------------------- common
def dual_chunks(cp: int, rank: int) -> tuple[int, int]:
    """The two chunk ids (of ``2 * cp``) that ``rank`` holds: ``(rank, 2 * cp - 1 - rank)``."""
    _check_int("cp", cp, 1)
    _check_int("rank", rank, 0)
    if rank >= cp:
        raise ValueError(f"rank={rank} with cp={cp}: rank must be in [0, cp)")
    return rank, 2 * cp - 1 - rank


def seq_dim(qkv_format: str) -> int:
    """Sequence (token) dimension of a format: ``"bshd"`` -> 1, ``"sbhd"`` -> 0, ``"thd"`` -> 0."""
    if qkv_format not in _SEQ_DIMS:
        raise ValueError(f"qkv_format={qkv_format!r} is not one of {', '.join(map(repr, _SEQ_DIMS))}")
    return _SEQ_DIMS[qkv_format]


# ----------------------------------------------------------------------------- dense
def split_sequence(x: torch.Tensor, cp: int, rank: int, qkv_format: str) -> torch.Tensor:
    """Rank ``rank``'s share of a dense tensor: ``[b, S, ...]`` (bshd) or ``[S, b, ...]`` (sbhd)
    -> ``[b, 2c, ...]`` / ``[2c, b, ...]`` with ``c = S // (2 * cp)``, chunk ``rank`` then chunk
    ``2 * cp - 1 - rank``; a new contiguous tensor. ``S`` must be divisible by ``2 * cp``."""
    first, second = dual_chunks(cp, rank)
    dim = _dense_dim(qkv_format)
    if x.dim() <= dim:
        raise ValueError(f"x of shape {tuple(x.shape)} has no sequence dim {dim} for qkv_format={qkv_format!r}")
    s = x.shape[dim]
    if s % (2 * cp):
        raise ValueError(f"sequence length S={s} is not divisible by 2*cp={2 * cp} (cp={cp})")
    c = s // (2 * cp)
    return torch.cat((x.narrow(dim, first * c, c), x.narrow(dim, second * c, c)), dim)


def gather_sequence(parts: Sequence[torch.Tensor], qkv_format: str) -> torch.Tensor:
    """Inverse of :func:`split_sequence`: ``parts[r]`` is rank ``r``'s local tensor (``[b, 2c, ...]``
    or ``[2c, b, ...]``) for every rank, ``cp = len(parts)``; returns the full sequence
    (``S = 2c * cp``)."""
    cp = _check_parts(parts)
    dim = _dense_dim(qkv_format)
    local = parts[0].shape[dim]
    if local % 2:
        raise ValueError(f"local sequence length {local} of parts (qkv_format={qkv_format!r}) must be even")
    c = local // 2
    chunks: list[Optional[torch.Tensor]] = [None] * (2 * cp)
    for rank, part in enumerate(parts):
        first, second = dual_chunks(cp, rank)
        chunks[first], chunks[second] = part.narrow(dim, 0, c), part.narrow(dim, c, c)
    return torch.cat(chunks, dim)


# ----------------------------------------------------------------------------- THD
def _thd_chunks(cu_seqlens_padded: torch.Tensor, cp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P_i, k_i)`` int64 ``[b]``: each sequence's first global padded row and its chunk size
    ``L_i // (2 * cp)``. The one place THD chunk geometry is computed (no host sync)."""
    _check_cu("cu_seqlens_padded", cu_seqlens_padded)
    padded = cu_seqlens_padded.long()
    return padded[:-1], (padded[1:] - padded[:-1]) // (2 * cp)


def _token_rows(cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor, tokens: int) -> torch.Tensor:
    """int64 ``[tokens]``: global padded row of each unpadded (packed) token."""
    _check_cu("cu_seqlens", cu_seqlens)
    _check_cu("cu_seqlens_padded", cu_seqlens_padded)
    cu, padded = cu_seqlens.long(), cu_seqlens_padded.long().to(cu_seqlens.device)
    tok = torch.arange(tokens, device=cu.device)
    seq = torch.searchsorted(cu[1:], tok, right=True)
    return tok + (padded - cu)[seq]


def pad_cu_seqlens(cu_seqlens: torch.Tensor, cp: int) -> torch.Tensor:
    """``cu_seqlens_padded`` int32 ``[b + 1]`` from ``cu_seqlens`` (int ``[b + 1]``): each length
    rounded up to a multiple of ``2 * cp`` (0 stays 0), cumulated from 0. No host sync."""
    _check_int("cp", cp, 1)
    _check_cu("cu_seqlens", cu_seqlens)
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    rounded = (lens + 2 * cp - 1) // (2 * cp) * (2 * cp)
    return torch.cat((cu_seqlens.new_zeros(1, dtype=torch.int32), rounded.cumsum(0).int()))


def thd_partition_index(
    cu_seqlens_padded: torch.Tensor, cp: int, rank: int, total_tokens: Optional[int] = None
) -> torch.Tensor:
    """int64 ``[t_padded // cp]``: global padded row of each of ``rank``'s local rows.

    ``total_tokens`` is the global padded token count ``t_padded == cu_seqlens_padded[-1]``.
    Given, there is no host sync; left out, it is read with ``int(cu_seqlens_padded[-1])``,
    the one host sync here (it sets the output size). A value other than
    ``cu_seqlens_padded[-1]`` is not supported (rows past the last sequence have no mapping)."""
    first, second = dual_chunks(cp, rank)
    starts, k = _thd_chunks(cu_seqlens_padded, cp)
    if total_tokens is None:
        total_tokens = int(cu_seqlens_padded[-1])
    _check_int("total_tokens", total_tokens, 0)
    if total_tokens % cp:
        raise ValueError(f"total_tokens={total_tokens} is not divisible by cp={cp}")
    local_starts = starts // cp  # P_i // cp; sequence i's local rows end at local_starts + 2 * k_i
    row = torch.arange(total_tokens // cp, device=starts.device)
    seq = torch.searchsorted(local_starts + 2 * k, row, right=True)
    offset, k = row - local_starts[seq], k[seq]
    return starts[seq] + offset + torch.where(offset < k, first * k, (second - 1) * k)


def thd_valid_lengths(
    cu_seqlens: torch.Tensor,
    cu_seqlens_padded: torch.Tensor,
    cp: int,
    rank: int,
    first: bool = True,
    second: bool = True,
) -> torch.Tensor:
    """int32 ``[b]``: valid tokens of each of ``rank``'s local sequences, ``v1 * first + v2 * second``
    (``v1``/``v2``: valid tokens in its first/second chunk; they always form a prefix of the chunk).
    No host sync."""
    chunk_ids = dual_chunks(cp, rank)
    _check_cu("cu_seqlens", cu_seqlens)
    _, k = _thd_chunks(cu_seqlens_padded, cp)
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long().to(k.device)
    valid = torch.zeros_like(k)
    for chunk, wanted in zip(chunk_ids, (first, second)):
        if wanted:
            valid += torch.minimum((lens - chunk * k).clamp(min=0), k)
    return valid.int()


def thd_local_cu_seqlens(
    cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rank``'s local ``(cu_seqlens, cu_seqlens_padded)``, both int32 ``[b + 1]``: the cumulated
    valid lengths ``v1 + v2`` from 0, and ``cu_seqlens_padded // cp``. No host sync."""
    valid = thd_valid_lengths(cu_seqlens, cu_seqlens_padded, cp, rank)
    cu_local = torch.cat((valid.new_zeros(1), valid.cumsum(0).int()))
    return cu_local, (cu_seqlens_padded // cp).int()


def pad_thd(x: torch.Tensor, cu_seqlens: torch.Tensor, cp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed tokens ``[t, ...]`` (``t == cu_seqlens[-1]``) -> ``(x_padded [t_padded, ...],
    cu_seqlens_padded int32 [b + 1])``, pad rows zero. Data preparation: syncs to read
    ``cu_seqlens[-1]`` and ``t_padded``."""
    cu_padded = pad_cu_seqlens(cu_seqlens, cp)
    if x.shape[0] != int(cu_seqlens[-1]):
        raise ValueError(f"x has {x.shape[0]} tokens but cu_seqlens[-1]={int(cu_seqlens[-1])}")
    rows = _token_rows(cu_seqlens, cu_padded, x.shape[0]).to(x.device)
    out = x.new_zeros((int(cu_padded[-1]), *x.shape[1:]))
    return out.index_copy_(0, rows, x), cu_padded


def unpad_thd(x_padded: torch.Tensor, cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pad_thd`: ``[t_padded, ...]`` -> valid tokens ``[t, ...]``, ``t = cu_seqlens[-1]``
    (read with a host sync)."""
    _check_cu("cu_seqlens", cu_seqlens)
    rows = _token_rows(cu_seqlens, cu_seqlens_padded, int(cu_seqlens[-1]))
    return x_padded.index_select(0, rows.to(x_padded.device))


def split_thd(x_padded: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """``rank``'s local rows ``[t_padded // cp, ...]`` of the global padded ``x_padded [t_padded, ...]``,
    whose row count must be ``cu_seqlens_padded[-1]``. No host sync (the size comes from ``x_padded``)."""
    index = thd_partition_index(cu_seqlens_padded, cp, rank, total_tokens=x_padded.shape[0])
    return x_padded.index_select(0, index.to(x_padded.device))


def gather_thd(parts: Sequence[torch.Tensor], cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_thd`: ``parts[r]`` is rank ``r``'s local ``[t_padded // cp, ...]`` for
    every rank (``cp = len(parts)``) -> global padded ``[t_padded, ...]``. No host sync."""
    cp = _check_parts(parts)
    total = parts[0].shape[0] * cp
    index = torch.cat([thd_partition_index(cu_seqlens_padded, cp, r, total_tokens=total) for r in range(cp)])
    out = parts[0].new_empty((total, *parts[0].shape[1:]))
    return out.index_copy_(0, index.to(out.device), torch.cat(parts))


# ----------------------------------------------------------------------------- dispatch
def _require_padded(qkv_format: str, cu_seqlens_padded: Optional[torch.Tensor]) -> None:
    if cu_seqlens_padded is None:
        raise ValueError(f"cu_seqlens_padded is required for qkv_format={qkv_format!r}, got cu_seqlens_padded=None")


def shard(
    x: torch.Tensor, cp: int, rank: int, qkv_format: str, cu_seqlens_padded: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Rank ``rank``'s share of ``x``: :func:`split_sequence` for bshd/sbhd, :func:`split_thd` for thd
    (``x`` padded ``[t_padded, ...]``, ``cu_seqlens_padded`` required). ``cu_seqlens_padded`` is
    ignored for dense formats."""
    if qkv_format == "thd":
        _require_padded(qkv_format, cu_seqlens_padded)
        return split_thd(x, cu_seqlens_padded, cp, rank)
    return split_sequence(x, cp, rank, qkv_format)


def unshard(
    parts: Sequence[torch.Tensor], qkv_format: str, cu_seqlens_padded: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Inverse of :func:`shard` given every rank's share (``cp = len(parts)``): :func:`gather_sequence`
    or :func:`gather_thd` (``cu_seqlens_padded`` required for thd, ignored otherwise)."""
    if qkv_format == "thd":
        _require_padded(qkv_format, cu_seqlens_padded)
        return gather_thd(parts, cu_seqlens_padded)
    return gather_sequence(parts, qkv_format)


def group_heads(x: torch.Tensor, g: int, groups: int) -> torch.Tensor:
    """Heads of group ``g`` of ``groups`` equal head groups of ``x`` ``[..., h, d]`` (a view)."""
    n = x.shape[-2] // groups
    return x if groups == 1 else x.narrow(-2, g * n, n)
