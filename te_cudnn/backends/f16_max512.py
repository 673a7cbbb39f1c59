"""F16 max512 sub-backend: cuDNN's non-flash fused-attention engine for sequences <= 512.

TransformerEngine served it from ``fused_attn_f16_max512_seqlen.cu`` (legacy descriptor API)
until v2.16. cuDNN 9.19 still runs its engine ("eng0") for a generic graph of matmul,
pointwise and reduction nodes in one fixed pattern, which the frontend's Python API can
express (``gpu_findings.md``; TE spec section 5):

forward   K' = K^T * scale (io dtype)  ->  S = Q K' (fp32)  [+ bias]  ->  mask (gen_index rows and
          columns vs the lengths, row >= col for causal; masked scores become -1e10)  ->
          softmax as max / sub / exp / sum / div, written as P (io dtype, F16x16 reordered: the
          aux tensor the backward needs)  ->  O = P V
backward  dV = P^T dO; dP = dO V^T; dS = scale * P (dP - rowsum(P dP)), masked to 0 and written
          (io dtype, F16x16); dQ = dS K; dK = dS^T Q; dBias = sum_b dS / scale

Differences from TransformerEngine's version:

* the backward writes dS to its own scratch buffer, so the saved softmax survives and a
  second backward over the same forward gives the same gradients (TE aliased dS onto S);
* the frontend's Python API has no matmul m/n/k overrides, through which TE passed per-batch
  lengths; the engine ignores lengths given as a mask, so padding masks are declined;
* where the causal mask skips whole tiles, the engine neither writes them nor skips reading
  them back: the launchers (``te_cudnn.launchers``) zero-fill S and the dS scratch for causal
  graphs;
* the Python API has no RNG node, so dropout is declined (with that reason);
* ``aux_ctx_tensors`` is ``[S, rng_state, (bias)]`` like the other sub-backends (TE: ``[S]``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..config import AttnConfig
from ..enums import BACKEND_FP8_THREADS_PER_CTA, AttnBiasType, AttnMaskType, FusedAttnBackend, QKVLayout
from ..runtime import RuntimeEnv, cudnn_module
from ._common import new_graph
from .base import Capabilities, Direction, GraphSpec, SubBackend, Uid
from .operands import BIAS, Operand, Operands, Q, Source, as_input, const, io_dtype

__all__ = ["BWD_OPERANDS", "FWD_OPERANDS", "MASK_VALUE", "F16Max512Seqlen"]

MASK_VALUE = -1e10  # TE's forward mask value; the backward masks dS with 0
# fp16: the engine holds masked scores in the io dtype, where -1e10 is -inf and a fully masked
# (padded) row would become NaN; -30000 is finite there and exp() of it is still 0.
MASK_VALUE_FP16 = -30000.0


def _by_value(value: float, dtype: torch.dtype) -> torch.Tensor:
    """A by-value scalar operand: a [1, 1, 1, 1] CPU tensor the graph keeps and binds itself at
    every execute (and serializes with the plan), as TE's engine took its constants."""
    return torch.full((1, 1, 1, 1), value, dtype=dtype)


def _bhsd(rows: str, cols: str) -> Callable[[AttnConfig], tuple[int, ...]]:
    """[b, h, rows, cols] of the config's fields (the engine takes no GQA: h heads everywhere)."""
    return lambda c: (c.b, c.h, getattr(c, rows), getattr(c, cols))


def softmax_stride(cfg: AttnConfig) -> tuple[int, ...]:
    """The saved softmax S and the dS scratch: contiguous [b, h, sq, skv]."""
    return (cfg.h * cfg.sq * cfg.skv, cfg.sq * cfg.skv, cfg.skv, 1)


def _swap(stride: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a tensor read transposed in its last two dims."""
    return (stride[0], stride[1], stride[3], stride[2])


def _full_lengths(uid: int, field: str) -> Operand:
    return Operand(uid, Source.CONSTANT, lambda c: (c.b, 1, 1, 1), const((1, 1, 1, 1)), const(torch.int32),
                   origin=f"the full lengths {field}, a constant: no padding mask", align16=False)  # fmt: skip


_K = Operand(Uid.K, Source.TENSOR, _bhsd("skv", "d_qk"), lambda c: c.k_stride, io_dtype)
_V = Operand(Uid.V, Source.TENSOR, _bhsd("skv", "d_qk"), lambda c: c.v_stride, io_dtype)
#: The softmax P the forward saves for the backward: io dtype, in the engine's F16x16 tile order.
_P = Operand(Uid.STATS, Source.RESULT, _bhsd("sq", "skv"), softmax_stride, io_dtype, output=True, reordering="F16x16",
             origin="softmax_lse, or aux_ctx_tensors[0] in the backward")  # fmt: skip
_GRADS = tuple(
    Operand(uid, Source.RESULT, _bhsd(rows, "d_qk"), lambda c, i=i: c.grad_strides[i], io_dtype, output=True)
    for i, (uid, rows) in enumerate(((Uid.DQ, "sq"), (Uid.DK, "skv"), (Uid.DV, "skv")))
)  # fmt: skip
_DBIAS = Operand(Uid.DBIAS, Source.RESULT, lambda c: (1, c.h, c.sq, c.skv),
                 lambda c: (c.h * c.sq * c.skv, c.sq * c.skv, c.skv, 1), io_dtype, output=True,
                 present=lambda c: c.has_dbias)  # fmt: skip
_LENGTHS = (_full_lengths(Uid.SEQ_LEN_Q, "sq"), _full_lengths(Uid.SEQ_LEN_KV, "skv"))
#: Forward: q, K^T (the engine reads K transposed), v, O, the softmax P [, bias], the lengths.
FWD_OPERANDS = Operands(
    Q, replace(_K, dims=_bhsd("d_qk", "skv"), strides=lambda c: _swap(c.k_stride)), _V,
    Operand(Uid.O, Source.RESULT, _bhsd("sq", "d_qk"), lambda c: c.o_stride, io_dtype, output=True, origin="out"), _P,
    BIAS, *_LENGTHS,
)  # fmt: skip
#: Backward: q, k, V^T, the saved P, dO, dQ, dK, dV, the dS scratch [, dBias], the lengths.
BWD_OPERANDS = Operands(
    Q, _K, replace(_V, dims=_bhsd("d_qk", "skv"), strides=lambda c: _swap(c.v_stride)),
    as_input(_P, graph_name="softmax"),
    Operand(Uid.DO, Source.TENSOR, _bhsd("sq", "d_qk"), lambda c: c.do_stride or c.o_stride, io_dtype), *_GRADS,
    replace(_P, uid=Uid.DS, source=Source.SCRATCH, origin="scratch te_cudnn allocates"), _DBIAS, *_LENGTHS,
)  # fmt: skip


class F16Max512Seqlen(SubBackend):
    enum = FusedAttnBackend.F16_max512_seqlen
    caps = Capabilities(
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        layouts=frozenset(
            {QKVLayout.sb3hd, QKVLayout.sbhd_sb2hd, QKVLayout.bs3hd, QKVLayout.bshd_bs2hd, QKVLayout.bshd_bshd_bshd}
        ),
        # TE also served padding and padding_causal here, through per-batch m/n/k overrides on the
        # matmuls, which the frontend's Python API does not have; see extra_reasons.
        masks=frozenset({AttnMaskType.no_mask, AttnMaskType.causal}),
        bias_types=frozenset({AttnBiasType.no_bias, AttnBiasType.post_scale_bias}),
        max_seqlen=512,
        seqlen_multiple=64,
        head_dims=frozenset({64}),
        supports_gqa=False,
        supports_window=False,
        # The frontend's Python graph API has no RNG node: the fused dropout cannot be expressed.
        supports_dropout=False,
        saves_softmax=True,
        # A deserialized generic graph loses the by-value scalars it binds itself (execute then misses
        # their operands), so these plans are rebuilt per process, not stored.
        persistable=False,
        min_sm=80,
        max_sm=100,  # TE: sm80 and sm90 only
        tracking_issue=None,
    )
    fwd_operands = FWD_OPERANDS
    bwd_operands = BWD_OPERANDS

    # ------------------------------------------------------------------ rules
    def extra_reasons(self, cfg: AttnConfig, env: RuntimeEnv, direction: Direction) -> list[str]:
        why: list[str] = []
        if env.sm is not None and env.sm not in (80, 90):
            why.append(f"cuDNN's max512 engine runs on sm80 and sm90 only, got sm{env.sm}")
        if cfg.mask.is_padding:
            why.append(
                "padding masks: the engine takes per-batch lengths only as matmul overrides, which the frontend's "
                "Python API lacks; given as a mask, cuDNN 9.19 ignores them (the valid rows of a "
                "shorter sequence attended its padded keys)"
            )
        if cfg.layout == QKVLayout.sbhd_sb2hd and cfg.b == 3:
            why.append(
                "sbhd_sb2hd with b=3: cuDNN 9.19's engine 0 returns wrong, run-to-run varying results for it "
                "(other batch sizes and layouts are right)"
            )
        if cfg.bias_type == AttnBiasType.post_scale_bias and cfg.bias_shape is not None and cfg.bias_shape != (1, cfg.h, cfg.sq, cfg.skv):
            why.append(f"attn_bias shape {list(cfg.bias_shape)}: the max512 graph takes a [1, h, sq, skv] bias only")
        if cfg.bias_type == AttnBiasType.post_scale_bias and cfg.bias_stride is not None and cfg.bias_shape is not None:
            _, h, sq, skv = cfg.bias_shape
            if cfg.bias_stride[1:] != (sq * skv, skv, 1):
                why.append(f"attn_bias must be contiguous for max512, got stride {cfg.bias_stride}")
        if cfg.has_dbias and (cfg.is_training or direction == Direction.BWD) and cfg.skv not in (128, 256, 512):
            why.append(f"dBias needs skv of 128, 256 or 512 on this engine, got skv={cfg.skv} (cuDNN's rule)")
        if cfg.d_qk != cfg.d_v:
            why.append(f"d_qk={cfg.d_qk} != d_v={cfg.d_v}")
        return why

    def rng_elts_per_thread(self, cfg: AttnConfig) -> int:
        # ceil(sq * skv / 128), TE's increment (TE's PRE name: BACKEND_F16m512_FP8_THREADS_PER_CTA)
        return -(-cfg.sq * cfg.skv // BACKEND_FP8_THREADS_PER_CTA)

    # ------------------------------------------------------------------ graphs
    @staticmethod
    def _graph(cfg: AttnConfig, handle: Any, direction: Direction) -> tuple[Any, Any]:
        return new_graph(f"te_cudnn_F16_max512_seqlen_{direction.value}", cfg, handle)

    @staticmethod
    def _mask(g: Any, cfg: AttnConfig, operands: Operands, scores: Any, value: float) -> Any:
        """Masked scores: ``value`` where row >= len_q or col >= len_kv, or (causal) col > row.
        The engine recognises only the whole pattern (TE always built the padding part, too):
        without a padding mask the lengths are bound to the full sq/skv."""
        cudnn = cudnn_module()
        boolean = cudnn.data_type.BOOLEAN
        index = cudnn.data_type.INT32
        row = g.gen_index(scores, axis=2, name="row")
        col = g.gen_index(scores, axis=3, name="col")
        row.set_data_type(index)
        col.set_data_type(index)
        len_q = operands.tensor(g, cfg, Uid.SEQ_LEN_Q)
        len_kv = operands.tensor(g, cfg, Uid.SEQ_LEN_KV)
        in_q = g.cmp_lt(row, len_q, name="row_valid")
        in_kv = g.cmp_lt(col, len_kv, name="col_valid")
        in_q.set_data_type(boolean)
        in_kv.set_data_type(boolean)
        keep = g.logical_and(in_q, in_kv, name="padding_mask", compute_data_type=boolean)
        keep.set_data_type(boolean)
        if cfg.mask.is_causal:
            lower = g.cmp_ge(row, col, name="causal")
            lower.set_data_type(boolean)
            keep = g.logical_and(keep, lower, name="causal_mask", compute_data_type=boolean)
            keep.set_data_type(boolean)
        return g.binary_select(scores, _by_value(value, torch.float32), keep, name="masked")

    def build_fwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        cudnn = cudnn_module()
        g, io = self._graph(cfg, handle, Direction.FWD)
        table = FWD_OPERANDS
        f32 = cudnn.data_type.FLOAT
        b, h, sq = cfg.b, cfg.h, cfg.sq
        q, k_t, v = (table.tensor(g, cfg, uid) for uid in (Uid.Q, Uid.K, Uid.V))
        # The engine wants the scale folded into K in the io dtype (a float32 product is declined).
        k_scaled = g.mul(k_t, _by_value(cfg.attn_scale, cfg.dtype), name="k_scaled")
        k_scaled.set_data_type(io)
        s = g.matmul(q, k_scaled, compute_data_type=f32, name="bmm1")
        s.set_data_type(f32)
        if cfg.bias_type == AttnBiasType.post_scale_bias:
            s = g.add(s, table.tensor(g, cfg, Uid.BIAS), name="bias_add")
            s.set_data_type(f32)
        s = self._mask(g, cfg, table, s, MASK_VALUE_FP16 if cfg.dtype == torch.float16 else MASK_VALUE)
        row_max = g.reduction(s, mode=cudnn.reduction_mode.MAX, name="row_max")
        row_max.set_dim([b, h, sq, 1]).set_stride([h * sq, sq, 1, 1]).set_data_type(f32)
        shifted = g.sub(s, row_max, name="shifted")
        e = g.exp(shifted, name="exp")
        row_sum = g.reduction(e, mode=cudnn.reduction_mode.ADD, name="row_sum")
        row_sum.set_dim([b, h, sq, 1]).set_stride([h * sq, sq, 1, 1]).set_data_type(f32)
        p = table.output(g.div(e, row_sum, name="softmax"), cfg, Uid.STATS)  # P: the aux tensor
        table.output(g.matmul(p, v, compute_data_type=f32, name="bmm2"), cfg, Uid.O)
        return GraphSpec(g, self.operand_uids(cfg, Direction.FWD), Direction.FWD)

    def build_bwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        cudnn = cudnn_module()
        g, io = self._graph(cfg, handle, Direction.BWD)
        table = BWD_OPERANDS
        f32, boolean = cudnn.data_type.FLOAT, cudnn.data_type.BOOLEAN
        b, h, sq, skv = cfg.b, cfg.h, cfg.sq, cfg.skv
        p_t_stride = _swap(softmax_stride(cfg))
        q, k, v_t, p, d_o = (table.tensor(g, cfg, uid) for uid in (Uid.Q, Uid.K, Uid.V, Uid.STATS, Uid.DO))
        one = _by_value(1.0, torch.float32)  # the dropout scale: no dropout, but the pattern keeps the node
        zero = _by_value(0.0, torch.float32)
        # dV = |P^T * 1| dO
        p_t = g.reshape(p, name="p_transpose")
        p_t.set_dim([b, h, skv, sq]).set_stride(list(p_t_stride)).set_data_type(io)
        p_t = g.mul(p_t, one, name="p_transpose_scaled")
        p_t.set_data_type(io)
        p_t = g.abs(p_t, name="p_transpose_abs")
        p_t.set_data_type(io)
        dv = g.matmul(p_t, d_o, compute_data_type=f32, name="bmm_dv")
        # dP = dO V^T, with the dropout keep-mask (P > 0) and scale of TE's pattern
        dp = g.matmul(d_o, v_t, compute_data_type=f32, name="bmm_dp")
        dp.set_data_type(f32)
        p_abs = g.abs(p, name="p_abs")
        p_abs.set_data_type(io)
        kept = g.cmp_gt(p, zero, name="kept")
        kept.set_data_type(boolean)
        dp = g.mul(dp, one, name="dp_scaled")
        dp = g.binary_select(dp, zero, kept, name="dp_kept")
        # softmax backward: dS = scale * P (dP - rowsum(P dP))
        pdp = g.mul(p_abs, dp, name="p_dp")
        pdp_sum = g.reduction(pdp, mode=cudnn.reduction_mode.ADD, name="p_dp_sum")
        pdp_sum.set_dim([b, h, sq, 1]).set_stride([h * sq, sq, 1, 1]).set_data_type(f32)
        ds = g.sub(dp, pdp_sum, name="dp_centred")
        ds = g.mul(p_abs, ds, name="ds_unscaled")
        ds = g.mul(ds, _by_value(cfg.attn_scale, torch.float32), name="ds_scaled")
        ds = self._mask(g, cfg, table, ds, 0.0)
        # dS is written (the engine's pattern) to its own scratch buffer: the saved P survives.
        table.output(ds, cfg, Uid.DS)
        dq = g.matmul(ds, k, compute_data_type=f32, name="bmm_dq")
        ds_t = g.reshape(ds, name="ds_transpose")
        ds_t.set_dim([b, h, skv, sq]).set_stride(list(p_t_stride)).set_data_type(io)
        dk = g.matmul(ds_t, q, compute_data_type=f32, name="bmm_dk")
        # Gradients are allocated in the layout's own format (packed where the layout packs).
        for t, uid in ((dq, Uid.DQ), (dk, Uid.DK), (dv, Uid.DV)):
            table.output(t, cfg, uid)
        if cfg.has_dbias:
            db = g.reduction(ds, mode=cudnn.reduction_mode.ADD, name="dbias_sum")
            db.set_dim([1, h, sq, skv]).set_stride([h * sq * skv, sq * skv, skv, 1]).set_data_type(f32)
            table.output(g.mul(db, _by_value(1.0 / cfg.attn_scale, torch.float32), name="dbias"), cfg, Uid.DBIAS)
        return GraphSpec(g, self.operand_uids(cfg, Direction.BWD), Direction.BWD)
