"""Operand declarations: every operand of a sub-backend's graphs, declared once, in binding order.

A sub-backend declares the operands of its forward and of its backward graph as an
:class:`Operands` table of :class:`Operand` entries, in the order a launch binds them. Each
entry says what becomes the operand (``source``; ``origin``: what the caller passes), whether
the plan key fixes it (``keyed``) or its values are runtime data read per call, when the
graph has it (``present``), its dims, strides and dtype as functions of the
:class:`~te_cudnn.config.AttnConfig`, the ragged-offset operand that places it, its alignment
and whether the graph writes it.

Derived from the tables: the binding order (``SubBackend.operand_uids``, which the launchers,
the plan store and ``fused_attn_decode`` follow), the per-call runtime operands
(``runtime_uids``), every graph tensor the builders make or mark as an output
(:meth:`Operands.tensor`, :meth:`Operands.output`), the records a built graph must declare
(:meth:`Operands.expected`, :class:`DeclaredOperand`) and the names and alignment the operand
check (``te_cudnn.launch``) gives each uid. :meth:`Operands.key_fields` names the
``AttnConfig`` fields an operand is derived from: the plan key must keep every one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, NamedTuple

import torch

from ..config import AttnConfig
from ..enums import AttnBiasType
from ..runtime import cudnn_module, torch_dtype_to_cudnn
from .base import Uid

__all__ = [
    "BIAS", "DO", "DSINK", "OFFSET", "O_IN", "PAGE_TABLES", "RAGGED", "SEED", "SEQ_LEN_KV", "SEQ_LEN_Q", "SINK",
    "STATS", "STATS_IN", "DeclaredOperand", "K", "O", "Operand", "Operands", "Q", "Source", "V", "alignment",
    "as_input", "const", "grad", "io_dtype",
]  # fmt: skip


class Source(Enum):
    """Where the value bound to an operand comes from."""

    TENSOR = "a tensor the caller passes"
    RESULT = "a result te_cudnn allocates (or the caller's out)"
    LENGTHS = "per-sequence lengths derived from the call's cu_seqlens"
    OFFSETS = "ragged offsets derived from the call's cu_seqlens"
    FP8_SLOT = "a slot of the caller's FP8 metadata tables"
    RNG = "the dropout state rng_state"
    CONSTANT = "a constant te_cudnn makes once per call signature"
    SCRATCH = "scratch te_cudnn allocates"


Geometry = Callable[[AttnConfig], Any]


def _always(cfg: AttnConfig) -> bool:
    return True


@dataclass(frozen=True)
class Operand:
    """One graph operand. ``dims`` / ``strides`` are BHSD, in elements; ``dtype`` a torch dtype."""

    uid: int
    source: Source
    dims: Geometry
    strides: Geometry
    dtype: Geometry
    origin: str | None = None  # what the caller passes that becomes it, where the name does not say it
    present: Callable[[AttnConfig], bool] = _always
    # keyed: the plan key fixes what is bound; per-call: runtime data (lengths, offsets, pages)
    # whose values change from call to call under one plan, the key holding only their bounds
    keyed: bool = True
    placed_by: int | None = None  # the ragged-offset operand that places it, where the table has one
    align16: bool = True  # its start on a 16-byte boundary; else its element's alignment
    output: bool = False  # the graph writes it
    graph_name: str | None = None  # the graph tensor's name, where it is not Uid.NAMES'
    reordering: str | None = None  # a cudnn.tensor_reordering member the graph stores it in
    dtype_inferred: bool = False  # an output whose dtype the builder leaves to the graph (it infers this one)

    @property
    def name(self) -> str:
        return Uid.NAMES[self.uid]

    @property
    def role(self) -> str:
        """The operand check's name for it: the graph's name and what the caller passes."""
        return self.name if self.origin is None else f"{self.name} (from {self.origin})"


def as_input(op: Operand, **changes: Any) -> Operand:
    """A forward's result as the backward reads it: the caller passes it back."""
    return replace(op, source=Source.TENSOR, output=False, **changes)


def alignment(align16: bool, dims: tuple[int, ...], dtype: torch.dtype | None) -> int:
    """Bytes an operand's start must be a multiple of: 16 where it must be 16-byte aligned and
    has more than one element, else its element's size (1 when the dtype is unknown)."""
    numel = 1
    for n in dims:
        numel *= n
    item = dtype.itemsize if dtype is not None else 1
    return 16 if align16 and numel > 1 else item


class DeclaredOperand(NamedTuple):
    """One operand as a graph declares it (or its declaration says the graph must)."""

    uid: int
    role: str  # the graph's name for it, and what the caller passes that becomes it
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: torch.dtype | None  # None: a type the graph infers and no validated graph gave
    ragged: bool  # THD: [b, h, s, d] placed by ragged offsets; bound as token-major [t, h, d]
    align: int  # bytes its start must be a multiple of

    def describe(self) -> str:
        what = "THD [t, h, d] placed by ragged offsets, declared " if self.ragged else ""
        dtype = "dtype not declared" if self.dtype is None else str(self.dtype).removeprefix("torch.")
        return f"{what}dims {list(self.dims)} strides {list(self.strides)} {dtype}, {self.align}-byte aligned"


class _Reads:
    """An AttnConfig stand-in that records the fields read through it (properties included)."""

    def __init__(self, cfg: AttnConfig) -> None:
        self._cfg = cfg
        self.fields: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(type(self._cfg), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        self.fields.add(name)
        return getattr(self._cfg, name)


class Operands:
    """A graph's operand declarations in binding order."""

    def __init__(self, *entries: Operand) -> None:
        self.entries = entries
        self._by_uid = {op.uid: op for op in entries}
        if len(self._by_uid) != len(entries):
            raise ValueError(f"an operand is declared twice: {[op.name for op in entries]}")

    def __iter__(self):
        return iter(self.entries)

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def __getitem__(self, uid: int) -> Operand:
        return self._by_uid[uid]

    def get(self, uid: int) -> Operand | None:
        return self._by_uid.get(uid)

    def present(self, cfg: AttnConfig) -> tuple[Operand, ...]:
        return tuple(op for op in self.entries if op.present(cfg))

    def uids(self, cfg: AttnConfig) -> tuple[int, ...]:
        """The binding order: the uids of the operands ``cfg``'s graph has."""
        return tuple(op.uid for op in self.entries if op.present(cfg))

    def runtime_uids(self, cfg: AttnConfig) -> list[int]:
        """The per-call operands (lengths, ragged offsets, page tables), in binding order."""
        return [op.uid for op in self.entries if not op.keyed and op.present(cfg)]

    def placement(self, op: Operand, cfg: AttnConfig) -> int | None:
        """The uid of the ragged offsets that place ``op`` in ``cfg``'s graph, or None."""
        offsets = self._by_uid.get(op.placed_by) if op.placed_by is not None else None
        return offsets.uid if offsets is not None and offsets.present(cfg) else None

    def expected(self, cfg: AttnConfig) -> tuple[DeclaredOperand, ...]:
        """The operands ``cfg``'s graph must declare, in binding order, as
        ``te_cudnn.launch.declared_in_graph`` reads them from a validated graph."""
        out = []
        for op in self.present(cfg):
            dims, dtype = tuple(op.dims(cfg)), op.dtype(cfg)
            ragged = self.placement(op, cfg) is not None
            out.append(DeclaredOperand(op.uid, op.role, dims, tuple(op.strides(cfg)), dtype, ragged,
                                       alignment(op.align16, dims, dtype)))  # fmt: skip
        return tuple(out)

    def key_fields(self, cfg: AttnConfig, uid: int) -> frozenset[str]:
        """The AttnConfig fields the operand of ``uid`` is derived from for ``cfg``: whether the
        graph has it, its dims, strides, dtype and placement."""
        op, reads = self._by_uid[uid], _Reads(cfg)
        if op.present(reads):
            op.dims(reads), op.strides(reads), op.dtype(reads)
            if op.placed_by in self._by_uid:
                self._by_uid[op.placed_by].present(reads)
        return frozenset(reads.fields)

    # ------------------------------------------------------------------ graph tensors
    def tensor(self, graph: Any, cfg: AttnConfig, uid: int, offsets: dict[int, Any] | None = None) -> Any:
        """The graph tensor of the operand of ``uid`` as declared (an output's is marked so), or
        None where ``cfg``'s graph has no such operand; ``offsets``: the graph's ragged-offset
        tensors by uid (:meth:`ragged_offsets`)."""
        op = self._by_uid[uid]
        if not op.present(cfg):
            return None
        kw: dict[str, Any] = {}
        placed = self.placement(op, cfg)
        if placed is not None:
            kw["ragged_offset"] = offsets[placed]
        if op.reordering is not None:
            kw["reordering_type"] = getattr(cudnn_module().tensor_reordering, op.reordering)
        t = graph.tensor(name=op.graph_name or op.name, dim=list(op.dims(cfg)), stride=list(op.strides(cfg)),
                         data_type=torch_dtype_to_cudnn(op.dtype(cfg)), uid=uid, **kw)  # fmt: skip
        return t.set_output(True) if op.output else t

    def output(self, t: Any, cfg: AttnConfig, uid: int, offsets: dict[int, Any] | None = None) -> Any:
        """Mark a tensor an operation produced as the output operand of ``uid``, as declared."""
        op = self._by_uid[uid]
        t.set_output(True).set_uid(uid).set_dim(list(op.dims(cfg))).set_stride(list(op.strides(cfg)))
        if not op.dtype_inferred:
            t.set_data_type(torch_dtype_to_cudnn(op.dtype(cfg)))
        placed = self.placement(op, cfg)
        if placed is not None:
            t.set_ragged_offset(offsets[placed])
        if op.reordering is not None:
            t.set_reordering_type(getattr(cudnn_module().tensor_reordering, op.reordering))
        return t

    def ragged_offsets(self, graph: Any, cfg: AttnConfig) -> dict[int, Any]:
        """The graph tensors of the ragged offsets ``cfg`` has, by uid, made in binding order."""
        return {op.uid: self.tensor(graph, cfg, op.uid) for op in self.present(cfg) if op.source == Source.OFFSETS}


# ---------------------------------------------------------------------- shared declarations
# Operands that the flash sub-backends (F16 arbitrary-seqlen, FP8) declare alike.


def const(value: Any) -> Geometry:
    """A declaration field that does not depend on the configuration."""
    return lambda cfg: value


def io_dtype(cfg: AttnConfig) -> torch.dtype:
    return cfg.dtype


_F32, _I32, _I64, _ONE = const(torch.float32), const(torch.int32), const(torch.int64), const((1, 1, 1, 1))


def _kv_rows(cfg: AttnConfig) -> tuple[int, int]:
    """K/V's batch and sequence dims: a paged cache's (num_pages, page_size), else (b, skv)."""
    return (cfg.paged[0], cfg.paged[1]) if cfg.paged else (cfg.b, cfg.skv)


def _o_dims(cfg: AttnConfig) -> tuple[int, ...]:
    return (cfg.b, cfg.h, cfg.sq, cfg.d_v)


def _sink_dims(cfg: AttnConfig) -> tuple[int, ...]:
    return (1, cfg.h, 1, 1)


def _sink_strides(cfg: AttnConfig) -> tuple[int, ...]:
    return (cfg.h, 1, 1, 1)


Q = Operand(Uid.Q, Source.TENSOR, lambda c: (c.b, c.h, c.sq, c.d_qk), lambda c: c.q_stride, io_dtype,
            placed_by=Uid.RAGGED_Q)  # fmt: skip
K = Operand(Uid.K, Source.TENSOR, lambda c: (_kv_rows(c)[0], c.hg, _kv_rows(c)[1], c.d_qk), lambda c: c.k_stride,
            io_dtype, origin="k, or fused_attn_decode's k_cache", placed_by=Uid.RAGGED_K)  # fmt: skip
V = Operand(Uid.V, Source.TENSOR, lambda c: (_kv_rows(c)[0], c.hg, _kv_rows(c)[1], c.d_v), lambda c: c.v_stride,
            io_dtype, origin="v, or fused_attn_decode's v_cache", placed_by=Uid.RAGGED_V)  # fmt: skip
O = Operand(Uid.O, Source.RESULT, _o_dims, lambda c: c.o_stride, io_dtype, origin="out, or o in the backward",
            output=True, placed_by=Uid.RAGGED_O)  # fmt: skip
STATS = Operand(Uid.STATS, Source.RESULT, lambda c: (c.b, c.h, c.sq, 1), lambda c: c.stats_stride, _F32, output=True,
                origin="softmax_lse, or aux_ctx_tensors[0] in the backward", placed_by=Uid.RAGGED_STATS)  # fmt: skip
O_IN, STATS_IN = as_input(O), as_input(STATS)
DO = Operand(Uid.DO, Source.TENSOR, _o_dims, lambda c: c.do_stride or c.o_stride, io_dtype, placed_by=Uid.RAGGED_O)
BIAS = Operand(Uid.BIAS, Source.TENSOR, lambda c: c.bias_shape, lambda c: c.bias_stride, io_dtype,
               origin="attn_bias, or aux_ctx_tensors[2] in the backward",
               present=lambda c: c.bias_type == AttnBiasType.post_scale_bias)  # fmt: skip
SEED = Operand(Uid.SEED, Source.RNG, _ONE, _ONE, _I64, origin="rng_state[0]", present=lambda c: c.has_dropout,
               align16=False)  # fmt: skip
OFFSET = replace(SEED, uid=Uid.OFFSET, origin="rng_state[1]")
SINK = Operand(Uid.SINK, Source.TENSOR, _sink_dims, _sink_strides, _F32, origin="softmax_offset",
               present=lambda c: c.has_sink)  # fmt: skip
DSINK = Operand(Uid.DSINK, Source.RESULT, _sink_dims, _sink_strides, _F32, output=True,
                present=lambda c: c.has_sink and c.dsink_in_graph)  # fmt: skip
SEQ_LEN_Q = Operand(Uid.SEQ_LEN_Q, Source.LENGTHS, lambda c: (c.b, 1, 1, 1), _ONE, _I32,
                    origin="lengths from cu_seqlens_q", present=lambda c: c.mask.is_padding, keyed=False,
                    align16=False)  # fmt: skip
SEQ_LEN_KV = replace(SEQ_LEN_Q, uid=Uid.SEQ_LEN_KV,
                     origin="lengths from cu_seqlens_kv, or fused_attn_decode's cache_seqlens")  # fmt: skip
_OFFSETS_Q = Operand(Uid.RAGGED_Q, Source.OFFSETS, lambda c: (c.b + 1, 1, 1, 1), _ONE, _I64, keyed=False,
                     align16=False, origin="offsets from cu_seqlens_q(_padded)",
                     present=lambda c: c.ragged_q)  # fmt: skip
_OFFSETS_KV = replace(_OFFSETS_Q, origin="offsets from cu_seqlens_kv(_padded)", present=lambda c: c.ragged_kv)
#: THD ragged offsets ([b + 1, 1, 1, 1] int64, in elements): the q side's, then the kv side's.
RAGGED = (_OFFSETS_Q, replace(_OFFSETS_Q, uid=Uid.RAGGED_O), replace(_OFFSETS_Q, uid=Uid.RAGGED_STATS),
          replace(_OFFSETS_KV, uid=Uid.RAGGED_K), replace(_OFFSETS_KV, uid=Uid.RAGGED_V))  # fmt: skip
_PAGES = Operand(Uid.PAGE_TABLE_K, Source.TENSOR, lambda c: (c.b, 1, c.paged[2], 1),
                 lambda c: (c.paged[2], c.paged[2], 1, 1), _I32, present=lambda c: c.paged is not None, keyed=False,
                 origin="page_table_k, or fused_attn_decode's page_table")  # fmt: skip
PAGE_TABLES = (_PAGES, replace(_PAGES, uid=Uid.PAGE_TABLE_V, origin="page_table_v, or fused_attn_decode's page_table"))


def grad(uid: int, dtype: Geometry = io_dtype) -> Operand:
    """dQ, dK or dV: in the layout's format (``grad_strides``), placed like q, k or v."""
    index = {Uid.DQ: 0, Uid.DK: 1, Uid.DV: 2}[uid]
    heads = (lambda c: c.h) if uid == Uid.DQ else (lambda c: c.hg)
    rows = (lambda c: c.sq) if uid == Uid.DQ else (lambda c: c.skv)
    width = (lambda c: c.d_v) if uid == Uid.DV else (lambda c: c.d_qk)
    return Operand(uid, Source.RESULT, lambda c: (c.b, heads(c), rows(c), width(c)), lambda c: c.grad_strides[index],
                   dtype, output=True, placed_by=(Uid.RAGGED_Q, Uid.RAGGED_K, Uid.RAGGED_V)[index])  # fmt: skip
