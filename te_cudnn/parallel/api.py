"""``context_parallel_attention``: one attention over a sequence split across the ranks of a
``torch.distributed`` process group, and its single-process simulation.

Checks come first: an unsupported combination raises :class:`~te_cudnn.UnsupportedConfigError`
with the reasons before any rank communicates, so every rank fails the same way instead of
hanging in a collective.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import torch

from ..autograd import AttnOptions, attend_fp8
from ..config.checks import check_softmax_offset
from ..enums import SoftmaxType
from ..errors import UnsupportedConfigError
from .all_gather import AgJob, AgSpec, AllGatherAttn, plan_tiles
from .hierarchical import a2a_p2p_attention, check_layout, grid_groups
from .ring import DenseTiles, RingSpec, ThdTiles, WindowTiles, draw_rng_states
from .halo import HaloTiles, halo_applies
from .ring_attn import RingAttn, RingJob
from .schedule import ring_window, single_key_tiles
from .transport import (AllToAll, LoopbackAllToAll, all_gather_flat, all_gather_simulated, group_info, reduce_scatter_flat,
                        reduce_scatter_simulated, run_loopback, run_on_group, run_simulated)
from .ulysses import SumGradOverGroup, a2a_attention, head_slice, simulated_exchange
from .ulysses_groups import A2aJob, GroupedA2A

__all__ = ["CpOptions", "context_parallel_attention", "simulate_context_parallel", "cp_decline_reasons",
           "ring_rank_alone", "a2a_rank_alone"]

_COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")
_DENSE_MASKS = ("no_mask", "causal")
_THD_MASKS = {"padding": "padding", "padding_causal": "padding_causal", "no_mask": "padding", "causal": "padding_causal"}


@dataclass(frozen=True)
class CpOptions:
    """Everything but the tensors of a context-parallel call (validated by :func:`_options`)."""

    comm: str
    fmt: str
    mask: str
    attn_scale: Optional[float]
    dropout: float
    deterministic: bool
    window: tuple[int, int]
    bias_type: str
    softmax_type: str
    fp8: bool
    head_groups: int = 1

    @property
    def causal(self) -> bool:
        return "causal" in self.mask

    @property
    def layout(self) -> str:
        return f"{self.fmt}_{self.fmt}_{self.fmt}"


def _choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")
    return value


def _options(cp_comm_type, qkv_format, attn_mask_type, attn_scale, dropout, deterministic, window_size, attn_bias,
             attn_bias_type, softmax_type, fp8_meta, training: bool, head_groups: int = 1) -> CpOptions:  # fmt: skip
    comm = _choice("cp_comm_type", cp_comm_type, _COMM_TYPES)
    fmt = _choice("qkv_format", qkv_format, ("bshd", "sbhd", "thd"))
    if not isinstance(attn_mask_type, str):
        raise TypeError(f"attn_mask_type must be a str, got {attn_mask_type!r}")
    mask = _THD_MASKS.get(attn_mask_type, attn_mask_type) if fmt == "thd" else attn_mask_type
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
    bias_type = attn_bias_type or ("no_bias" if attn_bias is None else "post_scale_bias")
    window = (-1, 0 if "causal" in mask else -1) if window_size is None else tuple(window_size)
    if isinstance(head_groups, bool) or not isinstance(head_groups, int) or head_groups < 1:
        raise ValueError(f"head_groups must be a positive int (the head groups a2a or p2p runs one after another), got "
                         f"{head_groups!r}")  # fmt: skip
    return CpOptions(comm, fmt, mask, attn_scale, float(dropout) if training else 0.0, bool(deterministic), window,
                     bias_type, softmax_type, fp8_meta is not None, head_groups)  # fmt: skip


def cp_decline_reasons(o: CpOptions, cp: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       layout: Optional[tuple[int, int]] = None) -> list[str]:  # fmt: skip
    """Why a context-parallel call cannot run (empty: it can). Reads shapes only (no sync).
    ``layout``: ``(a2a group size, p2p group size)`` for ``"a2a+p2p"`` (default ``(1, cp)``)."""
    why = []
    masks = tuple(_THD_MASKS.values()) if o.fmt == "thd" else _DENSE_MASKS
    if o.mask not in masks:
        why.append(f"attn_mask_type={o.mask!r} with qkv_format={o.fmt!r}: context parallelism serves "
                   f"{', '.join(masks)} (bottom-right masks and user masks are not split across ranks)")  # fmt: skip
    if not o.fp8 and q.dtype not in (torch.float16, torch.bfloat16):
        why.append(f"q is {q.dtype}: context parallelism runs float16/bfloat16 attention (FP8 through fp8_meta)")
    dims = 3 if o.fmt == "thd" else 4
    if q.dim() != dims or k.dim() != dims or v.dim() != dims:
        why.append(f"qkv_format={o.fmt!r} takes {dims}-d q, k, v; got {q.dim()}, {k.dim()}, {v.dim()} dims")
        return why
    seq = 0 if o.fmt in ("sbhd", "thd") else 1
    if o.fmt != "thd":
        for name, t in (("q", q), ("k", k)):
            if t.shape[seq] % 2:
                why.append(f"{name} holds {t.shape[seq]} tokens per rank: each rank holds two equal chunks "
                           f"(the global length must be divisible by 2 * cp = {2 * cp})")  # fmt: skip
        if o.causal and q.shape[seq] != k.shape[seq]:
            why.append(f"causal attention needs as many queries as keys per rank, got {q.shape[seq]} and {k.shape[seq]}")
    if o.comm == "p2p":
        why += _p2p_reasons(o, cp, q.shape[seq], k.shape[seq])
    elif o.comm == "all_gather":
        why += _all_gather_reasons(o, q.shape[seq], k.shape[seq])
    elif o.comm == "a2a+p2p":
        why += _a2a_p2p_reasons(o, layout or (1, cp), q, k, seq)
    elif q.shape[-2] % cp or k.shape[-2] % cp:
        why.append(f"a2a splits heads over the ranks: h={q.shape[-2]} and hg={k.shape[-2]} must be divisible by "
                   f"cp={cp} (use cp_comm_type='p2p')")  # fmt: skip
    elif q.shape[-2] % (cp * o.head_groups) or k.shape[-2] % (cp * o.head_groups):
        why.append(f"a2a with head_groups={o.head_groups} splits each of {o.head_groups} head groups over the "
                   f"ranks: h={q.shape[-2]} and hg={k.shape[-2]} must be divisible by head_groups * cp = "
                   f"{o.head_groups * cp} (use fewer head groups)")  # fmt: skip
    if o.head_groups > 1 and o.comm not in ("a2a", "p2p"):
        why.append(f"head_groups={o.head_groups} is for cp_comm_type='a2a' or 'p2p' (pass head_groups=1)")
    if o.head_groups > 1 and o.comm == "p2p" and o.fmt == "thd":
        why.append(f"p2p with head_groups={o.head_groups} and qkv_format='thd': the ring attends views of one head "
                   f"group, and THD tensors must have packed strides (use head_groups=1, or cp_comm_type='a2a' "
                   f"with head_groups)")  # fmt: skip
    if o.head_groups > 1 and o.comm == "p2p" and (q.shape[-2] % o.head_groups or k.shape[-2] % o.head_groups):
        why.append(f"p2p with head_groups={o.head_groups} runs the ring once per head group: h={q.shape[-2]} and "
                   f"hg={k.shape[-2]} must be divisible by {o.head_groups} (use fewer head groups)")  # fmt: skip
    if o.head_groups > 1 and o.fp8:
        why.append(f"head_groups={o.head_groups} with FP8 (fp8_meta): the FP8 scales are per tensor, not per head "
                   f"group (pass head_groups=1)")  # fmt: skip
    return why


def _p2p_reasons(o: CpOptions, cp: int, s_q: int, s_kv: int) -> list[str]:
    why = []
    if o.bias_type != "no_bias":
        why.append(f"p2p: attn_bias_type={o.bias_type!r} is not split along the ring (use cp_comm_type='a2a')")
    if o.fp8:
        why.append("p2p: FP8 (fp8_meta) is not supported: every ring step's output and gradients would need "
                   "their own per-step scales and amaxes (TransformerEngine's per-step quantizer copies, dequantized "
                   "for the fp32 merge, amaxes reduced over the group), which the ring does not keep; use "
                   "cp_comm_type='a2a' (one FP8 attention over whole sequences)")  # fmt: skip
    sink = o.softmax_type != "vanilla"
    if sink and o.fmt == "thd":
        why.append(f"p2p: softmax_type={o.softmax_type!r} (attention sinks) with qkv_format='thd' is not supported "
                   f"(the sink is folded in after the ring, but the THD ring has no CPU check of it yet; use "
                   f"cp_comm_type='a2a')")  # fmt: skip
    if sink and o.dropout:
        why.append(f"p2p: softmax_type={o.softmax_type!r} (attention sinks) with dropout={o.dropout} is not checked "
                   f"against a reference yet (use cp_comm_type='a2a')")  # fmt: skip
    if o.window in ((-1, -1), (-1, 0)):
        return why
    if o.fmt == "thd":
        why.append(f"p2p: window_size={o.window} (sliding windows) with qkv_format='thd' is not supported (the ring "
                   f"skips tiles by dense chunk geometry only; use cp_comm_type='a2a')")  # fmt: skip
        return why
    if o.causal and o.window[1] not in (-1, 0):
        why.append(f"p2p: window_size={o.window} has right={o.window[1]} but a causal mask allows no keys right "
                   f"of the diagonal (use right=0 or -1)")  # fmt: skip
        return why
    window = ring_window(o.window, o.causal, cp * s_kv)
    if window is None:
        return why
    if s_q != s_kv:
        why.append(f"p2p: a sliding window needs as many queries as keys per rank, got {s_q} and {s_kv}")
    if o.dropout:
        why.append(f"p2p: dropout={o.dropout} with window_size={o.window}: cuDNN takes no dropout with a sliding "
                   f"window")  # fmt: skip
    if s_q == s_kv and s_q % 2 == 0 and single_key_tiles(cp, s_q // 2, window):
        why.append(f"p2p: window_size={o.window} with chunks of {s_q // 2} tokens (S / (2 cp)) reaches some chunk "
                   f"pair in a single query-key pair (a bound of 1 more than a multiple of the chunk length), and "
                   f"cuDNN has no sq = skv = 1 backward (use cp_comm_type='all_gather' or 'a2a', or another "
                   f"window or cp)")  # fmt: skip
    return why


def _a2a_p2p_reasons(o: CpOptions, layout: tuple[int, int], q: torch.Tensor, k: torch.Tensor, seq: int) -> list[str]:
    """The a2a level splits heads; the ring then runs over the p2p group on the group's whole
    (A times longer) shares, so it declines what the p2p ring declines at that size."""
    a2a, p2p = layout
    why = []
    if q.shape[-2] % a2a or k.shape[-2] % a2a:
        why.append(f"a2a+p2p splits heads over the a2a group: h={q.shape[-2]} and hg={k.shape[-2]} must be "
                   f"divisible by its size {a2a} (use cp_comm_type='p2p', or a smaller a2a group)")  # fmt: skip
    ring = _p2p_reasons(o, p2p, a2a * q.shape[seq], a2a * k.shape[seq])
    return why + [f"a2a+p2p runs the p2p ring over the p2p group ({p2p} ranks) and inherits its limits: "
                  f"{r.removeprefix('p2p: ')}" for r in ring]  # fmt: skip


def _all_gather_reasons(o: CpOptions, s_q: int, s_kv: int) -> list[str]:
    why = []
    if o.fmt == "thd":
        why.append("all_gather: qkv_format='thd' is not supported (it needs per-sequence visible key lengths "
                   "over the gathered, reordered THD keys and a THD stand-in kernel to check it on CPU; use "
                   "cp_comm_type='p2p' for padding/padding_causal, or 'a2a' for THD with windows or "
                   "sinks)")  # fmt: skip
    if o.bias_type != "no_bias":
        why.append(f"all_gather: attn_bias_type={o.bias_type!r} is not sliced per chunk (use cp_comm_type='a2a')")
    if o.fp8:
        why.append("all_gather: FP8 (fp8_meta) is not supported (use cp_comm_type='a2a')")
    windowed = o.window[0] >= 0 or (o.window[1] >= 0 and not o.causal)
    if o.causal and o.window[1] not in (-1, 0):
        why.append(f"all_gather: window_size={o.window} has right={o.window[1]} but a causal mask allows no keys "
                   f"right of the diagonal (use right=0 or -1)")  # fmt: skip
    if windowed and s_q != s_kv:
        why.append(f"all_gather: a sliding window needs as many queries as keys per rank, got {s_q} and {s_kv}")
    if o.dropout and (o.causal or windowed):
        why.append(f"all_gather: dropout={o.dropout} with a causal mask or sliding window: each chunk's call is "
                   f"bottom-right aligned with fewer queries than keys, and cuDNN takes no dropout there (use "
                   f"cp_comm_type='p2p' for causal attention with dropout)")  # fmt: skip
    if (o.causal or windowed) and s_q == 2:
        why.append("all_gather: one token per chunk (2 per rank) with a causal mask or sliding window: a chunk's "
                   "call would have one query row, for which cuDNN has no sink and no sq = skv = 1 backward (use "
                   "at least 2 tokens per chunk)")  # fmt: skip
    return why


@dataclass(frozen=True)
class _Call:
    """One context-parallel call, for the ranks ``ranks`` of a group of size ``cp``."""

    o: CpOptions
    cp: int
    ranks: tuple[int, ...]
    cu: tuple[Optional[torch.Tensor], ...]  # cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded
    max_seqlen: tuple[Optional[int], Optional[int]]
    rng_gen: Optional[torch.Generator]

    def ring(self, qs, ks, vs, run: Callable[[list], list], softmax_offset: Optional[torch.Tensor] = None,
             shared: Callable[[Any], Any] = lambda t: t, rng_shift: int = 0) -> list[torch.Tensor]:  # fmt: skip
        """The p2p ring of the listed ranks (checks the sink before any exchange). ``rng_shift``
        is added to the dropout seeds (rings of an a2a+p2p grid draw independent masks)."""
        o = self.o
        check_softmax_offset(SoftmaxType.coerce(o.softmax_type, argument="softmax_type"), softmax_offset,
                             qs[0].shape[-2], qs[0])  # fmt: skip
        specs = tuple(RingSpec(self.cp, r, o.fmt, o.causal, o.attn_scale, o.dropout, o.deterministic) for r in self.ranks)
        tiles = tuple(self._tiles(s, q, k) for s, q, k in zip(specs, qs, ks))
        groups = o.head_groups if o.comm == "p2p" else 1

        def draw(s: RingSpec, device: torch.device) -> Optional[torch.Tensor]:  # every head group its own masks
            if not o.dropout:
                return None
            states = draw_rng_states(s, device, self.rng_gen)
            return states + torch.tensor([rng_shift, 0], device=device) if rng_shift else states

        rngs = tuple(tuple(draw(s, q.device) for s, q in zip(specs, qs)) for _ in range(groups))
        job = RingJob(specs, tiles, rngs, run, o.softmax_type, groups)
        return list(RingAttn.apply(job, shared(softmax_offset), *qs, *ks, *vs))

    def a2a_p2p(self, qs, ks, vs, layout: tuple[int, int], exchange, run: Callable[[list], list],
                ring_ranks: tuple[int, ...], groups: tuple, softmax_offset: Optional[torch.Tensor],
                shared: Callable[[Any], Any]) -> list[torch.Tensor]:  # fmt: skip
        """Hierarchical attention of the listed ranks (:mod:`te_cudnn.parallel.hierarchical`):
        ``exchange`` is one a2a group's all-to-all, ``run`` one ring's driver over the ring
        ranks ``ring_ranks``, ``groups`` the listed ranks' ``(a2a blocks, rings)``. The sink
        logits are checked (all heads) before any exchange; each ring gets its heads' logits."""
        o, (n_a2a, n_p2p), h = self.o, layout, qs[0].shape[-2]
        check_softmax_offset(SoftmaxType.coerce(o.softmax_type, argument="softmax_type"), softmax_offset, h, qs[0])
        offset, ring_call = shared(softmax_offset), replace(self, cp=n_p2p, ranks=ring_ranks)

        def ring(a: int, rq, rk, rv) -> list[torch.Tensor]:
            sink = head_slice(offset, 1, n_a2a, a, h)  # a copy: cuDNN-aligned and contiguous for the ring's check
            return ring_call.ring(rq, rk, rv, run, None if sink is None else sink.clone(), rng_shift=a * n_p2p)

        return a2a_p2p_attention(ring, qs, ks, vs, n_a2a, n_p2p, o.fmt, self.cu[2:], exchange, *groups)

    def _tiles(self, spec: RingSpec, q: torch.Tensor, k: torch.Tensor):
        if spec.fmt != "thd":
            dim = 1 if spec.fmt == "bshd" else 0
            window = ring_window(self.o.window, spec.causal, k.shape[dim] * self.cp)
            if window is None:
                return DenseTiles(spec, q.shape[dim], k.shape[dim])
            if halo_applies(spec, window, q.shape[dim] // 2):  # te_cudnn.parallel.halo
                return HaloTiles(spec, q.shape[dim], window)
            return WindowTiles(spec, q.shape[dim], window)
        max_q, max_kv = (m if m is not None else t.shape[0] * self.cp for m, t in zip(self.max_seqlen, (q, k)))
        return ThdTiles.build(spec, q, k, *self.cu, max_q, max_kv)

    def ulysses(self, qs, ks, vs, exchange, shared: Callable[[Optional[torch.Tensor]], Optional[torch.Tensor]],
                attn_bias, softmax_offset, fp8_meta) -> list[torch.Tensor]:  # fmt: skip
        o, cp = self.o, self.cp
        bias, offset = shared(attn_bias), shared(softmax_offset)
        opts = AttnOptions(qkv_layout=o.layout, attn_mask_type=o.mask, attn_bias_type=o.bias_type,
                           attn_scale=o.attn_scale, dropout=o.dropout, window_size=o.window,
                           deterministic=o.deterministic, softmax_type=o.softmax_type)  # fmt: skip
        cu_q, cu_kv, pad_q, pad_kv = self.cu
        seq = 0 if o.fmt in ("sbhd", "thd") else 1
        max_q, max_kv = (m if m is not None else t.shape[seq] * cp for m, t in zip(self.max_seqlen, (qs[0], ks[0])))

        if fp8_meta is None:  # only the sequence-sharded tensors are kept (te_cudnn.parallel.ulysses_groups)
            job = A2aJob(self.ranks, cp, o.fmt, o.head_groups, self.cu, (max_q, max_kv), opts, self.rng_gen, exchange)
            return list(GroupedA2A.apply(job, bias, offset, *qs, *ks, *vs))

        def attn(rank: int, q, k, v) -> torch.Tensor:
            return attend_fp8(q, k, v, fp8_meta, cu_q, cu_kv, max_q, max_kv, replace(opts, attn_bias_type="no_bias"))

        return a2a_attention(attn, self.ranks, qs, ks, vs, cp, o.fmt, (pad_q, pad_kv), exchange)

    def all_gather(self, qs, ks, vs, gather, reduce_scatter, softmax_offset, shared) -> list[torch.Tensor]:
        """The all-gather attention of the listed ranks (checks the sink before any collective)."""
        o, seq = self.o, 1 if self.o.fmt == "bshd" else 0
        check_softmax_offset(SoftmaxType.coerce(o.softmax_type, argument="softmax_type"), softmax_offset,
                             qs[0].shape[-2], qs[0])  # fmt: skip
        window = (o.window[0], 0) if o.causal else o.window
        spec = AgSpec(self.cp, o.fmt, o.causal, window, o.attn_scale, o.dropout, o.deterministic, o.softmax_type)
        tiles = tuple(plan_tiles(spec, r, q.shape[seq], k.shape[seq]) for r, q, k in zip(self.ranks, qs, ks))
        rngs = tuple(_ag_rng_states(r, len(t), q.device, self.rng_gen) if o.dropout else None
                     for r, t, q in zip(self.ranks, tiles, qs))  # fmt: skip
        job = AgJob(spec, self.ranks, tiles, rngs, gather, reduce_scatter)
        return list(AllGatherAttn.apply(job, shared(softmax_offset), *qs, *ks, *vs))


def _ag_rng_states(rank: int, tiles: int, device: torch.device, gen: Optional[torch.Generator]) -> torch.Tensor:
    """[tiles, 2] int64 Philox (seed, offset) per call, drawn on the device; the rank is added to
    the seeds so ranks with equal generators draw independent masks (as the ring does)."""
    states = torch.randint(0, 1 << 62, (tiles, 2), dtype=torch.int64, device=device, generator=gen)
    states[:, 0] += rank
    return states


def _prepare(q, k, v, cp: int, opts: CpOptions, cu: tuple, max_seqlen: tuple, layout) -> None:
    why = cp_decline_reasons(opts, cp, q, k, v, layout)
    if opts.fmt == "thd" and (cu[0] is None or cu[2] is None):
        why.append("qkv_format='thd' needs the global cu_seqlens_q and cu_seqlens_q_padded (every padded length a "
                   "multiple of 2 * cp; te_cudnn.parallel.pad_cu_seqlens makes them)")  # fmt: skip
    if why:
        grid = "" if layout is None else f" as (a2a, p2p) = {tuple(layout)}"
        raise UnsupportedConfigError(f"context-parallel attention (cp={cp}{grid}, cp_comm_type={opts.comm!r}, "
                                     f"qkv_format={opts.fmt!r}, attn_mask_type={opts.mask!r})",
                                     {f"cp_comm_type={opts.comm!r}": why})  # fmt: skip


def _cu_tuple(fmt: str, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded) -> tuple:
    if fmt != "thd":
        return (None, None, None, None)
    cu_kv = cu_seqlens_q if cu_seqlens_kv is None else cu_seqlens_kv
    pad_kv = cu_seqlens_q_padded if cu_seqlens_kv_padded is None else cu_seqlens_kv_padded
    return (cu_seqlens_q, cu_kv, cu_seqlens_q_padded, pad_kv)


def _setup(q, k, v, cp: int, ranks: tuple[int, ...], cp_comm_type: str = "p2p", *, qkv_format: str = "bshd",
           attn_mask_type: str = "causal", cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
           cu_seqlens_kv_padded=None, max_seqlen_q=None, max_seqlen_kv=None, attn_scale=None, dropout=0.0,
           deterministic=False, window_size=None, attn_bias=None, attn_bias_type=None, softmax_type="vanilla",
           softmax_offset=None, fp8_meta=None, rng_gen=None, is_training=None, head_groups=1,
           layout=None) -> tuple[_Call, tuple]:  # fmt: skip
    """Validate one call (before any communication); returns it and its (bias, sink, fp8) tensors.
    ``layout``: the ``(a2a, p2p)`` group sizes of ``"a2a+p2p"``."""
    training = torch.is_grad_enabled() if is_training is None else bool(is_training)
    opts = _options(cp_comm_type, qkv_format, attn_mask_type, attn_scale, dropout, deterministic, window_size,
                    attn_bias, attn_bias_type, softmax_type, fp8_meta, training, head_groups)  # fmt: skip
    cu = _cu_tuple(opts.fmt, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    _prepare(q, k, v, cp, opts, cu, (max_seqlen_q, max_seqlen_kv), layout)
    return _Call(opts, cp, ranks, cu, (max_seqlen_q, max_seqlen_kv), rng_gen), (attn_bias, softmax_offset, fp8_meta)


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp_group: Any,
                               cp_comm_type: str = "p2p", **options: Any) -> torch.Tensor:  # fmt: skip
    """Attention of this rank's queries over a sequence split across ``cp_group`` (differentiable).

    Every rank passes its *local* tokens, in TransformerEngine's dual-chunk order: with the
    global sequence cut into ``2 * cp`` chunks, rank ``r`` holds chunks ``r`` and
    ``2 * cp - 1 - r`` (:func:`te_cudnn.parallel.shard` makes them, :func:`~te_cudnn.parallel.unshard`
    gathers results). Shapes: ``bshd`` ``[b, S / cp, h, d]``, ``sbhd`` ``[S / cp, b, h, d]``,
    ``thd`` ``[T_padded / cp, h, d]``; k and v have ``hg`` heads (GQA/MQA) and may have their own
    head dims. Returns this rank's output ``[..., h, d_v]`` in q's format: the rows of full
    attention over the gathered sequence (causal: top-left, over global positions).

    ``cp_comm_type="p2p"`` (ring): key/value blocks circulate (``batch_isend_irecv`` on NCCL's
    stream, overlapped with each step's attention), outputs merge by their log-sum-exp in fp32;
    the backward sends key/value blocks with their fp32 gradients the other way. Masks
    ``no_mask``/``causal`` (``padding``/``padding_causal`` for THD), MHA/GQA, ``d_qk != d_v``,
    dropout (a fresh Philox state per step and rank, replayed by the backward), ``deterministic``;
    for ``bshd``/``sbhd``, sliding windows (each step computes only the chunk pairs the window
    reaches; blocks still travel the whole ring) and ``softmax_type``/``softmax_offset`` (the sink
    folded in once per row after the ring; the learnable sink's gradient summed over the group),
    neither with dropout.
    ``"a2a"`` (Ulysses): all-to-all to whole sequences of ``h / cp`` heads, one local te_cudnn
    attention with all its features (``attn_bias`` ``[1|b, 1|h, S, S]`` over global positions,
    ``window_size``, ``softmax_type``/``softmax_offset``, ``fp8_meta``), all-to-all back; ``h``
    and ``hg`` must be divisible by ``cp``. Gradients of the bias and sink logits are summed
    over the group, so every rank holds the full gradient. ``"all_gather"`` (Llama 3): key/value
    shares all-gathered once; each of the rank's two query chunks attends, in one fused call, the
    keys its causal mask or ``window_size`` reaches (a bottom-right aligned slice, nothing more);
    dK/dV reduce-scattered (fp32) to their owners. ``bshd``/``sbhd``, ``no_mask``/``causal``,
    sliding windows, ``softmax_type``/``softmax_offset`` (sink gradient summed over the group),
    MHA/GQA, ``d_qk != d_v``, ``deterministic``; dropout only for ``no_mask`` without a window.
    ``"a2a+p2p"`` (hierarchical, TransformerEngine's): ``cp_group=[a2a_group, p2p_group]``; the
    all-to-all of ``"a2a"`` inside the first group (``h`` and ``hg`` divisible by its size),
    the ``"p2p"`` ring across the second on the head-sharded whole shares of the first group,
    the all-to-all back (:mod:`te_cudnn.parallel.hierarchical`). Ranks are laid out as
    TransformerEngine's: the rank at ring position ``p`` and a2a position ``a`` holds the
    dual-chunk share of ``g = p * A + a`` (``cp = A * P``). It serves what the ring serves at
    ``P`` ranks (windows and sinks for ``bshd``/``sbhd``, THD without them, no bias, no FP8).

    Keyword options: ``qkv_format`` (``"bshd"``, ``"sbhd"``, ``"thd"``), ``attn_mask_type``
    (default ``"causal"``), ``cu_seqlens_q/kv``, ``cu_seqlens_q/kv_padded``,
    ``max_seqlen_q/kv``, ``attn_scale``, ``dropout``, ``deterministic``, ``window_size``,
    ``attn_bias`` (+ ``attn_bias_type``), ``softmax_type``, ``softmax_offset``, ``fp8_meta``,
    ``rng_gen``, ``is_training`` (default: grad mode). THD: ``cu_seqlens_q/kv`` are the *global*
    valid lengths and ``cu_seqlens_q/kv_padded`` the global offsets with every sequence padded
    to a multiple of ``2 * cp`` (:func:`~te_cudnn.parallel.pad_cu_seqlens`); ``max_seqlen_q/kv``
    the global maxima (default: bounded by the token count). Padded rows of the output and of
    the gradients are zero.

    Raises ``ValueError``/``TypeError`` for malformed arguments and
    :class:`~te_cudnn.UnsupportedConfigError` (with the reasons) before any communication.
    FP8 (``fp8_meta``) declines under ``"p2p"``, ``"all_gather"`` and ``"a2a+p2p"``: use ``"a2a"``.
    """
    if cp_comm_type == "a2a+p2p":
        return _a2a_p2p_on_groups(q, k, v, cp_group, **options)
    if isinstance(cp_group, (list, tuple)):
        raise ValueError(f"cp_group is a list of {len(cp_group)}: only cp_comm_type='a2a+p2p' takes groups as a "
                         f"list ([a2a_group, p2p_group]); got cp_comm_type={cp_comm_type!r}")  # fmt: skip
    cp, rank = group_info(cp_group)
    call, (bias, offset, fp8_meta) = _setup(q, k, v, cp, (rank,), cp_comm_type, **options)

    def shared(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return SumGradOverGroup.apply(t, cp_group) if t is not None and t.requires_grad else t

    if call.o.comm == "p2p":
        return call.ring([q], [k], [v], lambda programs: [run_on_group(programs[0], cp_group)], offset, shared)[0]

    if call.o.comm == "all_gather":
        return call.all_gather([q], [k], [v], lambda xs: [all_gather_flat(xs[0], cp_group)],
                               lambda xs: [reduce_scatter_flat(xs[0], cp_group)], offset, shared)[0]  # fmt: skip

    def exchange(sends: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [AllToAll.apply(sends[0], cp_group)]

    return call.ulysses([q], [k], [v], exchange, shared, bias, offset, fp8_meta)[0]


def _a2a_p2p_on_groups(q, k, v, cp_group: Any, **options: Any) -> torch.Tensor:
    """``context_parallel_attention(..., [a2a_group, p2p_group], "a2a+p2p")``: this rank's part
    of the grid (validated, sink included, before any collective)."""
    if not isinstance(cp_group, (list, tuple)) or len(cp_group) != 2:
        raise ValueError(f"cp_comm_type='a2a+p2p' takes cp_group=[a2a_group, p2p_group] (the all-to-all group "
                         f"first, e.g. the GPUs of one node; the ring's group second), got {cp_group!r}")  # fmt: skip
    a2a_group, p2p_group = cp_group
    (n_a2a, a), (n_p2p, p) = group_info(a2a_group), group_info(p2p_group)
    call, (_, offset, _) = _setup(q, k, v, n_a2a * n_p2p, (p * n_a2a + a,), "a2a+p2p", layout=(n_a2a, n_p2p),
                                  **options)  # fmt: skip

    def shared(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:  # summed over the a2a group, then the ring's
        if t is None or not t.requires_grad:
            return t
        return SumGradOverGroup.apply(SumGradOverGroup.apply(t, a2a_group), p2p_group)

    def exchange(sends: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [AllToAll.apply(sends[0], a2a_group)]

    def run(programs: list) -> list:
        return [run_on_group(programs[0], p2p_group)]

    groups = ([[0]], [(a, [0])])
    return call.a2a_p2p([q], [k], [v], (n_a2a, n_p2p), exchange, run, (p,), groups, offset, shared)[0]


def simulate_context_parallel(q_parts: Sequence[torch.Tensor], k_parts: Sequence[torch.Tensor],
                              v_parts: Sequence[torch.Tensor], cp_comm_type: str = "p2p",
                              cp_layout: Optional[tuple[int, int]] = None,
                              **options: Any) -> list[torch.Tensor]:  # fmt: skip
    """:func:`context_parallel_attention` of ``cp = len(q_parts)`` virtual ranks in one process
    (no process group, no NCCL): part ``r`` is rank ``r``'s local tensor, and so is result ``r``.
    The ring runs the same per-rank programs in lockstep and its exchanges become copies; the
    all-to-all becomes stacking. Differentiable. Same keyword options. For tests, and for
    trying a configuration on one GPU.

    ``cp_comm_type="a2a+p2p"`` needs ``cp_layout=(A, P)``, the sizes of the a2a group and of
    the ring (``A * P == cp``): part ``g = p * A + a`` is the rank at ring position ``p`` and
    a2a position ``a`` (TransformerEngine's global rank order: a2a groups are contiguous
    blocks ``[pA, pA + A)``, rings are strided); every part still holds the dual-chunk share of
    ``cp`` (:func:`~te_cudnn.parallel.shard` with ``cp`` and ``g``). Other types take no layout."""
    if not (len(q_parts) == len(k_parts) == len(v_parts)) or not q_parts:
        raise ValueError(f"q_parts, k_parts, v_parts must list the same number (>= 1) of ranks, got "
                         f"{len(q_parts)}, {len(k_parts)}, {len(v_parts)}")  # fmt: skip
    cp = len(q_parts)
    if cp_comm_type == "a2a+p2p":
        layout = check_layout(cp_layout, cp)
    elif cp_layout is not None:
        raise ValueError(f"cp_layout is for cp_comm_type='a2a+p2p' only, got cp_comm_type={cp_comm_type!r}")
    else:
        layout = None
    call, (bias, offset, fp8_meta) = _setup(q_parts[0], k_parts[0], v_parts[0], cp, tuple(range(cp)), cp_comm_type,
                                            layout=layout, **options)  # fmt: skip
    qs, ks, vs = list(q_parts), list(k_parts), list(v_parts)
    if call.o.comm == "a2a+p2p":
        return call.a2a_p2p(qs, ks, vs, layout, simulated_exchange, run_simulated, tuple(range(layout[1])),
                            grid_groups(*layout), offset, lambda t: t)  # fmt: skip
    if call.o.comm == "p2p":
        return call.ring(qs, ks, vs, run_simulated, offset)
    if call.o.comm == "all_gather":
        return call.all_gather(qs, ks, vs, all_gather_simulated, reduce_scatter_simulated, offset, lambda t: t)
    return call.ulysses(qs, ks, vs, simulated_exchange, lambda t: t, bias, offset, fp8_meta)


def ring_rank_alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int, rank: int = 0,
                    **options: Any) -> torch.Tensor:  # fmt: skip
    """One rank of a ``cp``-way p2p ring on one GPU, without a process group: every key/value
    block it would receive is a copy of its own (:func:`~te_cudnn.parallel.transport.run_loopback`).
    It allocates, computes and copies what that rank would, so its time and peak memory are the
    rank's, less the communication; the *values* are not attention over a real sequence. For
    sizing (how long a sequence fits per rank, what a step costs) before a multi-GPU run.
    Differentiable; same keyword options as :func:`context_parallel_attention`."""
    call, (_, offset, _) = _setup(q, k, v, cp, (rank,), "p2p", **options)
    return call.ring([q], [k], [v], lambda programs: [run_loopback(programs[0])], offset)[0]


def a2a_rank_alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int, rank: int = 0,
                   **options: Any) -> torch.Tensor:  # fmt: skip
    """One rank of a ``cp``-way a2a (Ulysses) attention on one GPU, without a process group: each
    all-to-all receives the rank's own send (:class:`~te_cudnn.parallel.transport.LoopbackAllToAll`),
    so the rank allocates and computes what it would (the whole sequence for ``h / cp`` heads);
    the *values* are not attention over a real sequence. For sizing, as :func:`ring_rank_alone`.
    Differentiable; same keyword options as :func:`context_parallel_attention`."""
    call, (bias, offset, fp8_meta) = _setup(q, k, v, cp, (rank,), "a2a", **options)

    def exchange(sends: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [LoopbackAllToAll.apply(sends[0])]

    return call.ulysses([q], [k], [v], exchange, lambda t: t, bias, offset, fp8_meta)[0]
