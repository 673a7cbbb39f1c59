"""``FusedAttnFunc``: a thin ``torch.autograd.Function`` over fused_attn_fwd / fused_attn_bwd.

The forward picks the sub-backend once and the backward reuses it (PyTorch only lets us
decide during the forward). Only tensors are saved; the options travel as one frozen
:class:`AttnOptions`. The output gradient is used as-is when cuDNN can read it (unit-stride
last dim, 16-byte aligned strides) and made contiguous otherwise, since autograd may hand
over expanded or transposed gradients.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Optional

import torch

from . import torch_ops
from .enums import FusedAttnBackend, QKVFormat, QKVLayout
from .errors import MisalignedError
from .layouts import layout_info
from .launchers import plain_bwd, plain_fwd
from .lean import LeanDoor, LeanTraining, as_is, new_output, policy_token, run_inference, wants_grad
from .ops import fused_attn_bwd, fused_attn_fwd
from .torch_ops import _is_compiling, use_custom_ops
from .varlen import BatchLengths

__all__ = ["AttnOptions", "FusedAttnFunc", "fused_attention", "attend", "lean_attention", "Fp8FusedAttnFunc",
           "fp8_attention"]


@dataclass(frozen=True)
class AttnOptions:
    """The non-tensor arguments shared by the forward and the backward."""

    qkv_layout: str = "bshd_bshd_bshd"
    attn_mask_type: str = "no_mask"
    attn_bias_type: str = "no_bias"
    attn_scale: Optional[float] = None
    dropout: float = 0.0
    window_size: tuple[int, int] = (-1, -1)
    bottom_right_diagonal: Optional[bool] = None
    deterministic: bool = False
    fused_attention_backend: Optional[FusedAttnBackend] = None
    softmax_type: str = "vanilla"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


#: Names people reach for (PyTorch's SDPA, flash-attention, TransformerEngine's modules) and
#: the option that means it here.
_ALIASES = {
    "mask": "attn_mask_type", "mask_type": "attn_mask_type", "attn_mask": "attn_mask_type",
    "causal": "attn_mask_type='causal'", "is_causal": "attn_mask_type='causal'",
    "bias_type": "attn_bias_type", "bias": "attn_bias (a tensor) and attn_bias_type",
    "layout": "qkv_layout", "qkv_format": "qkv_layout", "scale": "attn_scale", "softmax_scale": "attn_scale",
    "dropout_p": "dropout", "attention_dropout": "dropout", "window": "window_size",
    "backend": "fused_attention_backend",
}  # fmt: skip
_OPTION_NAMES = tuple(f.name for f in fields(AttnOptions) if f.name != "extra")


def _options(function: str, options: dict[str, Any], accepted: Iterable[str], arguments: Iterable[str]) -> AttnOptions:
    """``AttnOptions`` from keyword options, or a ``TypeError`` that names the unknown keyword,
    what was probably meant and every accepted option (``AttnOptions``' own error names only
    the dataclass). Eager calls remember the result per (function, options) (building the
    dataclass on every call would cost host time); torch.compile traces it afresh instead."""
    key = None
    if not _is_compiling():
        try:
            key = (function, *options.items())
            hit = _OPTIONS_MEMO.get(key)
        except TypeError:  # an unhashable value (a list window_size, ...): validated below every time
            key = hit = None
        if hit is not None:
            return hit
    accepted = tuple(accepted)
    for name in options:
        if name in accepted:
            continue
        if name in _OPTION_NAMES:  # an option of fused_attention that this function does not pass on
            raise TypeError(
                f"{function}() does not take {name}={options[name]!r} (it has no such option, and ignoring it would "
                f"change the result silently); accepted options: {', '.join(accepted)}"
            )
        every = (*arguments, *accepted)
        guess = _ALIASES.get(name) or next(iter(difflib.get_close_matches(name, every, n=1)), None)
        hint = f" (did you mean {guess}?)" if guess else ""
        raise TypeError(
            f"{function}() got an unexpected keyword argument {name!r}{hint}; accepted keyword arguments: "
            f"{', '.join(every)}"
        )
    opts = AttnOptions(**options)
    if key is not None and len(_OPTIONS_MEMO) < _OPTIONS_MEMO_LIMIT:
        _OPTIONS_MEMO[key] = opts
    return opts


_OPTIONS_MEMO: dict[tuple, AttnOptions] = {}
_OPTIONS_MEMO_LIMIT = 1024


def _layout_facts() -> dict[Any, tuple[int, int, str]]:
    """Per layout (name, lower-case name and member): the dims of q and k that bound the
    sequence lengths (sbhd: 0, bshd: 1, bhsd: 2, thd: 0, the token count) and the unpacked
    layout FP8 runs on (quantizing packed views gives separate tensors). Built once at
    import: torch.compile then reads a constant table instead of tracing enum coercion."""

    dims = {QKVFormat.sbhd: 0, QKVFormat.bshd: 1, QKVFormat.bhsd: 2, QKVFormat.thd: 0}
    table: dict[Any, tuple[int, int, str]] = {}
    for layout in QKVLayout:
        info = layout_info(layout)
        if info.is_paged:
            continue
        q_fmt, kv_fmt = info.q_format.name, info.kv_format.name
        facts = (dims[info.q_format], dims[info.kv_format], f"{q_fmt}_{kv_fmt}_{kv_fmt}")
        table[layout] = table[layout.name] = table[layout.name.upper()] = facts
    return table


_LAYOUT_FACTS = _layout_facts()


def _facts(qkv_layout: Any) -> tuple[int, int, str]:
    facts = _LAYOUT_FACTS.get(qkv_layout)
    if facts is None:
        layout = QKVLayout.coerce(qkv_layout, argument="qkv_layout")  # raises for unknown names
        facts = _LAYOUT_FACTS.get(layout)
        if facts is not None:  # another spelling of a known layout
            return facts
        raise ValueError(f"qkv_layout={layout.name} (paged KV) needs page tables: call fused_attn_fwd directly")
    return facts


def _readable_grad(g: torch.Tensor) -> torch.Tensor:
    esize = g.element_size()
    if g.stride(-1) == 1 and all(s * esize % 16 == 0 for n, s in zip(g.shape[:-1], g.stride()[:-1]) if n > 1):
        return g
    return g.contiguous()


_grad_enabled = torch.is_grad_enabled

_FUSED_ARGUMENTS = ("attn_bias", "cu_seqlens_q", "cu_seqlens_kv", "rng_gen", "is_training", "softmax_offset", "lengths")
#: The options :class:`Fp8FusedAttnFunc` passes on (it has no bias, dropout or window).
_FP8_OPTIONS = ("qkv_layout", "attn_mask_type", "attn_scale", "deterministic", "fused_attention_backend")


def _padded(options: AttnOptions) -> dict:
    """THD token offsets (``cu_seqlens_*_padded``) the module passes through ``extra``."""
    padded = options.extra.get("cu_seqlens_padded")
    return {} if padded is None else {"cu_seqlens_q_padded": padded[0], "cu_seqlens_kv_padded": padded[1]}


class FusedAttnFunc(torch.autograd.Function):
    """``out = FusedAttnFunc.apply(is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q,
    cu_seqlens_kv, q, k, v, attn_bias, rng_gen, options, softmax_offset=None)``; differentiable
    in q, k, v, a post-scale ``attn_bias`` (when cuDNN produces dBias) and, for
    ``softmax_type="learnable"``, the sink logits ``softmax_offset`` (fp32 ``[1, h, 1, 1]``)."""

    @staticmethod
    def forward(ctx, is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, attn_bias, rng_gen,
                options, softmax_offset=None, lengths=None, prepared=None):  # fmt: skip
        padded = _padded(options)
        if lengths is None and cu_seqlens_q is not None:  # the backward uses the lengths this forward derives
            lengths = BatchLengths(cu_seqlens_q, cu_seqlens_kv, padded.get("cu_seqlens_q_padded"),
                                   padded.get("cu_seqlens_kv_padded"))  # fmt: skip
        out, aux = fused_attn_fwd(
            is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, q.dtype,
            options.fused_attention_backend, attn_bias=attn_bias, attn_scale=options.attn_scale,
            dropout=options.dropout, qkv_layout=options.qkv_layout, attn_bias_type=options.attn_bias_type,
            attn_mask_type=options.attn_mask_type, softmax_type=options.softmax_type,
            window_size=options.window_size, bottom_right_diagonal=options.bottom_right_diagonal, rng_gen=rng_gen,
            softmax_offset=softmax_offset, lengths=lengths, _prepared=prepared, **padded,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, cu_seqlens_q, cu_seqlens_kv, *aux)
        ctx.max_seqlens = (max_seqlen_q, max_seqlen_kv)
        ctx.options = options
        ctx.lengths = lengths
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, cu_q, cu_kv, *aux = ctx.saved_tensors
        o = ctx.options
        dq, dk, dv, dbias, d_offset = fused_attn_bwd(
            *ctx.max_seqlens, cu_q, cu_kv, q, k, v, out, _readable_grad(d_out), q.dtype, aux,
            o.fused_attention_backend, attn_scale=o.attn_scale, dropout=o.dropout, qkv_layout=o.qkv_layout,
            attn_bias_type=o.attn_bias_type, attn_mask_type=o.attn_mask_type, softmax_type=o.softmax_type,
            window_size=o.window_size, bottom_right_diagonal=o.bottom_right_diagonal, deterministic=o.deterministic,
            lengths=ctx.lengths, **_padded(o),
        )  # fmt: skip
        return None, None, None, None, None, dq, dk, dv, dbias, None, None, d_offset, None, None


class _LeanAttnFunc(torch.autograd.Function):
    """A front door's remembered training call (:class:`te_cudnn.lean.LeanTraining`): the
    forward and the backward launch the prepared plain plans on the door's own tensors (only
    their pointers are read: no layout views, no argument handling, one autograd node)."""

    @staticmethod
    def forward(ctx, q, k, v, entry):
        out, aux = plain_fwd(entry.prep, q, k, v, new_output(entry.template))
        ctx.save_for_backward(q, k, v, out, aux[0])
        ctx.entry, ctx.rng_state = entry, aux[1]
        return out

    @staticmethod
    def backward(ctx, d_out):
        if _grad_enabled():  # create_graph=True: a second derivative must raise (once_differentiable)
            return _lean_backward_once(ctx, d_out)
        return _lean_backward(ctx, d_out)


def _lean_backward(ctx, d_out):
    q, k, v, out, stats = ctx.saved_tensors
    entry = ctx.entry
    prep = entry.backwards.get(d_out.stride())  # a learned stride is readable (_readable_grad): the shape is fixed
    if prep is None:
        d_out = _readable_grad(d_out)
        prep = entry.backwards.get(d_out.stride())
        if prep is None:
            return (*_first_lean_backward(entry, q, k, v, out, d_out, stats, ctx.rng_state), None)
    dq, dk, dv, _, _ = plain_bwd(prep, q, k, v, out, d_out, stats, ctx.rng_state)
    return dq, dk, dv, None


_lean_backward_once = torch.autograd.function.once_differentiable(_lean_backward)


def _first_lean_backward(entry: LeanTraining, q, k, v, out, d_out, stats, rng_state) -> tuple:
    """The backward of a remembered training call for output-gradient strides not seen yet: the
    full path on the graph layout's views, remembered when its prepared backward is plain and
    allocates the gradients as ``empty_like`` of the door's q, k, v would."""
    o, view, out_view, prepared = entry.options, entry.view, entry.out_view, []
    dq, dk, dv, _, _ = fused_attn_bwd(
        *entry.seqlens, None, None, view(q), view(k), view(v), out_view(out), out_view(d_out), q.dtype,
        [stats, rng_state],
        o.fused_attention_backend, attn_scale=o.attn_scale, dropout=o.dropout, qkv_layout=o.qkv_layout,
        attn_bias_type=o.attn_bias_type, attn_mask_type=o.attn_mask_type, softmax_type=o.softmax_type,
        window_size=o.window_size, bottom_right_diagonal=o.bottom_right_diagonal, deterministic=o.deterministic,
        _prepared=prepared,
    )  # fmt: skip
    grads = view(dq), view(dk), view(dv)
    prep = prepared[0] if len(prepared) == 1 else None
    if (prep is not None and prep.plain and prep.grads_like_inputs and len(entry.backwards) < 8
            and all(g.stride() == torch.empty_like(t, device="meta").stride() for g, t in zip(grads, (q, k, v)))):  # fmt: skip
        entry.backwards[d_out.stride()] = prep
    return grads


#: ``_LeanAttnFunc.apply`` without the Python wrapper of ``Function.apply``, which binds default
#: arguments (the function has none) and unwraps functorch tensors (used only while no functorch
#: transform is active; under one, the full ``apply``).
_lean_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _LeanAttnFunc)
_functorch_active = torch._C._are_functorch_transforms_active


def lean_attention(entry: LeanTraining, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A remembered training call (te_cudnn.lean) again on new tensors of its signature."""
    if _functorch_active():
        return _LeanAttnFunc.apply(q, k, v, entry)
    return _lean_apply(q, k, v, entry)


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_bias: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    rng_gen: Optional[torch.Generator] = None,
    is_training: Optional[bool] = None,
    softmax_offset: Optional[torch.Tensor] = None,
    lengths: Optional[BatchLengths] = None,
    **options: Any,
) -> torch.Tensor:
    """Differentiable fused attention with keyword options (see :class:`AttnOptions`).

    ``fused_attention(q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")`` with
    q ``[b, sq, h, d]`` and k, v ``[b, skv, hg, d]`` (fp16 or bf16, on a CUDA device) returns
    the output ``[b, sq, h, d_v]``. Sequence lengths are read off q and k for the layout's
    format. Every argument after ``v`` is a keyword.

    Options (keyword, default):

    - ``qkv_layout="bshd_bshd_bshd"``: how q, k, v are laid out: ``bshd_bshd_bshd`` for
      ``[b, s, h, d]``, ``sbhd_sbhd_sbhd`` for ``[s, b, h, d]``, ``bhsd_bhsd_bhsd`` for
      torch SDPA's ``[b, h, s, d]``, ``thd_thd_thd`` for packed variable-length batches, or
      a packed form (``bs3hd``, ``bshd_bs2hd``, ...: views of one buffer).
    - ``attn_mask_type="no_mask"``: ``no_mask``, ``causal``, ``causal_bottom_right``,
      ``padding``, ``padding_causal`` or ``padding_causal_bottom_right``.
    - ``attn_bias_type="no_bias"``: ``no_bias``, ``post_scale_bias`` (with ``attn_bias``) or
      ``alibi``.
    - ``attn_scale=None``: the softmax scale; None is ``1 / sqrt(d)``.
    - ``dropout=0.0``: dropout probability on the attention weights (training only).
    - ``window_size=(-1, -1)``: sliding window ``(left, right)``; -1 is unbounded.
    - ``bottom_right_diagonal=None``: align the mask's diagonal to the bottom-right corner
      when sq != skv; None follows ``attn_mask_type``.
    - ``deterministic=False``: a bit-reproducible backward (more workspace on Hopper).
    - ``fused_attention_backend=None``: force a sub-backend (a ``FusedAttnBackend`` or its
      name); None lets te_cudnn choose (``te_cudnn.explain`` says which and why).
    - ``softmax_type="vanilla"``: ``vanilla``, ``off_by_one`` or ``learnable`` (attention
      sinks; ``learnable`` needs ``softmax_offset``).

    Tensors and other arguments (keyword, default None):

    - ``attn_bias``: the bias of ``post_scale_bias``, ``[1 or b, 1 or h, 1 or sq, skv]``.
    - ``cu_seqlens_q``: int32 ``[b + 1]`` cumulative query lengths, for padding masks and THD
      layouts.
    - ``cu_seqlens_kv``: the same for the keys and values.
    - ``rng_gen``: the CUDA generator dropout draws from (default: torch's).
    - ``is_training``: keep what the backward needs; None is ``torch.is_grad_enabled()``.
    - ``softmax_offset``: the per-head sink logits of ``softmax_type="learnable"``, fp32
      ``[1, h, 1, 1]``, differentiable.
    - ``lengths``: a :class:`te_cudnn.BatchLengths` of ``cu_seqlens_q/kv``, built once per
      batch and passed to every layer, reuses the lengths the first layer derived (without
      it, every call derives them; in eager mode the backward reuses its forward's, while the custom
      operators that torch.compile and CUDA-graph capture use derive them in each call).

    An unknown keyword raises ``TypeError`` naming it, what was probably meant (``is_causal``,
    ``softmax_scale``, ...) and every accepted option.
    """
    sig, recorded = None, False
    if (attn_bias is None and cu_seqlens_q is None and cu_seqlens_kv is None and rng_gen is None
            and softmax_offset is None and lengths is None and not _is_compiling()):  # fmt: skip
        try:  # a signature seen before: its remembered call (te_cudnn.lean)
            recorded = wants_grad(q, k, v)
            if not recorded or (is_training is not False and not use_custom_ops()):
                sig = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
                       q.get_device(), k.get_device(), v.get_device(), policy_token(), is_training, recorded,
                       *options.items())  # fmt: skip
                entry = _LEAN.find(sig)
                if entry is not None:
                    return lean_attention(entry, q, k, v) if recorded else run_inference(entry, q, k, v)
        except (AttributeError, TypeError, MisalignedError):  # the full path below names what is wrong
            sig = None
    opts = _options("fused_attention", options, _OPTION_NAMES, _FUSED_ARGUMENTS)
    q_dim, kv_dim, _ = _facts(opts.qkv_layout)
    if is_training is None:
        is_training = torch.is_grad_enabled()
    prepared: list = []
    sq, skv = q.shape[q_dim], k.shape[kv_dim]
    out = attend(q, k, v, attn_bias, cu_seqlens_q, cu_seqlens_kv, sq, skv, is_training, rng_gen, opts,
                 softmax_offset=softmax_offset, lengths=lengths, _prepared=prepared)  # fmt: skip
    if sig is not None:
        _LEAN.learn(sig, prepared, out, (opts, (sq, skv), as_is, as_is) if recorded else None)
    return out


#: ``fused_attention``'s remembered calls (te_cudnn.lean).
_LEAN = LeanDoor()


def attend(q, k, v, attn_bias, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, is_training, rng_gen,
           opts: AttnOptions, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None, softmax_offset=None,
           lengths=None, _prepared: Optional[list] = None) -> torch.Tensor:  # fmt: skip
    """The one dispatch point of the differentiable F16 attention (``fused_attention``, the
    module, the SDPA drop-in): the custom ops while compiling or capturing a CUDA graph; in
    eager mode :class:`FusedAttnFunc` over the plans when autograd records the call, else
    ``fused_attn_fwd`` itself (no autograd node to build, no softmax stats to write;
    ``_prepared`` receives its prepared call, see te_cudnn.lean)."""
    custom_ops = use_custom_ops()
    if not custom_ops and not wants_grad(q, k, v, attn_bias, softmax_offset):
        o = opts
        out, _ = fused_attn_fwd(
            is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, q.dtype,
            o.fused_attention_backend, attn_bias=attn_bias, attn_scale=o.attn_scale, dropout=o.dropout,
            qkv_layout=o.qkv_layout, attn_bias_type=o.attn_bias_type, attn_mask_type=o.attn_mask_type,
            softmax_type=o.softmax_type, window_size=o.window_size, bottom_right_diagonal=o.bottom_right_diagonal,
            rng_gen=rng_gen, softmax_offset=softmax_offset, lengths=lengths, cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded, softmax_stats=False, _prepared=_prepared,
        )  # fmt: skip
        return out
    if custom_ops:
        if rng_gen is not None and _is_compiling():
            raise TypeError("rng_gen is not supported under torch.compile (dropout draws from the default CUDA "
                            "generator there); pass rng_gen=None")  # fmt: skip
        return torch_ops.attention(
            q, k, v, attn_bias, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, is_training,
            qkv_layout=opts.qkv_layout, attn_mask_type=opts.attn_mask_type, attn_bias_type=opts.attn_bias_type,
            attn_scale=opts.attn_scale, dropout=opts.dropout, window_size=opts.window_size,
            bottom_right_diagonal=opts.bottom_right_diagonal, backend=opts.fused_attention_backend,
            softmax_type=opts.softmax_type, deterministic=opts.deterministic, cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded, rng_gen=rng_gen, softmax_offset=softmax_offset,
        )  # fmt: skip
    if cu_seqlens_q_padded is not None or cu_seqlens_kv_padded is not None:
        opts = replace(opts, extra={**opts.extra, "cu_seqlens_padded": (cu_seqlens_q_padded, cu_seqlens_kv_padded)})
    return FusedAttnFunc.apply(
        is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, attn_bias, rng_gen, opts,
        softmax_offset, lengths, _prepared,
    )


class Fp8FusedAttnFunc(torch.autograd.Function):
    """FP8 attention inside a higher-precision model: q, k, v (fp16/bf16) are cast to FP8 with
    ``meta``'s QKV scale, the fused FP8 kernels run, and O and the gradients come back
    dequantized in the inputs' dtype (straight-through for the casts). ``meta`` is an
    :class:`te_cudnn.fp8.Fp8AttentionMeta`; call its ``update()`` once per training step."""

    @staticmethod
    def forward(ctx, q, k, v, meta, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, options):
        q8, k8, v8 = (meta.quantize(t, "qkv") for t in (q, k, v))
        out8, aux = fused_attn_fwd(
            True, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q8, k8, v8, q8.dtype,
            options.fused_attention_backend, attn_scale=options.attn_scale, qkv_layout=options.qkv_layout,
            attn_mask_type=options.attn_mask_type, **meta.fwd_kwargs(),
        )  # fmt: skip
        ctx.save_for_backward(q8, k8, v8, out8, cu_seqlens_q, cu_seqlens_kv, *aux)
        ctx.meta, ctx.options, ctx.max_seqlens, ctx.dtype = meta, options, (max_seqlen_q, max_seqlen_kv), q.dtype
        return meta.dequantize(out8, "o").to(q.dtype)

    @staticmethod
    def backward(ctx, d_out):
        q8, k8, v8, out8, cu_q, cu_kv, *aux = ctx.saved_tensors
        meta, o = ctx.meta, ctx.options
        d_o8 = meta.quantize(_readable_grad(d_out), "do")
        dq8, dk8, dv8, _, _ = fused_attn_bwd(
            *ctx.max_seqlens, cu_q, cu_kv, q8, k8, v8, out8, d_o8, q8.dtype, aux, o.fused_attention_backend,
            attn_scale=o.attn_scale, qkv_layout=o.qkv_layout, attn_mask_type=o.attn_mask_type,
            deterministic=o.deterministic, **meta.bwd_kwargs(),
        )  # fmt: skip
        grads = (meta.dequantize(g, "dqkv").to(ctx.dtype) for g in (dq8, dk8, dv8))
        return (*grads, None, None, None, None, None, None)


def fp8_attention(q, k, v, meta, *, cu_seqlens_q=None, cu_seqlens_kv=None, **options: Any) -> torch.Tensor:
    """Differentiable FP8 fused attention for fp16/bf16 q, k, v (see :class:`Fp8FusedAttnFunc`).

    Options: ``qkv_layout``, ``attn_mask_type``, ``attn_scale``, ``deterministic``,
    ``fused_attention_backend``; any other keyword (``dropout``, ``window_size``, a bias, ...)
    raises ``TypeError`` rather than being ignored."""
    opts = _options("fp8_attention", options, _FP8_OPTIONS, ("cu_seqlens_q", "cu_seqlens_kv"))
    q_dim, kv_dim, _ = _facts(opts.qkv_layout)
    return attend_fp8(q, k, v, meta, cu_seqlens_q, cu_seqlens_kv, q.shape[q_dim], k.shape[kv_dim], opts)


def attend_fp8(q, k, v, meta, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, opts: AttnOptions) -> torch.Tensor:
    """FP8 counterpart of :func:`attend`: ``te_cudnn::fp8_fwd`` when compiling or capturing,
    :class:`Fp8FusedAttnFunc` in eager mode. Packed layouts run as their unpacked twins: the
    FP8 casts give q, k and v buffers of their own."""
    unpacked = _facts(opts.qkv_layout)[2]
    if unpacked != opts.qkv_layout:
        opts = replace(opts, qkv_layout=unpacked)
    if use_custom_ops():
        return torch_ops.fp8_attention(
            q, k, v, meta, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, qkv_layout=opts.qkv_layout,
            attn_mask_type=opts.attn_mask_type, attn_scale=opts.attn_scale, backend=opts.fused_attention_backend,
            deterministic=opts.deterministic,
        )  # fmt: skip
    return Fp8FusedAttnFunc.apply(q, k, v, meta, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, opts)
