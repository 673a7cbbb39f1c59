"""The launchers of prepared calls: each allocates a call's results, binds its operands in the
order of the sub-backend's graph and launches the plan (through :mod:`te_cudnn.launch`).

``plain_fwd`` / ``plain_bwd`` are the shortest paths (dense F16 without bias, FP8, paging or
sink); ``general_fwd`` / ``general_bwd`` serve every other call: padding masks and THD, paged
KV, a bias, sinks, the max logit, FP8 (and its backward split into parts), max512. The
functional API (:mod:`te_cudnn.ops`) and the custom operators call them with a call's
:class:`~te_cudnn.prepared._Prepared`.
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from typing import Optional, Sequence

import torch

from .config import AttnConfig
from .empty import empty_fwd
from .enums import AttnBiasType, QKVFormat
from .errors import CaptureMissError
from .fp8_operands import _fp8_bwd_amaxes, _slot, fp8_fwd_operands
from .layouts import alloc_qkv_grads, layout_info
from .plans import CompiledPlan, handle_for, plan_cache
from .plans.cache import next_tick
from .plans.split import chosen_split, slice_operand, split_config
from .plans.tune import autotuning
from .prepared import _Prepared
from .rng import _check_rng_state, _rng_state
from .sink_grad import sink_grad
from .launch import BWD_NAMES as _BWD_NAMES
from .launch import FWD_NAMES as _FWD_NAMES
from .launch import execute as _execute
from .launch import is_capturing as _is_capturing
from .launch import launch as _launch
from .launch import misaligned as _misaligned
from .launch import neg_inf as _neg_inf
from .launch import seed_offset as _seed_offset
from .launch import zeroed as _zeroed
from .varlen import BatchLengths
from .varlen import buffers_for as _buffers_for
from .varlen import check_runtime_tensors as _check_runtime_tensors


_NEG_INF = float("-inf")
_empty_like = torch.empty_like


def _aligned_bias(bias: torch.Tensor, cfg: AttnConfig) -> torch.Tensor:
    """The caller's post-scale bias in a buffer cuDNN can read (``cfg.bias_stride``: rows padded
    to 16 bytes). The one place the fused path copies; see AttnConfig.bias_copy."""
    shape, stride = cfg.bias_shape, cfg.bias_stride
    buf = torch.empty(shape[0] * stride[0], dtype=bias.dtype, device=bias.device).as_strided(shape, stride)
    return buf.copy_(bias)


def plain_fwd(prep: _Prepared, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: Optional[torch.Tensor] = None,
              softmax_lse: Optional[torch.Tensor] = None, rng_state: Optional[torch.Tensor] = None,
              rng_gen: Optional[torch.Generator] = None) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
    """The forward's shortest path (``prep.plain``: dense F16, no bias, FP8, paging or sink;
    dropout allowed): allocate O and the stats, read the pointers, launch. The caller has
    matched the call to ``prep`` (fused_attn_fwd by its signature, the custom ops by theirs)."""
    plan = prep.plan
    if plan is None or plan.evicted:
        plan = prep.get_plan()
    plan.hits += 1  # plan_cache.hit, inline (see PlanCache.hit: no lock needed)
    plan.last_used = next_tick()
    # empty_like is torch's cheapest allocation; empty_like of a template (see _template) is a
    # contiguous result of the template's shape.
    o = _empty_like(q if prep.out_like_q else prep.out_template) if out is None else out
    if prep.stats_template is None:  # a graph without stats (softmax_stats=False): aux_ctx_tensors[0] is None
        st = None
    else:
        st = _empty_like(prep.stats_template) if softmax_lse is None else softmax_lse
    if prep.rng_increment:
        if rng_state is None:
            rng_state = _rng_state(prep, rng_gen)
        else:
            _check_rng_state(rng_state, prep.device)
    else:
        rng_state = prep.zero_rng
    if plan.launch.mode != "raw":
        buffers = [q, k, v, o] if st is None else [q, k, v, o, st]
        _execute(plan, buffers, prep.device, _FWD_NAMES[:len(buffers)], rng_state if prep.rng_increment else None)
        return o, [st, rng_state]
    # the builder's uid order: q, k, v, o, (stats), (seed, offset)
    pq, pk, pv, po = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    if st is None:
        if (pq | pk | pv | po) & 15:
            _misaligned(q=q, k=k, v=v, out=o)
        ptrs = array("Q", (pq, pk, pv, po))
    else:
        ps = st.data_ptr()
        if (pq | pk | pv | po | ps) & 15:
            _misaligned(q=q, k=k, v=v, out=o, softmax_lse=st)
        ptrs = array("Q", (pq, pk, pv, po, ps))
    if prep.rng_increment:
        seed = rng_state.data_ptr()
        ptrs.append(seed)
        ptrs.append(seed + 8)
    _launch(plan, ptrs, prep.index)
    return o, [st, rng_state]


def plain_bwd(prep: _Prepared, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, d_o: torch.Tensor,
              stats: torch.Tensor, rng_state: torch.Tensor) -> list[Optional[torch.Tensor]]:  # fmt: skip
    """The backward's shortest path (``prep.plain``): allocate dQ, dK, dV in the layout's
    format, read the pointers, launch; ``[dq, dk, dv, None, None]`` as fused_attn_bwd returns."""
    plan = prep.plan
    if plan is None or plan.evicted:
        plan = prep.get_plan()
    plan.hits += 1
    plan.last_used = next_tick()
    if prep.grads_like_inputs:  # separate q, k, v: in their own strides when dense (layouts.alloc_qkv_grads)
        dq, dk, dv = _empty_like(q), _empty_like(k), _empty_like(v)
    else:
        dq, dk, dv = alloc_qkv_grads(prep.cfg.layout, q, k, v)
    dropout = prep.cfg.has_dropout
    if plan.launch.mode != "raw":
        _execute(plan, [q, k, v, o, stats, d_o, dq, dk, dv], prep.device, _BWD_NAMES, rng_state if dropout else None)
        return [dq, dk, dv, None, None]
    # the builder's uid order: q, k, v, o, stats, d_o, dq, dk, dv, (seed, offset)
    pq, pk, pv, po, ps, pdo = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), stats.data_ptr(), d_o.data_ptr()
    if (pq | pk | pv | po | ps | pdo) & 15:
        _misaligned(**dict(zip(_BWD_NAMES, (q, k, v, o, stats, d_o))))
    ptrs = array("Q", (pq, pk, pv, po, ps, pdo, dq.data_ptr(), dk.data_ptr(), dv.data_ptr()))
    if dropout:
        seed = rng_state.data_ptr()
        ptrs.append(seed)
        ptrs.append(seed + 8)
    _launch(plan, ptrs, prep.index)
    return [dq, dk, dv, None, None]


def _fwd_results(prep: _Prepared, q: torch.Tensor, out: Optional[torch.Tensor], softmax_lse: Optional[torch.Tensor],
                 keyless_rows: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """O and the softmax stats of a forward that is not plain: the caller's (zeroed where cuDNN
    may leave rows unwritten), or new ones in the layout's format. ``keyless_rows``: whether a
    query row inside a sequence may see no key (see :func:`general_fwd`); cuDNN leaves such rows
    unwritten, and their logsumexp is -inf."""
    cfg = prep.cfg
    if out is not None:  # caller-provided results (checked when the signature was first seen)
        if prep.fill_out:
            out.zero_()
    elif cfg.ragged_q:  # sizes vary per call; padding tokens stay zero (TE zero-fills THD outputs)
        out = _zeroed(_empty_like(q) if prep.out_like_q else
                      torch.empty((*q.shape[:-1], cfg.d_v), dtype=q.dtype, device=prep.device), prep.index)
    elif prep.fill_out:
        out = _zeroed(_empty_like(q if prep.out_like_q else prep.out_template), prep.index)
    else:
        out = _empty_like(q if prep.out_like_q else prep.out_template)
    if softmax_lse is not None:
        stats = softmax_lse
        if prep.zero_stats:
            stats.zero_()
        elif prep.varlen and (keyless_rows or not cfg.ragged_q):
            stats.fill_(_NEG_INF)
    elif cfg.ragged_q:  # token-major [t, h, 1]; rows of padding tokens are undefined (as TE's)
        stats = torch.empty((q.shape[0], cfg.h, 1), dtype=torch.float32, device=prep.device)
        if keyless_rows:
            _neg_inf(stats, prep.index)
    elif prep.varlen and not prep.softmax_aux:
        stats = _neg_inf(_empty_like(prep.stats_template), prep.index)
    elif prep.zero_stats:  # max512 causal: the engine leaves skipped tiles of S unwritten, its backward reads them
        stats = _zeroed(_empty_like(prep.stats_template), prep.index)
    else:
        stats = _empty_like(prep.stats_template)
    return out, stats


def general_fwd(prep: _Prepared, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: Optional[torch.Tensor],
                softmax_lse: Optional[torch.Tensor], rng_state: Optional[torch.Tensor],
                rng_gen: Optional[torch.Generator], attn_bias: Optional[torch.Tensor], cu_seqlens: tuple,
                page_table_k: Optional[torch.Tensor], page_table_v: Optional[torch.Tensor],
                softmax_offset: Optional[torch.Tensor], fp8: Optional[tuple],
                lengths: Optional[BatchLengths] = None) -> tuple:  # fmt: skip
    """Every forward that is not plain (a padding mask, THD, paging, a bias, a sink, the max
    logit, FP8, max512): checks the per-call tensors, allocates the results and binds the
    operands in the order of the sub-backend's graph (``operand_uids``): q, k, v, O, stats,
    then bias, seed and offset, sink (F16), max, the FP8 scaling operands and amaxes, sink
    (FP8), and last the runtime lengths / ragged offsets / page tables.
    ``cu_seqlens``: (q, kv, q_padded, kv_padded); ``fp8``: :func:`fp8_fwd_operands`' arguments."""
    cfg = prep.cfg
    if prep.varlen or page_table_k is not None:
        _check_runtime_tensors(prep, q, cu_seqlens, () if page_table_k is None else (page_table_k, page_table_v))
    if (q.data_ptr() | k.data_ptr() | v.data_ptr() | (0 if out is None else out.data_ptr())
            | (0 if softmax_lse is None else softmax_lse.data_ptr())) & 15:
        _misaligned(q=q, k=k, v=v, out=out, softmax_lse=softmax_lse)
    plan = prep.get_plan()
    # Self-attention lengths (one cu_seqlens tensor for q and kv): every query row inside a
    # sequence sees at least its own key under every mask and window te_cudnn accepts, so cuDNN
    # writes every such row's stats and only rows outside the sequences stay unwritten.
    out, stats = _fwd_results(prep, q, out, softmax_lse, cu_seqlens[1] is not cu_seqlens[0])
    buffers = [q, k, v, out, stats]
    if rng_state is None or not prep.rng_increment:
        rng_state = _rng_state(prep, rng_gen)
    else:
        _check_rng_state(rng_state, prep.device)
    if attn_bias is not None:
        buffers.append(_aligned_bias(attn_bias, cfg) if cfg.bias_copy else attn_bias)
    if prep.rng_increment:
        buffers.extend(_seed_offset(rng_state))
    sink = None
    if cfg.has_sink:  # F16: after the dropout operands
        sink = prep.zero_sink if softmax_offset is None else softmax_offset
        if not prep.fp8:
            buffers.append(sink)
    max_rows = None
    if cfg.return_max_logit:  # shaped as the stats
        max_rows = torch.empty_like(stats)
        buffers.append(max_rows)
    if prep.fp8:
        buffers += fp8_fwd_operands(*fp8)
        if sink is not None:  # FP8: after the scaling operands
            buffers.append(sink)
    if prep.varlen:
        buffers += _buffers_for(prep, cu_seqlens, lengths)
    elif prep.full_lens is not None:
        buffers += prep.full_lens
    if cfg.paged is not None:
        pages = (cfg.b, 1, cfg.paged[2], 1)
        buffers += [page_table_k.view(pages), page_table_v.view(pages)]
    _execute(plan, buffers, prep.device)
    aux = [stats, rng_state]
    if attn_bias is not None:
        aux.append(attn_bias)
    if sink is not None:  # TE 2.x: the offset rides along for the backward
        aux.append(sink)
    if max_rows is not None:
        return out, aux, _max_logit(max_rows, prep, cu_seqlens[0], cu_seqlens[2])
    return out, aux


def _max_logit(rows: torch.Tensor, prep: _Prepared, cu_q: Optional[torch.Tensor], cu_q_padded: Optional[torch.Tensor]) -> torch.Tensor:
    """TE 2.x's ``max_logit``: the per-head maximum of cuDNN's per-row maxima, ``[h]`` in O's
    dtype. Rows that hold no query (THD padding tokens, padded positions) are left out."""
    cfg = prep.cfg
    if cfg.ragged_q:  # [t, h, 1]: rows of tokens outside every sequence are undefined
        t = rows.shape[0]
        pos = torch.arange(t, device=rows.device, dtype=torch.int32)
        starts = cu_q if cu_q_padded is None else cu_q_padded
        seq = (torch.searchsorted(starts, pos, right=True) - 1).clamp(0, starts.shape[0] - 2)
        valid = pos - starts[seq] < (cu_q[seq + 1] - cu_q[seq])
        rows = rows.masked_fill(~valid.view(t, 1, 1), float("-inf"))
        return rows.amax(dim=(0, 2)).to(cfg.dtype)
    if cfg.mask.is_padding and cu_q is not None:  # [b, h, sq, 1]: positions past each sequence's end
        lens = (cu_q[1:] - cu_q[:-1]).view(-1, 1, 1, 1)
        pos = torch.arange(rows.shape[2], device=rows.device).view(1, 1, -1, 1)
        rows = rows.masked_fill(pos >= lens, float("-inf"))
    return rows.amax(dim=(0, 2, 3)).to(cfg.dtype)


def _empty_fwd(prep: _Prepared, q, out, softmax_lse, attn_bias, rng_gen, amax_slots, softmax_offset) -> tuple:
    """A zero-size forward (see te_cudnn.empty): no cuDNN call, and the generator advances
    as a non-empty call's would."""
    cfg = prep.cfg
    stats_shape = (q.shape[0], cfg.h, 1) if cfg.ragged_q and not prep.softmax_aux else prep.stats_shape
    o, stats = empty_fwd(cfg, q, out, softmax_lse, stats_shape, prep.stats_template.dtype, amax_slots if prep.fp8 else ())
    aux = [stats, _rng_state(prep, rng_gen)]
    if attn_bias is not None:
        aux.append(attn_bias)
    if cfg.has_sink:
        aux.append(prep.zero_sink if softmax_offset is None else softmax_offset)
    if cfg.return_max_logit:  # no logits at all: the maximum of nothing
        return o, aux, torch.full((cfg.h,), float("-inf"), dtype=cfg.dtype, device=q.device)
    return o, aux


def general_bwd(prep: _Prepared, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, d_o: torch.Tensor,
                aux: Sequence[torch.Tensor], cu_seqlens: tuple, fp8: Optional[tuple],
                lengths: Optional[BatchLengths] = None) -> list[Optional[torch.Tensor]]:  # fmt: skip
    """Every backward that is not plain (a padding mask, THD, a bias, a sink, FP8, max512):
    checks the per-call tensors, allocates dQ, dK, dV (zeroed where cuDNN may leave rows
    unwritten) and binds the operands in the order of the sub-backend's graph
    (``operand_uids``): q, k, v, O, stats, dO, dQ, dK, dV, then bias and dBias, seed and
    offset, sink and its gradient (F16), the FP8 scaling operands and amaxes, sink (FP8), and
    last the runtime lengths / ragged offsets. An FP8 backward the autotuner split runs as
    parts (:func:`_split_bwd`); max512 has its own operands (:func:`_max512_bwd`).
    ``aux``: the forward's aux_ctx_tensors; ``cu_seqlens``: (q, kv, q_padded, kv_padded);
    ``fp8``: (:func:`fp8_bwd_scales`, the amax_dp slot, the amax_dqkv slot)."""
    cfg = prep.cfg
    if prep.varlen:
        _check_runtime_tensors(prep, q, cu_seqlens)
    if (q.data_ptr() | k.data_ptr() | v.data_ptr() | o.data_ptr() | d_o.data_ptr()) & 15:
        _misaligned(q=q, k=k, v=v, o=o, d_o=d_o)
    plan = prep.get_plan()
    if fp8 is not None:
        split = chosen_split(plan.tuning)
        if split is not None:  # the autotuner measured that parts of the call are faster (te_cudnn.plans.split)
            lens = _buffers_for(prep, cu_seqlens, lengths) if prep.varlen else []
            return _split_bwd(prep, split, [q, k, v, o, aux[0], d_o], fp8[0], lens, fp8[1], fp8[2])
    dq, dk, dv = alloc_qkv_grads(cfg.layout, q, k, v, zero=prep.fill_grads, dtype=cfg.do_dtype)
    if prep.softmax_aux:
        return _max512_bwd(prep, q, k, v, d_o, dq, dk, dv, aux) + [None]
    buffers = [q, k, v, o, aux[0], d_o, dq, dk, dv]
    dbias = None
    if cfg.bias_type == AttnBiasType.post_scale_bias:
        bias = aux[2]
        buffers.append(_aligned_bias(bias, cfg) if cfg.bias_copy else bias)
        if cfg.has_dbias:  # cuDNN writes dBias contiguous (the builders declare it so)
            dbias = torch.empty(bias.shape, dtype=bias.dtype, device=prep.device)
            buffers.append(dbias)
    if cfg.has_dropout:
        buffers.extend(_seed_offset(aux[1]))
    sink_ops: list[torch.Tensor] = []
    d_sink = None
    if cfg.has_sink:  # [softmax_offset, (d_softmax_offset)]: after dropout (F16) or the scaling operands (FP8)
        sink_ops.append(aux[prep.sink_index])
        if cfg.dsink_in_graph:  # cuDNN accumulates it across rows: it starts at zero
            d_sink = torch.zeros((1, cfg.h, 1, 1), dtype=torch.float32, device=prep.device)
            sink_ops.append(d_sink)
        if fp8 is None:
            buffers += sink_ops
    amax3 = None
    if fp8 is not None:
        amax3 = torch.empty((3, 1, 1, 1), dtype=torch.float32, device=prep.device)  # dQ, dK, dV amaxes
        buffers += fp8[0] + _fp8_bwd_amaxes(amax3, _slot(fp8[1], 0))
        buffers += sink_ops
    if prep.varlen:
        buffers += _buffers_for(prep, cu_seqlens, lengths)
    elif prep.full_lens is not None:
        buffers += prep.full_lens
    _execute(plan, buffers, prep.device)
    if cfg.has_dsink and not cfg.dsink_in_graph:
        d_sink = _sink_grad(cfg, o, d_o, aux[0], aux[prep.sink_index], cu_seqlens[0])
    if amax3 is not None:  # one META_DQKV slot holds the amax of dQ, dK and dV together
        torch.amax(amax3.view(3, 1), dim=0, out=fp8[2])
    if dbias is not None and cfg.bias_copy and not aux[2].is_contiguous():
        dbias = torch.empty_like(aux[2]).copy_(dbias)  # a copied bias' gradient in the caller's strides
    return [dq, dk, dv, dbias, d_sink]


#: (batch axis, head axis) of q/k/v/o/dO per format; the softmax stats are [b, h, s, 1].
_BH_AXES = {QKVFormat.bshd: (0, 2), QKVFormat.sbhd: (1, 2), QKVFormat.bhsd: (0, 1)}


def _split_bwd(prep: _Prepared, split: tuple[str, int], operands: list[torch.Tensor], scales: list[torch.Tensor],
               lens: list[torch.Tensor], amax_dp: torch.Tensor, amax_dqkv: torch.Tensor) -> list[Optional[torch.Tensor]]:
    """The backward as ``parts`` launches over zero-copy views of the batch or of whole GQA head
    groups, as the autotuner measured and recorded (te_cudnn.plans.split). One plan serves every
    part: its configuration keeps the full tensors' strides, so each part reads views of q, k,
    v, O, dO and the stats and writes its gradients straight into views of the full dQ, dK, dV
    (no copies). Each part writes its own amaxes into a scratch row; their maximum goes to the
    caller's ``amax_dp`` / ``amax_dqkv`` slots.

    ``operands``: the full q, k, v, O, softmax stats and dO; ``scales``: :func:`fp8_bwd_scales`
    (shared by every part); ``lens``: the per-sequence lengths of a padding mask ([b, 1, 1, 1]
    each, or none); ``amax_dp`` / ``amax_dqkv``: the caller's one-element metadata slots."""
    cfg = prep.cfg
    dim, parts = split
    plan = _part_plan(prep, split)
    axes = _BH_AXES[layout_info(cfg.layout).q_format]
    sizes = (cfg.b, cfg.h, cfg.hg)
    q, k, v, o, stats, d_o = operands
    grads = alloc_qkv_grads(cfg.layout, q, k, v, zero=prep.varlen, dtype=cfg.do_dtype)  # padding rows stay zero
    amax = torch.empty((parts, 4, 1, 1, 1), dtype=torch.float32, device=prep.device)  # per part: dQ, dK, dV, dP
    for i in range(parts):
        views = [slice_operand(t, dim, i, parts, sizes, axes) for t in (q, k, v, o)]
        views.append(slice_operand(stats, dim, i, parts, sizes, (0, 1)))
        views += [slice_operand(t, dim, i, parts, sizes, axes) for t in (d_o, *grads)]
        views += scales + _fp8_bwd_amaxes(amax[i, :3], _slot(amax[i, 3].view(1), 0))
        views += [slice_operand(t, dim, i, parts, sizes, (0, 1)) for t in lens]  # the lengths are sliced too
        _execute(plan, views, prep.device)
    torch.amax(amax[:, :3].reshape(3 * parts, 1), dim=0, out=amax_dqkv)
    torch.amax(amax[:, 3].reshape(parts, 1), dim=0, out=amax_dp)
    return [*grads, None, None]


def _part_plan(prep: _Prepared, split: tuple[str, int]) -> CompiledPlan:
    """The plan of one part of a split backward (``split_config``: the part's sizes, the full
    tensors' strides), through the plan cache and store like any plan; never tuned itself (the
    whole call's tuning chose this split)."""
    held = prep.split_plan
    if held is not None and held[0] == split and plan_cache.hit(held[1]):
        return held[1]
    if _is_capturing():
        raise CaptureMissError(f"the split backward plan for {prep.cfg.summary()} is not in the plan cache")
    part_cfg = split_config(prep.cfg, *split)
    key = replace(prep.key, config=part_cfg)
    backend, device = prep.backend, prep.device.index
    with torch.cuda.device(device), autotuning(False):
        plan = plan_cache.get_or_build(key, lambda: backend.build(part_cfg, key.direction, handle_for(device)))
    prep.split_plan = (split, plan)
    return plan


def _sink_grad(cfg: AttnConfig, o: torch.Tensor, d_o: torch.Tensor, stats: torch.Tensor, sink: torch.Tensor,
               cu_q: Optional[torch.Tensor]) -> torch.Tensor:
    """d_softmax_offset of learnable sinks for dense F16 tensors (see te_cudnn.sink_grad)."""
    lens = (cu_q[1:] - cu_q[:-1]) if cfg.mask.is_padding and cu_q is not None else None
    return sink_grad(o, d_o, stats, sink, layout_info(cfg.layout).q_format == QKVFormat.sbhd, lens)


def _max512_bwd(prep: _Prepared, q, k, v, d_o, dq, dk, dv, aux) -> list[Optional[torch.Tensor]]:
    """The max512 backward: reads the saved softmax S and never overwrites it (dS goes to its
    own scratch, zeroed where a causal mask leaves tiles the engine reads but never writes)."""
    cfg = prep.cfg
    plan = prep.get_plan()
    shape = (cfg.b, cfg.h, cfg.sq, cfg.skv)
    ds = (torch.zeros if cfg.mask.is_causal else torch.empty)(shape, dtype=cfg.dtype, device=prep.device)
    buffers = [q, k, v, aux[0], d_o, dq, dk, dv, ds]
    dbias = None
    if cfg.has_dbias:
        dbias = torch.empty(cfg.bias_shape, dtype=cfg.dtype, device=prep.device)
        buffers.append(dbias)
    _execute(plan, buffers + prep.full_lens, prep.device)
    return [dq, dk, dv, dbias]
