"""``te_cudnn.DotProductAttention``: TransformerEngine's attention module over te_cudnn's plans.

The commonly used part of ``transformer_engine.pytorch.DotProductAttention``, with the same
argument names and meanings; FP8 through an :class:`~te_cudnn.Fp8AttentionMeta`. In eager mode
the module calls the cached plans directly; under ``torch.compile`` and CUDA-graph capture it
goes through te_cudnn's custom operators (no graph break, dropout graph-safe).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Optional, Sequence, Union

import torch
import torch.distributed as dist

from .autograd import AttnOptions, attend, attend_fp8, lean_attention
from .enums import AttnMaskType
from .errors import MisalignedError
from .fp8 import Fp8AttentionMeta
from .lean import LeanDoor, as_is, policy_token, run_inference, wants_grad
from .layouts import get_qkv_layout
from .parallel import context_parallel_attention
from .torch_ops import _is_compiling, use_custom_ops

__all__ = ["DotProductAttention"]

_FORMATS = ("sbhd", "bshd", "thd")
_MASKS = tuple(m.name for m in AttnMaskType)
_BIAS_TYPES = ("no_bias", "post_scale_bias", "alibi")


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(repr(c) for c in choices)}")
    return value


def _window(window_size: Optional[Sequence[int]], mask: str) -> tuple[int, int]:
    """TE's meaning: None is unbounded ((-1, 0) under causal masks)."""
    if window_size is None:
        return (-1, 0) if "causal" in mask else (-1, -1)
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or any(isinstance(w, bool) or not isinstance(w, int) or w < -1 for w in window_size)):  # fmt: skip
        raise ValueError(f"window_size must be None or a (left, right) pair of ints >= -1, got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _padding_masks(attention_mask: Any, s_q: int, s_kv: int, cross: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """cu_seqlens_q, cu_seqlens_kv from TE's padding ``attention_mask``: one bool ``[b, 1, 1, s]``
    tensor (self attention) or a ``(q_mask, kv_mask)`` pair."""
    if isinstance(attention_mask, torch.Tensor) and not cross:
        cu = _cu_seqlens_from_mask(attention_mask, "attention_mask", s_q)
        return cu, cu
    if (not isinstance(attention_mask, (tuple, list)) or len(attention_mask) != 2
            or not all(isinstance(m, torch.Tensor) for m in attention_mask)):  # fmt: skip
        want = "a (q_mask, kv_mask) pair of" if cross else "a bool [b, 1, 1, s] tensor or a (q_mask, kv_mask) pair of"
        raise ValueError(f"attention_mask must be {want} bool [b, 1, 1, s] tensors (True = padding), got "
                         f"{type(attention_mask).__name__}")  # fmt: skip
    return (_cu_seqlens_from_mask(attention_mask[0], "attention_mask[0]", s_q),
            _cu_seqlens_from_mask(attention_mask[1], "attention_mask[1]", s_kv))  # fmt: skip


def _check_fp8_meta(meta: Any) -> Optional[Fp8AttentionMeta]:
    if meta is not None and not isinstance(meta, Fp8AttentionMeta):
        raise TypeError(f"fp8_meta must be a te_cudnn.Fp8AttentionMeta or None, got {type(meta).__name__}")
    return meta


def _cu_seqlens_from_mask(mask: torch.Tensor, name: str, s: Optional[int] = None) -> torch.Tensor:
    """TE's ``get_cu_seqlens``: a padding mask ``[b, 1, 1, s]`` (True = padding, at the end of
    each sequence) to int32 cumulative lengths ``[b + 1]``, on the device (no host sync)."""
    if (not isinstance(mask, torch.Tensor) or mask.layout != torch.strided or mask.dtype != torch.bool
            or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1 or (s is not None and mask.shape[3] != s)):  # fmt: skip
        got = f"{mask.dtype} {list(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a bool [b, 1, 1, {'s' if s is None else s}] padding mask (True = masked "
                         f"out), got {got}")  # fmt: skip
    lengths = (~mask).view(mask.shape[0], mask.shape[3]).sum(dim=1, dtype=torch.int32)
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


_LEAN = LeanDoor()  # every module's repeated calls (te_cudnn.lean)


def _split_heads(h: int, d: int, t: torch.Tensor) -> torch.Tensor:
    """The module's output ``[..., h * d]`` as the graph's ``[..., h, d]``."""
    return t.unflatten(-1, (h, d))


class DotProductAttention(torch.nn.Module):
    """Scaled dot-product attention over cuDNN's fused kernels (TransformerEngine's interface).

    Args:
        num_attention_heads: heads of the query, ``h``.
        kv_channels: head dim ``d`` (or ``(d_qk, d_v)``).
        num_gqa_groups: key/value heads ``hg`` (GQA/MQA); defaults to ``num_attention_heads``.
        attention_dropout: dropout on the attention probabilities (applied in training mode).
        qkv_format: ``"sbhd"`` (TE's default), ``"bshd"`` or ``"thd"``.
        attn_mask_type: ``"causal"`` (default), ``"no_mask"``, ``"padding"``, ``"padding_causal"``,
            ``"causal_bottom_right"``, ``"padding_causal_bottom_right"`` or ``"arbitrary"``.
        window_size: sliding window ``(left, right)``; None is unbounded.
        attention_type: ``"self"`` or ``"cross"``.
        layer_number: accepted for TE compatibility (unused).
        softmax_scale: defaults to ``1 / sqrt(d_qk)``.
        deterministic: bit-reproducible backward (TE reads ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``; so
            does the default here).
        fp8_meta: run attention in FP8 with these scales (:class:`te_cudnn.Fp8AttentionMeta`).
        softmax_type: ``"vanilla"`` (default), ``"off_by_one"`` (an attention sink of logit 0: the
            softmax denominator is ``1 + Σ exp``) or ``"learnable"`` (a per-head sink logit
            ``α_h``: ``exp(α_h) + Σ exp``). For ``"learnable"`` the module owns
            ``softmax_offset``, an fp32 ``nn.Parameter`` of shape ``[h]`` initialised to zeros
            (TransformerEngine's name and initialisation), trained with the model.

    Shapes (``h`` heads, ``hg`` key/value heads): query ``[sq, b, h, d_qk]`` (sbhd),
    ``[b, sq, h, d_qk]`` (bshd) or ``[t_q, h, d_qk]`` (thd); key/value likewise with ``skv`` and
    ``hg``. The output has the heads flattened as TE returns it: ``[sq, b, h * d_v]``,
    ``[b, sq, h * d_v]`` or ``[t_q, h * d_v]``. The equivalent PyTorch computation (bshd)::

        q, k, v = (x.transpose(1, 2) for x in (query, key, value))             # [b, h, s, d]
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=bias_and_mask, dropout_p=p if training else 0.0,
            scale=softmax_scale, enable_gqa=hg != h)                           # causal: top-left
        out = out.transpose(1, 2).reshape(b, sq, h * d_v)

    ``forward(query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None,
    cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None,
    attn_mask_type=None, window_size=None, core_attention_bias_type="no_bias",
    core_attention_bias=None, ...)``: padding masks take either ``cu_seqlens_q/kv`` (int32 ``[b + 1]``)
    or TE's ``attention_mask``: a bool ``[b, 1, 1, s]`` tensor (True = padding; sequences padded
    at the end), or a pair ``(q_mask, kv_mask)`` for cross attention. ``"arbitrary"`` takes a
    bool ``attention_mask`` broadcastable to ``[b, h, sq, skv]`` (True = masked out), applied as an
    additive bias. ``core_attention_bias`` (``post_scale_bias``) is ``[1|b, 1|h, sq, skv]``. THD
    inputs need ``cu_seqlens_q/kv``; without ``max_seqlen_q/kv`` the token count bounds them (no
    host sync; pass the true maxima for the fastest plans). THD views of one packed
    ``[t, 3, h, d]`` buffer are recognised in eager mode; under torch.compile pass separate
    THD tensors (4-d formats take any strides, packed or not, in both modes).
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: Union[int, tuple[int, int]],
        num_gqa_groups: Optional[int] = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: Optional[tuple[int, int]] = None,
        attention_type: str = "self",
        layer_number: Optional[int] = None,
        softmax_scale: Optional[float] = None,
        deterministic: Optional[bool] = None,
        fp8_meta: Optional[Fp8AttentionMeta] = None,
        softmax_type: str = "vanilla",
        cp_group: Any = None,
        cp_comm_type: str = "p2p",
        cp_head_groups: int = 1,
    ) -> None:
        super().__init__()
        for name, value, optional in (("num_attention_heads", num_attention_heads, False),
                                      ("num_gqa_groups", num_gqa_groups, True)):  # fmt: skip
            if (value is not None or not optional) and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int{' or None' if optional else ''}, got {value!r}")
        if isinstance(kv_channels, int) and not isinstance(kv_channels, bool):
            kv_channels = (kv_channels, kv_channels)
        if (not isinstance(kv_channels, (tuple, list)) or len(kv_channels) != 2
                or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in kv_channels)):  # fmt: skip
            raise ValueError(f"kv_channels must be a positive int or a (d_qk, d_v) pair, got {kv_channels!r}")
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups or num_attention_heads
        if num_attention_heads % self.num_gqa_groups:
            raise ValueError(f"num_gqa_groups={num_gqa_groups} must divide num_attention_heads={num_attention_heads}")
        self.hidden_size_per_attention_head_k, self.hidden_size_per_attention_head_v = kv_channels
        if isinstance(attention_dropout, bool) or not isinstance(attention_dropout, (int, float)) or not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {attention_dropout!r}")
        self.attention_dropout = float(attention_dropout)
        self.qkv_format = _check_choice("qkv_format", qkv_format, _FORMATS)
        self.attn_mask_type = _check_choice("attn_mask_type", attn_mask_type, _MASKS)
        self.window_size = _window(window_size, attn_mask_type)
        self.attention_type = _check_choice("attention_type", attention_type, ("self", "cross"))
        self.layer_number = layer_number
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.hidden_size_per_attention_head_k)
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) or not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale must be a finite number or None, got {softmax_scale!r}")
        self.softmax_scale = float(softmax_scale)
        if deterministic is None:
            deterministic = os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1") == "0"
        self.deterministic = bool(deterministic)
        self.fp8_meta = _check_fp8_meta(fp8_meta)
        self.softmax_type = _check_choice("softmax_type", softmax_type, ("vanilla", "off_by_one", "learnable"))
        if self.softmax_type == "learnable":  # TE: Parameter(zeros(h)); the sink logit of each query head
            self.softmax_offset = torch.nn.Parameter(torch.zeros(num_attention_heads, dtype=torch.float32))
        else:
            self.softmax_offset = None  # off_by_one: te_cudnn passes zeros
        self._options: dict[tuple, AttnOptions] = {}
        self.set_context_parallel_group(cp_group, cp_comm_type=cp_comm_type, cp_head_groups=cp_head_groups)

    #: The attributes a call's result depends on besides its arguments (the cached path's key).
    _STATE_ATTRS = frozenset(("training", "qkv_format", "attn_mask_type", "window_size", "softmax_scale",
                              "attention_dropout", "deterministic", "softmax_type", "num_attention_heads",
                              "num_gqa_groups", "attention_type"))  # fmt: skip

    def _state(self) -> tuple:
        state = (self.training, self.qkv_format, self.attn_mask_type, self.window_size, self.softmax_scale,
                 self.attention_dropout, self.deterministic, self.softmax_type, self.attention_type)  # fmt: skip
        self.__dict__["_lean_state"] = state
        return state

    def __setattr__(self, name: str, value: Any) -> None:
        if name in DotProductAttention._STATE_ATTRS:  # .train(), .eval() and user edits: the key is read afresh
            self.__dict__.pop("_lean_state", None)
        super().__setattr__(name, value)

    def set_context_parallel_group(self, cp_group: Any, cp_global_ranks: Any = None, cp_stream: Any = None,
                                   cp_comm_type: str = "p2p", cp_head_groups: int = 1) -> None:  # fmt: skip
        """Split attention's sequence over ``cp_group`` (TransformerEngine's method and argument
        names; ``cp_global_ranks`` and ``cp_stream`` are accepted and not needed: peers come from
        the group, and NCCL overlaps the exchanges with compute on its own stream). ``None`` or
        a group of one rank turns context parallelism off. ``cp_comm_type="a2a+p2p"`` takes
        ``cp_group=[a2a_group, p2p_group]`` (all-to-all inside the first, e.g. one node's GPUs;
        the ring across the second); both of one rank turn it off. Inputs are then each rank's share of
        the sequence (:func:`te_cudnn.parallel.shard`); see
        :func:`te_cudnn.parallel.context_parallel_attention` for what each ``cp_comm_type`` serves.
        ``cp_head_groups`` (beyond TransformerEngine; a2a and p2p) is its ``head_groups``: the
        attention of ``h / cp_head_groups`` heads at a time, for less memory per rank."""
        self.cp_comm_type = _check_choice("cp_comm_type", cp_comm_type, ("p2p", "a2a", "all_gather", "a2a+p2p"))
        if isinstance(cp_head_groups, bool) or not isinstance(cp_head_groups, int) or cp_head_groups < 1:
            raise ValueError(f"cp_head_groups must be a positive int (1: all heads at once), got {cp_head_groups!r}")
        self.cp_head_groups = cp_head_groups
        self.cp_group = None
        if cp_group is None:
            return
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("cp_group needs an initialised torch.distributed process group")
        if self.cp_comm_type == "a2a+p2p":  # TE: [a2a_group (intra-node), p2p_group (the ring)]
            if not isinstance(cp_group, (list, tuple)) or len(cp_group) != 2:
                raise ValueError(f"cp_comm_type='a2a+p2p' takes cp_group=[a2a_group, p2p_group], got {cp_group!r}")
            if dist.get_world_size(cp_group[0]) * dist.get_world_size(cp_group[1]) > 1:
                self.cp_group = list(cp_group)
        elif isinstance(cp_group, (list, tuple)):
            raise ValueError(f"a list of groups is for cp_comm_type='a2a+p2p' ([a2a_group, p2p_group]); got "
                             f"cp_comm_type={self.cp_comm_type!r}")  # fmt: skip
        elif dist.get_world_size(cp_group) > 1:
            self.cp_group = cp_group

    def extra_repr(self) -> str:
        return (f"num_attention_heads={self.num_attention_heads}, num_gqa_groups={self.num_gqa_groups}, "
                f"kv_channels=({self.hidden_size_per_attention_head_k}, {self.hidden_size_per_attention_head_v}), "
                f"qkv_format={self.qkv_format!r}, attn_mask_type={self.attn_mask_type!r}, "
                f"window_size={self.window_size}, attention_dropout={self.attention_dropout}, "
                f"softmax_scale={self.softmax_scale:.6g}"
                + (f", softmax_type={self.softmax_type!r}" if self.softmax_type != "vanilla" else ""))  # fmt: skip

    def _sink_offset(self) -> Optional[torch.Tensor]:
        """The learnable sink logits as TE's fp32 [1, h, 1, 1] (a view; a cast if the model was cast)."""
        offset = self.softmax_offset
        if offset is None:
            return None
        offset = offset.view(1, -1, 1, 1)
        return offset if offset.dtype == torch.float32 else offset.float()

    def _opts(self, layout: str, mask: str, bias_type: str, window: tuple[int, int], dropout: float) -> AttnOptions:
        """The call's options, remembered per combination in eager mode (building the dataclass
        costs host time on every call). While compiling they are built afresh: the trace folds them to constants,
        and the compiled code then carries no guards on the cache dict."""
        if _is_compiling():
            return self._make_opts(layout, mask, bias_type, window, dropout)
        key = (layout, mask, bias_type, window, dropout, self.softmax_scale, self.deterministic, self.softmax_type)
        opts = self._options.get(key)
        if opts is None:
            opts = self._options[key] = self._make_opts(layout, mask, bias_type, window, dropout)
        return opts

    def _make_opts(self, layout: str, mask: str, bias_type: str, window: tuple[int, int], dropout: float) -> AttnOptions:
        return AttnOptions(qkv_layout=layout, attn_mask_type=mask, attn_bias_type=bias_type,
                           attn_scale=self.softmax_scale, dropout=dropout, window_size=window,
                           deterministic=self.deterministic, softmax_type=self.softmax_type)  # fmt: skip

    def _check_inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fmt: str) -> None:
        self._check_shapes(q, k, v, fmt)
        for name, t in (("key_layer", k), ("value_layer", v)):
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device} but query_layer is on {q.device}")
            if t.dtype != q.dtype:
                raise TypeError(f"{name}.dtype={t.dtype} differs from query_layer.dtype={q.dtype}")

    def _check_shapes(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fmt: str) -> None:
        dims = 3 if fmt == "thd" else 4
        for name, t, heads, d in (
            ("query_layer", q, self.num_attention_heads, self.hidden_size_per_attention_head_k),
            ("key_layer", k, self.num_gqa_groups, self.hidden_size_per_attention_head_k),
            ("value_layer", v, self.num_gqa_groups, self.hidden_size_per_attention_head_v),
        ):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != dims or t.shape[-2] != heads or t.shape[-1] != d:
                want = {"sbhd": "[s, b, h, d]", "bshd": "[b, s, h, d]", "thd": "[t, h, d]"}[fmt]
                raise ValueError(f"{name} has shape {list(t.shape)}; qkv_format={fmt!r} expects {want} with "
                                 f"{heads} heads of dim {d}")  # fmt: skip

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask: Optional[Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = None,
        qkv_format: Optional[str] = None,
        cu_seqlens_q: Optional[torch.Tensor] = None,
        cu_seqlens_kv: Optional[torch.Tensor] = None,
        max_seqlen_q: Optional[int] = None,
        max_seqlen_kv: Optional[int] = None,
        attn_mask_type: Optional[str] = None,
        window_size: Optional[tuple[int, int]] = None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: Optional[torch.Tensor] = None,
        fast_zero_fill: bool = True,
        cu_seqlens_q_padded: Optional[torch.Tensor] = None,
        cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
        fp8_meta: Optional[Fp8AttentionMeta] = None,
    ) -> torch.Tensor:
        sig = None
        if (attention_mask is None and qkv_format is None and cu_seqlens_q is None and cu_seqlens_kv is None
                and attn_mask_type is None and window_size is None and core_attention_bias is None
                and cu_seqlens_q_padded is None and cu_seqlens_kv_padded is None and fp8_meta is None
                and self.fp8_meta is None and self.cp_group is None and self.softmax_offset is None
                and core_attention_bias_type == "no_bias" and not _is_compiling()):  # fmt: skip
            try:
                q, k, v = query_layer, key_layer, value_layer
                recorded = wants_grad(q, k, v)
                if not recorded or not use_custom_ops():
                    state = self.__dict__.get("_lean_state") or self._state()
                    sig = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
                           q.get_device(), k.get_device(), v.get_device(), policy_token(), state, recorded)  # fmt: skip
                    entry = _LEAN.find(sig)
                    if entry is not None:
                        return lean_attention(entry, q, k, v) if recorded else run_inference(entry, q, k, v)
            except (AttributeError, TypeError, MisalignedError):  # the full path below names what is wrong
                sig = None
        prepared: list = []  # the prepared forward, for the cached path
        out = self._forward(query_layer, key_layer, value_layer, attention_mask, qkv_format, cu_seqlens_q, cu_seqlens_kv,
                            max_seqlen_q, max_seqlen_kv, attn_mask_type, window_size, core_attention_bias_type,
                            core_attention_bias, cu_seqlens_q_padded, cu_seqlens_kv_padded, fp8_meta, prepared)  # fmt: skip
        if sig is not None:
            _LEAN.learn(sig, prepared, out, self._recorded(prepared, out) if sig[-1] else None)
        return out

    def _recorded(self, prepared: list, out: torch.Tensor) -> Optional[tuple]:
        """What a remembered training call's first backward needs (te_cudnn.lean.LeanTraining):
        the options and lengths of the plain call in ``prepared``, and the output's head split."""
        if len(prepared) != 1:
            return None
        cfg = prepared[0].cfg
        opts = self._opts(cfg.layout.name, cfg.mask.name, "no_bias", cfg.window, 0.0)
        return opts, (cfg.sq, cfg.skv), as_is, functools.partial(_split_heads, cfg.h, cfg.d_v)

    def _forward(self, query_layer, key_layer, value_layer, attention_mask, qkv_format, cu_seqlens_q, cu_seqlens_kv,
                 max_seqlen_q, max_seqlen_kv, attn_mask_type, window_size, core_attention_bias_type, core_attention_bias,
                 cu_seqlens_q_padded, cu_seqlens_kv_padded, fp8_meta, prepared: list) -> torch.Tensor:  # fmt: skip
        fmt = self.qkv_format if qkv_format is None else _check_choice("qkv_format", qkv_format, _FORMATS)
        mask = self.attn_mask_type if attn_mask_type is None else _check_choice("attn_mask_type", attn_mask_type, _MASKS)
        window = self.window_size if window_size is None and attn_mask_type is None else _window(window_size, mask)
        bias_type = _check_choice("core_attention_bias_type", core_attention_bias_type, _BIAS_TYPES)
        q, k, v = query_layer, key_layer, value_layer
        self._check_inputs(q, k, v, fmt)
        bias = core_attention_bias
        if (bias is None) != (bias_type != "post_scale_bias"):
            raise ValueError(f"core_attention_bias_type={bias_type!r} and core_attention_bias="
                             f"{'None' if bias is None else 'a tensor'} disagree (post_scale_bias needs the tensor)")  # fmt: skip
        if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 4):
            raise ValueError(f"core_attention_bias must be a 4-d [1|b, 1|h, sq, skv] tensor, got "
                             f"{list(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")  # fmt: skip
        if mask == "arbitrary":  # a user mask (True = masked out) becomes an additive bias
            if fmt == "thd":
                raise ValueError("attn_mask_type='arbitrary' is not supported with qkv_format='thd'")
            if bias_type == "alibi":
                raise ValueError("attn_mask_type='arbitrary' becomes a post-scale bias, which cannot be combined "
                                 "with core_attention_bias_type='alibi'")  # fmt: skip
            if q.dtype not in (torch.float16, torch.bfloat16):
                raise TypeError(f"attn_mask_type='arbitrary' needs float16 or bfloat16 query_layer, got {q.dtype}")
            s_dim = 0 if fmt == "sbhd" else 1
            b, h, sq, skv = q.shape[1 - s_dim], q.shape[2], q.shape[s_dim], k.shape[s_dim]
            if (not isinstance(attention_mask, torch.Tensor) or attention_mask.layout != torch.strided
                    or attention_mask.dtype != torch.bool or attention_mask.dim() != 4
                    or any(n not in (1, full) for n, full in zip(attention_mask.shape, (b, h, sq, skv)))):  # fmt: skip
                got = (f"{attention_mask.dtype} {list(attention_mask.shape)}" if isinstance(attention_mask, torch.Tensor)
                       else type(attention_mask).__name__)  # fmt: skip
                raise ValueError(f"attn_mask_type='arbitrary' needs a bool attention_mask of shape [1|{b}, 1|{h}, 1|{sq}, "
                                 f"1|{skv}] (True = masked out), got {got}")  # fmt: skip
            full = attention_mask.expand(attention_mask.shape[0], attention_mask.shape[1], sq, skv)
            if bias is not None and any(n not in (1, f) for n, f in zip(bias.shape, (b, h, sq, skv))):
                raise ValueError(f"core_attention_bias has shape {list(bias.shape)}; expected [1|{b}, 1|{h}, {sq}, {skv}]")
            # the dtype's lowest value, not -inf: a row with every key masked stays finite (uniform weights)
            masked = torch.zeros(full.shape, dtype=q.dtype, device=q.device).masked_fill(full, torch.finfo(q.dtype).min)
            bias = masked if bias is None else bias + masked
            bias_type, mask, attention_mask = "post_scale_bias", "no_mask", None
        if "padding" in mask and fmt != "thd" and cu_seqlens_q is None:
            if attention_mask is None:
                raise ValueError(f"attn_mask_type={mask!r} needs attention_mask or cu_seqlens_q/cu_seqlens_kv")
            s_dim = 0 if fmt == "sbhd" else 1
            cu_seqlens_q, cu_seqlens_kv = _padding_masks(attention_mask, q.shape[s_dim], k.shape[s_dim],
                                                         self.attention_type == "cross")  # fmt: skip
        elif attention_mask is not None and fmt == "thd":
            raise ValueError("qkv_format='thd' takes its lengths from cu_seqlens_q/kv; attention_mask is not used")
        elif attention_mask is not None and "padding" not in mask:
            raise ValueError(f"attention_mask was given but attn_mask_type={mask!r} does not use it "
                             "(use a padding mask type or 'arbitrary')")  # fmt: skip
        if cu_seqlens_kv is None and self.attention_type == "self":
            cu_seqlens_kv = cu_seqlens_q
        if fmt == "thd":
            if cu_seqlens_q is None or cu_seqlens_kv is None:
                raise ValueError("qkv_format='thd' needs cu_seqlens_q and cu_seqlens_kv (int32 [b + 1])")
            if "padding" not in mask:  # TE: THD is variable-length, so its masks are padding masks
                mask = "padding" if mask == "no_mask" else "padding_" + mask
            max_sq = q.shape[0] if max_seqlen_q is None else max_seqlen_q
            max_skv = k.shape[0] if max_seqlen_kv is None else max_seqlen_kv
        else:
            s_dim = 0 if fmt == "sbhd" else 1
            max_sq, max_skv = q.shape[s_dim], k.shape[s_dim]
        layout = f"{fmt}_{fmt}_{fmt}"  # separate tensors with any strides cuDNN reads: no copies
        if fmt == "thd" and not _is_compiling():  # THD views of one packed buffer carry their own layout name
            layout = get_qkv_layout(q, k, v, "thd")
        dropout = self.attention_dropout if self.training else 0.0
        meta = _check_fp8_meta(fp8_meta) if fp8_meta is not None else self.fp8_meta
        if self.cp_group is not None:
            out = context_parallel_attention(
                q, k, v, self.cp_group, self.cp_comm_type, qkv_format=fmt, attn_mask_type=mask,
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_q_padded=cu_seqlens_q_padded,
                cu_seqlens_kv_padded=cu_seqlens_kv_padded, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
                attn_scale=self.softmax_scale, dropout=dropout, deterministic=self.deterministic, window_size=window,
                attn_bias=bias, attn_bias_type=bias_type, softmax_type=self.softmax_type,
                softmax_offset=self._sink_offset(), fp8_meta=meta, is_training=self.training or torch.is_grad_enabled(),
                head_groups=self.cp_head_groups,
            )  # fmt: skip
            return out.view(*out.shape[:-2], out.shape[-2] * out.shape[-1])
        if meta is not None:
            if dropout or bias is not None or bias_type != "no_bias" or window != _window(None, mask):
                raise ValueError("FP8 attention (fp8_meta) takes no dropout, bias or sliding window; set "
                                 "attention_dropout=0 (or eval()), core_attention_bias_type='no_bias' and "
                                 "window_size=None")  # fmt: skip
            if cu_seqlens_q_padded is not None or cu_seqlens_kv_padded is not None:
                raise ValueError("FP8 attention (fp8_meta) takes no cu_seqlens_q_padded / cu_seqlens_kv_padded")
            if q.dtype not in (torch.float16, torch.bfloat16):
                raise TypeError(f"FP8 attention (fp8_meta) casts float16 or bfloat16 inputs to FP8; query_layer is "
                                f"{q.dtype}")  # fmt: skip
            if self.softmax_type != "vanilla":
                raise ValueError(f"FP8 attention (fp8_meta) with softmax_type={self.softmax_type!r}: the module's FP8 "
                                 "path takes no attention sinks (cuDNN serves FP8 sinks from 9.21; call "
                                 "te_cudnn.fused_attn_fwd with FP8 tensors and softmax_offset there)")  # fmt: skip
            opts = self._opts(layout, mask, "no_bias", window, 0.0)
            out = attend_fp8(q, k, v, meta, cu_seqlens_q, cu_seqlens_kv, max_sq, max_skv, opts)
        else:
            opts = self._opts(layout, mask, bias_type, window, dropout)
            is_training = self.training or torch.is_grad_enabled()  # stats for a backward whenever one can follow
            out = attend(q, k, v, bias, cu_seqlens_q, cu_seqlens_kv, max_sq, max_skv, is_training, None, opts,
                         cu_seqlens_q_padded, cu_seqlens_kv_padded, softmax_offset=self._sink_offset(),
                         _prepared=prepared)  # fmt: skip
        return out.view(*out.shape[:-2], out.shape[-2] * out.shape[-1])
