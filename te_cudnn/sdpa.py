"""A drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on cuDNN fused attention.

:func:`scaled_dot_product_attention` takes torch's arguments and ``[b, h, s, d]`` tensors of any
strides and runs :func:`te_cudnn.fused_attention` on ``transpose(1, 2)`` views of them
(``bshd_bshd_bshd``: cuDNN reads each tensor through its own strides, so nothing is copied
unless cuDNN cannot read a tensor in place). Masks become a post-scale bias
(:func:`mask_to_bias`). There is no fallback: what cuDNN cannot do raises.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional, Sequence

import torch

from .autograd import AttnOptions, attend, lean_attention
from .errors import MisalignedError, UnsupportedConfigError
from .lean import LeanDoor, policy_token, run_inference, wants_grad
from .packed_rows import attend_one_row
from .torch_ops import use_custom_ops

__all__ = ["scaled_dot_product_attention", "mask_to_bias", "masked_value"]

_log = logging.getLogger("te_cudnn")

_F16 = (torch.float16, torch.bfloat16)
_ALIGN = 16  # bytes: cuDNN's stride and address alignment
_WHO = "te_cudnn.scaled_dot_product_attention"


def _compiling() -> bool:
    """Inside torch.compile tracing (FakeTensors have no data pointers)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(is_compiling and is_compiling())


def _capturing() -> bool:
    """Inside a CUDA-graph capture on the current stream (False on CPU-only builds)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _describe(t: torch.Tensor) -> str:
    return f"{_dtype_name(t.dtype)} {list(t.shape)} on {t.device}"


def masked_value(dtype: torch.dtype) -> float:
    """The bias that stands for a False entry of a boolean mask: ``-1e30``, or the dtype's most
    negative value where that is larger (fp16: ``-65504``). Finite, so that a row of masked
    keys cannot give ``-inf - -inf = NaN``, and far from fp32's limit (``-3.4e38``; bf16's own
    minimum is ``-3.39e38``), so that no fp32 arithmetic cuDNN does on a score (a scale by
    ``log2(e)``, subtracting the row maximum) can overflow it to ``-inf``. Every masked key of
    a row that allows any key gets softmax weight exactly 0."""
    return max(torch.finfo(dtype).min, -1e30)


def _unsupported(summary: str, reason: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(summary, {_WHO: [reason]})


# ================================================================================ validation


def _check_qkv(query: Any, key: Any, value: Any, enable_gqa: Any) -> None:
    """torch's SDPA rules for [b, h, s, d] inputs, as TypeError / ValueError naming the argument;
    UnsupportedConfigError for well-formed inputs cuDNN's fused attention does not take."""
    tensors = (("query", query), ("key", key), ("value", value))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_nested or t.layout != torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got a {'nested' if t.is_nested else t.layout} one")
    for name, t in tensors:
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D [batch, heads, seq_len, head_dim], got {t.dim()}-D shape {list(t.shape)} "
                "(torch's SDPA also takes 3-D or more batch dims; te_cudnn takes exactly [b, h, s, d]: reshape first)"
            )
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"query, key and value must have one dtype, got {_dtype_name(query.dtype)}, {_dtype_name(key.dtype)}, "
            f"{_dtype_name(value.dtype)}"
        )
    if not query.dtype.is_floating_point:
        raise TypeError(f"query must be a floating-point tensor (float16 or bfloat16 here), got {_dtype_name(query.dtype)}")
    if not (query.device == key.device == value.device):
        raise ValueError(f"query, key and value must be on one device, got {query.device}, {key.device}, {value.device}")
    (b, h, _sq, d), (bk, hk, skv, dk), (bv, hv, sv, _dv) = query.shape, key.shape, value.shape
    if not b == bk == bv:
        raise ValueError(f"query, key and value must have one batch size, got {b}, {bk}, {bv} (shapes [b, h, s, d])")
    if skv != sv:
        raise ValueError(f"key has {skv} positions but value has {sv} (shapes [b, h, s, d])")
    if dk != d:
        raise ValueError(f"query's head dim {d} differs from key's {dk} (value's may differ)")
    if not enable_gqa and (hk != h or hv != h):
        raise ValueError(
            f"query has {h} heads but key has {hk} and value {hv}; pass enable_gqa=True for grouped-query "
            "attention (torch raises here too)"
        )
    if enable_gqa and (hk == 0 or hv == 0 or h % hk or h % hv):
        raise ValueError(f"enable_gqa=True needs key's and value's heads ({hk}, {hv}) to divide query's {h} heads")
    if query.dtype not in _F16:
        raise _unsupported(
            _summary(query, key, value),
            f"cuDNN fused attention takes float16 or bfloat16 inputs, got {_dtype_name(query.dtype)} (cast with "
            ".to(torch.bfloat16), use te_cudnn.fp8_attention for FP8, or torch's SDPA for float32)",
        )
    if hk != hv:
        raise _unsupported(_summary(query, key, value),
                           f"key ({hk} heads) and value ({hv} heads) must have the same number of heads")


def _summary(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> str:
    return f"query {_describe(query)}, key {_describe(key)}, value {_describe(value)}"


def _check_options(attn_mask: Any, dropout_p: Any, is_causal: Any, scale: Any) -> tuple[float, bool, Optional[float]]:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__} {dropout_p!r}")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p} must be in [0, 1) (cuDNN's dropout cannot drop everything)")
    if isinstance(is_causal, torch.SymBool):
        is_causal = bool(is_causal)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if is_causal and attn_mask is not None:
        raise ValueError(
            "attn_mask and is_causal=True were both given; torch's SDPA rejects this too: pass one of them "
            "(fold the causal pattern into the mask)"
        )
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a float or None, got {type(scale).__name__} {scale!r}")
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"scale={scale} must be finite")
    return dropout_p, is_causal, scale


# ================================================================================ masks


def mask_to_bias(
    attn_mask: torch.Tensor, shape: Sequence[int], dtype: torch.dtype
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """torch SDPA's ``attn_mask`` as te_cudnn's post-scale bias.

    ``shape`` is the attention's ``(b, h, L, S)`` and ``dtype`` q's dtype. The mask must
    broadcast to ``shape`` (torch's rule) and be boolean (True = attend), float32 or of
    ``dtype`` (additive). Returns ``(bias, row_has_key)``:

    * ``bias``: shape ``[1|b, 1|h, L, S]`` in ``dtype`` (the batch and head dims stay 1 where the
      mask broadcasts over them; the query and key dims are always full, as cuDNN needs; rows
      start on 16-byte boundaries, so cuDNN reads it in place). A boolean mask becomes 0 where
      True and :func:`masked_value` (``-1e30``; fp16: ``-65504``) where False: finite, so no row
      can turn into NaN, and masked keys get weight exactly 0 in any row that allows at least
      one key. A float mask in ``dtype`` that needs no broadcasting is returned as is
      (zero-copy; its gradient is cuDNN's dBias); otherwise it is cast and/or materialized,
      differentiably. Float masks are used as given: their masked entries should be ``-inf``
      or finite values no lower than about ``-1e30``.
    * ``row_has_key``: for boolean masks, a bool ``[1|b, 1|h, 1|L, 1]`` tensor, False for query
      rows that allow no key at all. Attention over such a row is a softmax over nothing: torch's
      math backend returns zeros there, while the finite bias would give an average of the
      values, so the caller zeroes those rows (see :func:`scaled_dot_product_attention`).
      None for float masks.

    Raises TypeError for a mask of another dtype and ValueError for one that does not
    broadcast to ``shape``.
    """
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.layout != torch.strided:
        raise TypeError(f"attn_mask must be a dense (strided) tensor, got layout {attn_mask.layout}")
    b, h, sq, skv = (int(n) for n in shape)
    mdt = attn_mask.dtype
    if mdt not in (torch.bool, torch.float32, dtype):
        raise TypeError(
            f"attn_mask must be bool (True = attend), float32 or query's dtype {_dtype_name(dtype)} (additive), "
            f"got {_dtype_name(mdt)} (torch's rule)"
        )
    if attn_mask.dim() > 4 or any(n not in (1, full) for n, full in zip(attn_mask.shape[::-1], (skv, sq, h, b))):
        raise ValueError(
            f"attn_mask of shape {list(attn_mask.shape)} does not broadcast to [b, h, L, S] = {[b, h, sq, skv]}"
        )
    m = attn_mask[(None,) * (4 - attn_mask.dim())] if attn_mask.dim() < 4 else attn_mask
    bb = b if m.shape[0] == b else 1
    hh = h if m.shape[1] == h else 1
    target = (bb, hh, sq, skv)
    if mdt == torch.bool:
        bias = _aligned_empty(target, dtype, m.device).fill_(masked_value(dtype)).masked_fill_(m, 0.0)
        return bias, m.any(dim=-1, keepdim=True)
    bias = m if mdt == dtype else m.to(dtype)
    if bias.requires_grad and torch.is_grad_enabled() and target[:3] == (1, 1, 1):
        # cuDNN writes no dBias for a bias broadcast over b, h and sq (TE's 111s rule): give it
        # a head (or batch) dim so that the mask gets its gradient
        if h > 1:
            target = (1, h, sq, skv)
        elif b > 1:
            target = (b, 1, sq, skv)
        else:
            raise _unsupported(
                f"attn_mask {_describe(attn_mask)} that requires grad, b = h = L = 1",
                "cuDNN produces no dBias for a [1, 1, 1, S] bias, so the mask would get no gradient",
            )
    if tuple(bias.shape) != target:
        bias = bias.expand(target)
    if any(st == 0 and n > 1 for n, st in zip(bias.shape, bias.stride())):  # broadcast dims: materialize
        if not _compiling():
            _log.debug("attn_mask %s stride %s is materialized as a %s bias (cuDNN needs full query and key dims)",
                       list(attn_mask.shape), tuple(attn_mask.stride()), list(target))  # fmt: skip
        bias = _aligned_empty(target, dtype, m.device).copy_(bias)  # differentiable: the gradient sums back
    return bias, None


def _aligned_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized ``shape`` tensor whose rows start on 16-byte boundaries (the last dim is
    padded in memory), so that cuDNN reads it in place (te_cudnn would otherwise copy a bias
    with, say, ``S = 100`` bf16 keys into such a buffer on every call)."""
    per = _ALIGN // dtype.itemsize
    row = -(-shape[-1] // per) * per
    if row == shape[-1]:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty((*shape[:-1], row), dtype=dtype, device=device)[..., : shape[-1]]


# ================================================================================ attention


def _readable(t: torch.Tensor) -> bool:
    """cuDNN reads ``t`` in place: unit-stride last dim, 16-byte multiples for the other
    strides (dims of size 1 excepted) and a 16-byte aligned start."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return False
    esize = t.element_size()
    if (t.shape[-1] * esize) % _ALIGN:  # a head dim cuDNN declines anyway: no copy, the head-dim rule reports it
        return True
    if any(n > 1 and (s * esize) % _ALIGN for n, s in zip(t.shape[:-1], t.stride()[:-1])):
        return False
    return _compiling() or t.numel() == 0 or t.data_ptr() % _ALIGN == 0


def _bshd(t: torch.Tensor, name: str) -> torch.Tensor:
    """``[b, h, s, d]`` -> a ``[b, s, h, d]`` view; a contiguous copy only when cuDNN cannot read it."""
    view = t.transpose(1, 2)
    if _readable(view):
        return view
    if not _compiling():  # (a logging call would break a torch.compile graph)
        _log.debug("%s %s stride %s cannot be read by cuDNN in place (it needs a unit-stride head dim, 16-byte "
                   "multiple strides and a 16-byte aligned start): copied into a contiguous [b, s, h, d] buffer",
                   name, list(t.shape), tuple(t.stride()))  # fmt: skip
    return view.clone(memory_format=torch.contiguous_format)  # a copy also of a contiguous view with an unaligned start


#: (causal, scale, dropout, bias, window, softmax type) -> the options of the bshd call
_OPTIONS: dict[tuple, AttnOptions] = {}


def _options(causal: bool, scale: Optional[float], dropout_p: float, bias: bool, window: Optional[tuple[int, int]],
             softmax_type: str) -> AttnOptions:  # fmt: skip
    key = (causal, scale, dropout_p, bias, window, softmax_type)
    opts = _OPTIONS.get(key)
    if opts is None:
        opts = AttnOptions(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal" if causal else "no_mask",
                           attn_bias_type="post_scale_bias" if bias else "no_bias", attn_scale=scale,
                           dropout=dropout_p, window_size=(-1, -1) if window is None else window,
                           softmax_type=softmax_type)  # fmt: skip
        if len(_OPTIONS) < 1024 and not _compiling():
            _OPTIONS[key] = opts
    return opts


def _attention_bshd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    bias: Optional[torch.Tensor],
    row_has_key: Optional[torch.Tensor],
    causal: bool,
    scale: Optional[float],
    dropout_p: float,
    window_size: Optional[tuple[int, int]] = None,
    sinks: Optional[torch.Tensor] = None,
    prepared: Optional[list] = None,
) -> torch.Tensor:
    """Fused attention on ``[b, s, h, d]`` views; returns ``[b, s_q, h, d_v]``. Rows without any
    allowed key (``row_has_key`` False, ``[1|b, 1|h, 1|L, 1]``) come back as zeros. ``sinks``:
    learnable sink logits (fp32 ``[1, h, 1, 1]``). ``prepared`` receives the prepared forward of a
    call autograd does not record (te_cudnn.lean)."""
    is_training = dropout_p > 0.0 or wants_grad(q, k, v, bias, sinks)
    opts = _options(causal, scale, dropout_p, bias is not None, window_size,
                    "vanilla" if sinks is None else "learnable")  # fmt: skip
    out = attend(q, k, v, bias, None, None, q.shape[1], k.shape[1], is_training, None, opts, softmax_offset=sinks,
                 _prepared=prepared)  # fmt: skip
    if row_has_key is not None:
        out = torch.where(row_has_key.transpose(1, 2), out, 0.0)
    return out


_LEAN = LeanDoor()


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """``[b, h, s, d]`` <-> ``[b, s, h, d]``: the drop-in's tensors as the bshd graph sees them."""
    return t.transpose(1, 2)


def _lean_sig(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *options: Any) -> Optional[tuple]:
    """The drop-in's signature of a call without mask or dropout (te_cudnn.lean); the options
    include whether autograd records the call."""
    return (query.shape, query.stride(), key.shape, key.stride(), value.shape, value.stride(), query.dtype, key.dtype,
            value.dtype, query.get_device(), key.get_device(), value.get_device(), policy_token(), *options)  # fmt: skip


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on cuDNN fused attention.

    Equivalent torch call (same arguments, same result up to rounding)::

        torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
            dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    Shapes: ``query [b, h, L, E]``, ``key [b, h_kv, S, E]``, ``value [b, h_kv, S, Ev]`` in float16
    or bfloat16 on a CUDA device, any strides; returns ``[b, h, L, Ev]`` (a transposed view of a
    contiguous ``[b, L, h, Ev]`` tensor, as torch's fused backends return). Nothing is copied:
    ``transpose(1, 2)`` views go to :func:`te_cudnn.fused_attention` as ``bshd_bshd_bshd``;
    a tensor cuDNN cannot read in place (head dim not unit-stride, strides not 16-byte
    multiples, an unaligned start) is copied to a contiguous one, logged at DEBUG on the
    ``te_cudnn`` logger. Differentiable in query, key, value and a float ``attn_mask``.

    Semantics (torch's):

    * ``is_causal``: top-left causal (query i sees keys 0..i, also when L != S);
      ``attn_mask`` together with ``is_causal=True`` raises ``ValueError``.
    * ``attn_mask``: broadcastable to ``[b, h, L, S]``; boolean (True = attend) or additive
      (float32 or the inputs' dtype). It becomes a post-scale bias ``[1|b, 1|h, L, S]`` in the
      inputs' dtype (:func:`mask_to_bias`: False -> ``-1e30``, fp16 ``-65504``: finite, so no
      NaN), which cuDNN reads on every call: a mask costs a ``[1|b, 1|h, L, S]`` tensor in
      memory (saved for the backward in training) and its reads. A float mask that requires grad
      gets its gradient (cuDNN's dBias). Query rows of a boolean mask that allow no key give
      zeros (output and gradients), as torch's math backend does. A float-mask row whose
      entries are all ``-inf`` is undefined (NaN is likely): use a boolean mask for such rows.
    * ``scale`` defaults to ``1 / sqrt(E)``; ``dropout_p > 0`` applies dropout whenever given
      (as torch does, also under ``no_grad``), drawing from the CUDA default generator
      (``torch.manual_seed`` makes it reproducible).
    * ``enable_gqa=False`` with differing head counts raises ``ValueError`` (as torch); with
      True, key/value heads must divide query heads (grouped-query attention runs natively,
      without repeating key and value).

    No silent fallback: malformed input raises ``TypeError`` / ``ValueError`` naming the
    argument; inputs torch takes but cuDNN does not (3-D or 5-D tensors: ``ValueError``; float32
    inputs, head dims or combinations no cuDNN sub-backend serves) raise
    :class:`te_cudnn.UnsupportedConfigError` with the reasons. Tensors off CUDA raise
    ``ValueError`` ("executes on CUDA devices").
    """
    sig = training = None
    if attn_mask is None and dropout_p == 0.0 and not _compiling():
        try:
            if not wants_grad(query, key, value):
                if is_causal is False and query.shape[2] == 1 and (enable_gqa is True or key.shape[1] == query.shape[1]):
                    out = attend_one_row(query, key, value, scale)  # a decode step over a growing cache (when on)
                    if out is not None:
                        return out.transpose(1, 2)
                sig = _lean_sig(query, key, value, is_causal, is_causal.__class__, scale, enable_gqa, False)
                entry = _LEAN.find(sig)
                if entry is not None:
                    return run_inference(entry, query, key, value)
            elif not use_custom_ops():
                sig = _lean_sig(query, key, value, is_causal, is_causal.__class__, scale, enable_gqa, True)
                entry = _LEAN.find(sig)
                if entry is not None:
                    return lean_attention(entry, query, key, value)
                training = True
        except (AttributeError, TypeError):  # not tensors, unhashable options: the checks below say what is wrong
            sig = None
        except MisalignedError:  # a start off 16 bytes this time: the full path copies that tensor
            sig = None
    _check_qkv(query, key, value, enable_gqa)
    dropout_p, is_causal, scale = _check_options(attn_mask, dropout_p, is_causal, scale)
    b, h, sq, _ = query.shape
    bias = row_has_key = None
    if attn_mask is not None:
        if isinstance(attn_mask, torch.Tensor) and attn_mask.device != query.device:
            raise ValueError(f"attn_mask is on {attn_mask.device} but query is on {query.device}")
        bias, row_has_key = mask_to_bias(attn_mask, (b, h, sq, key.shape[2]), query.dtype)
    prepared: list = []
    out = _attention_bshd(
        _bshd(query, "query"), _bshd(key, "key"), _bshd(value, "value"), bias=bias, row_has_key=row_has_key,
        causal=is_causal, scale=scale, dropout_p=dropout_p, prepared=prepared,
    ).transpose(1, 2)  # fmt: skip
    if sig is not None and _readable(query) and _readable(key) and _readable(value):  # read in place: no copies
        _LEAN.learn(sig, prepared, out, training and (_options(is_causal, scale, 0.0, False, None, "vanilla"),
                                                     (sq, key.shape[2]), _transposed, _transposed))
    return out
