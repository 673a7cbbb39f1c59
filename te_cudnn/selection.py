"""Which sub-backend would serve a configuration, and why the others decline, without a call:
:func:`explain` and TransformerEngine's :func:`get_fused_attn_backend`. They describe the
configuration from its sizes (no tensors), apply the forms te_cudnn serves a call in
(te_cudnn.served) and ask the backend policy in force, logging nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from . import policy as _policy
from .backends import BY_ENUM, Direction
from .config import AttnConfig, _value, describe_shapes
from .enums import FusedAttnBackend
from .runtime import RuntimeEnv, current_env
from .served import as_padding_mask, head_pad


@dataclass(frozen=True)
class Explanation:
    """Which sub-backend serves a configuration and why the others decline."""

    backend: FusedAttnBackend
    reasons: dict[str, list[str]]  # sub-backend name -> reasons (empty = supported)
    config: AttnConfig
    env: RuntimeEnv
    served_as: Optional[str] = None  # the form the call runs in, where cuDNN declines the one it comes in

    @property
    def empty(self) -> bool:
        """A zero-size configuration: the functions answer it without cuDNN (te_cudnn.empty)."""
        return self.config.empty

    def __str__(self) -> str:
        lines = [f"{self.config.summary()}", f"on {self.env.describe()}", f"-> {self.backend.name}"]
        if self.served_as:
            lines.append(f"   (served {self.served_as})")
        if self.empty:
            lines.append("   (an empty call: zero-size results without a cuDNN call; no graph is built)")
        for name, why in self.reasons.items():
            lines.append(f"  {name}: " + ("supported" if not why else "declined"))
            lines.extend(f"    - {r}" for r in why)
        return "\n".join(lines)


def explain(
    is_training: bool,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    qkv_layout: Any,
    attn_bias_type: Any,
    attn_mask_type: Any,
    softmax_type: Any,
    dropout: float,
    num_attn_heads: int,
    num_gqa_groups: int,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    head_dim_qk: int,
    head_dim_v: int,
    window_size_left: int = -1,
    window_size_right: int = -1,
    return_max_logit: bool = False,
    cuda_graph: bool = False,
    deterministic: bool = False,
    *,
    batch_size: int = 1,
    bias_shape: Optional[Sequence[int]] = None,
    env: Optional[RuntimeEnv] = None,
) -> Explanation:
    """Every sub-backend's reasons for declining a configuration (arguments as
    :func:`get_fused_attn_backend`). ``env`` defaults to the current GPU; without one, rules
    that depend on the GPU or cuDNN version are not checked (pass ``runtime.HOPPER_CUDNN_919``
    to check against the measured Hopper machine)."""
    for name, value in (("q_dtype", q_dtype), ("kv_dtype", kv_dtype)):
        if not isinstance(value, torch.dtype):
            raise TypeError(f"{name} must be a torch.dtype, got {_value(value)}")
    if q_dtype != kv_dtype:
        raise TypeError(f"q_dtype={q_dtype} differs from kv_dtype={kv_dtype}")
    for name, value in (("return_max_logit", return_max_logit), ("cuda_graph", cuda_graph)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {_value(value)}")
    shapes = dict(
        is_training=is_training, dtype=q_dtype, qkv_layout=qkv_layout, attn_bias_type=attn_bias_type,
        attn_mask_type=attn_mask_type, softmax_type=softmax_type, dropout=dropout, num_attn_heads=num_attn_heads,
        num_gqa_groups=num_gqa_groups, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
        head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, window_size=(window_size_left, window_size_right),
        deterministic=deterministic, batch_size=batch_size, bias_shape=bias_shape,
        return_max_logit=return_max_logit, cuda_graph=cuda_graph,
    )  # fmt: skip
    cfg = describe_shapes(**shapes)
    served_as = None  # the form te_cudnn runs the call in, when cuDNN declines the one it comes in (te_cudnn.served)
    pad = head_pad(cfg)
    if pad is not None:
        cfg = describe_shapes(**{**shapes, "head_dim_qk": pad[0], "head_dim_v": pad[1]})
        served_as = f"head dims padded with zero columns to d_qk={pad[0]}, d_v={pad[1]} (q, k, v copied per call)"
    full_form = as_padding_mask(cfg)
    if full_form is not None:
        cfg = full_form
        form = f"as {cfg.mask.name} with full lengths (sq > skv: the first query rows see no key and come back as zeros)"
        served_as = form if served_as is None else f"{served_as}; {form}"
    env = env or current_env()
    policy = _policy.current()  # a te_cudnn.backend_policy context or the environment: forced, forbidden
    per_backend = _policy.explain_config(cfg, env, Direction.FWD, policy)
    serving = [BY_ENUM[b] for b, why in per_backend.items() if not why]
    chosen = _policy.choose(serving, cfg, env, Direction.FWD, policy).enum if serving else FusedAttnBackend.No_Backend
    return Explanation(chosen, {b.name: why for b, why in per_backend.items()}, cfg, env, served_as)


def get_fused_attn_backend(*args: Any, **kwargs: Any) -> FusedAttnBackend:
    """The sub-backend that serves a configuration, or ``FusedAttnBackend.No_Backend``.

    Arguments as TransformerEngine's ``get_fused_attn_backend``: ``(is_training, q_dtype,
    kv_dtype, qkv_layout, attn_bias_type, attn_mask_type, softmax_type, dropout,
    num_attn_heads, num_gqa_groups, max_seqlen_q, max_seqlen_kv, head_dim_qk, head_dim_v,
    window_size_left, window_size_right, return_max_logit, cuda_graph, deterministic)``.
    Use :func:`explain` for the reasons.
    """
    return explain(*args, **kwargs).backend
