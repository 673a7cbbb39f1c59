"""The schemas of te_cudnn's custom operators (``te_cudnn.torch_ops``), and the ``config`` string
in which ``fwd`` / ``bwd`` take their options (:func:`op_config`, :func:`parse_op_config`)."""

from typing import NamedTuple, Optional

__all__ = [
    "BWD_SCHEMA", "DECODE_SCHEMA", "FP8_BWD_SCHEMA", "FP8_FWD_SCHEMA", "FWD_SCHEMA", "OpConfig", "op_config",
    "parse_op_config",
]  # fmt: skip

_CU = "Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? cu_seqlens_q_padded, Tensor? cu_seqlens_kv_padded"
#: The options travel as one string (:func:`op_config`): the dispatcher converts every argument
#: between Python and C++ on each call, and one string costs a fraction of a dozen scalars.
#: The two floats stay arguments: under ``dynamic=True`` torch.compile may trace a module's
#: float attributes as symbols, which cannot be formatted into a constant string.
FWD_SCHEMA = (f"(Tensor q, Tensor k, Tensor v, Tensor? attn_bias, {_CU}, Tensor? page_table_k, Tensor? page_table_v, "
              "Tensor? rng_state, Tensor? softmax_offset, SymInt max_seqlen_q, SymInt max_seqlen_kv, float? attn_scale, "
              "float dropout, str config) -> (Tensor, Tensor)")  # fmt: skip
BWD_SCHEMA = (f"(Tensor q, Tensor k, Tensor v, Tensor o, Tensor d_o, Tensor stats, Tensor? rng_state, "
              f"Tensor? attn_bias, Tensor? softmax_offset, {_CU}, SymInt max_seqlen_q, SymInt max_seqlen_kv, "
              "float? attn_scale, float dropout, str config) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")  # fmt: skip
_FP8_OPTS = ("SymInt max_seqlen_q, SymInt max_seqlen_kv, str qkv_layout, str attn_mask_type, float? attn_scale, "
             "int? backend, bool deterministic")  # fmt: skip
FP8_FWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor fwd_scale, "
                  "Tensor fwd_scale_inv, Tensor fwd_amax_history, ScalarType fwd_format, Tensor bwd_scale, "
                  "Tensor bwd_scale_inv, Tensor bwd_amax_history, ScalarType bwd_format, "
                  f"{_FP8_OPTS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")  # fmt: skip
FP8_BWD_SCHEMA = ("(Tensor d_out, Tensor q8, Tensor k8, Tensor v8, Tensor o8, Tensor stats, Tensor? cu_seqlens_q, "
                  "Tensor? cu_seqlens_kv, Tensor fwd_scale, Tensor fwd_scale_inv, Tensor bwd_scale, "
                  "Tensor bwd_scale_inv, Tensor bwd_amax_history, ScalarType bwd_format, ScalarType out_dtype, "
                  f"{_FP8_OPTS}) -> (Tensor, Tensor, Tensor, Tensor)")  # fmt: skip
#: ``te_cudnn.fused_attn_decode`` (forward only, no autograd): what it traces to under torch.compile
DECODE_SCHEMA = ("(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, Tensor? page_table, "
                 "float? attn_scale, int window_left) -> (Tensor, Tensor)")  # fmt: skip


class OpConfig(NamedTuple):
    """The options of one ``te_cudnn::fwd`` / ``bwd`` call, decoded from its ``config`` string."""

    is_training: bool
    qkv_layout: str
    attn_mask_type: str
    attn_bias_type: str
    window_left: int
    window_right: int
    bottom_right_diagonal: Optional[bool]
    backend: Optional[int]
    softmax_type: str
    deterministic: bool


def op_config(is_training: bool, qkv_layout: str, attn_mask_type: str, attn_bias_type: str, window_left: int,
              window_right: int, bottom_right_diagonal: Optional[bool], backend: Optional[int], softmax_type: str,
              deterministic: bool) -> str:  # fmt: skip
    """The ``config`` string of the ``fwd`` / ``bwd`` ops: the options of
    :func:`te_cudnn.fused_attn_fwd` but ``attn_scale`` and ``dropout`` (arguments of their own) as
    ``name=value`` pairs, e.g. ``train=1;layout=bshd_bshd_bshd;mask=causal;bias=no_bias;window=-1,0;brd=None;backend=None;softmax=vanilla;det=0``.
    A constant under torch.compile: it is built while tracing and baked into the graph."""
    return (f"train={int(bool(is_training))};layout={qkv_layout};mask={attn_mask_type};bias={attn_bias_type};"
            f"window={int(window_left)},{int(window_right)};brd={bottom_right_diagonal!r};backend={backend!r};"
            f"softmax={softmax_type};det={int(bool(deterministic))}")  # fmt: skip


_OPTIONAL = {"None": None, "True": True, "False": False}
_configs: dict[str, OpConfig] = {}


def parse_op_config(config: str) -> OpConfig:
    """:func:`op_config`'s inverse (decoded once per distinct string); ``ValueError`` naming
    the string when it is malformed."""
    parsed = _configs.get(config)
    if parsed is not None:
        return parsed
    try:
        f = dict(item.split("=", 1) for item in config.split(";"))
        left, right = f["window"].split(",")
        parsed = OpConfig(
            f["train"] == "1", f["layout"], f["mask"], f["bias"], int(left), int(right), _OPTIONAL[f["brd"]],
            None if f["backend"] == "None" else int(f["backend"]), f["softmax"], f["det"] == "1",
        )  # fmt: skip
    except (KeyError, ValueError) as exc:
        raise ValueError(f"config={config!r} is not a te_cudnn op config (build it with te_cudnn.torch_ops.op_config); "
                         f"{type(exc).__name__}: {exc}") from None  # fmt: skip
    if len(_configs) < 4096:
        _configs[config] = parsed
    return parsed
