"""The sub-backend contract: declared capabilities, "why not" reasons, operands, graph builders.

Each sub-backend declares its limits once, in a :class:`Capabilities` value. The base class
turns the declaration into human-readable reasons (``not_supported_reasons``); a subclass
only *adds* the rules a flat declaration cannot say (version- and arch-dependent ones). The
selector and every error message use these reasons, and the test-suite generates its cases
from the same declarations. Its graphs' operands are declared once too
(``fwd_operands`` / ``bwd_operands``, see :mod:`te_cudnn.backends.operands`): the binding
order and the per-call runtime operands derive from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

import torch

from ..config import AttnConfig
from ..enums import AttnBiasType, AttnMaskType, FusedAttnBackend, QKVLayout, SoftmaxType
from ..runtime import RuntimeEnv

__all__ = ["Capabilities", "Direction", "GraphSpec", "SubBackend", "Uid"]


class Direction(Enum):
    FWD = "fwd"
    BWD = "bwd"


class Uid:
    """Tensor uids shared by every graph, so a variant pack can be filled by uid."""

    Q = 1
    K = 2
    V = 3
    O = 4  # noqa: E741
    STATS = 5
    BIAS = 6
    SEED = 7
    OFFSET = 8
    SEQ_LEN_Q = 9
    SEQ_LEN_KV = 10
    DO = 11
    DQ = 12
    DK = 13
    DV = 14
    DBIAS = 15
    RAGGED_Q = 16  # ragged offsets (elements) of THD tensors, [B + 1, 1, 1, 1] int64
    RAGGED_K = 17
    RAGGED_V = 18
    RAGGED_O = 19
    RAGGED_STATS = 20
    PAGE_TABLE_K = 21  # [b, 1, max_pages_per_seq, 1] int32
    PAGE_TABLE_V = 22
    DS = 23  # max512 backward: the masked softmax gradient, written to scratch (io dtype, F16x16)
    SINK = 24  # attention sink logits (softmax_offset), fp32 [1, h, 1, 1]
    DSINK = 25  # backward of learnable sinks: d_softmax_offset, fp32 [1, h, 1, 1]
    MAX = 26  # forward with return_max_logit: per-row maximum logit, fp32 like the stats
    # FP8 scaling operands, fp32 [1, 1, 1, 1] views into the caller's metadata tensors
    DESCALE_Q = 30
    DESCALE_K = 31
    DESCALE_V = 32
    DESCALE_S = 33
    SCALE_S = 34
    SCALE_O = 35
    AMAX_S = 36
    AMAX_O = 37
    DESCALE_O = 38
    DESCALE_DO = 39
    DESCALE_DP = 40
    SCALE_DQ = 41
    SCALE_DK = 42
    SCALE_DV = 43
    SCALE_DP = 44
    AMAX_DQ = 45
    AMAX_DK = 46
    AMAX_DV = 47
    AMAX_DP = 48

    NAMES = {
        1: "q", 2: "k", 3: "v", 4: "o", 5: "stats", 6: "bias", 7: "seed", 8: "offset",
        9: "seq_len_q", 10: "seq_len_kv", 11: "d_o", 12: "dq", 13: "dk", 14: "dv", 15: "dbias",
        16: "ragged_q", 17: "ragged_k", 18: "ragged_v", 19: "ragged_o", 20: "ragged_stats",
        21: "page_table_k", 22: "page_table_v", 23: "ds", 24: "softmax_offset", 25: "d_softmax_offset", 26: "max",
        30: "descale_q", 31: "descale_k", 32: "descale_v", 33: "descale_s", 34: "scale_s", 35: "scale_o",
        36: "amax_s", 37: "amax_o", 38: "descale_o", 39: "descale_do", 40: "descale_dp", 41: "scale_dq",
        42: "scale_dk", 43: "scale_dv", 44: "scale_dp", 45: "amax_dq", 46: "amax_dk", 47: "amax_dv", 48: "amax_dp",
    }  # fmt: skip


@dataclass
class GraphSpec:
    """An unbuilt cuDNN graph and the uids of its operands, in the order execute binds them."""

    graph: Any
    uids: tuple[int, ...]
    direction: Direction


def _names(values) -> str:
    return ", ".join(getattr(v, "name", str(v).removeprefix("torch.")) for v in values)


@dataclass(frozen=True)
class Capabilities:
    """What a sub-backend supports, declared in one place."""

    dtypes: frozenset[torch.dtype]
    layouts: frozenset[QKVLayout]
    masks: frozenset[AttnMaskType]
    bias_types: frozenset[AttnBiasType]
    softmax_types: frozenset[SoftmaxType] = frozenset({SoftmaxType.vanilla})
    max_seqlen: Optional[int] = None  # both sq and skv
    seqlen_multiple: Optional[int] = None  # both sq and skv
    head_dim_multiple: int = 8
    head_dims: Optional[frozenset[int]] = None  # exact set, when the engine is that narrow
    max_head_dim: Optional[int] = None  # default limit; subclasses may widen it per version
    supports_gqa: bool = True
    supports_dropout: bool = True
    supports_window: bool = True
    supports_deterministic: bool = True
    supports_max_logit: bool = False  # TE 2.x return_max_logit (the per-row maximum logit as an output)
    min_sm: int = 80
    max_sm: Optional[int] = None  # exclusive
    min_cudnn: int = 90000
    bad_cudnn: frozenset[int] = field(default_factory=frozenset)
    saves_softmax: bool = False  # the forward saves the full softmax S for the backward (max512), not stats
    drops_stats: bool = False  # a forward graph may leave the softmax stats out (AttnConfig.writes_stats)
    persistable: bool = True  # plans may go to the on-disk plan store
    implemented: bool = True
    tracking_issue: Optional[str] = None  # where the missing part is tracked


class SubBackend:
    """A cuDNN fused-attention sub-backend. Subclasses set ``enum``, ``caps`` and builders."""

    enum: FusedAttnBackend
    caps: Capabilities

    @property
    def name(self) -> str:
        return self.enum.name

    # ---------------------------------------------------------------- capability
    def not_supported_reasons(self, cfg: AttnConfig, env: RuntimeEnv, direction: Direction = Direction.FWD) -> list[str]:
        """Every reason this sub-backend cannot serve ``cfg``; empty means supported.

        Facts ``env`` does not know (no GPU here) are not checked.
        """
        c = self.caps
        why: list[str] = []
        if not c.implemented:
            why.append(f"its graph builders are not implemented in this release ({c.tracking_issue})")
        if cfg.dtype not in c.dtypes:
            why.append(f"dtype={str(cfg.dtype).removeprefix('torch.')} (supported: {_names(sorted(c.dtypes, key=str))})")
        if cfg.layout not in c.layouts:
            why.append(f"qkv_layout={cfg.layout.name} (supported: {_names(sorted(c.layouts))})")
        if cfg.mask not in c.masks:
            why.append(f"attn_mask_type={cfg.mask.name} (supported: {_names(sorted(c.masks))})")
        if cfg.bias_type not in c.bias_types:
            why.append(f"attn_bias_type={cfg.bias_type.name} (supported: {_names(sorted(c.bias_types))})")
        if cfg.softmax_type not in c.softmax_types:
            why.append(f"softmax_type={cfg.softmax_type.name} (supported: {_names(sorted(c.softmax_types))})")
        if c.max_seqlen is not None and max(cfg.sq, cfg.skv) > c.max_seqlen:
            why.append(f"sequence lengths sq={cfg.sq}, skv={cfg.skv} exceed {c.max_seqlen}")
        if c.seqlen_multiple and (cfg.sq % c.seqlen_multiple or cfg.skv % c.seqlen_multiple):
            why.append(f"sequence lengths sq={cfg.sq}, skv={cfg.skv} must be multiples of {c.seqlen_multiple}")
        if cfg.d_qk % c.head_dim_multiple or cfg.d_v % c.head_dim_multiple:
            why.append(f"head dims d_qk={cfg.d_qk}, d_v={cfg.d_v} must be multiples of {c.head_dim_multiple}")
        if c.head_dims is not None and not {cfg.d_qk, cfg.d_v} <= c.head_dims:
            why.append(f"head dims d_qk={cfg.d_qk}, d_v={cfg.d_v} (supported: {sorted(c.head_dims)})")
        if not c.supports_gqa and cfg.is_gqa:
            why.append(f"grouped-query attention (h={cfg.h}, hg={cfg.hg}) is not supported")
        if not c.supports_dropout and cfg.has_dropout:
            why.append(f"dropout={cfg.dropout} is not supported")
        if not c.supports_window and cfg.has_window:
            why.append(f"sliding window {cfg.window} is not supported")
        if not c.supports_max_logit and cfg.return_max_logit and direction == Direction.FWD:
            why.append("return_max_logit is not supported (F16_arbitrary_seqlen gives it, as in TransformerEngine)")
        if not c.drops_stats and not cfg.writes_stats and direction == Direction.FWD:
            why.append("a forward without softmax stats is not supported (F16_arbitrary_seqlen gives it)")
        if not c.supports_deterministic and cfg.deterministic and direction == Direction.BWD:
            why.append("a deterministic backward is not supported")
        if direction == Direction.BWD and cfg.do_stride is not None and cfg.saved_softmax != c.saves_softmax:
            why.append(
                "aux_ctx_tensors[0] is the full softmax S an F16_max512_seqlen forward saved; this backward needs the "
                "fp32 softmax stats of its own forward" if cfg.saved_softmax else
                "aux_ctx_tensors[0] holds fp32 softmax stats; this backward needs the full softmax S its own forward saves"
            )  # fmt: skip
        if env.sm is not None:
            if env.sm < c.min_sm or (c.max_sm is not None and env.sm >= c.max_sm):
                upper = f", below sm{c.max_sm}" if c.max_sm is not None else ""
                why.append(f"GPU sm{env.sm} (needs sm{c.min_sm} or newer{upper})")
        if env.cudnn_version is not None:
            if env.cudnn_version < c.min_cudnn:
                why.append(f"cuDNN {env.cudnn_version} is older than {c.min_cudnn}")
            if env.cudnn_version in c.bad_cudnn:
                why.append(f"cuDNN {env.cudnn_version} has known bugs for this sub-backend")
        why.extend(self.extra_reasons(cfg, env, direction))
        return why

    def extra_reasons(self, cfg: AttnConfig, env: RuntimeEnv, direction: Direction) -> list[str]:
        """Rules the flat declaration cannot express. Override to add reasons."""
        return []

    def prefers(self, cfg: AttnConfig, env: RuntimeEnv, direction: Direction = Direction.FWD) -> bool:
        """True where automatic selection should pick this sub-backend over an earlier one in the
        registry that also serves ``cfg`` (measured faster). Default: registry order decides."""
        return False

    def supports(self, cfg: AttnConfig, env: RuntimeEnv, direction: Direction = Direction.FWD) -> bool:
        return not self.not_supported_reasons(cfg, env, direction)

    # ---------------------------------------------------------------- graphs
    def build_fwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        raise NotImplementedError(f"{self.name}: forward graph builder not implemented ({self.caps.tracking_issue})")

    def build_bwd(self, cfg: AttnConfig, handle: Any = None) -> GraphSpec:
        raise NotImplementedError(f"{self.name}: backward graph builder not implemented ({self.caps.tracking_issue})")

    def build(self, cfg: AttnConfig, direction: Direction, handle: Any = None) -> GraphSpec:
        if cfg.empty:  # cuDNN dies on zero-size graphs (SIGFPE in its heuristics); te_cudnn.empty answers
            raise ValueError(f"{cfg.summary()} is empty (a batch, sequence or token count of 0): no cuDNN graph is "
                             "built for it; fused_attn_fwd/bwd return its (empty or zero) results without cuDNN")  # fmt: skip
        return self.build_fwd(cfg, handle) if direction == Direction.FWD else self.build_bwd(cfg, handle)

    # ---------------------------------------------------------------- operands
    #: The operand declarations of the forward and backward graphs (``backends.operands.Operands``),
    #: in binding order: the one source of the builders' tensors, the binding order and the
    #: operand check's rules.
    fwd_operands: Any = None
    bwd_operands: Any = None

    def operands(self, direction: Direction) -> Any:
        """The declarations (``backends.operands.Operands``) of ``direction``'s graph."""
        table = self.fwd_operands if direction == Direction.FWD else self.bwd_operands
        if table is None:
            raise NotImplementedError(f"{self.name}: {direction.value} operands not declared ({self.caps.tracking_issue})")
        return table

    def operand_uids(self, cfg: AttnConfig, direction: Direction) -> tuple[int, ...]:
        """The uids of the graph's operands, in the order execute binds them (the declarations').
        The builders put exactly these into their :class:`GraphSpec`, and a plan loaded from the
        plan store takes them from here (its key), never from the file."""
        return self.operands(direction).uids(cfg)

    def runtime_uids(self, cfg: AttnConfig, direction: Direction = Direction.FWD) -> list[int]:
        """The uids of the per-call runtime operands (lengths, ragged offsets, page tables), in
        binding order: the graph's last operands."""
        return self.operands(direction).runtime_uids(cfg)

    def expected_operands(self, cfg: AttnConfig, direction: Direction) -> tuple:
        """The operands ``cfg``'s graph must declare (``backends.operands.DeclaredOperand``), in
        binding order, from the declarations alone."""
        return self.operands(direction).expected(cfg)

    # ---------------------------------------------------------------- runtime data
    def rng_elts_per_thread(self, cfg: AttnConfig) -> int:
        """How far one call advances the Philox offset (TransformerEngine's increments)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
