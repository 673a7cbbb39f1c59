"""F16 arbitrary-seqlen sub-backend: cuDNN's flash-style SDPA (``graph.sdpa`` / ``sdpa_backward``).

Semantics follow TransformerEngine's ``fused_attn_f16_arbitrary_seqlen.cu``: the forward
always produces the softmax stats (natural-log logsumexp, fp32 ``[b, h, sq, 1]``); masks
and sliding windows become cuDNN diagonal bands (``left = window_left + 1``,
``right = window_right``, causal = right bound 0); dropout takes a Philox seed/offset pair
from device memory (``rng_state``), so the backward replays the forward's mask.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..config import AttnConfig
from ..enums import (
    AttnBiasType,
    AttnMaskType,
    BACKEND_F16arb_ELTS_PER_THREADS,
    FusedAttnBackend,
    QKVLayout,
    SoftmaxType,
)
from ..layouts import layout_info
from ..runtime import RuntimeEnv, cudnn_module, cudnn_version_string
from . import operands as op
from ._common import new_graph, padding_kwargs, sink_kwargs
from .base import Capabilities, Direction, GraphSpec, SubBackend, Uid

__all__ = ["BWD_OPERANDS", "FWD_OPERANDS", "F16ArbitrarySeqlen"]


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1)


#: The per-row maximum logit (return_max_logit): shaped and placed as the stats.
MAX = replace(op.STATS, uid=Uid.MAX, origin="the max_logit rows", present=lambda c: c.return_max_logit)
#: dBias is contiguous, whatever the bias' strides: cuDNN plans backwards for a contiguous dBias
#: that it declines for one whose rows are padded to 16 bytes.
DBIAS = replace(op.BIAS, uid=Uid.DBIAS, source=op.Source.RESULT, strides=lambda c: _contiguous(c.bias_shape),
                origin=None, output=True, present=lambda c: c.has_dbias)  # fmt: skip
#: The forward's softmax stats, left out of graphs whose caller takes none (AttnConfig.writes_stats).
STATS = replace(op.STATS, present=lambda c: c.writes_stats)
_RUNTIME = (op.SEQ_LEN_Q, op.SEQ_LEN_KV, *op.RAGGED, *op.PAGE_TABLES)
#: The fixed operands, then the optional ones (bias and dBias, dropout seed and offset, the sink
#: and its gradient, the max logit), then the per-call runtime tensors.
FWD_OPERANDS = op.Operands(
    op.Q, op.K, op.V, replace(op.O, dtype_inferred=True), STATS, op.BIAS, op.SEED, op.OFFSET, op.SINK, MAX,
    *_RUNTIME,
)  # fmt: skip
BWD_OPERANDS = op.Operands(
    op.Q, op.K, op.V, op.O_IN, op.STATS_IN, op.DO, op.grad(Uid.DQ), op.grad(Uid.DK), op.grad(Uid.DV), op.BIAS, DBIAS,
    op.SEED, op.OFFSET, op.SINK, op.DSINK, *_RUNTIME,
)  # fmt: skip


class F16ArbitrarySeqlen(SubBackend):
    enum = FusedAttnBackend.F16_arbitrary_seqlen
    caps = Capabilities(
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        layouts=frozenset(l for l in QKVLayout if l != QKVLayout.bhsd_bhsd_bhsd),
        masks=frozenset(m for m in AttnMaskType if m != AttnMaskType.arbitrary),
        bias_types=frozenset({AttnBiasType.no_bias, AttnBiasType.post_scale_bias, AttnBiasType.alibi}),
        softmax_types=frozenset(SoftmaxType),  # sinks from cuDNN 9.13 (extra_reasons)
        head_dim_multiple=8,
        max_head_dim=128,  # widened to 256 on sm90 below, as cuDNN allows
        supports_max_logit=True,  # from cuDNN 9.21 (extra_reasons)
        drops_stats=True,  # dense q only (extra_reasons): THD stats are placed by their own ragged offsets
        min_sm=80,
        min_cudnn=90000,
        bad_cudnn=frozenset({91000, 91001}),  # TE: known SDPA bugs in 9.10.0 / 9.10.1
        tracking_issue=None,
    )
    fwd_operands = FWD_OPERANDS
    bwd_operands = BWD_OPERANDS

    # ------------------------------------------------------------------ rules
    def extra_reasons(self, cfg: AttnConfig, env: RuntimeEnv, direction: Direction) -> list[str]:
        why: list[str] = []
        if cfg.is_ragged and not cfg.mask.is_padding:
            why.append(
                f"qkv_layout={cfg.layout.name} (THD) needs a padding mask (padding, padding_causal or "
                f"padding_causal_bottom_right), got attn_mask_type={cfg.mask.name}"
            )
        if cfg.ragged_q and not cfg.writes_stats:
            why.append("a forward without softmax stats needs a dense q (THD q: the stats are written)")
        if cfg.is_ragged and env.sm is not None and env.sm < 90:
            why.append(f"THD layouts need sm90 or newer, got sm{env.sm}")
        v = env.cudnn_version
        if cfg.is_ragged and v is not None and v < 90600:
            # int64 ragged offsets, token-major ragged stats and max_total_seq_len need 9.6
            why.append(f"THD layouts need cuDNN 9.6 or newer here, got {v}")
        if layout_info(cfg.layout).q_format != layout_info(cfg.layout).kv_format and v is not None and v < 90700:
            why.append(f"mixed q/kv formats ({cfg.layout.name}) need cuDNN 9.7 or newer, got {v}")
        if cfg.paged is not None:
            if not cfg.mask.is_padding:
                why.append(f"paged KV caches need a padding mask (the lengths say how much of each page list is used), got {cfg.mask.name}")
            if cfg.is_training or direction == Direction.BWD:
                why.append("paged KV caches are inference-only: cuDNN has no paged backward (use is_training=False)")
            if v is not None and v < 90500:
                why.append(f"paged KV caches need cuDNN 9.5 or newer, got {v}")
            if cfg.ragged_q and v is not None and v < 90700:
                why.append(f"paged KV with THD queries needs cuDNN 9.7 or newer, got {v}")
            if v is not None and v < 90900 and max(cfg.d_qk, cfg.d_v) > 128:
                why.append(f"paged KV with head dims above 128 needs cuDNN 9.9 or newer, got {v}")
            if cfg.bias_type != AttnBiasType.no_bias:
                why.append("paged KV caches take no bias")
            if cfg.sq == 1 and cfg.mask.is_causal and not self._effective_bottom_right(cfg) and (v is None or v <= 91900):
                why.append(f"paged KV caches with one query row under a top-left causal mask (the row sees only the "
                           f"first key): cuDNN {cudnn_version_string(v) if v else '9.19'} builds no plan for it; use "
                           f"padding_causal_bottom_right (decode) or padding")  # fmt: skip
            if cfg.has_window and (cfg.window[1] != 0 or not self._effective_bottom_right(cfg)):
                why.append(f"paged KV caches take a sliding window as (left, 0), aligned to the end of each sequence's "
                           f"keys (bottom-right; the form checked against a reference), got window_size={cfg.window}")
        if cfg.mask.is_padding and cfg.bias_type == AttnBiasType.post_scale_bias:
            why.append(f"attn_mask_type={cfg.mask.name} with post_scale_bias is not fused (TransformerEngine's rule)")
        if cfg.sq == 1 and cfg.skv == 1 and (cfg.is_training or direction == Direction.BWD):
            why.append("cuDNN's SDPA backward does not support sq = skv = 1")
        why.extend(self._head_dim_reasons(cfg, env, direction))
        if env.sm is not None and env.sm >= 100 and (env.cudnn_version or 0) < 90700:
            why.append(f"sm{env.sm} needs cuDNN 9.7 or newer")
        bottom_right = self._effective_bottom_right(cfg)
        broadcast_q = cfg.bias_type == AttnBiasType.post_scale_bias and cfg.bias_shape is not None and cfg.bias_shape[2] != cfg.sq
        if broadcast_q and cfg.bias_shape[:3] == (1, 1, 1) and (cfg.is_training or direction == Direction.BWD):
            why.append(
                f"attn_bias shape {list(cfg.bias_shape)} (111s) in training: cuDNN 9.19 plans its backward but returns "
                "wrong gradients (dQ relative error 0.78); its forward is right (inference only)"
            )
        elif broadcast_q and cfg.bias_shape[:3] != (1, 1, 1):  # 111s: the forward plans and runs right
            why.append(
                f"attn_bias shape {list(cfg.bias_shape)}: cuDNN needs a bias of [1|b, 1|h, sq, skv], or [1, 1, 1, skv] "
                f"in inference (a bias broadcast over queries in only some dims is not fused)"
            )
        if cfg.bias_type == AttnBiasType.alibi:
            if not cfg.mask.is_causal or cfg.mask.is_padding:
                why.append(
                    f"alibi needs attn_mask_type causal or causal_bottom_right (cuDNN requires right bound 0; "
                    f"TransformerEngine does not fuse it with padding), got {cfg.mask.name}"
                )
            if env.sm is not None and env.sm < 90:
                why.append(f"alibi needs sm90 or newer, got sm{env.sm}")
        if bottom_right and cfg.mask.is_causal:
            if cfg.sq > cfg.skv and not cfg.mask.is_padding:
                why.append(f"causal_bottom_right needs sq <= skv, got sq={cfg.sq} > skv={cfg.skv}")
            where = f"{cfg.mask.name}" + ("" if cfg.mask.is_padding else " with sq != skv")
            if cfg.bias_type != AttnBiasType.no_bias:
                why.append(f"{where} cannot take attn_bias_type={cfg.bias_type.name}")
            if cfg.has_dropout:
                why.append(f"{where} cannot take dropout")
        if cfg.has_window:
            if cfg.bias_type != AttnBiasType.no_bias:
                why.append(f"sliding window {cfg.window} cannot take attn_bias_type={cfg.bias_type.name}")
            if cfg.has_dropout:
                why.append(f"sliding window {cfg.window} cannot take dropout")
            if cfg.sq > cfg.skv and not cfg.mask.is_padding:
                why.append(f"sliding window {cfg.window} needs sq <= skv, got sq={cfg.sq}, skv={cfg.skv}")
        if direction == Direction.BWD and cfg.deterministic and env.sm is not None and env.sm < 90:
            why.append(f"a deterministic backward needs sm90 or newer, got sm{env.sm}")
        why.extend(self._sink_reasons(cfg, env, direction))
        if cfg.return_max_logit and direction == Direction.FWD and v is not None and v < 92100:
            why.append(f"return_max_logit needs cuDNN 9.21 or newer (before it cuDNN's SDPA cannot output the softmax "
                       f"stats and the maximum logit together), found cuDNN {cudnn_version_string(v)}")  # fmt: skip
        if (cfg.cuda_graph and v is not None and v <= 91500 and cfg.is_training and not cfg.is_ragged
                and cfg.skv % 128 and not cfg.mask.is_padding):  # fmt: skip
            why.append(f"cuda_graph=True with skv={cfg.skv} (not a multiple of 128) in training: cuDNN {cudnn_version_string(v)} <= 9.15 "
                       "has a bug there (TransformerEngine's rule)")  # fmt: skip
        return why

    @staticmethod
    def _sink_reasons(cfg: AttnConfig, env: RuntimeEnv, direction: Direction) -> list[str]:
        """Attention sinks (softmax_type off_by_one / learnable): cuDNN's limits (frontend 1.32)."""
        if not cfg.has_sink:
            return []
        why, v = [], env.cudnn_version
        kind = f"softmax_type={cfg.softmax_type.name}"
        if v is not None and v < 91300:
            why.append(f"{kind} (attention sinks) needs cuDNN 9.13 or newer, got {cudnn_version_string(v)}")
        if cfg.sq == 1:
            why.append(f"{kind}: cuDNN's SDPA takes no sink with sq = 1 (decode)")
        training = cfg.is_training or direction == Direction.BWD
        if cfg.is_ragged and training and v is not None and v < 92600:
            why.append(f"{kind} with THD tensors in training: cuDNN's ragged backward with a sink needs 9.26 (older "
                       f"versions read out of bounds; the frontend's rule), got {cudnn_version_string(v)}")  # fmt: skip
        return why

    @staticmethod
    def _head_dim_reasons(cfg: AttnConfig, env: RuntimeEnv, direction: Direction) -> list[str]:
        d_qk, d_v = cfg.d_qk, cfg.d_v
        training = cfg.is_training or direction == Direction.BWD
        v = env.cudnn_version
        if d_qk <= 128 and d_v <= 128:
            return []
        if max(d_qk, d_v) > 256:
            return [f"head dims d_qk={d_qk}, d_v={d_v} exceed 256"]
        # 128 < d <= 256: sm90 only, inference from 9.1, training from 9.5 (TE's rule)
        if env.sm is not None and env.sm != 90:
            return [f"head dims above 128 (d_qk={d_qk}, d_v={d_v}) need sm90, got sm{env.sm}"]
        need = 90500 if training else 90100
        if v is not None and v < need:
            return [f"head dims above 128 need cuDNN {need} or newer for {'training' if training else 'inference'}"]
        if training and v is not None and v >= 91100 and d_qk >= 128 and d_v >= 128 and d_qk != d_v and (d_qk, d_v) != (192, 128):
            return [f"training with d_qk={d_qk} != d_v={d_v} (both >= 128) is not supported on sm90 except 192/128"]
        return []

    @staticmethod
    def _effective_bottom_right(cfg: AttnConfig) -> bool:
        """TE demotes bottom-right alignment to top-left when sq == skv and no padding mask
        makes per-sequence lengths differ (the masks are then identical)."""
        return cfg.bottom_right_diagonal and (cfg.sq != cfg.skv or cfg.mask.is_padding)

    def rng_elts_per_thread(self, cfg: AttnConfig) -> int:
        return BACKEND_F16arb_ELTS_PER_THREADS

    # ------------------------------------------------------------------ graphs
    def _mask_kwargs(self, cfg: AttnConfig, graph: Any, operands: op.Operands) -> dict[str, Any]:
        """attn_scale, bias/alibi, diagonal band, padding, paging and dropout options shared by fwd and bwd."""
        cudnn = cudnn_module()
        kw: dict[str, Any] = {"attn_scale": cfg.attn_scale}
        left, right = cfg.window
        if left >= 0:
            kw["diagonal_band_left_bound"] = left + 1  # cuDNN's left bound is exclusive
        if right >= 0:
            kw["diagonal_band_right_bound"] = right
        if "diagonal_band_left_bound" in kw or "diagonal_band_right_bound" in kw:
            kw["diagonal_alignment"] = (
                cudnn.diagonal_alignment.BOTTOM_RIGHT if self._effective_bottom_right(cfg) else cudnn.diagonal_alignment.TOP_LEFT
            )
        if cfg.bias_type == AttnBiasType.alibi:
            kw["use_alibi_mask"] = True
        kw.update(padding_kwargs(graph, cfg, operands))
        if cfg.paged is not None:
            kw["paged_attention_k_table"] = operands.tensor(graph, cfg, Uid.PAGE_TABLE_K)
            kw["paged_attention_v_table"] = operands.tensor(graph, cfg, Uid.PAGE_TABLE_V)
            # the keys a page list holds: cuDNN wants a table of exactly ceil(max / page_size) pages,
            # and the per-sequence lengths (padding masks only) bound what is read
            kw["paged_attention_max_seq_len_kv"] = cfg.paged[2] * cfg.paged[1]
        if cfg.has_dropout:
            kw["dropout"] = (cfg.dropout, operands.tensor(graph, cfg, Uid.SEED), operands.tensor(graph, cfg, Uid.OFFSET))
        return kw

    def _graph(self, cfg: AttnConfig, handle: Any, direction: Direction):
        """The graph with its ragged offsets, q, k, v and bias (None without one)."""
        g, _ = new_graph(f"te_cudnn_{self.name}_{direction.value}", cfg, handle)
        table = self.operands(direction)
        rag = table.ragged_offsets(g, cfg)
        q, k, v, bias = (table.tensor(g, cfg, uid, rag) for uid in (Uid.Q, Uid.K, Uid.V, Uid.BIAS))
        return g, table, q, k, v, bias, rag

    def build_fwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        g, table, q, k, v, bias, rag = self._graph(cfg, handle, Direction.FWD)
        kw = self._mask_kwargs(cfg, g, table)
        kw.update(sink_kwargs(g, cfg, table))
        if bias is not None:
            kw["bias"] = bias
        if cfg.return_max_logit:  # cuDNN >= 9.21 (extra_reasons): the maximum logit of each row, shaped as the stats
            kw["score_max"] = table.tensor(g, cfg, Uid.MAX, rag)
        # TE generates the stats in inference too (aux_ctx_tensors carries them); only a caller
        # that takes none (writes_stats=False) gets a graph without them.
        o, stats = g.sdpa(q=q, k=k, v=v, generate_stats=cfg.writes_stats, name="sdpa", **kw)
        table.output(o, cfg, Uid.O, rag)
        if cfg.writes_stats:
            table.output(stats, cfg, Uid.STATS, rag)
        return GraphSpec(g, self.operand_uids(cfg, Direction.FWD), Direction.FWD)

    def build_bwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        g, table, q, k, v, bias, rag = self._graph(cfg, handle, Direction.BWD)
        o, d_o, stats = (table.tensor(g, cfg, uid, rag) for uid in (Uid.O, Uid.DO, Uid.STATS))
        kw = self._mask_kwargs(cfg, g, table)
        kw.update(sink_kwargs(g, cfg, table))
        if cfg.ragged_q:
            kw["max_total_seq_len_q"] = cfg.max_total_q
        if cfg.ragged_kv:
            kw["max_total_seq_len_kv"] = cfg.max_total_kv
        if bias is not None:
            kw["bias"] = bias
            if cfg.has_dbias:
                kw["dBias"] = table.tensor(g, cfg, Uid.DBIAS)
        dq, dk, dv = g.sdpa_backward(
            q=q, k=k, v=v, o=o, dO=d_o, stats=stats, use_deterministic_algorithm=cfg.deterministic, name="sdpa_backward", **kw
        )
        # Gradients are allocated in the layout's own format (packed where the layout packs).
        for t, uid in ((dq, Uid.DQ), (dk, Uid.DK), (dv, Uid.DV)):
            table.output(t, cfg, uid, rag)
        return GraphSpec(g, self.operand_uids(cfg, Direction.BWD), Direction.BWD)
