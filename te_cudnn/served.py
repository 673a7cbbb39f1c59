"""Calls cuDNN declines in the form they come in, served in another form with the same answer.

* **Head dims that are not a multiple of 8** (F16, q, k and v in separate tensors, no paged
  cache): q, k and v are copied into buffers padded with zero columns to the next multiple of
  8 (zero columns add nothing to a score, and V's give zero output columns), the call runs on
  them with the softmax scale of the real head dim, and the results are sliced back into
  tensors of the caller's head dims (one copy each). The backward pads O and dO the same way
  and slices dQ, dK and dV. These copies are the price of the form; they are documented, and
  the call is logged at debug level when first prepared.
* **Bottom-right masks with more queries than keys** (``causal_bottom_right``, or a
  bottom-right window, on dense tensors with ``sq > skv``): the first ``sq - skv`` query rows
  (more with a window) see no key. cuDNN takes this only through its padding-mask graph, so
  the call runs as the padding variant of its mask with every sequence at its full length
  (constant length tensors, made once per call signature). Rows that see no key come back as
  zeros with ``-inf`` softmax stats, as flash-attention and te_cudnn's reference give them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from .config import AttnConfig
from .enums import AttnMaskType, QKVLayoutGroup
from .launch import kept
from .layouts import layout_info

__all__ = ["head_pad", "padded_head_dim", "pad_heads", "as_padding_mask", "full_lengths", "padded_fwd", "padded_bwd"]

_F16 = (torch.float16, torch.bfloat16)
_PADDING_VARIANT = {
    AttnMaskType.no_mask: AttnMaskType.padding,
    AttnMaskType.causal: AttnMaskType.padding_causal,
    AttnMaskType.causal_bottom_right: AttnMaskType.padding_causal_bottom_right,
}


def padded_head_dim(d: int) -> int:
    """``d`` rounded up to a multiple of 8."""
    return -(-d // 8) * 8


def head_pad(cfg: AttnConfig) -> Optional[tuple[int, int]]:
    """The padded ``(d_qk, d_v)`` a call runs with, or None when it runs as it comes (head dims
    multiples of 8) or cannot be padded here (FP8, packed q/k/v, paged caches, empty calls: the
    sub-backends then decline it with their reasons)."""
    if cfg.d_qk % 8 == 0 and cfg.d_v % 8 == 0:
        return None
    if cfg.dtype not in _F16 or cfg.empty or cfg.paged is not None:
        return None
    if layout_info(cfg.layout).group != QKVLayoutGroup.L_HD_HD_HD:
        return None
    return padded_head_dim(cfg.d_qk), padded_head_dim(cfg.d_v)


def pad_heads(t: torch.Tensor, d: int) -> torch.Tensor:
    """``t`` with zero columns appended to its last dim up to ``d`` (a new dense tensor)."""
    return F.pad(t, (0, d - t.shape[-1]))


def _dense(t: torch.Tensor, d: int) -> torch.Tensor:
    """The first ``d`` columns of ``t``, as a dense tensor in the caller's head dim."""
    return t[..., :d].contiguous()


def padded_fwd(pad: tuple[int, int], args: Any, fwd: Callable[..., Any]) -> Any:
    """``fused_attn_fwd`` (``fwd``) of a call with head dims not a multiple of 8 (``args``:
    its ``FwdArgs``), run on zero-padded copies of q, k and v (:func:`head_pad`)."""
    d_qk, d_v = args.q.shape[-1], args.v.shape[-1]
    kw = args._asdict()
    kw.update(q=pad_heads(args.q, pad[0]), k=pad_heads(args.k, pad[0]), v=pad_heads(args.v, pad[1]), out=None,
              attn_scale=d_qk ** -0.5 if args.attn_scale is None else args.attn_scale)  # fmt: skip
    result = fwd(**kw)
    out = _dense(result[0], d_v)
    if args.out is not None:
        out = args.out.copy_(out)
    return (out, *result[1:])


def padded_bwd(pad: tuple[int, int], args: Any, bwd: Callable[..., Any]) -> Any:
    """``fused_attn_bwd`` (``bwd``) of a call with head dims not a multiple of 8, on zero-padded
    copies of q, k, v, O and dO; dQ, dK and dV sliced back to the caller's head dims."""
    d_qk, d_v = args.q.shape[-1], args.v.shape[-1]
    kw = args._asdict()
    kw.update(q=pad_heads(args.q, pad[0]), k=pad_heads(args.k, pad[0]), v=pad_heads(args.v, pad[1]),
              o=pad_heads(args.o, pad[1]), d_o=pad_heads(args.d_o, pad[1]),
              attn_scale=d_qk ** -0.5 if args.attn_scale is None else args.attn_scale)  # fmt: skip
    dq, dk, dv, *rest = bwd(**kw)
    return [_dense(dq, d_qk), _dense(dk, d_qk), _dense(dv, d_v), *rest]


def as_padding_mask(cfg: AttnConfig) -> Optional[AttnConfig]:
    """The padding-mask form of a dense call whose bottom-right mask leaves query rows without
    a key (``sq > skv``), or None when the call needs no other form."""
    if cfg.mask.is_padding or cfg.is_ragged or cfg.paged is not None or cfg.empty or cfg.sq <= cfg.skv:
        return None
    if not cfg.bottom_right_diagonal or not (cfg.mask.is_causal or cfg.has_window):
        return None
    mask = _PADDING_VARIANT.get(cfg.mask)
    return None if mask is None else replace(cfg, mask=mask)


def full_lengths(cfg: AttnConfig, device: torch.device) -> list[torch.Tensor]:
    """The constant per-sequence lengths of :func:`as_padding_mask`'s form: ``sq`` and ``skv``
    for each of the ``b`` sequences (int32 ``[b, 1, 1, 1]``)."""
    return kept(lambda: [torch.full((cfg.b, 1, 1, 1), n, dtype=torch.int32, device=device) for n in (cfg.sq, cfg.skv)],
                device)  # fmt: skip
