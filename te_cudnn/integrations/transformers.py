"""te_cudnn as a Hugging Face transformers attention implementation.

::

    import te_cudnn.integrations.transformers as te_hf
    from transformers import AutoModelForCausalLM

    te_hf.register()                                   # adds "te_cudnn" (idempotent)
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="te_cudnn", dtype=torch.bfloat16).cuda()
    # or, on a built model: model.set_attn_implementation("te_cudnn")

:func:`register` uses transformers' public registration interface: ``AttentionInterface`` gets
:func:`attention_forward` and ``AttentionMaskInterface`` gets transformers' own ``sdpa_mask``
(without a mask function transformers passes ``attention_mask=None`` to unknown
implementations, and padding and causal information would be lost). The masks are therefore
exactly those of ``attn_implementation="sdpa"``: boolean ``[b, 1, q, kv]`` (True = attend), or
None when ``is_causal`` says it all. transformers is imported only when :func:`register` runs
(``pip install te_cudnn[hf]``); ``import te_cudnn`` never imports it.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from ..errors import MisalignedError, UnsupportedConfigError
from ..autograd import lean_attention
from ..lean import LeanDoor, as_is, run_inference, wants_grad
from ..packed_rows import attend_one_row
from ..torch_ops import _is_compiling, use_custom_ops
from ..sdpa import (
    _attention_bshd,
    _options,
    _transposed,
    _lean_sig,
    _bshd,
    _capturing,
    _check_options,
    _check_qkv,
    _compiling,
    _describe,
    mask_to_bias,
    masked_value,
)

__all__ = ["register", "attention_forward", "DEFAULT_NAME"]

_log = logging.getLogger("te_cudnn")

DEFAULT_NAME = "te_cudnn"
_WHO = "te_cudnn (transformers attention)"
_CACHE_ATTR = "_te_cudnn_bias"  # the bias of a boolean mask, kept on the mask for the model's other layers

#: kwargs transformers may pass that change the result and that cuDNN's fused attention does not
#: implement, with the implementation that serves them
_UNSUPPORTED = {
    "softcap": "logit soft-capping (softcap, e.g. Gemma 2) is not part of cuDNN's fused attention; use "
               "attn_implementation='eager'",
    "head_mask": "head_mask is not part of cuDNN's fused attention; use attn_implementation='eager'",
    "cache": "paged attention caches (continuous batching) are not supported; use attn_implementation='sdpa' "
             "for continuous batching",
}
#: kwargs transformers passes that the mask or the cache already encode (``sliding_window`` is
#: applied natively when no mask came): calls with no others take the inference shortcut
_INERT_KWARGS = frozenset({"position_ids", "use_cache", "cache_position", "sliding_window"})
_grad_enabled = torch.is_grad_enabled
_warned: set[str] = set()


def register(name: str = DEFAULT_NAME) -> str:
    """Make ``attn_implementation=name`` (default ``"te_cudnn"``) available to transformers.

    Registers :func:`attention_forward` with ``transformers.AttentionInterface`` and
    transformers' ``sdpa_mask`` with ``transformers.AttentionMaskInterface`` under ``name``.
    Idempotent (registering again replaces the entries with the same functions). Then
    ``AutoModel*.from_pretrained(..., attn_implementation=name)`` / ``from_config(cfg,
    attn_implementation=name)`` or ``model.set_attn_implementation(name)`` select it.
    Returns ``name``. Needs transformers >= 4.56.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {type(name).__name__} {name!r}")
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "te_cudnn.integrations.transformers.register() needs transformers >= 4.56 (AttentionInterface and "
            f"AttentionMaskInterface): pip install 'te_cudnn[hf]' ({e})"
        ) from e
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _mask_bias(mask: torch.Tensor, shape: tuple[int, int, int, int], dtype: torch.dtype):
    """:func:`te_cudnn.sdpa.mask_to_bias` of the mask sliced to ``shape``'s keys. Every layer of a
    model gets the same boolean mask tensor: its bias is built once and kept on the mask (one
    bias tensor, also saved once for the backward, instead of one per layer). Not while
    compiling or capturing a CUDA graph, and not for inference tensors (no version counter)."""
    skv = shape[3]
    sliced = mask[:, :, :, :skv] if mask.dim() == 4 and mask.shape[-1] > skv else mask
    if mask.dtype != torch.bool or _compiling() or _capturing() or mask.is_inference():
        return mask_to_bias(sliced, shape, dtype)
    key = (tuple(shape), dtype, mask._version, mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()))
    hit = getattr(mask, _CACHE_ATTR, None)
    if hit is not None and hit[0] == key:
        return hit[1]
    result = mask_to_bias(sliced, shape, dtype)
    try:
        setattr(mask, _CACHE_ATTR, (key, result))
    except (AttributeError, RuntimeError):  # pragma: no cover - tensor subclasses that refuse attributes
        pass
    return result


def _position_bias_mask(position_bias: torch.Tensor, attention_mask: Optional[torch.Tensor], is_causal: bool,
                        sq: int, skv: int, dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """The additive mask of transformers' sdpa path for models with a learned position bias (T5
    and the like): the bias where attention is allowed, a large negative value elsewhere."""
    fill = masked_value(dtype)  # not finfo.min: fp32's min becomes -inf in bf16
    if attention_mask is None:
        if not is_causal:
            return position_bias
        causal = torch.ones(sq, skv, dtype=torch.bool, device=position_bias.device).tril()
        return torch.where(causal, position_bias, fill)
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, position_bias, fill)
    return position_bias + attention_mask


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface over cuDNN fused attention.

    ``query [b, h, s_q, d]``, ``key``/``value [b, h_kv, s_kv, d]`` (any strides; GQA runs natively,
    without repeating key and value; with a KV cache ``s_kv > s_q``), ``attention_mask`` from
    ``sdpa_mask`` (boolean ``[b, 1, s_q, kv]``, True = attend, sliced to ``s_kv``; a float mask is
    taken as additive) or None. Returns ``(attn_output [b, s_q, h, d_v], None)`` (no attention
    weights). Mirrors transformers' ``sdpa_attention_forward``: ``is_causal`` defaults to
    ``module.is_causal`` (True) and holds only without a mask and for ``s_q > 1`` (top-left);
    dropout applies when ``module.training``; ``scaling`` defaults to ``1/sqrt(d)``.

    kwargs: ``position_bias`` is added to the mask (as transformers' sdpa does);
    ``sliding_window`` is in the mask (transformers builds one whenever the window matters) and
    is applied natively when no mask came; ``position_ids``, ``cache_position``, flash-attention
    varlen arguments and the like are already encoded in the mask and ignored;
    ``output_attentions`` warns once (no weights are returned). ``s_aux`` (gpt-oss' attention
    sinks, one logit per head) runs as learnable sinks (``softmax_type="learnable"``) and is
    differentiable; ``softcap``, ``head_mask`` and paged caches raise
    :class:`te_cudnn.UnsupportedConfigError` naming the implementation that serves them.
    Masks cost a bias tensor (see :func:`te_cudnn.scaled_dot_product_attention`), built once
    per forward for all layers.
    """
    sig = recorded = None  # a signature computed here is the one the call is remembered under
    if attention_mask is None and _INERT_KWARGS.issuperset(kwargs) and not (dropout and getattr(module, "training", True)) \
            and not _is_compiling():  # fmt: skip
        # a remembered signature goes from here to the launch: every decode step, and every
        # training forward after the first (autograd records it through one lean node)
        try:
            sq = query.shape[2]
            grad = _grad_enabled()
            recorded = grad and wants_grad(query, key, value)
            if sq == 1 and not grad:  # a decode step over a cache that grows (DynamicCache), when packed_one_row is on
                out = attend_one_row(query, key, value, scaling)
                if out is not None:
                    return out, None
            causal = sq > 1 and bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
            if not (causal and key.shape[2] > sq) and not (recorded and use_custom_ops()):  # else sliced below
                window = _window(kwargs.get("sliding_window"), key.shape[2]) if causal else None
                sig = _lean_sig(query, key, value, causal, scaling, window, recorded)
                entry = _LEAN.find(sig)
                if entry is not None:
                    return (lean_attention(entry, query, key, value) if recorded else run_inference(entry, query, key, value),
                            None)  # fmt: skip
        except (AttributeError, TypeError, MisalignedError):  # the checks below name what is wrong
            sig = None
    for name, why in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            summary = f"attn_implementation te_cudnn on {type(module).__name__} with {name}"
            raise UnsupportedConfigError(summary, {_WHO: [why]})
    if kwargs.get("output_attentions") and "output_attentions" not in _warned:
        _warned.add("output_attentions")
        _log.warning("te_cudnn attention does not return attention weights (output_attentions=True gives None)")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor or None, got {type(attention_mask).__name__} "
                        "(register() pairs te_cudnn with transformers' sdpa_mask)")  # fmt: skip
    sq = query.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = sq > 1 and attention_mask is None and bool(is_causal)
    position_bias = kwargs.get("position_bias")
    if is_causal and key.shape[2] > sq:  # keys past s_q are never attended with top-left causality (StaticCache prefill)
        key, value = key[:, :, :sq], value[:, :, :sq]
        if position_bias is not None:
            position_bias = position_bias[..., :sq]
    skv = key.shape[2]
    window = _window(kwargs.get("sliding_window"), skv) if is_causal else None  # is_causal: no mask
    s_aux = kwargs.get("s_aux")
    training = getattr(module, "training", True)
    if sig is None and attention_mask is None and position_bias is None and s_aux is None \
            and not (training and dropout) and not _compiling():  # fmt: skip
        try:
            if not wants_grad(query, key, value):
                sig = _lean_sig(query, key, value, is_causal, scaling, window, False)
                entry = _LEAN.find(sig)
                if entry is not None:
                    return run_inference(entry, query, key, value), None
            elif not use_custom_ops():
                sig = _lean_sig(query, key, value, is_causal, scaling, window, True)
                entry = _LEAN.find(sig)
                if entry is not None:
                    return lean_attention(entry, query, key, value), None
                recorded = True
        except (AttributeError, TypeError, MisalignedError):  # the checks below name what is wrong
            sig = None
    _check_qkv(query, key, value, True)
    if position_bias is not None:
        if attention_mask is not None and attention_mask.shape[-1] > skv:
            attention_mask = attention_mask[..., :skv]
        attention_mask = _position_bias_mask(position_bias, attention_mask, is_causal, sq, skv, query.dtype)
        is_causal = False
    dropout_p = float(dropout) if training else 0.0
    dropout_p, is_causal, scale = _check_options(attention_mask, dropout_p, is_causal, scaling)
    sinks = None if s_aux is None else _sink_logits(s_aux, query.shape[1])
    bias = row_has_key = None
    if attention_mask is not None:
        if attention_mask.device != query.device:
            raise ValueError(f"attention_mask is on {attention_mask.device} but query is on {query.device}")
        b, h = query.shape[:2]
        try:
            bias, row_has_key = _mask_bias(attention_mask, (b, h, sq, skv), query.dtype)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{e} (attention_mask {_describe(attention_mask)}, query {_describe(query)})") from e
    q, k, v = _bshd(query, "query"), _bshd(key, "key"), _bshd(value, "value")
    one_row = sinks is not None and sq == 1
    if one_row:  # cuDNN takes no sink with one query row: the row twice, the second answer dropped
        q = q.expand(-1, 2, -1, -1).contiguous()
        if bias is not None and bias.shape[2] == 1:  # cuDNN's bias has every query row (or is [1, 1, 1, skv])
            bias = bias.expand(-1, -1, 2, -1).contiguous()
        if row_has_key is not None and row_has_key.shape[2] == 1:
            row_has_key = row_has_key.expand(-1, -1, 2, -1)
    prepared: list = []
    out = _attention_bshd(q, k, v, bias=bias, row_has_key=row_has_key, causal=is_causal, scale=scale,
                          dropout_p=dropout_p, window_size=window, sinks=sinks, prepared=prepared)  # fmt: skip
    if one_row:
        return out[:, :1], None
    if sig is not None and q.data_ptr() == query.data_ptr() and k.data_ptr() == key.data_ptr() \
            and v.data_ptr() == value.data_ptr():  # read in place (no copies): later calls can go straight  # fmt: skip
        _LEAN.learn(sig, prepared, out, recorded and (_options(is_causal, scale, 0.0, False, window, "vanilla"),
                                                      (sq, skv), _transposed, as_is))
    return out, None


_LEAN = LeanDoor()


def _window(sliding_window: Any, skv: int) -> Optional[tuple[int, int]]:
    """The causal call's ``window_size`` for transformers' ``sliding_window`` (None when it
    covers every key). transformers: key j is seen from query i when i - window < j <= i."""
    if isinstance(sliding_window, int) and 0 < sliding_window < skv:
        return (sliding_window - 1, 0)
    return None


def _sink_logits(s_aux: Any, h: int) -> torch.Tensor:
    """gpt-oss' per-head sink logits (``s_aux``, ``[h]`` in the model's dtype) as te_cudnn's
    learnable ``softmax_offset`` (fp32 ``[1, h, 1, 1]``; the cast is differentiable, so the
    sinks are trained). transformers' eager attention appends them as one more logit column of
    the softmax and drops it afterwards: the same denominator ``exp(s_h) + Σ exp``."""
    if not isinstance(s_aux, torch.Tensor) or s_aux.numel() != h:
        got = f"{s_aux.dtype} {list(s_aux.shape)}" if isinstance(s_aux, torch.Tensor) else type(s_aux).__name__
        raise ValueError(f"s_aux must hold one sink logit per query head ({h}), got {got}")
    return s_aux.reshape(1, h, 1, 1).float()
