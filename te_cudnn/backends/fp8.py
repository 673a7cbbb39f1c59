"""FP8 sub-backend: cuDNN's ``sdpa_fp8`` / ``sdpa_fp8_backward`` with TE's FP8 metadata.

Wiring follows TransformerEngine's delayed-scaling recipe (``fused_attn_fp8.cu``): q, k, v
and O are FP8 (E4M3); dO, and with it dQ/dK/dV, may be E5M2 (TE's HYBRID format). Every
scale, scale-inverse and amax is an fp32 ``[1, 1, 1, 1]`` device operand, a view of one slot
of the caller's metadata tensors (``META_QKV``, ``META_S``, ``META_O`` in the forward table,
``META_DO``, ``META_DP``, ``META_DQKV`` in the backward table), so nothing is read on the
host. The three dQ/dK/dV amaxes are reduced into the one ``META_DQKV`` slot.

Hopper limits (cuDNN 9.19, sm90): head dim a multiple of 16 and at most 256 forward; the
backward needs d_qk = d_v = 128; masks no_mask, causal, padding, padding_causal; no bias,
alibi, sliding window or bottom-right alignment; dense bshd/sbhd layouts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..config import FP8_DTYPES, AttnConfig
from ..enums import BACKEND_FP8_THREADS_PER_CTA, AttnBiasType, AttnMaskType, FusedAttnBackend, SoftmaxType
from ..layouts import DENSE_LAYOUTS
from ..runtime import RuntimeEnv, cudnn_version_string
from . import operands as op
from ._common import new_graph, padding_kwargs, sink_kwargs
from .base import Capabilities, Direction, GraphSpec, SubBackend, Uid

__all__ = ["BWD_OPERANDS", "BWD_SCALARS", "FWD_OPERANDS", "FWD_SCALARS", "FP8Backend"]

FWD_SCALARS = (Uid.DESCALE_Q, Uid.DESCALE_K, Uid.DESCALE_V, Uid.DESCALE_S, Uid.SCALE_S, Uid.SCALE_O)
BWD_SCALARS = (
    Uid.DESCALE_Q, Uid.DESCALE_K, Uid.DESCALE_V, Uid.DESCALE_O, Uid.DESCALE_DO, Uid.DESCALE_S, Uid.DESCALE_DP,
    Uid.SCALE_S, Uid.SCALE_DQ, Uid.SCALE_DK, Uid.SCALE_DV, Uid.SCALE_DP,
)  # fmt: skip
FWD_AMAXES = (Uid.AMAX_S, Uid.AMAX_O)
BWD_AMAXES = (Uid.AMAX_DQ, Uid.AMAX_DK, Uid.AMAX_DV, Uid.AMAX_DP)

#: The metadata slot (argument[offset argument]) each scaling operand and amax is a view of.
_SLOTS = {
    Uid.DESCALE_Q: "d_scale_qkv", Uid.DESCALE_K: "d_scale_qkv", Uid.DESCALE_V: "d_scale_qkv",
    Uid.DESCALE_S: "d_scale_s", Uid.SCALE_S: "q_scale_s", Uid.SCALE_O: "q_scale_o", Uid.AMAX_S: "amax_s",
    Uid.AMAX_O: "amax_o", Uid.DESCALE_O: "d_scale_o", Uid.DESCALE_DO: "d_scale_do", Uid.DESCALE_DP: "d_scale_dp",
    Uid.SCALE_DQ: "q_scale_dqkv", Uid.SCALE_DK: "q_scale_dqkv", Uid.SCALE_DV: "q_scale_dqkv",
    Uid.SCALE_DP: "q_scale_dp", Uid.AMAX_DP: "amax_dp",
}  # fmt: skip


def _scalar(uid: int) -> op.Operand:
    """An fp32 [1, 1, 1, 1] scaling operand or amax: a view of one metadata slot, except the
    dQ/dK/dV amaxes, rows of a scratch reduced into amax_dqkv's slot after the call."""
    one, slot = op.const((1, 1, 1, 1)), _SLOTS.get(uid)
    origin = f"{slot}[{slot}_offset]" if slot else "a scratch row, reduced into amax_dqkv[amax_dqkv_offset]"
    return op.Operand(uid, op.Source.FP8_SLOT if slot else op.Source.SCRATCH, one, one, op.const(torch.float32),
                      origin=origin, output=uid in FWD_AMAXES + BWD_AMAXES, align16=False)  # fmt: skip


def _grad_dtype(cfg: AttnConfig) -> torch.dtype:
    """dO's dtype, and with it dQ/dK/dV's (TE's HYBRID format: E5M2 gradients)."""
    return cfg.do_dtype or cfg.dtype


#: The tensors, the fp32 scaling operands and amaxes, the sink (and its gradient), then the
#: lengths of a padding mask.
FWD_OPERANDS = op.Operands(
    op.Q, op.K, op.V, op.O, op.STATS, *map(_scalar, FWD_SCALARS + FWD_AMAXES), op.SINK, op.SEQ_LEN_Q, op.SEQ_LEN_KV,
)  # fmt: skip
BWD_OPERANDS = op.Operands(
    op.Q, op.K, op.V, op.O_IN, op.STATS_IN, replace(op.DO, dtype=_grad_dtype),
    *(op.grad(u, _grad_dtype) for u in (Uid.DQ, Uid.DK, Uid.DV)), *map(_scalar, BWD_SCALARS + BWD_AMAXES), op.SINK,
    op.DSINK, op.SEQ_LEN_Q, op.SEQ_LEN_KV,
)  # fmt: skip


class FP8Backend(SubBackend):
    enum = FusedAttnBackend.FP8
    caps = Capabilities(
        dtypes=frozenset(FP8_DTYPES),
        layouts=frozenset(DENSE_LAYOUTS),
        masks=frozenset({AttnMaskType.no_mask, AttnMaskType.causal, AttnMaskType.padding, AttnMaskType.padding_causal}),
        bias_types=frozenset({AttnBiasType.no_bias}),
        softmax_types=frozenset(SoftmaxType),  # sinks from cuDNN 9.21 (extra_reasons)
        head_dim_multiple=16,
        max_head_dim=256,
        supports_window=False,
        supports_dropout=False,
        min_sm=90,
        min_cudnn=90100,
        bad_cudnn=frozenset({91000}),  # TE: known SDPA FP8 bugs in 9.10.0
    )
    fwd_operands = FWD_OPERANDS
    bwd_operands = BWD_OPERANDS

    def extra_reasons(self, cfg: AttnConfig, env: RuntimeEnv, direction: Direction) -> list[str]:
        why: list[str] = []
        if cfg.bottom_right_diagonal and cfg.sq != cfg.skv:
            why.append("bottom-right alignment is Blackwell-only for FP8")
        if max(cfg.d_qk, cfg.d_v) > 256:
            why.append(f"head dims d_qk={cfg.d_qk}, d_v={cfg.d_v} exceed 256")
        training = cfg.is_training or direction == Direction.BWD
        if training and (env.sm is None or env.sm < 100) and (cfg.d_qk, cfg.d_v) != (128, 128):
            why.append(f"cuDNN's FP8 backward on Hopper needs d_qk = d_v = 128, got {cfg.d_qk}/{cfg.d_v}")
        if training and cfg.sq == 1 and cfg.skv == 1:  # the frontend's sdpa_fp8_backward validator says so
            why.append("cuDNN's SDPA backward does not support sq = skv = 1")
        v = env.cudnn_version
        if cfg.has_sink and v is not None and v < 92100:
            why.append(f"softmax_type={cfg.softmax_type.name}: FP8 attention takes sinks from cuDNN 9.21 "
                       f"(TransformerEngine's gate), got {cudnn_version_string(v)}")  # fmt: skip
        if cfg.has_sink and cfg.sq == 1:
            why.append(f"softmax_type={cfg.softmax_type.name}: cuDNN's SDPA takes no sink with sq = 1 (decode)")
        return why

    def rng_elts_per_thread(self, cfg: AttnConfig) -> int:
        # TE's quirk, kept for bit-compatible Philox offsets: ceil(sq * sq / 128)
        return -(-cfg.sq * cfg.sq // BACKEND_FP8_THREADS_PER_CTA)

    # ------------------------------------------------------------------ graphs
    def _graph(self, cfg: AttnConfig, handle: Any, direction: Direction):
        g, _ = new_graph(f"te_cudnn_FP8_{direction.value}", cfg, handle)
        table = self.operands(direction)
        q, k, v = (table.tensor(g, cfg, uid) for uid in (Uid.Q, Uid.K, Uid.V))
        opts = {"attn_scale": cfg.attn_scale, "use_causal_mask": cfg.mask.is_causal, **padding_kwargs(g, cfg, table),
                **sink_kwargs(g, cfg, table)}  # fmt: skip
        return g, table, q, k, v, opts

    def build_fwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        g, table, q, k, v, opts = self._graph(cfg, handle, Direction.FWD)
        scales = [table.tensor(g, cfg, uid) for uid in FWD_SCALARS]
        results = g.sdpa_fp8(q, k, v, *scales, generate_stats=True, name="sdpa_fp8", **opts)
        for t, uid in zip(results, (Uid.O, Uid.STATS, *FWD_AMAXES)):
            table.output(t, cfg, uid)
        return GraphSpec(g, self.operand_uids(cfg, Direction.FWD), Direction.FWD)

    def build_bwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        g, table, q, k, v, opts = self._graph(cfg, handle, Direction.BWD)
        o, d_o, stats = (table.tensor(g, cfg, uid) for uid in (Uid.O, Uid.DO, Uid.STATS))
        scales = [table.tensor(g, cfg, uid) for uid in BWD_SCALARS]
        results = g.sdpa_fp8_backward(q, k, v, o, d_o, stats, *scales, use_deterministic_algorithm=cfg.deterministic,
                                      name="sdpa_fp8_backward", **opts)  # fmt: skip
        for t, uid in zip(results, (Uid.DQ, Uid.DK, Uid.DV, *BWD_AMAXES)):
            table.output(t, cfg, uid)
        return GraphSpec(g, self.operand_uids(cfg, Direction.BWD), Direction.BWD)
