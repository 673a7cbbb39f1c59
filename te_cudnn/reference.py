"""Unfused attention reference with TransformerEngine / cuDNN semantics.

Everything is computed with plain torch ops in ``compute_dtype`` (fp32 by default), on the
inputs' device, and is differentiable with torch autograd. It is the oracle that fused
kernels are checked against, so it favours clarity over speed.

Conventions: row ``i`` is a query, column ``j`` a key; q is logical ``[b, h, sq, d_qk]``,
k ``[b, hg, skv, d_qk]`` and v ``[b, hg, skv, d_v]`` with any strides.

Attention sinks (TransformerEngine's ``softmax_type``, cuDNN's ``sink_token``) add one extra
logit ``alpha_h`` per query head to every softmax row. It takes part in the normalisation but
carries no value, and it is neither scaled, biased nor masked::

    p_ij  = exp(s_ij) / (exp(alpha_h) + sum_j' exp(s_ij'))      (masked s_ij' = -inf)
    out_i = sum_j p_ij v_j
    lse_i = log(exp(alpha_h) + sum_j exp(s_ij))

``vanilla`` has no sink (the ``exp(alpha_h)`` term is absent), ``off_by_one`` has
``alpha_h = 0`` (denominator ``1 + sum exp``) and ``learnable`` takes ``alpha_h`` from
``softmax_offset``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from te_cudnn.enums import AttnBiasType, AttnMaskType, SoftmaxType

__all__ = ["ReferenceOutput", "Fp8ReferenceOutput", "alibi_slopes", "allowed_mask", "attention_reference", "attention_reference_fp8"]


class ReferenceOutput(NamedTuple):
    """Result of :func:`attention_reference`."""

    out: torch.Tensor
    """``[b, h, sq, d_v]`` in ``compute_dtype``; 0 for rows that attend no key."""
    lse: torch.Tensor
    """``[b, h, sq, 1]`` natural-log logsumexp of the scaled, biased, masked scores
    (cuDNN "Stats"), taken before dropout; ``-inf`` for rows that attend no key. With a sink
    (``softmax_type`` other than vanilla) the sink term is included,
    ``log(exp(alpha_h) + sum_j exp(s_ij))``, so a row that attends no key has ``lse = alpha_h``."""


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes, fp32 ``[num_heads]``, in the cuDNN-frontend convention.

    With ``n = 2**floor(log2(h))`` the first ``n`` heads get ``2**(-8*(i+1)/n)``; the other
    ``h - n`` heads get ``2**(-4*(2*j+1)/n)``, the odd terms of the ``2n`` sequence.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * j + 1) / n) for j in range(num_heads - n)]
    return torch.tensor(slopes, dtype=torch.float32)


def _check_window(window_size: tuple[int, int]) -> tuple[int, int]:
    ok = len(window_size) == 2 and all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size)
    if not ok:
        raise ValueError(f"window_size must be a pair of ints >= -1 (-1 = unbounded), got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _check_seqlens(name: str, seqlens: torch.Tensor | None, limit: int, batch: int | None) -> torch.Tensor:
    if seqlens is None:
        raise ValueError(f"{name} is required for padding masks")
    if seqlens.dim() != 1 or seqlens.dtype == torch.bool or seqlens.is_floating_point() or seqlens.is_complex():
        raise ValueError(
            f"{name} must be a 1-D integer tensor, got shape {tuple(seqlens.shape)} and dtype {seqlens.dtype}"
        )
    if batch is not None and seqlens.shape[0] != batch:
        raise ValueError(f"{name} has {seqlens.shape[0]} entries, expected batch size {batch}")
    if seqlens.numel() and (int(seqlens.min()) < 0 or int(seqlens.max()) > limit):
        raise ValueError(f"{name} values must lie in [0, {limit}], got {seqlens.tolist()}")
    return seqlens


def allowed_mask(
    sq: int,
    skv: int,
    *,
    attn_mask_type: AttnMaskType | str | int,
    window_size: tuple[int, int] = (-1, -1),
    bottom_right_diagonal: bool | None = None,
    seqlens_q: torch.Tensor | None = None,
    seqlens_kv: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean ``[b or 1, 1, sq, skv]`` mask; True where query ``i`` may attend key ``j``.

    The diagonal offset is ``skv_b - sq_b`` when ``bottom_right_diagonal`` (default: True
    iff the mask type is a ``*_bottom_right`` one), else 0; ``sq_b``/``skv_b`` are the
    per-batch ``seqlens_q[b]``/``seqlens_kv[b]`` for padding masks and ``sq``/``skv``
    otherwise (seqlens are ignored for non-padding masks). Starting from all True:

    * causal types keep ``j <= i + offset``;
    * ``window_size=(left, right)`` keeps ``i + offset - left <= j <= i + offset + right``,
      ``-1`` meaning unbounded on that side (causal == window with ``right = 0``);
    * padding types keep ``i < seqlens_q[b]`` and ``j < seqlens_kv[b]``.

    ``arbitrary`` is not supported and raises ``ValueError``, as does a padding type without
    seqlens.
    """
    mask_type = AttnMaskType.coerce(attn_mask_type, argument="attn_mask_type")
    if mask_type == AttnMaskType.arbitrary:
        raise ValueError("attn_mask_type='arbitrary' is not supported by the reference")
    left, right = _check_window(window_size)
    if bottom_right_diagonal is None:
        bottom_right_diagonal = mask_type.is_bottom_right
    if device is None:
        device = seqlens_q.device if seqlens_q is not None else "cpu"

    i = torch.arange(sq, device=device).view(1, 1, sq, 1)
    j = torch.arange(skv, device=device).view(1, 1, 1, skv)
    allowed = torch.ones(1, 1, sq, skv, dtype=torch.bool, device=device)
    if mask_type.is_padding:
        seqlens_q = _check_seqlens("seqlens_q", seqlens_q, sq, None)
        seqlens_kv = _check_seqlens("seqlens_kv", seqlens_kv, skv, seqlens_q.shape[0])
        sq_b = seqlens_q.to(device=device, dtype=torch.long).view(-1, 1, 1, 1)
        skv_b = seqlens_kv.to(device=device, dtype=torch.long).view(-1, 1, 1, 1)
        allowed = allowed & (i < sq_b) & (j < skv_b)
        offset: torch.Tensor | int = skv_b - sq_b if bottom_right_diagonal else 0
    else:
        offset = skv - sq if bottom_right_diagonal else 0

    diag = i + offset  # the key aligned with query i
    if mask_type.is_causal:
        allowed = allowed & (j <= diag)
    if left >= 0:
        allowed = allowed & (j >= diag - left)
    if right >= 0:
        allowed = allowed & (j <= diag + right)
    return allowed


def _sink_logits(
    softmax_type: SoftmaxType | str | int,
    softmax_offset: torch.Tensor | None,
    num_heads: int,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """The per-head sink logit ``alpha`` as ``[1, h, 1, 1]`` in ``dtype`` (differentiable in
    ``softmax_offset``), or None for a vanilla softmax, which has no sink."""
    kind = SoftmaxType.coerce(softmax_type, argument="softmax_type")
    if kind == SoftmaxType.vanilla:
        if softmax_offset is not None:
            raise ValueError("softmax_offset must be None when softmax_type='vanilla' (a vanilla softmax has no sink)")
        return None
    if softmax_offset is None:
        if kind == SoftmaxType.learnable:
            raise ValueError("softmax_offset is required when softmax_type='learnable'")
        return torch.zeros(1, num_heads, 1, 1, dtype=dtype, device=device)  # off_by_one: alpha = 0
    if not isinstance(softmax_offset, torch.Tensor) or not softmax_offset.is_floating_point():
        got = softmax_offset.dtype if isinstance(softmax_offset, torch.Tensor) else type(softmax_offset).__name__
        raise ValueError(f"softmax_offset must be a floating-point tensor, got {got}")
    if tuple(softmax_offset.shape) not in ((num_heads,), (1, num_heads, 1, 1)):
        raise ValueError(
            f"softmax_offset must hold one logit per query head, shape [{num_heads}] or [1, {num_heads}, 1, 1], "
            f"got shape {tuple(softmax_offset.shape)} ({softmax_offset.numel()} elements)"
        )
    return softmax_offset.to(device=device, dtype=dtype).reshape(1, num_heads, 1, 1)


def _softmax_with_sink(scores: torch.Tensor, sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax and logsumexp of ``[scores, sink]`` over the last dim, sink column dropped.

    ``scores`` are masked with ``-inf``; the sink is finite, so every row (fully masked ones
    included) has a positive denominator and the results and gradients have no NaN.
    """
    extended = torch.cat([scores, sink.expand(*scores.shape[:-1], 1)], dim=-1)
    lse = torch.logsumexp(extended, dim=-1, keepdim=True)
    probs = torch.softmax(extended, dim=-1)[..., :-1]
    return probs, lse


def _check_broadcast(name: str, t: torch.Tensor, target: tuple[int, ...]) -> None:
    if t.dim() != len(target) or any(s not in (1, n) for s, n in zip(t.shape, target)):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, which does not broadcast to {target}")


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_scale: float | None = None,
    attn_mask_type: AttnMaskType | str | int = "no_mask",
    attn_bias_type: AttnBiasType | str | int = "no_bias",
    attn_bias: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    bottom_right_diagonal: bool | None = None,
    seqlens_q: torch.Tensor | None = None,
    seqlens_kv: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_keep_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
    softmax_type: SoftmaxType | str | int = "vanilla",
    softmax_offset: torch.Tensor | None = None,
) -> ReferenceOutput:
    """Unfused ``softmax(scores) @ v`` with TE/cuDNN semantics, computed in ``compute_dtype``.

    * GQA/MQA: ``hg`` must divide ``h``; query head ``i`` uses kv head ``i // (h // hg)``.
    * ``attn_scale`` defaults to ``1/sqrt(d_qk)``; ``scores = attn_scale * q @ k^T`` and then
      ``post_scale_bias`` adds ``attn_bias`` (4-D, each dim 1 or full, e.g. ``[1,h,sq,skv]``,
      ``[b,1,sq,skv]``, ``[1,1,1,skv]``); ``pre_scale_bias`` gives
      ``attn_scale * (q @ k^T + attn_bias)``; ``alibi`` adds ``slope_h * (j - i - offset)``
      with ``offset = skv - sq`` if bottom-right aligned else 0 and slopes from
      :func:`alibi_slopes`.
    * Masking follows :func:`allowed_mask`; masked scores are ``-inf``. Rows with no allowed
      key (including padded queries) give output 0 and lse ``-inf`` (``alpha_h`` with a sink,
      below), with no NaN in values or gradients.
    * Attention sinks: ``softmax_type`` (:class:`~te_cudnn.enums.SoftmaxType`, name or int)
      ``vanilla`` (default), ``off_by_one`` or ``learnable``. With a sink each row's softmax
      gets the extra logit ``alpha_h`` of its query head, not scaled, biased or masked, that
      contributes no value: ``p_ij = exp(s_ij) / (exp(alpha_h) + sum_j exp(s_ij))``,
      ``out_i = sum_j p_ij v_j`` and ``lse_i = log(exp(alpha_h) + sum_j exp(s_ij))``. So a row
      with no allowed key gives output 0 and lse ``alpha_h`` (finite). ``softmax_offset`` holds
      ``alpha`` (``[h]`` or ``[1, h, 1, 1]``, floating point): required for ``learnable``,
      optional for ``off_by_one`` (None means zeros, ``1 + sum exp``; a given tensor is used
      as is, as the cuDNN kernel does, and TransformerEngine passes zeros) and must be None
      for ``vanilla``.
    * Dropout (``dropout_p > 0``) needs a boolean ``dropout_keep_mask`` broadcastable to
      ``[b, h, sq, skv]``: ``probs * keep / (1 - dropout_p)``; lse is taken before dropout.
      The keep mask is ignored when ``dropout_p == 0``. With a sink, dropout acts on the
      probabilities of the real keys after the softmax in the same way.

    Differentiable w.r.t. q, k, v, attn_bias and softmax_offset. Bad arguments raise
    ``ValueError``.
    """
    mask_type = AttnMaskType.coerce(attn_mask_type, argument="attn_mask_type")
    bias_type = AttnBiasType.coerce(attn_bias_type, argument="attn_bias_type")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [b, h, s, d], got shape {tuple(t.shape)}")
    b, h, sq, d_qk = q.shape
    _, hg, skv, _ = k.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch sizes differ: q has {b}, k has {k.shape[0]}, v has {v.shape[0]}")
    if k.shape[3] != d_qk:
        raise ValueError(f"k has head dim {k.shape[3]}, but q has {d_qk}")
    if v.shape[1] != hg or v.shape[2] != skv:
        raise ValueError(f"v has {v.shape[1]} heads and {v.shape[2]} keys, but k has {hg} and {skv}")
    if hg == 0 or h % hg:
        raise ValueError(f"k has {hg} heads, which does not divide q's {h} heads")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    if dropout_p > 0.0:
        if dropout_keep_mask is None:
            raise ValueError(f"dropout_keep_mask is required when dropout_p={dropout_p} > 0")
        if dropout_keep_mask.dtype != torch.bool:
            raise ValueError(f"dropout_keep_mask must be a bool tensor, got dtype {dropout_keep_mask.dtype}")
        _check_broadcast("dropout_keep_mask", dropout_keep_mask, (b, h, sq, skv))
    if (attn_bias is not None) != (bias_type in (AttnBiasType.pre_scale_bias, AttnBiasType.post_scale_bias)):
        raise ValueError(
            f"attn_bias must be given exactly when attn_bias_type is pre/post_scale_bias (attn_bias_type={bias_type})"
        )
    if attn_bias is not None:
        _check_broadcast("attn_bias", attn_bias, (b, h, sq, skv))
    if mask_type.is_padding:
        _check_seqlens("seqlens_q", seqlens_q, sq, b)
        _check_seqlens("seqlens_kv", seqlens_kv, skv, b)
    sink = _sink_logits(softmax_type, softmax_offset, h, device=q.device, dtype=compute_dtype)
    if bottom_right_diagonal is None:
        bottom_right_diagonal = mask_type.is_bottom_right
    scale = 1.0 / math.sqrt(d_qk) if attn_scale is None else float(attn_scale)

    qf, kf, vf = (t.to(compute_dtype) for t in (q, k, v))
    if hg != h:
        kf = kf.repeat_interleave(h // hg, dim=1)
        vf = vf.repeat_interleave(h // hg, dim=1)
    scores = qf @ kf.transpose(-2, -1)
    if bias_type == AttnBiasType.pre_scale_bias:
        scores = scale * (scores + attn_bias.to(compute_dtype))
    else:
        scores = scale * scores
    if bias_type == AttnBiasType.post_scale_bias:
        scores = scores + attn_bias.to(compute_dtype)
    elif bias_type == AttnBiasType.alibi:
        offset = skv - sq if bottom_right_diagonal else 0
        i = torch.arange(sq, device=q.device).view(sq, 1)
        j = torch.arange(skv, device=q.device).view(1, skv)
        slopes = alibi_slopes(h).to(device=q.device, dtype=compute_dtype).view(1, h, 1, 1)
        scores = scores + slopes * (j - i - offset).to(compute_dtype)

    allowed = allowed_mask(
        sq, skv, attn_mask_type=mask_type, window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
        seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, device=q.device,
    )
    neg_inf = torch.tensor(float("-inf"), dtype=compute_dtype, device=q.device)
    if sink is not None:
        # The sink column keeps every row's denominator positive: no dummy scores needed.
        probs, lse = _softmax_with_sink(torch.where(allowed, scores, neg_inf), sink)
    else:
        any_allowed = allowed.any(dim=-1, keepdim=True)
        # Fully masked rows get finite dummy scores (0) so softmax/logsumexp and their
        # gradients stay finite; the results are replaced afterwards by torch.where.
        zero = torch.zeros((), dtype=compute_dtype, device=q.device)
        scores = torch.where(allowed, scores, torch.where(any_allowed, neg_inf, zero))
        lse = torch.where(any_allowed, torch.logsumexp(scores, dim=-1, keepdim=True), neg_inf)
        probs = torch.where(any_allowed, torch.softmax(scores, dim=-1), zero)

    if dropout_p > 0.0:
        probs = probs * dropout_keep_mask.to(q.device) / (1.0 - dropout_p)
    return ReferenceOutput(out=probs @ vf, lse=lse)


class Fp8ReferenceOutput(NamedTuple):
    out: torch.Tensor  # dequantized FP8 output, fp32 [b, h, sq, d_v]
    out8: torch.Tensor  # the FP8 output itself
    amax_s: torch.Tensor  # max of softmax(S) before quantization (0-d)
    amax_o: torch.Tensor  # max |O| before quantization (0-d)


def attention_reference_fp8(
    q8: torch.Tensor,
    k8: torch.Tensor,
    v8: torch.Tensor,
    *,
    descale_qkv: torch.Tensor | float,
    scale_s: torch.Tensor | float,
    descale_s: torch.Tensor | float,
    scale_o: torch.Tensor | float,
    attn_scale: float | None = None,
    attn_mask_type: AttnMaskType | str = "no_mask",
    seqlens_q: torch.Tensor | None = None,
    seqlens_kv: torch.Tensor | None = None,
    fmt: torch.dtype = torch.float8_e4m3fn,
    softmax_type: SoftmaxType | str | int = "vanilla",
    softmax_offset: torch.Tensor | None = None,
) -> Fp8ReferenceOutput:
    """FP8 emulation of the fused FP8 forward (delayed scaling): dequantize q, k, v; compute
    softmax(S) in fp32; quantize it with ``scale_s`` (as the kernel does before P·V), dequantize
    with ``descale_s``; O = P·V in fp32, quantized with ``scale_o``. Inputs are logical BHSD FP8
    tensors; masks as :func:`attention_reference`.

    ``softmax_type`` / ``softmax_offset`` add an attention sink exactly as in
    :func:`attention_reference`: the fp32 softmax is taken over the scores plus the per-head
    logit ``alpha_h`` (``P_ij = exp(s_ij) / (exp(alpha_h) + sum_j exp(s_ij))``), and only the
    P of the real keys is quantized (and counted in ``amax_s``) and multiplied by V."""
    q, k, v = (t.float() * descale_qkv for t in (q8, k8, v8))
    h, hg = q.shape[1], k.shape[1]
    sink = _sink_logits(softmax_type, softmax_offset, h, device=q.device, dtype=torch.float32)
    if hg != h:
        k, v = k.repeat_interleave(h // hg, dim=1), v.repeat_interleave(h // hg, dim=1)
    scale = attn_scale if attn_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = scale * q @ k.transpose(-2, -1)
    allowed = allowed_mask(q.shape[2], k.shape[2], attn_mask_type=attn_mask_type, seqlens_q=seqlens_q,
                           seqlens_kv=seqlens_kv, device=q.device)  # fmt: skip
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sink is not None:
        probs, _ = _softmax_with_sink(scores, sink)
    else:
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    fmax = 448.0 if fmt == torch.float8_e4m3fn else 57344.0
    amax_s = probs.amax()
    p8 = (probs * scale_s).clamp(-fmax, fmax).to(fmt).float() * descale_s
    out = p8 @ v
    amax_o = out.abs().amax()
    out8 = (out * scale_o).clamp(-fmax, fmax).to(fmt)
    return Fp8ReferenceOutput(out8.float() / scale_o, out8, amax_s, amax_o)
