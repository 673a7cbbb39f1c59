"""Prepared calls: what the first call of a signature computes, kept for every later one.

A :class:`_Prepared` holds what a repeated call needs (the configuration, the sub-backend, the
plan key and the plan, result templates, constant operands, the launch mode). The forward and
backward memos keep them under the raw call signatures :mod:`te_cudnn.ops` computes;
:func:`forget_prepared` drops them, with every cache built on them, so the next calls validate
and select again. (At interpreter exit te_cudnn.ops drops the cuDNN objects they reach.)
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Sequence

import torch

from .backends import Direction, SubBackend
from .config import AttnConfig
from .errors import CaptureMissError
from .launch import is_capturing as _is_capturing
from .launch import kept as _kept
from .memo import TEMPLATE_BYTES, SigMemo
from .plans import CompiledPlan, handle_for, plan_cache
from .plans.padded_rows import fills_grads, fills_out
from .row_fill import Lengths


@dataclass(eq=False)
class _Prepared:
    """Everything a repeated call needs, computed once per call signature."""

    cfg: AttnConfig
    backend: SubBackend
    key: Any
    out_shape: tuple[int, ...]
    stats_shape: tuple[int, ...]
    device: torch.device
    rng_increment: int
    out_like_q: bool = False  # O can be allocated as torch.empty_like(q) (the cheapest allocation)
    out_template: Optional[torch.Tensor] = None
    stats_template: Optional[torch.Tensor] = None
    varlen: bool = False  # padding mask or THD: per-call lengths/offsets, zero-filled results
    mult_q: Optional[torch.Tensor] = None  # elements per token of q, o, stats (THD q side)
    mult_kv: Optional[torch.Tensor] = None  # elements per token of k, v (THD kv side)
    mult_all: Optional[torch.Tensor] = None  # q, o, stats, k, v (both sides THD)
    fp8: bool = False
    softmax_aux: bool = False  # F16_max512_seqlen: aux[0] is the full softmax S, not fp32 stats
    plain: bool = False  # dense F16, no bias, FP8, paging, sink: the shortest hot path (dropout allowed)
    grads_like_inputs: bool = False  # backward, separate 4-d q/k/v: dq, dk, dv as empty_like(q, k, v)
    zero_rng: Optional[torch.Tensor] = None  # the device's shared all-zero rng_state
    zero_sink: Optional[torch.Tensor] = None  # off_by_one without softmax_offset: zeros [1, h, 1, 1]
    sink_index: int = 2  # backward: where aux_ctx_tensors holds softmax_offset
    full_lens: Optional[list] = None  # max512: int32 [b,1,1,1] lengths sq and skv for its length mask
    zero_stats: bool = False  # max512 causal: S must start zeroed
    empty: bool = False  # a zero-size call: answered by te_cudnn.empty, never by cuDNN
    cu_len: Optional[int] = None  # varlen: the length every cu_seqlens* must have (None: THD, varies per call)
    runtime_kind: tuple = ()  # varlen: what the runtime buffers depend on besides the cu_seqlens (cache key)
    lengths: Lengths = Lengths.AS_GIVEN  # padding masks: the lengths bound (te_cudnn.row_fill)
    one_query: Optional[torch.Tensor] = None  # int32 ones [b,1,1,1]: the query lengths of Lengths.ONE_QUERY
    fill_out: bool = False  # forward: zero O before cuDNN writes it (rows cuDNN may leave unwritten)
    fill_grads: bool = False  # backward: zero dQ, dK, dV likewise
    head_pad: Optional[tuple[int, int]] = None  # head dims not a multiple of 8: run padded (te_cudnn.served)
    plan: Optional[CompiledPlan] = None
    split_plan: Optional[tuple] = None  # FP8 backward run in parts: ((dim, parts), the parts' plan)
    index: int = -1  # device.index, read on every launch (set from device)

    #: The fields that hold device tensors (what te_cudnn.memo.held_bytes counts).
    held_fields: ClassVar[tuple[str, ...]] = (
        "out_template", "stats_template", "mult_q", "mult_kv", "mult_all", "zero_rng", "zero_sink", "full_lens",
        "one_query",
    )  # fmt: skip

    def __post_init__(self) -> None:
        self.index = -1 if self.device.index is None else self.device.index

    def get_plan(self) -> CompiledPlan:
        """The cached plan: a hit when still cached, a lookup or build after eviction."""
        plan = self.plan
        if plan is None or not plan_cache.hit(plan):
            if _is_capturing():
                raise CaptureMissError(f"the plan for {self.cfg.summary()} is not in the plan cache (evicted or never built)")
            backend, cfg, device = self.backend, self.cfg, self.device.index
            with torch.cuda.device(device):  # build / deserialize in the tensors' device's context
                plan = self.plan = plan_cache.get_or_build(
                    self.key, lambda: backend.build(cfg, self.key.direction, handle_for(device))
                )
                if self.varlen:  # the fills this plan's engine needs (te_cudnn.row_fill, te_cudnn.plans.padded_rows)
                    if self.key.direction == Direction.FWD:
                        self.fill_out = fills_out(cfg, backend, plan)
                    else:
                        self.fill_grads = fills_grads(cfg, backend, plan)
        return plan


_fwd_memo = SigMemo()
_bwd_memo = SigMemo()
_memo_lock = threading.Lock()


#: Other caches of prepared calls (the custom ops' launcher caches): forgotten with the memos.
_dependent_caches: list[dict] = []


def forget_prepared() -> None:
    """Forget every prepared call (the memos and the caches that hold their entries), so the
    next calls validate and select again (after the backend-policy environment changed)."""
    with _memo_lock:
        _fwd_memo.clear()
        _bwd_memo.clear()
        for cache in _dependent_caches:
            cache.clear()


def _remember(memo: SigMemo, sig: Optional[tuple], prepared: _Prepared) -> None:
    memo.remember(sig, prepared)


#: Result templates up to this size are real contiguous tensors: ``torch.empty_like`` of a
#: dense tensor skips the memory-format inference a non-dense one needs, which counts on the
#: small shapes whose calls are host-bound. Larger results use an expanded 1-element tensor,
#: which holds no memory. The memos bound what their templates hold (te_cudnn.memo).
_DENSE_TEMPLATE_BYTES = TEMPLATE_BYTES


def _template(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor that ``torch.empty_like`` turns into a new contiguous tensor of ``shape``: a
    contiguous one when small (never read: only its shape, strides, dtype and device matter),
    else a 1-element tensor expanded to ``shape`` (non-dense inputs get contiguous results).
    Shared by every prepared call that asks for the same one (see :func:`shared_template`)."""
    if math.prod(shape) * dtype.itemsize <= _DENSE_TEMPLATE_BYTES:
        return shared_template(tuple(shape), None, dtype, device)
    return shared_template((1,), None, dtype, device).expand(*shape)


#: (shape, strides, dtype, device) -> a template; never written, so calls of one shape (a
#: dynamic KV cache's decode steps: one signature per key length) share one tensor instead of
#: each making its own on te_cudnn's worker thread. At most this many, each at most
#: TEMPLATE_BYTES (4 MiB in all); cleared when full (the prepared calls keep the ones they
#: use). The memos count a shared template in every entry holding it: their byte bound
#: (te_cudnn.memo) stays an upper bound.
_TEMPLATES_LIMIT = 256
_templates: dict[tuple, torch.Tensor] = {}


def shared_template(shape: tuple[int, ...], stride: Optional[tuple[int, ...]], dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:  # fmt: skip
    """A kept tensor of ``shape`` (contiguous, or with ``stride``), made once per geometry."""
    key = (shape, stride, dtype, device)
    t = _templates.get(key)
    if t is None:
        if len(_templates) >= _TEMPLATES_LIMIT:
            _templates.clear()
        make = ((lambda: torch.empty(shape, dtype=dtype, device=device)) if stride is None
                else (lambda: torch.empty_strided(shape, stride, dtype=dtype, device=device)))  # fmt: skip
        t = _templates[key] = _kept(make, device)
    return t


