"""The first call of a signature (the slow path of ``fused_attn_fwd`` / ``fused_attn_bwd``):
check the arguments, describe the call (te_cudnn.config), choose the form it is served in
(te_cudnn.served), select a sub-backend under the backend policy in force, build the plan key,
the result templates and constant operands, and remember the prepared call under its signature
(te_cudnn.prepared). Runs once per call signature; inside a CUDA-graph capture it raises
CaptureMissError instead.

``a``, the call's arguments, is the record :mod:`te_cudnn.ops` makes of them (``FwdArgs`` /
``BwdArgs``: the public parameters by name).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Optional

import torch

from . import policy as _policy
from .backends import BY_ENUM, Direction
from .config import AttnConfig, _value, check_softmax_offset, describe_bwd, describe_fwd
from .errors import CaptureMissError
from .enums import AttnBiasType, FusedAttnBackend, QKVLayout, QKVLayoutGroup, SoftmaxType
from .layouts import layout_info
from .memo import SigMemo
from .plans import make_key
from .plans.cache import log_plan_outcome as _log_plan_outcome
from .prepared import _Prepared, _bwd_memo, _fwd_memo, _remember, _template
from .rng import zero_rng_state
from .runtime import RuntimeEnv, current_env, frontend_version
from .served import as_padding_mask, full_lengths, head_pad
from .launch import checking_operands as _checking_operands
from .launch import is_capturing as _is_capturing
from .launch import kept as _kept
from .varlen import length_fields as _length_fields
from .varlen import mult_fields as _mult_fields

_log = logging.getLogger("te_cudnn")


def _coerce_backend(value: Any) -> Optional[FusedAttnBackend]:
    if value is None:
        return None
    return FusedAttnBackend.coerce(value, argument="fused_attention_backend")


def _check_result_buffer(name: str, t: Any, shape: tuple, dtype: torch.dtype, q: torch.Tensor) -> None:
    """A caller-provided result must be a contiguous tensor of the result's shape and dtype."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or not t.is_contiguous() or t.device != q.device:
        raise ValueError(
            f"{name} must be a contiguous {str(dtype).removeprefix('torch.')} tensor of shape {list(shape)} on "
            f"{q.device}, got {str(t.dtype).removeprefix('torch.')} {list(t.shape)} stride {tuple(t.stride())} on {t.device}"
        )
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start on a 16-byte boundary")


def _require_cuda(cfg: AttnConfig, q: torch.Tensor) -> RuntimeEnv:
    if cfg.device < 0:
        raise ValueError(
            f"q is on {q.device}; fused attention executes on CUDA devices "
            "(te_cudnn.explain() and the graph builders work without one)"
        )
    env = current_env(cfg.device)
    if env.cudnn_version is None:
        raise ValueError("the cuDNN frontend found no libcudnn; install torch with cuDNN or te_cudnn[cu12]/[cu13]")
    return env


def _check_no_fp8_args(dtype: torch.dtype, q: Optional[torch.Tensor] = None, offsets: Optional[dict] = None,
                       **tensors: Any) -> None:
    """F16 calls take no FP8 scaling tensors; FP8 calls need every one of them, each an fp32
    vector on q's device with a slot at its offset (TE's explicit-tensor FP8 interface)."""
    given = [name for name, t in tensors.items() if t is not None]
    if dtype in (torch.float16, torch.bfloat16):
        if given:
            raise ValueError(f"{', '.join(given)} are FP8 scaling arguments, but q is {str(dtype).removeprefix('torch.')}; "
                             "pass them with float8 q, k, v only (or leave them None)")  # fmt: skip
        return
    for name, t in tensors.items():
        offset = (offsets or {}).get(name, 0)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise TypeError(f"{name}_offset must be an int (the slot of {name} to use), got {_value(offset)}")
        if t is None:
            raise ValueError(f"{name} is required for FP8 attention (fp32 metadata tensor, slot {offset})")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (an fp32 FP8 metadata table), got {_value(t)}")
        if t.dtype != torch.float32 or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-d float32 tensor (an FP8 metadata table), got {t.dtype} {list(t.shape)}")
        if q is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; FP8 scales are read on the device")
        if not 0 <= offset < t.shape[0]:
            raise ValueError(f"{name}_offset={offset} is outside {name} of length {t.shape[0]} (0 <= offset < {t.shape[0]})")


def _head_padded(memo: SigMemo, sig: Optional[tuple], cfg: AttnConfig, pad: tuple[int, int],
                 device: torch.device) -> _Prepared:  # fmt: skip
    """The prepared call of a signature whose head dims are not a multiple of 8: each call runs
    on zero-padded copies of its tensors (te_cudnn.served), prepared under their own signature."""
    _log.debug("%s: head dims padded to %s (tensors copied per call)", cfg.summary(), pad)
    prep = _Prepared(cfg=cfg, backend=None, key=None, out_shape=(), stats_shape=(), device=device,  # type: ignore[arg-type]
                     rng_increment=0, head_pad=pad)  # fmt: skip
    _remember(memo, sig, prep)
    return prep


def _prepare_fwd(sig: tuple, a: Any) -> _Prepared:
    """Slow path of the forward: validate, select, key. Runs once per call signature."""
    if _is_capturing():
        raise CaptureMissError("a forward call signature seen for the first time (shapes, strides or options)")
    layout = QKVLayout.coerce(a.qkv_layout, argument="qkv_layout")
    # the argument, else a te_cudnn.backend_policy context, else the environment (te_cudnn.policy)
    policy = _policy.resolve(_coerce_backend(a.fused_attention_backend))
    forced = policy.force
    cfg = describe_fwd(
        is_training=a.is_training, max_seqlen_q=a.max_seqlen_q, max_seqlen_kv=a.max_seqlen_kv,
        cu_seqlens_q=a.cu_seqlens_q, cu_seqlens_kv=a.cu_seqlens_kv, q=a.q, k=a.k, v=a.v,
        qkv_dtype=a.qkv_dtype, attn_bias=a.attn_bias, attn_scale=a.attn_scale, dropout=a.dropout,
        cu_seqlens_q_padded=a.cu_seqlens_q_padded, cu_seqlens_kv_padded=a.cu_seqlens_kv_padded,
        page_table_k=a.page_table_k, page_table_v=a.page_table_v,
        qkv_layout=layout, attn_bias_type=a.attn_bias_type, attn_mask_type=a.attn_mask_type,
        softmax_type=a.softmax_type, window_size=a.window_size,
        bottom_right_diagonal=a.bottom_right_diagonal, softmax_offset=a.softmax_offset,
        return_max_logit=a.return_max_logit, cuda_graph=a.cuda_graph,
    )  # fmt: skip
    fp8_names = ("d_scale_qkv", "d_scale_s", "q_scale_s", "q_scale_o", "amax_s", "amax_o")
    _check_no_fp8_args(cfg.dtype, a.q, {n: getattr(a, f"{n}_offset") for n in fp8_names}, **{n: getattr(a, n) for n in fp8_names})
    if a.rng_gen is not None and not isinstance(a.rng_gen, torch.Generator):
        raise TypeError(f"rng_gen must be a torch.Generator or None, got {type(a.rng_gen).__name__}")
    if not isinstance(a.softmax_stats, bool):
        raise TypeError(f"softmax_stats must be a bool, got {_value(a.softmax_stats)}")
    if not a.softmax_stats and a.softmax_lse is not None:
        raise ValueError("softmax_lse was given but softmax_stats=False asks for no stats; pass one or the other")
    pad = head_pad(cfg)
    if pad is not None:
        _check_result_buffer("out", a.out, (*a.q.shape[:-1], cfg.d_v), cfg.dtype, a.q)
        _require_cuda(cfg, a.q)
        return _head_padded(_fwd_memo, sig, cfg, pad, a.q.device)
    full_form = as_padding_mask(cfg)  # rows without a key: through the padding-mask graph (te_cudnn.served)
    if full_form is not None:
        cfg = full_form

    def stats_kind(saves_softmax: bool) -> tuple[tuple[int, ...], torch.dtype]:
        if saves_softmax:  # max512: the full softmax S in the io dtype (cuDNN's F16x16 tile order)
            return (cfg.b, cfg.h, cfg.sq, cfg.skv), cfg.dtype
        return ((a.q.shape[0], cfg.h, 1) if cfg.ragged_q else (cfg.b, cfg.h, cfg.sq, 1)), torch.float32

    _check_result_buffer("out", a.out, (*a.q.shape[:-1], cfg.d_v), cfg.dtype, a.q)
    guess = forced is not None and forced != FusedAttnBackend.No_Backend and BY_ENUM[forced].caps.saves_softmax
    _check_result_buffer("softmax_lse", a.softmax_lse, *stats_kind(guess), a.q)  # before any GPU work
    env = _require_cuda(cfg, a.q)
    if cfg.empty:  # no sub-backend runs, so none is asked (their size rules say nothing about nothing); the
        # named one, or the dtype's default, says how far the generator advances and what aux[0] is
        default = FusedAttnBackend.FP8 if cfg.dtype not in (torch.float16, torch.bfloat16) else FusedAttnBackend.F16_arbitrary_seqlen
        backend = BY_ENUM[forced if forced not in (None, FusedAttnBackend.No_Backend) else default]
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("zero-size call %s: answered without cuDNN (aux_ctx_tensors as %s's)", cfg.summary(), backend.name)
    else:
        backend = _policy.select(cfg, env, forced, Direction.FWD, policy=policy)  # logs the choice (INFO)
    stats_shape, stats_dtype = stats_kind(backend.caps.saves_softmax)
    _check_result_buffer("softmax_lse", a.softmax_lse, stats_shape, stats_dtype, a.q)
    plain = not (backend.enum == FusedAttnBackend.FP8 or cfg.mask.is_padding or cfg.is_ragged or cfg.paged is not None
                 or a.attn_bias is not None or backend.caps.saves_softmax or cfg.empty or cfg.has_sink
                 or cfg.return_max_logit or full_form is not None or _checking_operands())  # fmt: skip
    if not a.softmax_stats and plain and backend.caps.drops_stats:  # the shortest path, without stats
        cfg = replace(cfg, writes_stats=False)
    out_shape = (*a.q.shape[:-1], cfg.d_v)
    prep = _Prepared(
        cfg=cfg,
        backend=backend,
        key=make_key(backend.enum, Direction.FWD, cfg, env.cudnn_version, frontend_version()),
        out_shape=out_shape,
        stats_shape=stats_shape,
        device=a.q.device,
        rng_increment=backend.rng_elts_per_thread(cfg) if cfg.has_dropout else 0,
        out_like_q=cfg.d_v == cfg.d_qk and a.q.is_contiguous(),
        out_template=_template(out_shape, cfg.dtype, a.q.device),
        stats_template=_template(stats_shape, stats_dtype, a.q.device) if cfg.writes_stats else None,
        varlen=cfg.mask.is_padding or cfg.is_ragged,
        fp8=backend.enum == FusedAttnBackend.FP8,
        softmax_aux=backend.caps.saves_softmax,
        **_mult_fields(cfg, a.q.device),
    )
    prep.zero_rng = zero_rng_state(prep.device)
    prep.empty = cfg.empty
    prep.cu_len = None if cfg.ragged_q and cfg.ragged_kv else cfg.b + 1
    _length_fields(prep)  # fill_out: True until the plan's engine is known
    if full_form is not None:  # constant lengths, bound like max512's; O zero-filled (rows without a key)
        prep.varlen = False
        prep.full_lens = full_lengths(cfg, prep.device)
    prep.plain = plain
    if cfg.has_sink:  # off_by_one without an offset: zeros (TE's DotProductAttention passes zeros too)
        prep.zero_sink = _kept(lambda: torch.zeros((1, cfg.h, 1, 1), dtype=torch.float32, device=prep.device), prep.device)
    if cfg.bias_copy:
        _log.debug("attn_bias %s stride %s (data_ptr %% 16 = %d) cannot be read by cuDNN in place: each call copies it "
                   "into an aligned buffer with strides %s", list(cfg.bias_shape), tuple(a.attn_bias.stride()),
                   a.attn_bias.data_ptr() % 16, cfg.bias_stride)  # fmt: skip
    if full_form is None:
        prep.full_lens = _full_lens(cfg, prep)
    prep.zero_stats = prep.softmax_aux and cfg.mask.is_causal
    if not cfg.empty:
        _log_plan_outcome(prep.key)  # DEBUG: a hit, or built / loaded at the first launch (then INFO)
    _remember(_fwd_memo, sig, prep)
    return prep


def _full_lens(cfg: AttnConfig, prep: _Prepared) -> Optional[list]:
    """The max512 graphs always carry the length mask of TE's pattern; they get sq and skv."""
    if not prep.softmax_aux:
        return None
    return full_lengths(cfg, prep.device)


def _prepare_bwd(sig: tuple, a: Any) -> _Prepared:
    if _is_capturing():
        raise CaptureMissError("a backward call signature seen for the first time (shapes, strides or options)")
    layout = QKVLayout.coerce(a.qkv_layout, argument="qkv_layout")
    forced = _coerce_backend(a.fused_attention_backend)
    aux = a.aux_ctx_tensors
    if not isinstance(aux, (list, tuple)) or len(aux) < 2:
        raise ValueError(
            "aux_ctx_tensors must be the list fused_attn_fwd returned ([softmax_stats, rng_state, (bias)]), got "
            + ("None" if aux is None else f"a {type(aux).__name__} of length {len(aux)}" if isinstance(aux, (list, tuple))
               else f"a {type(aux).__name__}")
        )
    bias_type = AttnBiasType.coerce(a.attn_bias_type, argument="attn_bias_type")
    needs_bias = bias_type in (AttnBiasType.post_scale_bias, AttnBiasType.pre_scale_bias)
    if needs_bias and len(aux) < 3:
        raise ValueError(
            f"aux_ctx_tensors must hold [softmax_stats, rng_state, bias] for attn_bias_type={bias_type.name} "
            f"(the forward appends the bias); got {len(aux)} tensor(s)"
        )
    softmax = SoftmaxType.coerce(a.softmax_type, argument="softmax_type")
    sink_at = 2 + needs_bias  # TE 2.x: aux_ctx_tensors = [stats, rng_state, (bias), (softmax_offset)]
    if softmax != SoftmaxType.vanilla and len(aux) <= sink_at:
        raise ValueError(
            f"aux_ctx_tensors must hold the softmax_offset at index {sink_at} for softmax_type={softmax.name} (the "
            f"forward appends it); got {len(aux)} tensor(s)"
        )
    if softmax != SoftmaxType.vanilla and isinstance(a.q, torch.Tensor) and a.q.dim() >= 3:
        check_softmax_offset(softmax, aux[sink_at], a.q.shape[-2], a.q, f"aux_ctx_tensors[{sink_at}] (softmax_offset)")
    fwd = describe_fwd(
        is_training=True, max_seqlen_q=a.max_seqlen_q, max_seqlen_kv=a.max_seqlen_kv,
        cu_seqlens_q=a.cu_seqlens_q, cu_seqlens_kv=a.cu_seqlens_kv, q=a.q, k=a.k, v=a.v,
        softmax_offset=aux[sink_at] if softmax != SoftmaxType.vanilla else None,
        qkv_dtype=a.qkv_dtype, attn_bias=aux[2] if needs_bias and len(aux) > 2 else None,
        attn_scale=a.attn_scale, dropout=a.dropout, qkv_layout=layout, attn_bias_type=bias_type,
        cu_seqlens_q_padded=a.cu_seqlens_q_padded, cu_seqlens_kv_padded=a.cu_seqlens_kv_padded,
        attn_mask_type=a.attn_mask_type, softmax_type=a.softmax_type, window_size=a.window_size,
        bottom_right_diagonal=a.bottom_right_diagonal, cuda_graph=a.cuda_graph,
    )  # fmt: skip
    cfg, *_ = describe_bwd(fwd, q=a.q, o=a.o, d_o=a.d_o, aux_ctx_tensors=aux, deterministic=a.deterministic)
    fp8_names = ("d_scale_qkv", "d_scale_s", "d_scale_o", "d_scale_do", "d_scale_dp", "q_scale_s", "q_scale_dp",
                 "q_scale_dqkv", "amax_dp", "amax_dqkv")  # fmt: skip
    _check_no_fp8_args(cfg.dtype, a.q, {n: getattr(a, f"{n}_offset") for n in fp8_names}, **{n: getattr(a, n) for n in fp8_names})
    env = _require_cuda(cfg, a.q)
    pad = head_pad(cfg)
    if pad is not None:
        return _head_padded(_bwd_memo, sig, cfg, pad, a.q.device)
    full_form = as_padding_mask(cfg)  # rows without a key: through the padding-mask graph (te_cudnn.served)
    if full_form is not None:
        cfg = full_form
    if cfg.empty:  # nothing to differentiate: zeros, whichever sub-backend the forward's aux came from
        prep = _Prepared(cfg=cfg, backend=None, key=None, out_shape=(), stats_shape=(), device=a.q.device,  # type: ignore[arg-type]
                         rng_increment=0, fp8=cfg.dtype not in (torch.float16, torch.bfloat16), empty=True)  # fmt: skip
        _remember(_bwd_memo, sig, prep)
        return prep
    backend = _policy.select(cfg, env, forced, Direction.BWD)  # under the policy in force; logs the choice (INFO)
    prep = _Prepared(
        cfg=cfg,
        backend=backend,
        key=make_key(backend.enum, Direction.BWD, cfg, env.cudnn_version, frontend_version()),
        out_shape=(),
        stats_shape=(cfg.b, cfg.h, cfg.sq, 1),
        device=a.q.device,
        rng_increment=0,
        varlen=cfg.mask.is_padding or cfg.is_ragged,
        fp8=backend.enum == FusedAttnBackend.FP8,
        softmax_aux=backend.caps.saves_softmax,
        **_mult_fields(cfg, a.q.device),
    )
    prep.cu_len = None if cfg.ragged_q and cfg.ragged_kv else cfg.b + 1
    _length_fields(prep)  # the forward's lengths
    prep.full_lens = _full_lens(cfg, prep)
    if full_form is not None:  # constant lengths; dQ, dK, dV zero-filled (rows without a key)
        prep.varlen = False
        prep.full_lens = full_lengths(cfg, prep.device)
    prep.sink_index = 2 + (cfg.bias_type == AttnBiasType.post_scale_bias)  # aux: [stats, rng, (bias), (offset)]
    prep.plain = not (prep.fp8 or prep.varlen or prep.softmax_aux or cfg.has_sink or cfg.bias_type != AttnBiasType.no_bias
                      or prep.full_lens is not None or _checking_operands())  # fmt: skip
    prep.grads_like_inputs = prep.plain and layout_info(cfg.layout).group == QKVLayoutGroup.L_HD_HD_HD and a.q.dim() == 4
    _log_plan_outcome(prep.key)  # DEBUG: a hit, or built / loaded at the first launch (then INFO)
    _remember(_bwd_memo, sig, prep)
    return prep
