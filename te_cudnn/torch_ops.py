"""te_cudnn's attention as PyTorch custom operators (namespace ``te_cudnn``).

``torch.ops.te_cudnn.fwd`` / ``bwd`` run the cached cuDNN plans of :func:`te_cudnn.fused_attn_fwd`
/ :func:`te_cudnn.fused_attn_bwd`; ``fp8_fwd`` / ``fp8_bwd`` do the same for FP8 attention
inside a higher-precision model (casts and fused kernels in one op); ``decode`` runs
:func:`te_cudnn.fused_attn_decode` (forward only), which traces to it. Each op has a fake
(meta) implementation giving the exact shapes, dtypes and strides of its results, so
``torch.compile`` traces through it without a graph break (also with dynamic shapes), and an
autograd formula (``fwd``: a hand-written Autograd kernel, see :func:`_fwd_autograd`; ``fp8_fwd``:
``register_autograd``). The options of ``fwd`` / ``bwd`` travel as one ``config`` string
(:func:`op_config`): the dispatcher converts each argument on every call.

Results (all freshly allocated, contiguous):

* ``fwd`` -> ``(out, stats)``: ``out`` is ``[*q.shape[:-1], d_v]`` in q's dtype; ``stats`` is
  fp32 ``[b, h, sq, 1]`` (dense q) or ``[t, h, 1]`` (THD q), or the softmax ``[b, h, sq, skv]``
  in q's dtype when ``backend`` names ``F16_max512_seqlen``.
* ``bwd`` -> ``(g0, g1, g2, dbias, d_softmax_offset)``: the gradients in the layout's own packing: for ``*3hd`` /
  ``*h3d`` layouts ``g0`` is the packed ``dqkv`` buffer and ``g1``/``g2`` are empty; for
  ``*_2hd`` / ``*_h2d`` ``g1`` is the packed ``dkv`` buffer and ``g2`` is empty (a custom op
  may not return aliasing tensors; :func:`unpack_grads` takes the views). ``dbias`` is empty
  when there is no gradient for the bias (no bias, or one broadcast over b, h and sq);
  ``d_softmax_offset`` (fp32 ``[1, h, 1, 1]``) is empty unless ``softmax_type="learnable"``.

The wrappers here (:func:`attention`, :func:`fp8_attention`) are what ``fused_attention``,
``fp8_attention``, ``DotProductAttention`` and ``scaled_dot_product_attention`` call when
compiling or capturing a CUDA graph (see :func:`use_custom_ops`). Dropout then draws its
Philox seed/offset on the device (graph-safe), and the backward reuses that tensor.
"""

import os
from typing import NamedTuple, Optional, Sequence

import torch

from .decode import fused_attn_decode
from .enums import META_DO, META_DQKV, META_O, META_QKV, FusedAttnBackend, QKVFormat, QKVLayout, QKVLayoutGroup
from .fp8 import Fp8Table, bwd_kwargs, dequantize, fwd_kwargs, quantize
from .layouts import layout_info, packed_qkv_views
from . import prepared as _prepared_calls
from .launch import is_capturing as _is_capturing
from .launch import kept
from .launchers import plain_bwd, plain_fwd
from .ops import fused_attn_bwd, fused_attn_fwd
from .policy import token as _policy_token
from .rng import _device_rng_state

__all__ = ["attention", "fp8_attention", "use_custom_ops", "unpack_grads", "op_config", "parse_op_config", "OpConfig", "OPS"]

#: ``TE_CUDNN_CUSTOM_OPS=1`` takes the custom-op path in eager mode too (tests, measurements);
#: ``=0`` never takes it outside torch.compile / CUDA-graph capture (the default).
_FORCE_OPS = os.environ.get("TE_CUDNN_CUSTOM_OPS", "0").strip().lower() in ("1", "true", "yes", "on")

_MAX512 = int(FusedAttnBackend.F16_max512_seqlen)
_TAGS = (torch.Tag.needs_exact_strides,) if hasattr(torch.Tag, "needs_exact_strides") else ()
if not _TAGS and hasattr(torch.Tag, "needs_fixed_stride_order"):  # pragma: no cover - older torch
    _TAGS = (torch.Tag.needs_fixed_stride_order,)

_CU = "Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? cu_seqlens_q_padded, Tensor? cu_seqlens_kv_padded"
#: The options travel as one string (:func:`op_config`): the dispatcher converts every argument
#: between Python and C++ on each call, and one string costs a fraction of a dozen scalars
#: (``tools/probe_dispatch.py`` measures it).
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

try:
    _is_compiling = torch.compiler.is_compiling
except AttributeError:  # pragma: no cover - torch < 2.3
    _is_compiling = torch._dynamo.is_compiling


def use_custom_ops() -> bool:
    """True when the public autograd entry points should go through the custom ops: while
    torch.compile traces, during CUDA-graph capture, or when ``TE_CUDNN_CUSTOM_OPS=1``. In
    plain eager mode they call the plans directly (the dispatcher's host time is measured in
    ``tools/bench.py --only ops``)."""
    return _FORCE_OPS or _is_compiling() or _is_capturing()


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


# ------------------------------------------------------------------------------------------
# shapes of the results (shared by the fake implementations and the checks of the real ones)
# ------------------------------------------------------------------------------------------


_infos: dict = {}


def _info(qkv_layout: str):
    info = _infos.get(qkv_layout)
    if info is None:  # parsed once per layout string (the ops get the layout as a string per call)
        info = _infos[qkv_layout] = layout_info(QKVLayout.coerce(qkv_layout, argument="qkv_layout"))
    return info


def _stats_like(q: torch.Tensor, k: torch.Tensor, qkv_layout: str, backend: Optional[int]) -> torch.Tensor:
    info = _info(qkv_layout)
    if info.q_format == QKVFormat.thd:
        return q.new_empty((q.shape[0], q.shape[1], 1), dtype=torch.float32)
    b, h, sq = (q.shape[i] for i in _BHS[info.q_format])
    if backend == _MAX512:  # the saved softmax S (max512 layouts are dense)
        skv = k.shape[_BHS[info.kv_format][2]]
        return q.new_empty((b, h, sq, skv))
    return q.new_empty((b, h, sq, 1), dtype=torch.float32)


#: where b, h and s sit in a 4-d tensor of each format
_BHS = {QKVFormat.sbhd: (1, 2, 0), QKVFormat.bshd: (0, 2, 1), QKVFormat.bhsd: (0, 1, 2)}


def _unpacked(qkv_layout: str) -> str:
    """The layout FP8 runs on: its casts turn packed views into separate q, k, v buffers."""
    info = _info(qkv_layout)
    return f"{info.q_format.name}_{info.kv_format.name}_{info.kv_format.name}"


def _has_dbias(bias: Optional[torch.Tensor]) -> bool:
    """cuDNN gives dBias unless the bias broadcasts over b, h and sq (AttnConfig.has_dbias)."""
    return bias is not None and not (bias.shape[0] == 1 and bias.shape[1] == 1 and bias.shape[2] == 1)


def _grad_buffers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: QKVLayoutGroup) -> tuple:
    none = q.new_empty(0)
    if group == QKVLayoutGroup.L_3HD:
        return q.new_empty((*q.shape[:-2], 3, *q.shape[-2:])), none, q.new_empty(0)
    if group == QKVLayoutGroup.L_H3D:
        return q.new_empty((*q.shape[:-1], 3, q.shape[-1])), none, q.new_empty(0)
    if group == QKVLayoutGroup.L_HD_2HD:
        return q.new_empty(q.shape), k.new_empty((*k.shape[:-2], 2, *k.shape[-2:])), none
    if group == QKVLayoutGroup.L_HD_H2D:
        return q.new_empty(q.shape), k.new_empty((*k.shape[:-1], 2, k.shape[-1])), none
    return grads_like(q), grads_like(k), grads_like(v)


def grads_like(t: torch.Tensor) -> torch.Tensor:
    """A separate tensor's gradient as ``te_cudnn.layouts.alloc_qkv_grads`` allocates it."""
    return torch.empty_like(t) if t.dim() == 4 else t.new_empty(t.shape)


def unpack_grads(qkv_layout: str, g0: torch.Tensor, g1: torch.Tensor, g2: torch.Tensor) -> tuple:
    """dq, dk, dv from the ``bwd`` op's buffers (views of the packed ones, as TE returns them)."""
    group = _info(qkv_layout).group
    if group in (QKVLayoutGroup.L_3HD, QKVLayoutGroup.L_H3D):
        return packed_qkv_views(g0, group)
    if group in (QKVLayoutGroup.L_HD_2HD, QKVLayoutGroup.L_HD_H2D):
        return (g0, *packed_qkv_views(g1, group))
    return g0, g1, g2


def _packed_base(views: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """The buffer packed views were taken from (stacked when they are not views of one)."""
    base = views[0]._base
    if base is not None and all(t._base is base for t in views) and base.dim() == views[0].dim() + 1:
        return base
    return torch.stack(tuple(views), dim=dim)


# ------------------------------------------------------------------------------------------
# te_cudnn::fwd / te_cudnn::bwd
# ------------------------------------------------------------------------------------------

_zero_states: dict = {}


def _zero_rng(device: torch.device) -> torch.Tensor:
    state = _zero_states.get(device)
    if state is None:
        state = _zero_states[device] = kept(lambda: torch.zeros(2, dtype=torch.int64, device=device), device)
    return state


_zero_sinks: dict = {}


def _zero_sink(device: torch.device, h: int) -> torch.Tensor:
    """off_by_one's sink logits (zeros) when the caller passes no softmax_offset."""
    sink = _zero_sinks.get((device, h))
    if sink is None:
        sink = _zero_sinks[(device, h)] = kept(lambda: torch.zeros((1, h, 1, 1), dtype=torch.float32, device=device),
                                               device)  # fmt: skip
    return sink


def _heads(q: torch.Tensor, qkv_layout: str) -> int:
    info = _info(qkv_layout)
    return q.shape[1] if info.q_format == QKVFormat.thd else q.shape[_BHS[info.q_format][1]]


#: The ops' launcher caches: a call whose arguments match an earlier one (same config string,
#: sequence lengths, shapes, strides, dtypes and device; no bias, sequence-length tensors,
#: page tables or sink) is launched straight from the prepared description fused_attn_fwd /
#: fused_attn_bwd made for that earlier call, without their own (longer) signatures.
_fwd_launchers: dict = {}
_bwd_launchers: dict = {}
_LAUNCHER_LIMIT = 1024
_prepared_calls._dependent_caches += [_fwd_launchers, _bwd_launchers]  # forgotten with the memos (policy.reload_env)


def _keep(cache: dict, key: tuple, prepared: list) -> None:
    if prepared and prepared[0].plain:
        if len(cache) >= _LAUNCHER_LIMIT:
            cache.clear()
        cache[key] = prepared[0]


def _fwd_impl(q, k, v, attn_bias, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
              page_table_k, page_table_v, rng_state, softmax_offset, max_seqlen_q, max_seqlen_kv, attn_scale, dropout,
              config):  # fmt: skip
    key = seen = None
    if (attn_bias is None and cu_seqlens_q is None and cu_seqlens_kv is None and cu_seqlens_q_padded is None
            and cu_seqlens_kv_padded is None and page_table_k is None and softmax_offset is None):  # fmt: skip
        key = (config, max_seqlen_q, max_seqlen_kv, attn_scale, dropout, q.shape, q.stride(), k.shape, k.stride(),
               v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(), v.get_device(), _policy_token())  # fmt: skip
        prep = _fwd_launchers.get(key)
        if prep is not None:
            out, aux = plain_fwd(prep, q, k, v, rng_state=rng_state)
            return out, aux[0]
        seen = []
    c = parse_op_config(config)
    out, aux = fused_attn_fwd(
        c.is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, q.dtype, c.backend,
        attn_bias=attn_bias, cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
        page_table_k=page_table_k, page_table_v=page_table_v, attn_scale=attn_scale, dropout=dropout,
        qkv_layout=c.qkv_layout, attn_bias_type=c.attn_bias_type, attn_mask_type=c.attn_mask_type,
        softmax_type=c.softmax_type, window_size=(c.window_left, c.window_right),
        bottom_right_diagonal=c.bottom_right_diagonal, softmax_offset=softmax_offset, rng_state=rng_state,
        _prepared=seen,
    )  # fmt: skip
    stats = aux[0]
    if stats.dtype != torch.float32 and c.backend != _MAX512:
        raise RuntimeError(
            "te_cudnn's custom op selected F16_max512_seqlen automatically; its saved softmax has another shape than "
            "the op declares. Pass fused_attention_backend='F16_max512_seqlen' explicitly to use it under "
            "torch.compile / CUDA graphs"
        )
    if key is not None:
        _keep(_fwd_launchers, key, seen)
    return out, stats


def _fwd_fake(q, k, v, attn_bias, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
              page_table_k, page_table_v, rng_state, softmax_offset, max_seqlen_q, max_seqlen_kv, attn_scale, dropout,
              config):  # fmt: skip
    c = parse_op_config(config)
    return q.new_empty((*q.shape[:-1], v.shape[-1])), _stats_like(q, k, c.qkv_layout, c.backend)


def _bwd_impl(q, k, v, o, d_o, stats, rng_state, attn_bias, softmax_offset, cu_seqlens_q, cu_seqlens_kv,
              cu_seqlens_q_padded, cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv, attn_scale, dropout, config):  # fmt: skip
    key = seen = None
    if (attn_bias is None and softmax_offset is None and cu_seqlens_q is None and cu_seqlens_kv is None
            and cu_seqlens_q_padded is None and cu_seqlens_kv_padded is None):  # fmt: skip
        key = (config, max_seqlen_q, max_seqlen_kv, attn_scale, dropout, q.shape, q.stride(), k.shape, k.stride(),
               v.shape, v.stride(), o.shape, o.stride(), d_o.shape, d_o.stride(), stats.shape, stats.stride(), q.dtype, k.dtype, v.dtype,
               o.dtype, d_o.dtype, stats.dtype, q.get_device(), k.get_device(), v.get_device(), o.get_device(),
               d_o.get_device(), stats.get_device(),
               None if rng_state is None else (rng_state.shape, rng_state.stride(), rng_state.dtype, rng_state.get_device()),
               _policy_token())  # fmt: skip
        prep = _bwd_launchers.get(key)
        if prep is not None:
            dq, dk, dv, _, _ = plain_bwd(prep, q, k, v, o, d_o, stats, _zero_rng(q.device) if rng_state is None else rng_state)
            return _op_grads(prep.cfg.layout.name, q, dq, dk, dv, None, None, None)
        seen = []
    c = parse_op_config(config)
    aux = [stats, _zero_rng(q.device) if rng_state is None else rng_state]
    if attn_bias is not None:
        aux.append(attn_bias)
    if c.softmax_type != "vanilla":
        aux.append(_zero_sink(q.device, _heads(q, c.qkv_layout)) if softmax_offset is None else softmax_offset)
    dq, dk, dv, dbias, d_offset = fused_attn_bwd(
        max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, o, d_o, q.dtype, aux, c.backend,
        cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded, attn_scale=attn_scale,
        dropout=dropout, qkv_layout=c.qkv_layout, attn_bias_type=c.attn_bias_type, attn_mask_type=c.attn_mask_type,
        softmax_type=c.softmax_type, window_size=(c.window_left, c.window_right),
        bottom_right_diagonal=c.bottom_right_diagonal, deterministic=c.deterministic, _prepared=seen,
    )  # fmt: skip
    if key is not None:
        _keep(_bwd_launchers, key, seen)
    return _op_grads(c.qkv_layout, q, dq, dk, dv, dbias, d_offset, attn_bias)


def _op_grads(qkv_layout: str, q, dq, dk, dv, dbias, d_offset, attn_bias) -> tuple:
    """The bwd op's five results: gradients in the layout's packing (empty placeholders where a
    result does not exist: an op's results are tensors that alias neither inputs nor each other)."""
    group = _info(qkv_layout).group
    if group in (QKVLayoutGroup.L_3HD, QKVLayoutGroup.L_H3D):
        g = (_packed_base((dq, dk, dv), -3 if group == QKVLayoutGroup.L_3HD else -2), q.new_empty(0), q.new_empty(0))
    elif group in (QKVLayoutGroup.L_HD_2HD, QKVLayoutGroup.L_HD_H2D):
        g = (dq, _packed_base((dk, dv), -3 if group == QKVLayoutGroup.L_HD_2HD else -2), q.new_empty(0))
    else:
        g = (dq, dk, dv)
    if dbias is None or not _has_dbias(attn_bias):
        dbias = q.new_empty(0)
    elif not dbias.is_contiguous():
        dbias = dbias.contiguous()
    return (*g, dbias, q.new_empty(0, dtype=torch.float32) if d_offset is None else d_offset)


def _bwd_fake(q, k, v, o, d_o, stats, rng_state, attn_bias, softmax_offset, cu_seqlens_q, cu_seqlens_kv,
              cu_seqlens_q_padded, cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv, attn_scale, dropout, config):  # fmt: skip
    c = parse_op_config(config)
    dbias = attn_bias.new_empty(attn_bias.shape) if _has_dbias(attn_bias) else q.new_empty(0)
    learnable = c.softmax_type == "learnable" and softmax_offset is not None
    d_offset = softmax_offset.new_empty(softmax_offset.shape) if learnable else q.new_empty(0, dtype=torch.float32)
    return (*_grad_buffers(q, k, v, _info(c.qkv_layout).group), dbias, d_offset)


_N_FWD_INPUTS = 17  # q, k, v, attn_bias, 4 cu_seqlens, 2 page tables, rng_state, softmax_offset, 2 lengths,
# attn_scale, dropout, config
_OFFSET_INPUT = 11  # softmax_offset's position among the fwd op's inputs


def _fwd_setup(ctx, inputs, output):
    (q, k, v, bias, cu_q, cu_kv, cu_qp, cu_kvp, _pk, _pv, rng_state, offset, *tail) = inputs
    out, stats = output
    ctx.save_for_backward(q, k, v, out, stats, rng_state, bias, offset, cu_q, cu_kv, cu_qp, cu_kvp)
    ctx.tail = tail  # max_seqlen_q, max_seqlen_kv, attn_scale, dropout, config
    ctx.mark_non_differentiable(stats)


def _fwd_backward(ctx, d_out, _d_stats):
    q, k, v, out, stats, rng_state, bias, offset, cu_q, cu_kv, cu_qp, cu_kvp = ctx.saved_tensors
    g0, g1, g2, dbias, d_offset = torch.ops.te_cudnn.bwd(
        q, k, v, out, d_out.contiguous(), stats, rng_state, bias, offset, cu_q, cu_kv, cu_qp, cu_kvp, *ctx.tail
    )
    dq, dk, dv = unpack_grads(parse_op_config(ctx.tail[4]).qkv_layout, g0, g1, g2)
    grads = [None] * _N_FWD_INPUTS
    grads[:4] = (dq, dk, dv, dbias if _has_dbias(bias) else None)
    if offset is not None and d_offset.numel():
        grads[_OFFSET_INPUT] = d_offset
    return tuple(grads)


class _FwdWithGrad(torch.autograd.Function):
    """The autograd node of ``te_cudnn::fwd`` (what ``register_autograd`` would generate): the
    forward runs the op below autograd, the backward is :func:`_fwd_backward`."""

    @staticmethod
    def forward(ctx, keyset, *args):
        with torch._C._AutoDispatchBelowAutograd():
            out, stats = fwd_op.redispatch(keyset & _AFTER_AUTOGRAD, *args)
        _fwd_setup(ctx, args, (out, stats))
        return out, stats

    @staticmethod
    def backward(ctx, d_out, d_stats):
        return (None, *_fwd_backward(ctx, d_out, d_stats))


_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_CUDA_ONLY: set = set()  # raw keysets seen to hold nothing above the CUDA kernel


def _cuda_only(keyset) -> bool:
    """No mode, subclass, functionalization or fake tensor between autograd and the CUDA kernel."""
    raw = keyset.raw_repr()
    if raw in _CUDA_ONLY:
        return True
    below = (keyset & _AFTER_AUTOGRAD).remove(torch._C.DispatchKey.ADInplaceOrView)
    if below.highestPriorityTypeId() != torch._C.DispatchKey.CUDA:
        return False
    _CUDA_ONLY.add(raw)
    return True


def _fwd_autograd(keyset, *args):
    """``te_cudnn::fwd``'s Autograd kernel. With gradients to track: the autograd node. Without
    (inference, and compiled graphs, which run their forward with grad mode off): the CUDA
    kernel itself when nothing sits between, instead of a second trip through the dispatcher
    (register_autograd's redispatch converts every argument again: tools/probe_dispatch.py)."""
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
        return _FwdWithGrad.apply(keyset, *args)
    if _cuda_only(keyset):
        return _fwd_impl(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return fwd_op.redispatch(keyset & _AFTER_AUTOGRAD, *args)


# ------------------------------------------------------------------------------------------
# te_cudnn::fp8_fwd / te_cudnn::fp8_bwd: FP8 attention in a higher-precision model
# ------------------------------------------------------------------------------------------


def _fp8_fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_kv, fwd_scale, fwd_scale_inv, fwd_amax_history, fwd_format,
                  bwd_scale, bwd_scale_inv, bwd_amax_history, bwd_format, max_seqlen_q, max_seqlen_kv, qkv_layout,
                  attn_mask_type, attn_scale, backend, deterministic):  # fmt: skip
    """The bwd_* tables are not read here: they travel to the backward (register_autograd).
    Functional: this step's amax row comes back as a result (``fp8_attention`` folds it into
    the history): an op with an autograd formula must be functional."""
    row = fwd_amax_history[0].clone()
    table = Fp8Table(fwd_scale, fwd_scale_inv, row.unsqueeze(0))
    q8, k8, v8 = (quantize(t, table, META_QKV, fwd_format) for t in (q, k, v))
    o8, aux = fused_attn_fwd(
        True, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q8, k8, v8, q8.dtype, backend,
        attn_scale=attn_scale, qkv_layout=_unpacked(qkv_layout), attn_mask_type=attn_mask_type, **fwd_kwargs(table),
    )  # fmt: skip
    return dequantize(o8, table, META_O).to(q.dtype), q8, k8, v8, o8, aux[0], row


def _fp8_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, fwd_scale, fwd_scale_inv, fwd_amax_history, fwd_format,
                  bwd_scale, bwd_scale_inv, bwd_amax_history, bwd_format, max_seqlen_q, max_seqlen_kv, qkv_layout,
                  attn_mask_type, attn_scale, backend, deterministic):  # fmt: skip
    out_shape = (*q.shape[:-1], v.shape[-1])
    q8, k8, v8 = (torch.empty_like(t, dtype=fwd_format) for t in (q, k, v))
    return (q.new_empty(out_shape), q8, k8, v8, q.new_empty(out_shape, dtype=fwd_format),
            _stats_like(q, k, qkv_layout, None), fwd_amax_history.new_empty(fwd_amax_history.shape[1:]))  # fmt: skip


def _fp8_bwd_impl(d_out, q8, k8, v8, o8, stats, cu_seqlens_q, cu_seqlens_kv, fwd_scale, fwd_scale_inv, bwd_scale,
                  bwd_scale_inv, bwd_amax_history, bwd_format, out_dtype, max_seqlen_q, max_seqlen_kv, qkv_layout,
                  attn_mask_type, attn_scale, backend, deterministic):  # fmt: skip
    fwd = Fp8Table(fwd_scale, fwd_scale_inv, None)  # the backward reads the forward's scales only
    row = bwd_amax_history[0].clone()
    bwd = Fp8Table(bwd_scale, bwd_scale_inv, row.unsqueeze(0))
    d_o8 = quantize(d_out, bwd, META_DO, bwd_format)
    dq8, dk8, dv8, _, _ = fused_attn_bwd(
        max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q8, k8, v8, o8, d_o8, q8.dtype,
        [stats, _zero_rng(q8.device)], backend, attn_scale=attn_scale, qkv_layout=_unpacked(qkv_layout),
        attn_mask_type=attn_mask_type, deterministic=deterministic, **bwd_kwargs(fwd, bwd),
    )  # fmt: skip
    return (*(dequantize(g, bwd, META_DQKV).to(out_dtype).contiguous() for g in (dq8, dk8, dv8)), row)


def _fp8_bwd_fake(d_out, q8, k8, v8, o8, stats, cu_seqlens_q, cu_seqlens_kv, fwd_scale, fwd_scale_inv, bwd_scale,
                  bwd_scale_inv, bwd_amax_history, bwd_format, out_dtype, max_seqlen_q, max_seqlen_kv, qkv_layout,
                  attn_mask_type, attn_scale, backend, deterministic):  # fmt: skip
    row = bwd_amax_history.new_empty(bwd_amax_history.shape[1:])
    return (*(t.new_empty(t.shape, dtype=out_dtype) for t in (q8, k8, v8)), row)


def _fp8_fwd_setup(ctx, inputs, output):
    q, _k, _v, cu_q, cu_kv, f_scale, f_scale_inv, _f_amax, _f_fmt, b_scale, b_scale_inv, b_amax, b_fmt, *opts = inputs
    _out, q8, k8, v8, o8, stats, row = output
    ctx.save_for_backward(q8, k8, v8, o8, stats, cu_q, cu_kv, f_scale, f_scale_inv, b_scale, b_scale_inv, b_amax)
    ctx.mark_non_differentiable(q8, k8, v8, o8, stats, row)
    ctx.out_dtype, ctx.bwd_format, ctx.opts = q.dtype, b_fmt, opts


def _fp8_fwd_backward(ctx, d_out, *_unused):
    q8, k8, v8, o8, stats, cu_q, cu_kv, f_scale, f_scale_inv, b_scale, b_scale_inv, b_amax = ctx.saved_tensors
    dq, dk, dv, row = torch.ops.te_cudnn.fp8_bwd(
        d_out.contiguous(), q8, k8, v8, o8, stats, cu_q, cu_kv, f_scale, f_scale_inv, b_scale, b_scale_inv, b_amax,
        ctx.bwd_format, ctx.out_dtype, *ctx.opts,
    )  # fmt: skip
    b_amax[0].copy_(row)  # this step's dO, dP, dQKV amaxes, as the direct path writes them
    return (dq, dk, dv) + (None,) * (13 + len(ctx.opts) - 3)


def _decode_impl(q, k_cache, v_cache, cache_seqlens, page_table, attn_scale, window_left):
    """``te_cudnn::decode``: :func:`te_cudnn.fused_attn_decode` into a fresh contiguous O (the
    fake's strides, whatever q's), returning ``(out, softmax_lse)``."""
    b, sq, h = q.shape[:3]
    out = torch.empty((b, sq, h, v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    window = (-1, -1) if window_left < 0 else (window_left, 0)
    _, lse = fused_attn_decode(q, k_cache, v_cache, cache_seqlens, page_table, attn_scale=attn_scale,
                               window_size=window, out=out, return_softmax_lse=True)  # fmt: skip
    return out, lse


def _decode_fake(q, k_cache, v_cache, cache_seqlens, page_table, attn_scale, window_left):
    b, sq, h = q.shape[:3]
    return q.new_empty((b, sq, h, v_cache.shape[-1])), q.new_empty((b, h, sq, 1), dtype=torch.float32)


#: The ops are defined with ``torch.library.Library`` (define / impl / register_fake) rather than
#: ``torch.library.custom_op``: the dispatcher calls our function directly instead of through
#: custom_op's Python wrappers, which cost tens of microseconds per call in compiled graphs
#: (measured: tools/bench_ops.py). ``fwd``'s autograd is its own Autograd kernel rather than
#: ``register_autograd``'s, whose no-grad path (every call of a compiled graph) goes through the
#: dispatcher a second time (``tools/probe_dispatch.py`` measures both).
_lib = torch.library.Library("te_cudnn", "DEF")


def _define(name: str, schema: str, impl, fake) -> torch._ops.OpOverload:
    _lib.define(name + schema, tags=_TAGS)
    _lib.impl(name, impl, "CUDA")
    torch.library.register_fake(f"te_cudnn::{name}", fake, lib=_lib)
    return getattr(torch.ops.te_cudnn, name).default


fwd_op = _define("fwd", FWD_SCHEMA, _fwd_impl, _fwd_fake)
bwd_op = _define("bwd", BWD_SCHEMA, _bwd_impl, _bwd_fake)
fp8_fwd_op = _define("fp8_fwd", FP8_FWD_SCHEMA, _fp8_fwd_impl, _fp8_fwd_fake)
fp8_bwd_op = _define("fp8_bwd", FP8_BWD_SCHEMA, _fp8_bwd_impl, _fp8_bwd_fake)
decode_op = _define("decode", DECODE_SCHEMA, _decode_impl, _decode_fake)
_lib.impl("fwd", _fwd_autograd, "Autograd", with_keyset=True)
torch.library.register_autograd("te_cudnn::fp8_fwd", _fp8_fwd_backward, setup_context=_fp8_fwd_setup, lib=_lib)

#: name -> OpOverload (``torch.ops.te_cudnn.<name>.default``)
OPS = {"fwd": fwd_op, "bwd": bwd_op, "fp8_fwd": fp8_fwd_op, "fp8_bwd": fp8_bwd_op, "decode": decode_op}


# ------------------------------------------------------------------------------------------
# wrappers: what the public entry points call on the custom-op path
# ------------------------------------------------------------------------------------------


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: Optional[torch.Tensor],
              cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_kv: Optional[torch.Tensor], max_seqlen_q, max_seqlen_kv,
              is_training: bool, *, qkv_layout: str, attn_mask_type: str, attn_bias_type: str,
              attn_scale: Optional[float], dropout: float, window_size, bottom_right_diagonal: Optional[bool],
              backend, softmax_type: str, deterministic: bool,
              cu_seqlens_q_padded: Optional[torch.Tensor] = None, cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
              rng_gen: Optional[torch.Generator] = None, softmax_offset: Optional[torch.Tensor] = None) -> torch.Tensor:  # fmt: skip
    """Differentiable attention through ``te_cudnn::fwd`` (and ``bwd`` in the backward). Dropout
    draws its [seed, offset] on the device (fresh per call and per CUDA-graph replay)."""
    rng_state = _device_rng_state(q.device, rng_gen) if is_training and dropout > 0.0 else None
    config = op_config(is_training, str(qkv_layout), str(attn_mask_type), str(attn_bias_type), window_size[0],
                       window_size[1], bottom_right_diagonal, None if backend is None else int(backend),
                       str(softmax_type), deterministic)  # fmt: skip
    out, _ = torch.ops.te_cudnn.fwd(
        q, k, v, attn_bias, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, None, None,
        rng_state, softmax_offset, max_seqlen_q, max_seqlen_kv, attn_scale, float(dropout), config,
    )  # fmt: skip
    return out


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta, cu_seqlens_q: Optional[torch.Tensor],
                  cu_seqlens_kv: Optional[torch.Tensor], max_seqlen_q, max_seqlen_kv, *, qkv_layout: str,
                  attn_mask_type: str, attn_scale: Optional[float], backend, deterministic: bool) -> torch.Tensor:  # fmt: skip
    """FP8 attention of fp16/bf16 q, k, v through ``te_cudnn::fp8_fwd`` (``fp8_bwd`` backward);
    ``meta`` is a :class:`te_cudnn.Fp8AttentionMeta` whose amax histories get this step's amaxes."""
    f, b = meta.fwd, meta.bwd
    out, _q8, _k8, _v8, _o8, _stats, row = torch.ops.te_cudnn.fp8_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_kv, f.scale, f.scale_inv, f.amax_history, meta.fwd_format, b.scale,
        b.scale_inv, b.amax_history, meta.bwd_format, max_seqlen_q, max_seqlen_kv, str(qkv_layout),
        str(attn_mask_type), attn_scale, None if backend is None else int(backend), deterministic,
    )  # fmt: skip
    f.amax_history[0].copy_(row)
    return out
