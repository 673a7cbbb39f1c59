"""F16 arbitrary-seqlen sub-backend: cuDNN's flash-style SDPA (``graph.sdpa`` / ``sdpa_backward``).

Semantics follow TransformerEngine's ``fused_attn_f16_arbitrary_seqlen.cu``: the forward
always produces the softmax stats (natural-log logsumexp, fp32 ``[b, h, sq, 1]``); masks
and sliding windows become cuDNN diagonal bands (``left = window_left + 1``,
``right = window_right``, causal = right bound 0); dropout takes a Philox seed/offset pair
from device memory (``rng_state``), so the backward replays the forward's mask.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import AttnConfig
from ..enums import AttnBiasType, AttnMaskType, FusedAttnBackend, QKVLayout, SoftmaxType
from ..layouts import layout_info
from ..runtime import RuntimeEnv, cudnn_module, cudnn_version_string, torch_dtype_to_cudnn
from ._common import new_graph, padding_kwargs, sink_kwargs, sink_uids
from .base import Capabilities, Direction, GraphSpec, SubBackend, Uid

__all__ = ["F16ArbitrarySeqlen"]


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
        min_sm=80,
        min_cudnn=90000,
        bad_cudnn=frozenset({91000, 91001}),  # TE: known SDPA bugs in 9.10.0 / 9.10.1
        tracking_issue=None,
    )

    # ------------------------------------------------------------------ rules
    def extra_reasons(self, cfg: AttnConfig, env: RuntimeEnv, direction: Direction) -> list[str]:
        why: list[str] = []
        if cfg.is_ragged and not cfg.mask.is_padding:
            why.append(
                f"qkv_layout={cfg.layout.name} (THD) needs a padding mask (padding, padding_causal or "
                f"padding_causal_bottom_right), got attn_mask_type={cfg.mask.name}"
            )
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
                "wrong gradients (dQ relative error 0.78, measured on H100); its forward is right (inference only)"
            )
        elif broadcast_q and cfg.bias_shape[:3] != (1, 1, 1):  # 111s: the forward plans and runs right (H100)
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
        from ..enums import BACKEND_F16arb_ELTS_PER_THREADS

        return BACKEND_F16arb_ELTS_PER_THREADS

    # ------------------------------------------------------------------ graphs
    def _mask_kwargs(self, cfg: AttnConfig, graph: Any) -> dict[str, Any]:
        """attn_scale, bias/alibi, diagonal band and dropout options shared by fwd and bwd."""
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
        kw.update(padding_kwargs(graph, cfg))
        if cfg.paged is not None:
            i32 = cudnn.data_type.INT32
            pages = cfg.paged[2]
            for key, uid in (("paged_attention_k_table", Uid.PAGE_TABLE_K), ("paged_attention_v_table", Uid.PAGE_TABLE_V)):
                kw[key] = graph.tensor(name=Uid.NAMES[uid], dim=[cfg.b, 1, pages, 1], stride=[pages, pages, 1, 1],
                                       data_type=i32, uid=uid)  # fmt: skip
            # the keys a page list holds: cuDNN wants a table of exactly ceil(max / page_size) pages,
            # and the per-sequence lengths (padding masks only) bound what is read
            kw["paged_attention_max_seq_len_kv"] = pages * cfg.paged[1]
        if cfg.has_dropout:
            i64 = cudnn.data_type.INT64
            seed = graph.tensor(name="seed", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i64, uid=Uid.SEED)
            offset = graph.tensor(name="offset", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i64, uid=Uid.OFFSET)
            kw["dropout"] = (cfg.dropout, seed, offset)
        return kw

    @staticmethod
    def _ragged(g: Any, cfg: AttnConfig) -> dict[int, Any]:
        """Ragged-offset tensors of the THD sides, by the uid of the tensor they place."""
        i64 = cudnn_module().data_type.INT64
        uids = ([Uid.RAGGED_Q, Uid.RAGGED_O, Uid.RAGGED_STATS] if cfg.ragged_q else []) + (
            [Uid.RAGGED_K, Uid.RAGGED_V] if cfg.ragged_kv else []
        )
        return {
            uid: g.tensor(name=Uid.NAMES[uid], dim=[cfg.b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i64, uid=uid)
            for uid in uids
        }

    @staticmethod
    def runtime_uids(cfg: AttnConfig) -> list[int]:
        """Uids of per-call runtime tensors, in the order the graphs list them last."""
        uids = [Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV] if cfg.mask.is_padding else []
        if cfg.ragged_q:
            uids += [Uid.RAGGED_Q, Uid.RAGGED_O, Uid.RAGGED_STATS]
        if cfg.ragged_kv:
            uids += [Uid.RAGGED_K, Uid.RAGGED_V]
        if cfg.paged is not None:
            uids += [Uid.PAGE_TABLE_K, Uid.PAGE_TABLE_V]
        return uids

    def _graph(self, cfg: AttnConfig, handle: Any, direction: Direction):
        g, io = new_graph(f"te_cudnn_{self.name}_{direction.value}", cfg, handle)
        rag = self._ragged(g, cfg)
        q = g.tensor(name="q", dim=[cfg.b, cfg.h, cfg.sq, cfg.d_qk], stride=list(cfg.q_stride), data_type=io, uid=Uid.Q,
                     ragged_offset=rag.get(Uid.RAGGED_Q))  # fmt: skip
        kv_b, kv_s = (cfg.paged[0], cfg.paged[1]) if cfg.paged else (cfg.b, cfg.skv)  # page pools
        k = g.tensor(name="k", dim=[kv_b, cfg.hg, kv_s, cfg.d_qk], stride=list(cfg.k_stride), data_type=io, uid=Uid.K,
                     ragged_offset=rag.get(Uid.RAGGED_K))  # fmt: skip
        v = g.tensor(name="v", dim=[kv_b, cfg.hg, kv_s, cfg.d_v], stride=list(cfg.v_stride), data_type=io, uid=Uid.V,
                     ragged_offset=rag.get(Uid.RAGGED_V))  # fmt: skip
        bias = None
        if cfg.bias_type == AttnBiasType.post_scale_bias:
            bias = g.tensor(name="bias", dim=list(cfg.bias_shape), stride=list(cfg.bias_stride), data_type=io, uid=Uid.BIAS)
        return g, q, k, v, bias, rag

    def operand_uids(self, cfg: AttnConfig, direction: Direction) -> tuple[int, ...]:
        """The fixed operands, then the optional ones in the order ops.py binds them: bias (and
        dBias in the backward), dropout seed/offset, the per-call runtime tensors."""
        if direction == Direction.FWD:
            uids = [Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS]
        else:
            uids = [Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS, Uid.DO, Uid.DQ, Uid.DK, Uid.DV]
        if cfg.bias_type == AttnBiasType.post_scale_bias:
            uids.append(Uid.BIAS)
            if direction == Direction.BWD and cfg.has_dbias:
                uids.append(Uid.DBIAS)
        if cfg.has_dropout:
            uids += [Uid.SEED, Uid.OFFSET]
        uids += sink_uids(cfg, direction == Direction.BWD)
        if direction == Direction.FWD and cfg.return_max_logit:
            uids.append(Uid.MAX)
        return tuple(uids + self.runtime_uids(cfg))

    def build_fwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        cudnn = cudnn_module()
        g, q, k, v, bias, rag = self._graph(cfg, handle, Direction.FWD)
        kw = self._mask_kwargs(cfg, g)
        kw.update(sink_kwargs(g, cfg, backward=False))
        if bias is not None:
            kw["bias"] = bias
        score_max = None
        if cfg.return_max_logit:  # cuDNN >= 9.21 (extra_reasons): the maximum logit of each row, shaped as the stats
            score_max = g.tensor(name="max", dim=[cfg.b, cfg.h, cfg.sq, 1], stride=list(cfg.stats_stride),
                                 data_type=cudnn.data_type.FLOAT, uid=Uid.MAX, ragged_offset=rag.get(Uid.RAGGED_STATS))  # fmt: skip
            kw["score_max"] = score_max
        # TE generates the stats in inference too: aux_ctx_tensors always carries them.
        o, stats = g.sdpa(q=q, k=k, v=v, generate_stats=True, name="sdpa", **kw)
        if score_max is not None:
            score_max.set_output(True)
        o.set_output(True).set_uid(Uid.O).set_dim([cfg.b, cfg.h, cfg.sq, cfg.d_v]).set_stride(list(cfg.o_stride))
        stats.set_output(True).set_uid(Uid.STATS).set_data_type(cudnn.data_type.FLOAT)
        stats.set_dim([cfg.b, cfg.h, cfg.sq, 1]).set_stride(list(cfg.stats_stride))
        if cfg.ragged_q:
            o.set_ragged_offset(rag[Uid.RAGGED_O])
            stats.set_ragged_offset(rag[Uid.RAGGED_STATS])
        return GraphSpec(g, self.operand_uids(cfg, Direction.FWD), Direction.FWD)

    def build_bwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        cudnn = cudnn_module()
        io = torch_dtype_to_cudnn(cfg.dtype)
        g, q, k, v, bias, rag = self._graph(cfg, handle, Direction.BWD)
        o_dims = [cfg.b, cfg.h, cfg.sq, cfg.d_v]
        o = g.tensor(name="o", dim=o_dims, stride=list(cfg.o_stride), data_type=io, uid=Uid.O, ragged_offset=rag.get(Uid.RAGGED_O))
        d_o = g.tensor(name="d_o", dim=o_dims, stride=list(cfg.do_stride or cfg.o_stride), data_type=io, uid=Uid.DO,
                       ragged_offset=rag.get(Uid.RAGGED_O))  # fmt: skip
        stats = g.tensor(name="stats", dim=[cfg.b, cfg.h, cfg.sq, 1], stride=list(cfg.stats_stride),
                         data_type=cudnn.data_type.FLOAT, uid=Uid.STATS, ragged_offset=rag.get(Uid.RAGGED_STATS))  # fmt: skip
        kw = self._mask_kwargs(cfg, g)
        kw.update(sink_kwargs(g, cfg, backward=True))
        if cfg.ragged_q:
            kw["max_total_seq_len_q"] = cfg.max_total_q
        if cfg.ragged_kv:
            kw["max_total_seq_len_kv"] = cfg.max_total_kv
        dbias = None
        if bias is not None:
            kw["bias"] = bias
            if cfg.has_dbias:
                # contiguous, whatever the bias' strides: with skv = 100 in bf16 cuDNN 9.19 plans a backward
                # for a contiguous dBias but none for one whose rows are padded to 16 bytes (measured on H100)
                shape = list(cfg.bias_shape)
                contiguous = [shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1]
                dbias = g.tensor(name="dbias", dim=shape, stride=contiguous, data_type=io, uid=Uid.DBIAS)
                kw["dBias"] = dbias
        dq, dk, dv = g.sdpa_backward(
            q=q, k=k, v=v, o=o, dO=d_o, stats=stats, use_deterministic_algorithm=cfg.deterministic, name="sdpa_backward", **kw
        )
        # Gradients are allocated in the layout's own format (packed where the layout packs).
        for t, uid, dim, stride, off in (
            (dq, Uid.DQ, [cfg.b, cfg.h, cfg.sq, cfg.d_qk], cfg.grad_strides[0], rag.get(Uid.RAGGED_Q)),
            (dk, Uid.DK, [cfg.b, cfg.hg, cfg.skv, cfg.d_qk], cfg.grad_strides[1], rag.get(Uid.RAGGED_K)),
            (dv, Uid.DV, [cfg.b, cfg.hg, cfg.skv, cfg.d_v], cfg.grad_strides[2], rag.get(Uid.RAGGED_V)),
        ):
            t.set_output(True).set_uid(uid).set_dim(dim).set_stride(list(stride)).set_data_type(io)
            if off is not None:
                t.set_ragged_offset(off)
        if dbias is not None:
            dbias.set_output(True)
        if "dSink_token" in kw:
            kw["dSink_token"].set_output(True)
        return GraphSpec(g, self.operand_uids(cfg, Direction.BWD), Direction.BWD)
