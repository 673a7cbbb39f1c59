"""``te_cudnn::fwd`` / ``te_cudnn::bwd`` (``te_cudnn.torch_ops``): their CUDA implementations, which
run the cached plans of :func:`te_cudnn.fused_attn_fwd` / :func:`te_cudnn.fused_attn_bwd` (a call
like an earlier one straight from its prepared launcher), and their fakes. Their autograd and
registration: ``te_cudnn.torch_ops``."""

import torch

from . import prepared as _prepared_calls
from .enums import QKVFormat, QKVLayoutGroup
from .launch import kept
from .launchers import plain_bwd, plain_fwd
from .ops import fused_attn_bwd, fused_attn_fwd
from .policy import token as _policy_token
from .torch_ops_schema import parse_op_config
from .torch_ops_shapes import _BHS, _MAX512, _grad_buffers, _has_dbias, _info, _packed_base, _stats_like

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

