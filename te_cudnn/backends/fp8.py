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

from typing import Any

from ..config import FP8_DTYPES, AttnConfig
from ..enums import BACKEND_FP8_THREADS_PER_CTA, AttnBiasType, AttnMaskType, FusedAttnBackend, SoftmaxType
from ..layouts import DENSE_LAYOUTS
from ..runtime import RuntimeEnv, cudnn_module, cudnn_version_string, torch_dtype_to_cudnn
from ._common import new_graph, padding_kwargs, scalar, sink_kwargs, sink_uids
from .base import Capabilities, Direction, GraphSpec, SubBackend, Uid

__all__ = ["FP8Backend"]

FWD_SCALARS = (Uid.DESCALE_Q, Uid.DESCALE_K, Uid.DESCALE_V, Uid.DESCALE_S, Uid.SCALE_S, Uid.SCALE_O)
BWD_SCALARS = (
    Uid.DESCALE_Q, Uid.DESCALE_K, Uid.DESCALE_V, Uid.DESCALE_O, Uid.DESCALE_DO, Uid.DESCALE_S, Uid.DESCALE_DP,
    Uid.SCALE_S, Uid.SCALE_DQ, Uid.SCALE_DK, Uid.SCALE_DV, Uid.SCALE_DP,
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

    @staticmethod
    def runtime_uids(cfg: AttnConfig) -> list[int]:
        return [Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV] if cfg.mask.is_padding else []

    def operand_uids(self, cfg: AttnConfig, direction: Direction) -> tuple[int, ...]:
        """The tensors, the fp32 scaling operands and amaxes, then the lengths of a padding mask."""
        if direction == Direction.FWD:
            uids = [Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS, *FWD_SCALARS, Uid.AMAX_S, Uid.AMAX_O]
        else:
            uids = [Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS, Uid.DO, Uid.DQ, Uid.DK, Uid.DV, *BWD_SCALARS,
                    Uid.AMAX_DQ, Uid.AMAX_DK, Uid.AMAX_DV, Uid.AMAX_DP]  # fmt: skip
        return tuple(uids + sink_uids(cfg, direction == Direction.BWD) + self.runtime_uids(cfg))

    # ------------------------------------------------------------------ graphs
    def _graph(self, cfg: AttnConfig, handle: Any, direction: Direction):
        g, io = new_graph(f"te_cudnn_FP8_{direction.value}", cfg, handle)
        q = g.tensor(name="q", dim=[cfg.b, cfg.h, cfg.sq, cfg.d_qk], stride=list(cfg.q_stride), data_type=io, uid=Uid.Q)
        k = g.tensor(name="k", dim=[cfg.b, cfg.hg, cfg.skv, cfg.d_qk], stride=list(cfg.k_stride), data_type=io, uid=Uid.K)
        v = g.tensor(name="v", dim=[cfg.b, cfg.hg, cfg.skv, cfg.d_v], stride=list(cfg.v_stride), data_type=io, uid=Uid.V)
        opts = {"attn_scale": cfg.attn_scale, "use_causal_mask": cfg.mask.is_causal, **padding_kwargs(g, cfg),
                **sink_kwargs(g, cfg, backward=direction == Direction.BWD)}  # fmt: skip
        return g, io, q, k, v, opts

    @staticmethod
    def _amax(t: Any, uid: int) -> None:
        t.set_output(True).set_uid(uid).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1])
        t.set_data_type(cudnn_module().data_type.FLOAT)

    def build_fwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        cudnn = cudnn_module()
        g, io, q, k, v, opts = self._graph(cfg, handle, Direction.FWD)
        s = {uid: scalar(g, uid) for uid in FWD_SCALARS}
        o, stats, amax_s, amax_o = g.sdpa_fp8(
            q, k, v, s[Uid.DESCALE_Q], s[Uid.DESCALE_K], s[Uid.DESCALE_V], s[Uid.DESCALE_S], s[Uid.SCALE_S],
            s[Uid.SCALE_O], generate_stats=True, name="sdpa_fp8", **opts,
        )  # fmt: skip
        o.set_output(True).set_uid(Uid.O).set_dim([cfg.b, cfg.h, cfg.sq, cfg.d_v]).set_stride(list(cfg.o_stride))
        o.set_data_type(io)
        stats.set_output(True).set_uid(Uid.STATS).set_data_type(cudnn.data_type.FLOAT)
        stats.set_dim([cfg.b, cfg.h, cfg.sq, 1]).set_stride(list(cfg.stats_stride))
        self._amax(amax_s, Uid.AMAX_S)
        self._amax(amax_o, Uid.AMAX_O)
        return GraphSpec(g, self.operand_uids(cfg, Direction.FWD), Direction.FWD)

    def build_bwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        cudnn = cudnn_module()
        g, io, q, k, v, opts = self._graph(cfg, handle, Direction.BWD)
        grad_io = torch_dtype_to_cudnn(cfg.do_dtype or cfg.dtype)
        o_dims = [cfg.b, cfg.h, cfg.sq, cfg.d_v]
        o = g.tensor(name="o", dim=o_dims, stride=list(cfg.o_stride), data_type=io, uid=Uid.O)
        d_o = g.tensor(name="d_o", dim=o_dims, stride=list(cfg.do_stride or cfg.o_stride), data_type=grad_io, uid=Uid.DO)
        stats = g.tensor(name="stats", dim=[cfg.b, cfg.h, cfg.sq, 1], stride=list(cfg.stats_stride),
                         data_type=cudnn.data_type.FLOAT, uid=Uid.STATS)  # fmt: skip
        s = {uid: scalar(g, uid) for uid in BWD_SCALARS}
        dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp = g.sdpa_fp8_backward(
            q, k, v, o, d_o, stats, *(s[uid] for uid in BWD_SCALARS),
            use_deterministic_algorithm=cfg.deterministic, name="sdpa_fp8_backward", **opts,
        )  # fmt: skip
        for t, uid, dim, stride in (
            (dq, Uid.DQ, [cfg.b, cfg.h, cfg.sq, cfg.d_qk], cfg.grad_strides[0]),
            (dk, Uid.DK, [cfg.b, cfg.hg, cfg.skv, cfg.d_qk], cfg.grad_strides[1]),
            (dv, Uid.DV, [cfg.b, cfg.hg, cfg.skv, cfg.d_v], cfg.grad_strides[2]),
        ):
            t.set_output(True).set_uid(uid).set_dim(dim).set_stride(list(stride)).set_data_type(grad_io)
        for t, uid in ((amax_dq, Uid.AMAX_DQ), (amax_dk, Uid.AMAX_DK), (amax_dv, Uid.AMAX_DV), (amax_dp, Uid.AMAX_DP)):
            self._amax(t, uid)
        if "dSink_token" in opts:
            opts["dSink_token"].set_output(True)
        return GraphSpec(g, self.operand_uids(cfg, Direction.BWD), Direction.BWD)
