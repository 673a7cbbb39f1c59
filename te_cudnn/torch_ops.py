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

Where the parts live (each name also importable from here, as before): the schemas and the
``config`` string in ``torch_ops_schema``, the shapes of the results in ``torch_ops_shapes``,
the implementations and fakes of ``fwd`` / ``bwd`` in ``torch_ops_fwd_bwd``, of ``fp8_fwd`` /
``fp8_bwd`` in ``torch_ops_fp8``, of ``decode`` in ``torch_ops_decode``. Here: the registration
(``torch.library``), ``fwd``'s Autograd kernel and the wrappers.
"""

import os
from typing import Optional

import torch

from .launch import is_capturing as _is_capturing
from .rng import _device_rng_state

# F401: names that moved out of this module stay importable from here
from .torch_ops_decode import _decode_fake, _decode_impl
from .torch_ops_fp8 import (  # noqa: F401
    _fp8_bwd_fake, _fp8_bwd_impl, _fp8_fwd_backward, _fp8_fwd_fake, _fp8_fwd_impl, _fp8_fwd_setup,
)  # fmt: skip
from .torch_ops_fwd_bwd import (  # noqa: F401
    _LAUNCHER_LIMIT, _bwd_fake, _bwd_impl, _bwd_launchers, _fwd_fake, _fwd_impl, _fwd_launchers, _heads, _keep,
    _op_grads, _zero_rng, _zero_sink, _zero_sinks, _zero_states,
)  # fmt: skip
from .torch_ops_schema import (  # noqa: F401
    _CU, _FP8_OPTS, _OPTIONAL, BWD_SCHEMA, DECODE_SCHEMA, FP8_BWD_SCHEMA, FP8_FWD_SCHEMA, FWD_SCHEMA, OpConfig, _configs,
    op_config, parse_op_config,
)  # fmt: skip
from .torch_ops_shapes import (  # noqa: F401
    _BHS, _MAX512, _grad_buffers, _has_dbias, _info, _infos, _packed_base, _stats_like, _unpacked, grads_like,
    unpack_grads,
)  # fmt: skip

__all__ = ["attention", "fp8_attention", "use_custom_ops", "unpack_grads", "op_config", "parse_op_config", "OpConfig", "OPS"]

#: ``TE_CUDNN_CUSTOM_OPS=1`` takes the custom-op path in eager mode too (tests, measurements);
#: ``=0`` never takes it outside torch.compile / CUDA-graph capture (the default).
_FORCE_OPS = os.environ.get("TE_CUDNN_CUSTOM_OPS", "0").strip().lower() in ("1", "true", "yes", "on")

_TAGS = (torch.Tag.needs_exact_strides,) if hasattr(torch.Tag, "needs_exact_strides") else ()
if not _TAGS and hasattr(torch.Tag, "needs_fixed_stride_order"):  # pragma: no cover - older torch
    _TAGS = (torch.Tag.needs_fixed_stride_order,)

try:
    _is_compiling = torch.compiler.is_compiling
except AttributeError:  # pragma: no cover - torch < 2.3
    _is_compiling = torch._dynamo.is_compiling


def use_custom_ops() -> bool:
    """True when the public autograd entry points should go through the custom ops: while
    torch.compile traces, during CUDA-graph capture, or when ``TE_CUDNN_CUSTOM_OPS=1``. In
    plain eager mode they call the plans directly, without the dispatcher's host time."""
    return _FORCE_OPS or _is_compiling() or _is_capturing()


# ------------------------------------------------------------------------------------------
# te_cudnn::fwd's autograd: its own Autograd kernel (fp8_fwd's formula: torch_ops_fp8)
# ------------------------------------------------------------------------------------------

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
    (register_autograd's redispatch converts every argument again)."""
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
        return _FwdWithGrad.apply(keyset, *args)
    if _cuda_only(keyset):
        return _fwd_impl(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return fwd_op.redispatch(keyset & _AFTER_AUTOGRAD, *args)


# ------------------------------------------------------------------------------------------
# registration
# ------------------------------------------------------------------------------------------

#: The ops are defined with ``torch.library.Library`` (define / impl / register_fake) rather than
#: ``torch.library.custom_op``: the dispatcher calls our function directly instead of through
#: custom_op's Python wrappers, which add host time to every call of a compiled graph. ``fwd``'s
#: autograd is its own Autograd kernel rather than ``register_autograd``'s, whose no-grad path
#: (every call of a compiled graph) goes through the dispatcher a second time.
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
