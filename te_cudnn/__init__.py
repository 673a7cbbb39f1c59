"""te_cudnn: cuDNN fused attention for PyTorch, through the cuDNN frontend's Python graphs.

TransformerEngine-compatible ``fused_attn_fwd`` / ``fused_attn_bwd`` over cached cuDNN
plans, with declared sub-backend capabilities and explicit reasons when they decline.

Layers (data flows down): ``enums`` -> ``layouts`` -> ``config`` -> ``backends`` ->
``plans`` -> ``prepared`` -> ``launchers`` / ``first_call`` -> ``ops`` -> ``autograd``;
``reference`` is an unfused fp32 implementation of the same semantics.
"""

from .autograd import AttnOptions, Fp8FusedAttnFunc, FusedAttnFunc, fp8_attention, fused_attention
from .fp8 import Fp8AttentionMeta
from .module import DotProductAttention
from .enums import (
    BACKEND_F16arb_ELTS_PER_THREADS,
    BACKEND_FP8_THREADS_PER_CTA,
    META_DO,
    META_DP,
    META_DQKV,
    META_O,
    META_QKV,
    META_S,
    AttnBiasType,
    AttnMaskType,
    Fp8BwdIdx,
    Fp8FwdIdx,
    FusedAttnBackend,
    QKVFormat,
    QKVLayout,
    SoftmaxType,
)
from .decode import fused_attn_decode
from .errors import CaptureMissError, GraphBuildError, MisalignedError, TeCudnnError, UnsupportedConfigError
from .layouts import get_qkv_layout
from .launch import release_workspaces
from .ops import fused_attn_bwd, fused_attn_fwd
from .selection import Explanation, explain, get_fused_attn_backend
from .plans import plan_cache
from .sdpa import scaled_dot_product_attention
from .varlen import BatchLengths, reuse_lengths
from .policy import backend_policy

from ._version import __version__

__all__ = [
    "fused_attn_fwd", "fused_attn_bwd", "fused_attn_decode", "get_fused_attn_backend", "explain", "Explanation", "release_workspaces",
    "FusedAttnFunc", "fused_attention", "AttnOptions", "get_qkv_layout", "plan_cache", "backend_policy",
    "Fp8AttentionMeta", "Fp8FusedAttnFunc", "fp8_attention", "DotProductAttention", "scaled_dot_product_attention",
    "QKVLayout", "QKVFormat", "AttnMaskType", "AttnBiasType", "SoftmaxType", "FusedAttnBackend",
    "Fp8FwdIdx", "Fp8BwdIdx", "META_QKV", "META_O", "META_S", "META_DQKV", "META_DO", "META_DP",
    "BACKEND_F16arb_ELTS_PER_THREADS", "BACKEND_FP8_THREADS_PER_CTA",
    "TeCudnnError", "UnsupportedConfigError", "GraphBuildError", "CaptureMissError", "MisalignedError", "BatchLengths", "reuse_lengths",
    "__version__",
]  # fmt: skip
