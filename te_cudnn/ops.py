"""``fused_attn_fwd`` / ``fused_attn_bwd``: TransformerEngine's interface over cached cuDNN plans.

Host path: the first call with a given signature (shapes, strides, dtypes, devices and
options) validates it, selects a sub-backend and looks up or builds the plan; the result is
remembered under the raw signature, so later calls do no validation, no selection and no key
construction, only allocation of the results and the launch. Nothing is copied: q, k, v are
handed to cuDNN as strided views, results are allocated in the layout's own format.

Below this module: :mod:`te_cudnn.launch` runs a plan on the caller's stream (workspaces,
launch contexts, pointer arrays) and :mod:`te_cudnn.varlen` computes and caches the per-call
lengths and ragged offsets of variable-length calls.
"""

from __future__ import annotations

import atexit
import inspect
from collections import namedtuple
from array import array
import logging
import math
import threading
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import torch

from . import policy as _policy
from .backends import BY_ENUM, Direction, SubBackend
from .config import AttnConfig, _value, check_softmax_offset, describe_bwd, describe_fwd, describe_shapes
from .empty import empty_bwd, empty_fwd
from .errors import CaptureMissError
from .enums import (
    META_DO,
    META_DP,
    META_DQKV,
    META_O,
    META_QKV,
    META_S,
    AttnBiasType,
    FusedAttnBackend,
    QKVFormat,
    QKVLayout,
    QKVLayoutGroup,
    SoftmaxType,
)
from .layouts import alloc_qkv_grads, layout_info
from .memo import TEMPLATE_BYTES, SigMemo
from .plans import CompiledPlan, handle_for, make_key, plan_cache
from .plans.cache import next_tick
from .plans.cache import log_plan_outcome as _log_plan_outcome
from .plans.split import chosen_split, slice_operand, split_config
from .plans.tune import autotuning
from .policy import token as _policy_token
from .served import as_padding_mask, full_lengths, head_pad, padded_bwd, padded_fwd
from .sink_grad import sink_grad
from .ragged import bucket_batch, bucket_q_seqlen, bucket_seqlen, bucket_tokens
from .row_fill import Lengths, fills_grads, fills_out
from .runtime import RuntimeEnv, current_env, frontend_version
from .launch import BWD_NAMES as _BWD_NAMES
from .launch import checking_operands as _checking_operands
from .launch import FWD_NAMES as _FWD_NAMES
from .launch import execute as _execute
from .launch import is_capturing as _is_capturing
from .launch import kept as _kept
from .launch import launch as _launch
from .launch import misaligned as _misaligned
from .launch import release_workspaces
from .launch import seed_offset as _seed_offset
from .varlen import BatchLengths
from .varlen import buffers_for as _buffers_for
from .varlen import check_runtime_tensors as _check_runtime_tensors
from .varlen import length_fields as _length_fields
from .varlen import mult_fields as _mult_fields
from .varlen import clear as _clear_runtime_buffers

__all__ = ["fused_attn_fwd", "fused_attn_bwd", "get_fused_attn_backend", "explain", "Explanation", "release_workspaces"]

_log = logging.getLogger("te_cudnn")

#: Parameters of :func:`fused_attn_fwd` that are per-call data, never part of its call
#: signature (a repeated signature skips validation; everything else is keyed). What each
#: one's values do, and what is checked on every call.
FWD_PER_CALL = {
    "cu_seqlens_q": "values: the lengths are derived from them on the device by every call (or taken from "
                    "lengths=); whether it is given is keyed; dtype, device and size checked per call where read",
    "cu_seqlens_kv": "as cu_seqlens_q",
    "cu_seqlens_q_padded": "as cu_seqlens_q (token offsets of THD tensors)",
    "cu_seqlens_kv_padded": "as cu_seqlens_q_padded",
    "page_table_k": "values read by every launch; its shape is keyed; dtype, device and contiguity checked per call",
    "page_table_v": "as page_table_k",
    "rng_gen": "the generator dropout draws from, read by every call",
    "rng_state": "dropout's seed and offset, read by every call; dtype, shape and device checked per call",
    "fast_zero_fill": "accepted for TransformerEngine compatibility; results are zero where promised either way",
    "lengths": "a BatchLengths of this call's cu_seqlens tensors, checked by identity on every call",
}

#: Parameters of :func:`fused_attn_bwd` that are per-call data (see :data:`FWD_PER_CALL`).
BWD_PER_CALL = {name: FWD_PER_CALL[name] for name in (
    "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "fast_zero_fill", "lengths")}



@dataclass(eq=False)
class _Prepared:
    """Everything a repeated call needs, computed once per call signature."""

    cfg: AttnConfig
    backend: SubBackend
    key: Any
    out_shape: tuple[int, ...]
    stats_shape: tuple[int, ...]
    device: torch.device
    rng_increment: int
    out_like_q: bool = False  # O can be allocated as torch.empty_like(q) (the cheapest allocation)
    out_template: Optional[torch.Tensor] = None
    stats_template: Optional[torch.Tensor] = None
    varlen: bool = False  # padding mask or THD: per-call lengths/offsets, zero-filled results
    mult_q: Optional[torch.Tensor] = None  # elements per token of q, o, stats (THD q side)
    mult_kv: Optional[torch.Tensor] = None  # elements per token of k, v (THD kv side)
    mult_all: Optional[torch.Tensor] = None  # q, o, stats, k, v (both sides THD)
    fp8: bool = False
    softmax_aux: bool = False  # F16_max512_seqlen: aux[0] is the full softmax S, not fp32 stats
    plain: bool = False  # dense F16, no bias, FP8, paging, sink: the shortest hot path (dropout allowed)
    grads_like_inputs: bool = False  # backward, separate 4-d q/k/v: dq, dk, dv as empty_like(q, k, v)
    zero_rng: Optional[torch.Tensor] = None  # the device's shared all-zero rng_state
    zero_sink: Optional[torch.Tensor] = None  # off_by_one without softmax_offset: zeros [1, h, 1, 1]
    sink_index: int = 2  # backward: where aux_ctx_tensors holds softmax_offset
    full_lens: Optional[list] = None  # max512: int32 [b,1,1,1] lengths sq and skv for its length mask
    zero_stats: bool = False  # max512 causal: S must start zeroed
    empty: bool = False  # a zero-size call: answered by te_cudnn.empty, never by cuDNN
    cu_len: Optional[int] = None  # varlen: the length every cu_seqlens* must have (None: THD, varies per call)
    runtime_kind: tuple = ()  # varlen: what the runtime buffers depend on besides the cu_seqlens (cache key)
    lengths: Lengths = Lengths.AS_GIVEN  # padding masks: the lengths bound (te_cudnn.row_fill)
    one_query: Optional[torch.Tensor] = None  # int32 ones [b,1,1,1]: the query lengths of Lengths.ONE_QUERY
    fill_out: bool = False  # forward: zero O before cuDNN writes it (rows cuDNN may leave unwritten)
    fill_grads: bool = False  # backward: zero dQ, dK, dV likewise
    head_pad: Optional[tuple[int, int]] = None  # head dims not a multiple of 8: run padded (te_cudnn.served)
    plan: Optional[CompiledPlan] = None
    split_plan: Optional[tuple] = None  # FP8 backward run in parts: ((dim, parts), the parts' plan)
    index: int = -1  # device.index, read on every launch (set from device)

    def __post_init__(self) -> None:
        self.index = -1 if self.device.index is None else self.device.index

    def get_plan(self) -> CompiledPlan:
        """The cached plan: a hit when still cached, a lookup or build after eviction."""
        plan = self.plan
        if plan is None or not plan_cache.hit(plan):
            if _is_capturing():
                raise CaptureMissError(f"the plan for {self.cfg.summary()} is not in the plan cache (evicted or never built)")
            backend, cfg, device = self.backend, self.cfg, self.device.index
            with torch.cuda.device(device):  # build / deserialize in the tensors' device's context
                plan = self.plan = plan_cache.get_or_build(
                    self.key, lambda: backend.build(cfg, self.key.direction, handle_for(device))
                )
                if self.varlen:  # the fills this plan's engine needs (te_cudnn.row_fill, te_cudnn.padded_rows)
                    if self.key.direction == Direction.FWD:
                        self.fill_out = fills_out(cfg, backend, plan)
                    else:
                        self.fill_grads = fills_grads(cfg, backend, plan)
        return plan


_fwd_memo = SigMemo()
_bwd_memo = SigMemo()
_memo_lock = threading.Lock()
_zero_rng: dict[int, torch.Tensor] = {}


#: Other caches of prepared calls (the custom ops' launcher caches): forgotten with the memos.
_dependent_caches: list[dict] = []


def forget_prepared() -> None:
    """Forget every prepared call (the memos and the caches that hold their entries), so the
    next calls validate and select again (after the backend-policy environment changed)."""
    with _memo_lock:
        _fwd_memo.clear()
        _bwd_memo.clear()
        for cache in _dependent_caches:
            cache.clear()


def _remember(memo: SigMemo, sig: Optional[tuple], prepared: _Prepared) -> None:
    memo.remember(sig, prepared)


def _meta(t: Optional[torch.Tensor]) -> Any:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


def _sink_sig(t: torch.Tensor) -> tuple:
    """What a call signature keeps of ``softmax_offset`` (checked once per signature)."""
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15)


def _thd_sizes(qs, ks, vs, max_seqlen_q, max_seqlen_kv, cu_q, cu_kv) -> tuple:
    """Signature sizes of a call with THD tensors: only the buckets a plan sees (token counts,
    batch and max sequence lengths vary per batch and are runtime data), plus the equalities
    the first validation relied on."""
    return (
        bucket_tokens(qs[0]) if len(qs) == 3 else qs, qs[1:], bucket_tokens(ks[0]) if len(ks) == 3 else ks, ks[1:],
        vs[1:], ks[0] == vs[0], bucket_q_seqlen(max_seqlen_q) if len(qs) == 3 else max_seqlen_q,
        bucket_seqlen(max_seqlen_kv) if len(ks) == 3 else max_seqlen_kv,
        None if cu_q is None else bucket_batch(cu_q.shape[0] - 1), None if cu_kv is None else cu_kv.shape == cu_q.shape,
        cu_q.shape if cu_q is not None and (len(qs) == 4 or len(ks) == 4) else None,
        # zero-size calls (answered without cuDNN) share no signature with the others of their bucket
        0 in (qs[0], ks[0], max_seqlen_q, max_seqlen_kv) or (cu_q is not None and cu_q.shape[0] < 2),
    )  # fmt: skip


_INT32 = torch.int32
_NEG_INF = float("-inf")


def _aligned_bias(bias: torch.Tensor, cfg: AttnConfig) -> torch.Tensor:
    """The caller's post-scale bias in a buffer cuDNN can read (``cfg.bias_stride``: rows padded
    to 16 bytes). The one place the fused path copies; see AttnConfig.bias_copy."""
    shape, stride = cfg.bias_shape, cfg.bias_stride
    buf = torch.empty(shape[0] * stride[0], dtype=bias.dtype, device=bias.device).as_strided(shape, stride)
    return buf.copy_(bias)


#: Result templates up to this size are real contiguous tensors: ``torch.empty_like`` of a
#: dense tensor skips the memory-format inference a non-dense one needs, which counts on the
#: small shapes whose calls are host-bound. Larger results use an expanded 1-element tensor,
#: which holds no memory. The memos bound what their templates hold (te_cudnn.memo).
_DENSE_TEMPLATE_BYTES = TEMPLATE_BYTES


def _template(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor that ``torch.empty_like`` turns into a new contiguous tensor of ``shape``: a
    contiguous one when small (never read: only its shape, strides, dtype and device matter),
    else a 1-element tensor expanded to ``shape`` (non-dense inputs get contiguous results)."""
    if math.prod(shape) * dtype.itemsize <= _DENSE_TEMPLATE_BYTES:
        return _kept(lambda: torch.empty(tuple(shape), dtype=dtype, device=device), device)
    return _kept(lambda: torch.empty(1, dtype=dtype, device=device), device).expand(*shape)


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


def _fp8_sig(tensors: tuple, offsets: tuple) -> tuple:
    return tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.get_device()) for t in tensors) + offsets


def fp8_fwd_operands(d_scale_qkv, qkv_off, d_scale_s, ds_off, q_scale_s, qs_off, q_scale_o, qo_off, amax_s, as_off,
                     amax_o, ao_off) -> list[torch.Tensor]:  # fmt: skip
    """FP8 forward operands in the graph's order (``backends.fp8.FWD_SCALARS`` + amax_s, amax_o):
    descale_q = descale_k = descale_v = d_scale_qkv[META_QKV]; descale_s = d_scale_s[META_S];
    scale_s = q_scale_s[META_S]; scale_o = q_scale_o[META_O]; amaxes written to
    amax_s[META_S] and amax_o[META_O] (offsets as given)."""
    qkv = _slot(d_scale_qkv, qkv_off)
    return [qkv, qkv, qkv, _slot(d_scale_s, ds_off), _slot(q_scale_s, qs_off), _slot(q_scale_o, qo_off),
            _slot(amax_s, as_off), _slot(amax_o, ao_off)]  # fmt: skip


def fp8_bwd_operands(amax3, d_scale_qkv, qkv_off, d_scale_o, do_off, d_scale_do, ddo_off, d_scale_s, ds_off, d_scale_dp,
                     ddp_off, q_scale_s, qs_off, q_scale_dqkv, qdqkv_off, q_scale_dp, qdp_off, amax_dp, adp_off):  # fmt: skip
    """FP8 backward operands in the graph's order (``backends.fp8.BWD_SCALARS`` + the four
    amaxes): dQ/dK/dV amaxes land in ``amax3`` and are reduced into ``amax_dqkv[META_DQKV]``."""
    scales = fp8_bwd_scales(d_scale_qkv, qkv_off, d_scale_o, do_off, d_scale_do, ddo_off, d_scale_s, ds_off, d_scale_dp,
                            ddp_off, q_scale_s, qs_off, q_scale_dqkv, qdqkv_off, q_scale_dp, qdp_off)  # fmt: skip
    return scales + _fp8_bwd_amaxes(amax3, _slot(amax_dp, adp_off))


def fp8_bwd_scales(d_scale_qkv, qkv_off, d_scale_o, do_off, d_scale_do, ddo_off, d_scale_s, ds_off, d_scale_dp, ddp_off,
                   q_scale_s, qs_off, q_scale_dqkv, qdqkv_off, q_scale_dp, qdp_off) -> list[torch.Tensor]:  # fmt: skip
    """The twelve scaling operands of the FP8 backward (``backends.fp8.BWD_SCALARS``), each a
    [1, 1, 1, 1] view of its metadata slot: what every part of a split backward shares."""
    qkv, dqkv = _slot(d_scale_qkv, qkv_off), _slot(q_scale_dqkv, qdqkv_off)
    return [
        qkv, qkv, qkv, _slot(d_scale_o, do_off), _slot(d_scale_do, ddo_off), _slot(d_scale_s, ds_off),
        _slot(d_scale_dp, ddp_off), _slot(q_scale_s, qs_off), dqkv, dqkv, dqkv, _slot(q_scale_dp, qdp_off),
    ]  # fmt: skip


def _fp8_bwd_amaxes(amax3: torch.Tensor, amax_dp: torch.Tensor) -> list[torch.Tensor]:
    """The backward's amax outputs after its scales: dQ, dK, dV (rows of ``amax3``), then dP."""
    return [amax3[0:1], amax3[1:2], amax3[2:3], amax_dp]


def _slot(table: torch.Tensor, offset: int) -> torch.Tensor:
    """Slot ``offset`` of a 1-d metadata table as the [1, 1, 1, 1] operand a graph declares."""
    return table.as_strided((1, 1, 1, 1), (1, 1, 1, 1), table.storage_offset() + offset * table.stride(0))


_rng_lock = threading.Lock()


def _rng_state(prep: _Prepared, rng_gen: Optional[torch.Generator]) -> torch.Tensor:
    """[seed, offset] for cuDNN's Philox dropout; advances the generator like TE."""
    device = prep.device.index
    if prep.rng_increment == 0:  # no dropout: a shared all-zero state, never written
        state = _zero_rng.get(device)
        if state is None:
            state = _zero_rng[device] = _kept(lambda: torch.zeros(2, dtype=torch.int64, device=prep.device), prep.device)
        return state
    gen = rng_gen if rng_gen is not None else torch.cuda.default_generators[device]
    if _is_capturing():
        return _device_rng_state(prep.device, gen)
    seed = gen.initial_seed()
    with _rng_lock:  # read-and-advance as one step: two threads never draw the same offset
        offset = gen.get_offset()
        gen.set_offset(offset + (prep.rng_increment + 3) // 4 * 4)  # torch keeps offsets 4-aligned
    if seed >= 1 << 63:  # the uint64 seed travels bit-for-bit in an int64 tensor
        seed -= 1 << 64
    return torch.tensor([seed, offset], dtype=torch.int64).to(prep.device, non_blocking=True)


#: Seeds and offsets drawn on the device stay below 2**62 (offsets well away from wrapping).
_DEVICE_RNG_BOUND = 1 << 62


def _device_rng_state(device: torch.device, gen: Optional[torch.Generator] = None) -> torch.Tensor:
    """A fresh [seed, offset] drawn by a torch RNG kernel on the device: graph-safe (inside a
    CUDA-graph capture every replay draws new values from the generator's graph-safe Philox
    state, so every replay gets a fresh dropout mask) and traceable by torch.compile. The
    backward reads the same tensor, so it replays the forward's mask. A generator other than
    the default must be registered with the graph (``CUDAGraph.register_generator_state``)."""
    return torch.randint(0, _DEVICE_RNG_BOUND, (2,), dtype=torch.int64, device=device, generator=gen)


def _check_rng_state(rng_state: Any, device: torch.device) -> None:
    if not isinstance(rng_state, torch.Tensor):
        raise TypeError(f"rng_state must be a torch.Tensor (int64 [2] = Philox seed, offset) or None, got {_value(rng_state)}")
    if rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,) or rng_state.device != device or rng_state.stride() != (1,):
        raise ValueError(f"rng_state must be a contiguous int64 [2] tensor (Philox seed, offset) on {device}, got "
                         f"{rng_state.dtype} {list(rng_state.shape)} stride {tuple(rng_state.stride())} on {rng_state.device}")  # fmt: skip


def _drop_cudnn_objects() -> None:
    """At interpreter exit (before modules are torn down): drop te_cudnn's references to cuDNN
    frontend objects (prepared calls, plans, launch contexts, handles). torch.library keeps the
    custom ops' Python functions, and through them te_cudnn's module state, alive to the end;
    plans still alive when the frontend's native module is finalized make it report "leaked"
    instances on stderr."""
    from .plans import handles  # noqa: PLC0415

    try:
        forget_prepared()
        _clear_runtime_buffers()
        release_workspaces()
        plan_cache.clear()
        handles._idle.clear()
    except Exception:  # pragma: no cover - exiting anyway; never turn an exit into a traceback
        pass


atexit.register(_drop_cudnn_objects)


_empty_like = torch.empty_like


def plain_fwd(prep: _Prepared, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: Optional[torch.Tensor] = None,
              softmax_lse: Optional[torch.Tensor] = None, rng_state: Optional[torch.Tensor] = None,
              rng_gen: Optional[torch.Generator] = None) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
    """The forward's shortest path (``prep.plain``: dense F16, no bias, FP8, paging or sink;
    dropout allowed): allocate O and the stats, read the pointers, launch. The caller has
    matched the call to ``prep`` (fused_attn_fwd by its signature, the custom ops by theirs)."""
    plan = prep.plan
    if plan is None or plan.evicted:
        plan = prep.get_plan()
    plan.hits += 1  # plan_cache.hit, inline (see PlanCache.hit: no lock needed)
    plan.last_used = next_tick()
    # empty_like is torch's cheapest allocation; empty_like of a template (see _template) is a
    # contiguous result of the template's shape.
    o = _empty_like(q if prep.out_like_q else prep.out_template) if out is None else out
    st = _empty_like(prep.stats_template) if softmax_lse is None else softmax_lse
    if prep.rng_increment:
        if rng_state is None:
            rng_state = _rng_state(prep, rng_gen)
        else:
            _check_rng_state(rng_state, prep.device)
    else:
        rng_state = prep.zero_rng
    if plan.launch.mode != "raw":
        _execute(plan, [q, k, v, o, st], prep.device, _FWD_NAMES, rng_state if prep.rng_increment else None)
        return o, [st, rng_state]
    # the builder's uid order: q, k, v, o, stats, (seed, offset)
    pq, pk, pv, po, ps = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), st.data_ptr()
    if (pq | pk | pv | po | ps) & 15:
        _misaligned(q=q, k=k, v=v, out=o, softmax_lse=st)
    ptrs = array("Q", (pq, pk, pv, po, ps))
    if prep.rng_increment:
        seed = rng_state.data_ptr()
        ptrs.append(seed)
        ptrs.append(seed + 8)
    _launch(plan, ptrs, prep.index)
    return o, [st, rng_state]


def plain_bwd(prep: _Prepared, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, d_o: torch.Tensor,
              stats: torch.Tensor, rng_state: torch.Tensor) -> list[Optional[torch.Tensor]]:  # fmt: skip
    """The backward's shortest path (``prep.plain``): allocate dQ, dK, dV in the layout's
    format, read the pointers, launch; ``[dq, dk, dv, None, None]`` as fused_attn_bwd returns."""
    plan = prep.plan
    if plan is None or plan.evicted:
        plan = prep.get_plan()
    plan.hits += 1
    plan.last_used = next_tick()
    if prep.grads_like_inputs:  # separate q, k, v: in their own strides when dense (layouts.alloc_qkv_grads)
        dq, dk, dv = _empty_like(q), _empty_like(k), _empty_like(v)
    else:
        dq, dk, dv = alloc_qkv_grads(prep.cfg.layout, q, k, v)
    dropout = prep.cfg.has_dropout
    if plan.launch.mode != "raw":
        _execute(plan, [q, k, v, o, stats, d_o, dq, dk, dv], prep.device, _BWD_NAMES, rng_state if dropout else None)
        return [dq, dk, dv, None, None]
    # the builder's uid order: q, k, v, o, stats, d_o, dq, dk, dv, (seed, offset)
    pq, pk, pv, po, ps, pdo = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), stats.data_ptr(), d_o.data_ptr()
    if (pq | pk | pv | po | ps | pdo) & 15:
        _misaligned(**dict(zip(_BWD_NAMES, (q, k, v, o, stats, d_o))))
    ptrs = array("Q", (pq, pk, pv, po, ps, pdo, dq.data_ptr(), dk.data_ptr(), dv.data_ptr()))
    if dropout:
        seed = rng_state.data_ptr()
        ptrs.append(seed)
        ptrs.append(seed + 8)
    _launch(plan, ptrs, prep.index)
    return [dq, dk, dv, None, None]


# ================================================================================ forward


def fused_attn_fwd(
    is_training: bool,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_kv: Optional[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qkv_dtype: Optional[torch.dtype],
    fused_attention_backend: Any = None,
    attn_bias: Optional[torch.Tensor] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    page_table_k: Optional[torch.Tensor] = None,
    page_table_v: Optional[torch.Tensor] = None,
    d_scale_qkv: Optional[torch.Tensor] = None,
    d_scale_qkv_offset: int = META_QKV,
    d_scale_s: Optional[torch.Tensor] = None,
    d_scale_s_offset: int = META_S,
    q_scale_s: Optional[torch.Tensor] = None,
    q_scale_s_offset: int = META_S,
    q_scale_o: Optional[torch.Tensor] = None,
    q_scale_o_offset: int = META_O,
    amax_s: Optional[torch.Tensor] = None,
    amax_s_offset: int = META_S,
    amax_o: Optional[torch.Tensor] = None,
    amax_o_offset: int = META_O,
    attn_scale: Optional[float] = None,
    dropout: float = 0.0,
    fast_zero_fill: bool = True,
    qkv_layout: str = "sbh3d",
    attn_bias_type: str = "no_bias",
    attn_mask_type: str = "padding",
    softmax_type: str = "vanilla",
    window_size: Sequence[int] = (-1, -1),
    bottom_right_diagonal: Optional[bool] = None,
    rng_gen: Optional[torch.Generator] = None,
    softmax_offset: Optional[torch.Tensor] = None,
    return_max_logit: bool = False,
    cuda_graph: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
    softmax_lse: Optional[torch.Tensor] = None,
    rng_state: Optional[torch.Tensor] = None,
    lengths: Optional[BatchLengths] = None,
    _prepared: Optional[list] = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Fused scaled-dot-product attention forward (TransformerEngine's ``fused_attn_fwd``).

    Shapes follow ``qkv_layout``: for ``bshd_*`` layouts q is ``[b, sq, h, d_qk]`` and k/v are
    ``[b, skv, hg, d]``; for ``sbhd_*`` the first two dims swap; packed layouts (``sb3hd``,
    ``bsh3d``, ``*_2hd``, ``*_h2d``) take q, k, v as views into one buffer. ``hg`` must divide
    ``h`` (GQA/MQA). Equivalent PyTorch, in BHSD::

        s = attn_scale * q @ k.transpose(-2, -1) + bias   # attn_scale defaults to d_qk ** -0.5
        out = dropout(softmax(mask(s))) @ v

    Returns ``(out, aux_ctx_tensors)``: ``out`` in q's format with head dim ``d_v``;
    ``aux_ctx_tensors = [softmax_lse (fp32 [b, h, sq, 1], natural-log logsumexp), rng_state
    (int64 [2] = Philox seed, offset; a shared all-zero tensor when dropout is off), bias
    (post_scale_bias only)]``, which ``fused_attn_bwd`` takes back.

    ``fused_attention_backend=None`` selects the sub-backend; naming one checks it and never
    falls back. Masks: ``no_mask``, ``causal`` (top-left), ``causal_bottom_right`` and the
    padding masks ``padding``, ``padding_causal``, ``padding_causal_bottom_right`` (TE's
    default), whose per-sequence lengths come from ``cu_seqlens_q/kv`` (int32 ``[b + 1]``,
    checked on every call); THD and paged layouts as in the README. ``window_size=(left, right)``
    lets query i see keys
    ``[i + skv - sq - left, i + skv - sq + right]`` (bottom-right aligned; top-left drops the
    ``skv - sq``); -1 is unbounded. Dropout draws its Philox seed/offset from ``rng_gen``
    (default: the device's CUDA generator), advancing it by 16 as TE does.

    Beyond TransformerEngine: keyword-only ``out`` and ``softmax_lse`` take preallocated,
    contiguous result tensors (for static buffers and CUDA graphs); they are written and
    returned instead of new tensors. Keyword-only ``rng_state`` (int64 ``[2]`` on the device:
    Philox seed, offset) is used for dropout instead of drawing from ``rng_gen``, and returned
    as ``aux_ctx_tensors[1]`` (te_cudnn's custom ops pass one drawn on the device).
    Keyword-only ``lengths`` (a :class:`te_cudnn.BatchLengths` of this call's ``cu_seqlens*``)
    reuses the lengths and offsets that an earlier call of the same batch derived; without it,
    a padding-mask or THD call derives them on the device from ``cu_seqlens*`` on every call,
    so the answer never depends on how the caller wrote them.

    CUDA graphs: inside a capture, dropout draws its seed and offset on the device from
    ``rng_gen``'s graph-safe state, so every replay uses a fresh mask and the backward replays
    the forward's. A call whose plan is not built yet raises :class:`CaptureMissError`: run
    one eager step first.

    Zero-size calls (a batch, sequence or token count of 0, or a ``max_seqlen_*`` of 0) return
    results of the right shapes without calling cuDNN: ``out`` zeros, fp32 stats ``-inf``; the
    generator advances as usual (see :mod:`te_cudnn.empty`). A post-scale bias cuDNN cannot read
    in place (rows not a multiple of 16 bytes, e.g. ``skv = 100`` in bf16, or an unaligned
    start) is copied into an aligned buffer, the one copy on the fused path (logged at debug
    level on the ``te_cudnn`` logger); aligned biases are read where they are.

    Raises:
        TypeError / ValueError: malformed input, naming the argument and its value.
        UnsupportedConfigError: valid input no sub-backend serves; lists every reason.
        GraphBuildError: cuDNN declined to plan the graph.
    """
    try:
        qs, ks, vs = q.shape, k.shape, v.shape
        sizes = (
            (qs, ks, vs, max_seqlen_q, max_seqlen_kv) if len(qs) == 4 and len(ks) == 4
            else _thd_sizes(qs, ks, vs, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv)
        )  # fmt: skip
        extra = None  # the optional tensors, described only when one is given (most calls pass none)
        if not (attn_bias is None and page_table_k is None and page_table_v is None and out is None
                and softmax_lse is None and softmax_offset is None and d_scale_qkv is None and d_scale_s is None
                and q_scale_s is None and q_scale_o is None and amax_s is None and amax_o is None):
            extra = (
                None if attn_bias is None else (attn_bias.shape, attn_bias.stride(), attn_bias.dtype,
                                                attn_bias.get_device(),
                                                attn_bias.data_ptr() & 15),  # an unaligned start is copied (bias_copy)
                None if page_table_k is None else page_table_k.shape, None if page_table_v is None else page_table_v.shape,
                _meta(out), _meta(softmax_lse), None if softmax_offset is None else _sink_sig(softmax_offset),
                None if d_scale_qkv is None and d_scale_s is None and q_scale_s is None and q_scale_o is None
                and amax_s is None and amax_o is None else _fp8_sig(
                    (d_scale_qkv, d_scale_s, q_scale_s, q_scale_o, amax_s, amax_o),
                    (d_scale_qkv_offset, d_scale_s_offset, q_scale_s_offset, q_scale_o_offset, amax_s_offset,
                     amax_o_offset)),
            )  # fmt: skip
        sig: Optional[tuple] = (
            sizes, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(),
            v.get_device(), is_training, qkv_dtype, fused_attention_backend, attn_scale, dropout, qkv_layout,
            attn_bias_type, attn_mask_type, softmax_type,
            window_size if window_size.__class__ is tuple else tuple(window_size), bottom_right_diagonal,
            # cu_seqlens are validated when a signature is first seen; dense non-padding masks never
            # read them, so later calls only note whether they are given (two fewer C calls each).
            cu_seqlens_q is None, cu_seqlens_kv is None, cu_seqlens_q_padded is None and cu_seqlens_kv_padded is None,
            extra, return_max_logit, cuda_graph,
            _policy_token(),  # te_cudnn.backend_policy in force (~20 ns): another policy prepares its own call
        )  # fmt: skip
        prep = _fwd_memo.find(sig)
    except (AttributeError, TypeError, IndexError, RuntimeError):  # not tensors (or 0-d, nested ones; tensors in
        # scalar places), unhashable options: the slow path says what is wrong
        sig = prep = None
    if prep is None:  # the first call of this signature: validate, select, key (the slow path)
        prep = _prepare_fwd(sig, FwdArgs(
            is_training=is_training, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, q=q, k=k, v=v, qkv_dtype=qkv_dtype,
            fused_attention_backend=fused_attention_backend, attn_bias=attn_bias,
            cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            page_table_k=page_table_k, page_table_v=page_table_v, d_scale_qkv=d_scale_qkv,
            d_scale_qkv_offset=d_scale_qkv_offset, d_scale_s=d_scale_s, d_scale_s_offset=d_scale_s_offset,
            q_scale_s=q_scale_s, q_scale_s_offset=q_scale_s_offset, q_scale_o=q_scale_o, q_scale_o_offset=q_scale_o_offset,
            amax_s=amax_s, amax_s_offset=amax_s_offset, amax_o=amax_o, amax_o_offset=amax_o_offset,
            attn_scale=attn_scale, dropout=dropout, fast_zero_fill=fast_zero_fill, qkv_layout=qkv_layout,
            attn_bias_type=attn_bias_type, attn_mask_type=attn_mask_type, softmax_type=softmax_type,
            window_size=window_size, bottom_right_diagonal=bottom_right_diagonal, rng_gen=rng_gen,
            softmax_offset=softmax_offset, return_max_logit=return_max_logit, cuda_graph=cuda_graph, out=out,
            softmax_lse=softmax_lse, rng_state=rng_state, lengths=lengths,
        ))  # fmt: skip
    if _prepared is not None:
        _prepared.append(prep)
    if prep.plain:  # dense F16, no bias, FP8, paging or sink: the shortest path
        return plain_fwd(prep, q, k, v, out, softmax_lse, rng_state, rng_gen)
    if prep.head_pad is not None:  # head dims not a multiple of 8: on padded copies (te_cudnn.served)
        given = locals()
        return padded_fwd(prep.head_pad, FwdArgs(**{n: given[n] for n in FwdArgs._fields}), fused_attn_fwd)
    if prep.empty:
        return _empty_fwd(prep, q, out, softmax_lse, attn_bias, rng_gen, ((amax_s, amax_s_offset), (amax_o, amax_o_offset)),
                          softmax_offset)  # fmt: skip
    fp8 = None
    if prep.fp8:
        fp8 = (d_scale_qkv, d_scale_qkv_offset, d_scale_s, d_scale_s_offset, q_scale_s, q_scale_s_offset, q_scale_o,
               q_scale_o_offset, amax_s, amax_s_offset, amax_o, amax_o_offset)  # fmt: skip
    return general_fwd(prep, q, k, v, out, softmax_lse, rng_state, rng_gen, attn_bias,
                       (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded),
                       page_table_k, page_table_v, softmax_offset, fp8, lengths)  # fmt: skip


def _fwd_results(prep: _Prepared, q: torch.Tensor, out: Optional[torch.Tensor],
                 softmax_lse: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """O and the softmax stats of a forward that is not plain: the caller's (zeroed where cuDNN
    may leave rows unwritten), or new ones in the layout's format."""
    cfg = prep.cfg
    if out is not None:  # caller-provided results (checked when the signature was first seen)
        if prep.fill_out:
            out.zero_()
    elif cfg.ragged_q:  # sizes vary per call; padding tokens stay zero (TE zero-fills THD outputs)
        out = torch.zeros((*q.shape[:-1], cfg.d_v), dtype=q.dtype, device=prep.device)
    elif prep.fill_out:
        out = torch.zeros_like(q if prep.out_like_q else prep.out_template)
    else:
        out = torch.empty_like(q if prep.out_like_q else prep.out_template)
    # padding masks and THD: a query row that sees no key (a sequence without keys, more queries
    # than keys under a bottom-right mask) may be left unwritten by cuDNN; its logsumexp is -inf
    if softmax_lse is not None:
        stats = softmax_lse
        if prep.zero_stats:
            stats.zero_()
        elif prep.varlen:
            stats.fill_(_NEG_INF)
    elif cfg.ragged_q:
        stats = torch.full((q.shape[0], cfg.h, 1), _NEG_INF, dtype=torch.float32, device=prep.device)
    elif prep.varlen and not prep.softmax_aux:
        stats = torch.full_like(prep.stats_template, _NEG_INF)
    elif prep.zero_stats:  # max512 causal: the engine leaves skipped tiles of S unwritten, its backward reads them
        stats = torch.zeros_like(prep.stats_template)
    else:
        stats = torch.empty_like(prep.stats_template)
    return out, stats


def general_fwd(prep: _Prepared, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: Optional[torch.Tensor],
                softmax_lse: Optional[torch.Tensor], rng_state: Optional[torch.Tensor],
                rng_gen: Optional[torch.Generator], attn_bias: Optional[torch.Tensor], cu_seqlens: tuple,
                page_table_k: Optional[torch.Tensor], page_table_v: Optional[torch.Tensor],
                softmax_offset: Optional[torch.Tensor], fp8: Optional[tuple],
                lengths: Optional[BatchLengths] = None) -> tuple:  # fmt: skip
    """Every forward that is not plain (a padding mask, THD, paging, a bias, a sink, the max
    logit, FP8, max512): checks the per-call tensors, allocates the results and binds the
    operands in the order of the sub-backend's graph (``operand_uids``): q, k, v, O, stats,
    then bias, seed and offset, sink (F16), max, the FP8 scaling operands and amaxes, sink
    (FP8), and last the runtime lengths / ragged offsets / page tables.
    ``cu_seqlens``: (q, kv, q_padded, kv_padded); ``fp8``: :func:`fp8_fwd_operands`' arguments."""
    cfg = prep.cfg
    if prep.varlen or page_table_k is not None:
        _check_runtime_tensors(prep, q, cu_seqlens, () if page_table_k is None else (page_table_k, page_table_v))
    if (q.data_ptr() | k.data_ptr() | v.data_ptr() | (0 if out is None else out.data_ptr())
            | (0 if softmax_lse is None else softmax_lse.data_ptr())) & 15:
        _misaligned(q=q, k=k, v=v, out=out, softmax_lse=softmax_lse)
    plan = prep.get_plan()
    out, stats = _fwd_results(prep, q, out, softmax_lse)
    buffers = [q, k, v, out, stats]
    if rng_state is None or not prep.rng_increment:
        rng_state = _rng_state(prep, rng_gen)
    else:
        _check_rng_state(rng_state, prep.device)
    if attn_bias is not None:
        buffers.append(_aligned_bias(attn_bias, cfg) if cfg.bias_copy else attn_bias)
    if prep.rng_increment:
        buffers.extend(_seed_offset(rng_state))
    sink = None
    if cfg.has_sink:  # F16: after the dropout operands
        sink = prep.zero_sink if softmax_offset is None else softmax_offset
        if not prep.fp8:
            buffers.append(sink)
    max_rows = None
    if cfg.return_max_logit:  # shaped as the stats
        max_rows = torch.empty_like(stats)
        buffers.append(max_rows)
    if prep.fp8:
        buffers += fp8_fwd_operands(*fp8)
        if sink is not None:  # FP8: after the scaling operands
            buffers.append(sink)
    if prep.varlen:
        buffers += _buffers_for(prep, cu_seqlens, lengths)
    elif prep.full_lens is not None:
        buffers += prep.full_lens
    if cfg.paged is not None:
        pages = (cfg.b, 1, cfg.paged[2], 1)
        buffers += [page_table_k.view(pages), page_table_v.view(pages)]
    _execute(plan, buffers, prep.device)
    aux = [stats, rng_state]
    if attn_bias is not None:
        aux.append(attn_bias)
    if sink is not None:  # TE 2.x: the offset rides along for the backward
        aux.append(sink)
    if max_rows is not None:
        return out, aux, _max_logit(max_rows, prep, cu_seqlens[0], cu_seqlens[2])
    return out, aux


def _call_record(name: str, fn: Any) -> type:
    """A named tuple of ``fn``'s public parameters, in its order and with no defaults: what the
    slow path of a call reads (:func:`_prepare_fwd` / :func:`_prepare_bwd`). Built from the
    signature, so the two cannot drift apart; having no defaults, a record that leaves a
    parameter out fails when it is made, not later."""
    fields = [n for n in inspect.signature(fn).parameters if not n.startswith("_")]
    record = namedtuple(name, fields)  # type: ignore[misc]  # noqa: PYI024
    record.__doc__ = f"The arguments of one ``{fn.__name__}`` call, by name ({len(fields)} fields)."
    return record


#: One forward call's arguments (see _call_record).
FwdArgs = _call_record("FwdArgs", fused_attn_fwd)


def _public_signature(fn: Any) -> None:
    """Show ``fn``'s signature without its internal parameters (``_prepared``: a list that
    receives the call's prepared description, which the custom ops keep to launch later calls
    of the same kind directly) in ``help()`` and ``inspect.signature``."""
    sig = inspect.signature(fn)
    fn.__signature__ = sig.replace(parameters=[p for n, p in sig.parameters.items() if not n.startswith("_")])


_public_signature(fused_attn_fwd)
_FWD_PARAMETERS = {n: p for n, p in inspect.signature(fused_attn_fwd).parameters.items() if n in FwdArgs._fields}


def fwd_call_args(**given: Any) -> FwdArgs:
    """A forward call's arguments as :func:`_prepare_fwd` reads them: ``fused_attn_fwd``'s
    defaults, then ``given`` (which must name its parameters and give the ones without a
    default). For entry points that prepare a forward of their own (``te_cudnn.decode``)."""
    unknown = given.keys() - _FWD_PARAMETERS.keys()
    missing = [n for n, p in _FWD_PARAMETERS.items() if p.default is inspect.Parameter.empty and n not in given]
    if unknown:
        raise TypeError(f"fused_attn_fwd has no parameters {sorted(unknown)}")
    if missing:
        raise TypeError(f"fused_attn_fwd needs {missing}")
    return FwdArgs(**{**{n: p.default for n, p in _FWD_PARAMETERS.items()}, **given})


def _max_logit(rows: torch.Tensor, prep: _Prepared, cu_q: Optional[torch.Tensor], cu_q_padded: Optional[torch.Tensor]) -> torch.Tensor:
    """TE 2.x's ``max_logit``: the per-head maximum of cuDNN's per-row maxima, ``[h]`` in O's
    dtype. Rows that hold no query (THD padding tokens, padded positions) are left out."""
    cfg = prep.cfg
    if cfg.ragged_q:  # [t, h, 1]: rows of tokens outside every sequence are undefined
        t = rows.shape[0]
        pos = torch.arange(t, device=rows.device, dtype=torch.int32)
        starts = cu_q if cu_q_padded is None else cu_q_padded
        seq = (torch.searchsorted(starts, pos, right=True) - 1).clamp(0, starts.shape[0] - 2)
        valid = pos - starts[seq] < (cu_q[seq + 1] - cu_q[seq])
        rows = rows.masked_fill(~valid.view(t, 1, 1), float("-inf"))
        return rows.amax(dim=(0, 2)).to(cfg.dtype)
    if cfg.mask.is_padding and cu_q is not None:  # [b, h, sq, 1]: positions past each sequence's end
        lens = (cu_q[1:] - cu_q[:-1]).view(-1, 1, 1, 1)
        pos = torch.arange(rows.shape[2], device=rows.device).view(1, 1, -1, 1)
        rows = rows.masked_fill(pos >= lens, float("-inf"))
    return rows.amax(dim=(0, 2, 3)).to(cfg.dtype)


def _empty_fwd(prep: _Prepared, q, out, softmax_lse, attn_bias, rng_gen, amax_slots, softmax_offset) -> tuple:
    """A zero-size forward (see te_cudnn.empty): no cuDNN call, and the generator advances
    as a non-empty call's would."""
    cfg = prep.cfg
    stats_shape = (q.shape[0], cfg.h, 1) if cfg.ragged_q and not prep.softmax_aux else prep.stats_shape
    o, stats = empty_fwd(cfg, q, out, softmax_lse, stats_shape, prep.stats_template.dtype, amax_slots if prep.fp8 else ())
    aux = [stats, _rng_state(prep, rng_gen)]
    if attn_bias is not None:
        aux.append(attn_bias)
    if cfg.has_sink:
        aux.append(prep.zero_sink if softmax_offset is None else softmax_offset)
    if cfg.return_max_logit:  # no logits at all: the maximum of nothing
        return o, aux, torch.full((cfg.h,), float("-inf"), dtype=cfg.dtype, device=q.device)
    return o, aux


def _head_padded(memo: SigMemo, sig: Optional[tuple], cfg: AttnConfig, pad: tuple[int, int],
                 device: torch.device) -> _Prepared:  # fmt: skip
    """The prepared call of a signature whose head dims are not a multiple of 8: each call runs
    on zero-padded copies of its tensors (te_cudnn.served), prepared under their own signature."""
    _log.debug("%s: head dims padded to %s (tensors copied per call)", cfg.summary(), pad)
    prep = _Prepared(cfg=cfg, backend=None, key=None, out_shape=(), stats_shape=(), device=device,  # type: ignore[arg-type]
                     rng_increment=0, head_pad=pad)  # fmt: skip
    _remember(memo, sig, prep)
    return prep


def _prepare_fwd(sig: tuple, a: FwdArgs) -> _Prepared:
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
        stats_template=_template(stats_shape, stats_dtype, a.q.device),
        varlen=cfg.mask.is_padding or cfg.is_ragged,
        fp8=backend.enum == FusedAttnBackend.FP8,
        softmax_aux=backend.caps.saves_softmax,
        **_mult_fields(cfg, a.q.device),
    )
    prep.zero_rng = _rng_state(replace(prep, rng_increment=0), None)
    prep.empty = cfg.empty
    prep.cu_len = None if cfg.ragged_q and cfg.ragged_kv else cfg.b + 1
    _length_fields(prep)  # fill_out: True until the plan's engine is known
    if full_form is not None:  # constant lengths, bound like max512's; O zero-filled (rows without a key)
        prep.varlen = False
        prep.full_lens = full_lengths(cfg, prep.device)
    prep.plain = not (prep.fp8 or prep.varlen or cfg.paged is not None or a.attn_bias is not None
                      or prep.softmax_aux or prep.empty or cfg.has_sink or cfg.return_max_logit
                      or prep.full_lens is not None or _checking_operands())  # fmt: skip
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


# ================================================================================ backward


def fused_attn_bwd(
    max_seqlen_q: int,
    max_seqlen_kv: int,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_kv: Optional[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    d_o: torch.Tensor,
    qkv_dtype: Optional[torch.dtype],
    aux_ctx_tensors: list[torch.Tensor],
    fused_attention_backend: Any = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    d_scale_qkv: Optional[torch.Tensor] = None,
    d_scale_qkv_offset: int = META_QKV,
    d_scale_s: Optional[torch.Tensor] = None,
    d_scale_s_offset: int = META_S,
    d_scale_o: Optional[torch.Tensor] = None,
    d_scale_o_offset: int = META_O,
    d_scale_do: Optional[torch.Tensor] = None,
    d_scale_do_offset: int = META_DO,
    d_scale_dp: Optional[torch.Tensor] = None,
    d_scale_dp_offset: int = META_DP,
    q_scale_s: Optional[torch.Tensor] = None,
    q_scale_s_offset: int = META_S,
    q_scale_dp: Optional[torch.Tensor] = None,
    q_scale_dp_offset: int = META_DP,
    q_scale_dqkv: Optional[torch.Tensor] = None,
    q_scale_dqkv_offset: int = META_DQKV,
    amax_dp: Optional[torch.Tensor] = None,
    amax_dp_offset: int = META_DP,
    amax_dqkv: Optional[torch.Tensor] = None,
    amax_dqkv_offset: int = META_DQKV,
    attn_scale: Optional[float] = None,
    dropout: float = 0.0,
    fast_zero_fill: bool = True,
    qkv_layout: str = "sbh3d",
    attn_bias_type: str = "no_bias",
    attn_mask_type: str = "padding",
    softmax_type: str = "vanilla",
    window_size: Sequence[int] = (-1, -1),
    bottom_right_diagonal: Optional[bool] = None,
    deterministic: bool = False,
    cuda_graph: bool = False,
    *,
    lengths: Optional[BatchLengths] = None,
    _prepared: Optional[list] = None,
) -> list[Optional[torch.Tensor]]:
    """Fused attention backward (TransformerEngine 2.x's ``fused_attn_bwd``).

    Takes the forward's inputs, its output ``o``, the output gradient ``d_o`` (any strides
    with a unit-stride last dim) and the forward's ``aux_ctx_tensors`` (with a sink, its last
    entry is the ``softmax_offset`` the forward used); the options must match the forward's.
    Returns ``[dq, dk, dv, dbias, d_softmax_offset]`` in the layout's own format (for
    packed layouts dq/dk/dv are views of one buffer, as in TE); ``dbias`` is None without a
    post-scale bias or when the bias broadcasts over b, h and sq; ``d_softmax_offset`` (fp32
    ``[1, h, 1, 1]``) is None unless ``softmax_type="learnable"``. ``deterministic=True``
    asks cuDNN for a bit-reproducible backward (on Hopper its workspace grows as sq x skv).
    Keyword-only ``lengths``: as in :func:`fused_attn_fwd`; pass the forward's to use the
    lengths the forward used.

    Raises the same errors as :func:`fused_attn_fwd`.
    """
    try:
        n_aux = len(aux_ctx_tensors)
        extra = None  # what most calls leave out (a bias, a sink, FP8 scaling tensors), described only when given
        if not (n_aux == 2 and d_scale_qkv is None and d_scale_s is None and d_scale_o is None and d_scale_do is None
                and d_scale_dp is None and q_scale_s is None and q_scale_dp is None and q_scale_dqkv is None
                and amax_dp is None and amax_dqkv is None):
            extra = (
                *(_meta(t) for t in aux_ctx_tensors[2:4]),
                # an unaligned bias is copied; an unaligned softmax_offset is refused
                *(t.data_ptr() & 15 for t in aux_ctx_tensors[2:4]),
                None if d_scale_qkv is None and d_scale_s is None and d_scale_o is None and d_scale_do is None
                and d_scale_dp is None and q_scale_s is None and q_scale_dp is None and q_scale_dqkv is None
                and amax_dp is None and amax_dqkv is None else _fp8_sig(
                    (d_scale_qkv, d_scale_s, d_scale_o, d_scale_do, d_scale_dp, q_scale_s, q_scale_dp, q_scale_dqkv,
                     amax_dp, amax_dqkv),
                    (d_scale_qkv_offset, d_scale_s_offset, d_scale_o_offset, d_scale_do_offset, d_scale_dp_offset,
                     q_scale_s_offset, q_scale_dp_offset, q_scale_dqkv_offset, amax_dp_offset, amax_dqkv_offset)),
            )  # fmt: skip
        stats, rng = aux_ctx_tensors[0], aux_ctx_tensors[1]
        sig: Optional[tuple] = (
            (q.shape, k.shape, v.shape, max_seqlen_q, max_seqlen_kv) if q.dim() == 4 and k.dim() == 4
            else _thd_sizes(q.shape, k.shape, v.shape, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv),
            q.stride(), k.stride(), v.stride(), o.shape, o.stride(), d_o.shape, d_o.stride(), q.dtype, k.dtype, v.dtype, o.dtype,
            d_o.dtype, q.get_device(), k.get_device(), v.get_device(), o.get_device(), d_o.get_device(), qkv_dtype,
            fused_attention_backend, attn_scale, dropout, qkv_layout, attn_bias_type, attn_mask_type, softmax_type,
            window_size if window_size.__class__ is tuple else tuple(window_size), bottom_right_diagonal,
            deterministic,
            # as in fused_attn_fwd: cu_seqlens are validated when a signature is first seen and, where a
            # padding mask or THD reads them, on every call (_check_runtime_tensors)
            cu_seqlens_q is None, cu_seqlens_kv is None,
            n_aux, stats.shape, stats.stride(), stats.dtype, stats.get_device(), _meta(rng), extra, cuda_graph,
            cu_seqlens_q_padded is None and cu_seqlens_kv_padded is None,
            _policy_token(),  # te_cudnn.backend_policy in force (~20 ns): another policy prepares its own call
        )  # fmt: skip
        prep = _bwd_memo.find(sig)
    except (AttributeError, TypeError, IndexError, RuntimeError):  # not tensors (or 0-d, nested ones; tensors in
        # scalar places), unhashable options: the slow path says what is wrong
        sig = prep = None
    if prep is None:  # the first call of this signature: validate, select, key (the slow path)
        prep = _prepare_bwd(sig, BwdArgs(
            max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, q=q, k=k, v=v, o=o, d_o=d_o, qkv_dtype=qkv_dtype,
            aux_ctx_tensors=aux_ctx_tensors, fused_attention_backend=fused_attention_backend,
            cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            d_scale_qkv=d_scale_qkv, d_scale_qkv_offset=d_scale_qkv_offset, d_scale_s=d_scale_s,
            d_scale_s_offset=d_scale_s_offset, d_scale_o=d_scale_o, d_scale_o_offset=d_scale_o_offset,
            d_scale_do=d_scale_do, d_scale_do_offset=d_scale_do_offset, d_scale_dp=d_scale_dp,
            d_scale_dp_offset=d_scale_dp_offset, q_scale_s=q_scale_s, q_scale_s_offset=q_scale_s_offset,
            q_scale_dp=q_scale_dp, q_scale_dp_offset=q_scale_dp_offset, q_scale_dqkv=q_scale_dqkv,
            q_scale_dqkv_offset=q_scale_dqkv_offset, amax_dp=amax_dp, amax_dp_offset=amax_dp_offset,
            amax_dqkv=amax_dqkv, amax_dqkv_offset=amax_dqkv_offset, attn_scale=attn_scale, dropout=dropout,
            fast_zero_fill=fast_zero_fill, qkv_layout=qkv_layout, attn_bias_type=attn_bias_type,
            attn_mask_type=attn_mask_type, softmax_type=softmax_type, window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal, deterministic=deterministic, cuda_graph=cuda_graph,
            lengths=lengths,
        ))  # fmt: skip
    if _prepared is not None:
        _prepared.append(prep)
    if prep.plain:  # dense F16, no bias, FP8 or sink: the shortest path
        return plain_bwd(prep, q, k, v, o, d_o, aux_ctx_tensors[0], aux_ctx_tensors[1])
    if prep.head_pad is not None:  # head dims not a multiple of 8: on padded copies (te_cudnn.served)
        given = locals()
        return padded_bwd(prep.head_pad, BwdArgs(**{n: given[n] for n in BwdArgs._fields}), fused_attn_bwd)
    if prep.empty:
        return empty_bwd(prep.cfg, q, k, v, aux_ctx_tensors[2] if prep.cfg.has_dbias else None,
                         ((amax_dp, amax_dp_offset), (amax_dqkv, amax_dqkv_offset)) if prep.fp8 else ())  # fmt: skip
    fp8 = None
    if prep.fp8:
        fp8 = (fp8_bwd_scales(d_scale_qkv, d_scale_qkv_offset, d_scale_o, d_scale_o_offset, d_scale_do, d_scale_do_offset,
                              d_scale_s, d_scale_s_offset, d_scale_dp, d_scale_dp_offset, q_scale_s, q_scale_s_offset,
                              q_scale_dqkv, q_scale_dqkv_offset, q_scale_dp, q_scale_dp_offset),
               amax_dp.narrow(0, amax_dp_offset, 1), amax_dqkv.narrow(0, amax_dqkv_offset, 1))  # fmt: skip
    return general_bwd(prep, q, k, v, o, d_o, aux_ctx_tensors,
                       (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded), fp8, lengths)


def general_bwd(prep: _Prepared, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, d_o: torch.Tensor,
                aux: Sequence[torch.Tensor], cu_seqlens: tuple, fp8: Optional[tuple],
                lengths: Optional[BatchLengths] = None) -> list[Optional[torch.Tensor]]:  # fmt: skip
    """Every backward that is not plain (a padding mask, THD, a bias, a sink, FP8, max512):
    checks the per-call tensors, allocates dQ, dK, dV (zeroed where cuDNN may leave rows
    unwritten) and binds the operands in the order of the sub-backend's graph
    (``operand_uids``): q, k, v, O, stats, dO, dQ, dK, dV, then bias and dBias, seed and
    offset, sink and its gradient (F16), the FP8 scaling operands and amaxes, sink (FP8), and
    last the runtime lengths / ragged offsets. An FP8 backward the autotuner split runs as
    parts (:func:`_split_bwd`); max512 has its own operands (:func:`_max512_bwd`).
    ``aux``: the forward's aux_ctx_tensors; ``cu_seqlens``: (q, kv, q_padded, kv_padded);
    ``fp8``: (:func:`fp8_bwd_scales`, the amax_dp slot, the amax_dqkv slot)."""
    cfg = prep.cfg
    if prep.varlen:
        _check_runtime_tensors(prep, q, cu_seqlens)
    if (q.data_ptr() | k.data_ptr() | v.data_ptr() | o.data_ptr() | d_o.data_ptr()) & 15:
        _misaligned(q=q, k=k, v=v, o=o, d_o=d_o)
    plan = prep.get_plan()
    if fp8 is not None:
        split = chosen_split(plan.tuning)
        if split is not None:  # the autotuner measured that parts of the call are faster (te_cudnn.plans.split)
            lens = _buffers_for(prep, cu_seqlens, lengths) if prep.varlen else []
            return _split_bwd(prep, split, [q, k, v, o, aux[0], d_o], fp8[0], lens, fp8[1], fp8[2])
    dq, dk, dv = alloc_qkv_grads(cfg.layout, q, k, v, zero=prep.fill_grads, dtype=cfg.do_dtype)
    if prep.softmax_aux:
        return _max512_bwd(prep, q, k, v, d_o, dq, dk, dv, aux) + [None]
    buffers = [q, k, v, o, aux[0], d_o, dq, dk, dv]
    dbias = None
    if cfg.bias_type == AttnBiasType.post_scale_bias:
        bias = aux[2]
        buffers.append(_aligned_bias(bias, cfg) if cfg.bias_copy else bias)
        if cfg.has_dbias:  # cuDNN writes dBias contiguous (the builders declare it so)
            dbias = torch.empty(bias.shape, dtype=bias.dtype, device=prep.device)
            buffers.append(dbias)
    if cfg.has_dropout:
        buffers.extend(_seed_offset(aux[1]))
    sink_ops: list[torch.Tensor] = []
    d_sink = None
    if cfg.has_sink:  # [softmax_offset, (d_softmax_offset)]: after dropout (F16) or the scaling operands (FP8)
        sink_ops.append(aux[prep.sink_index])
        if cfg.dsink_in_graph:  # cuDNN accumulates it across rows: it starts at zero
            d_sink = torch.zeros((1, cfg.h, 1, 1), dtype=torch.float32, device=prep.device)
            sink_ops.append(d_sink)
        if fp8 is None:
            buffers += sink_ops
    amax3 = None
    if fp8 is not None:
        amax3 = torch.empty((3, 1, 1, 1), dtype=torch.float32, device=prep.device)  # dQ, dK, dV amaxes
        buffers += fp8[0] + _fp8_bwd_amaxes(amax3, _slot(fp8[1], 0))
        buffers += sink_ops
    if prep.varlen:
        buffers += _buffers_for(prep, cu_seqlens, lengths)
    elif prep.full_lens is not None:
        buffers += prep.full_lens
    _execute(plan, buffers, prep.device)
    if cfg.has_dsink and not cfg.dsink_in_graph:
        d_sink = _sink_grad(cfg, o, d_o, aux[0], aux[prep.sink_index], cu_seqlens[0])
    if amax3 is not None:  # one META_DQKV slot holds the amax of dQ, dK and dV together
        torch.amax(amax3.view(3, 1), dim=0, out=fp8[2])
    if dbias is not None and cfg.bias_copy and not aux[2].is_contiguous():
        dbias = torch.empty_like(aux[2]).copy_(dbias)  # a copied bias' gradient in the caller's strides
    return [dq, dk, dv, dbias, d_sink]


#: One backward call's arguments (see _call_record).
BwdArgs = _call_record("BwdArgs", fused_attn_bwd)
_public_signature(fused_attn_bwd)


#: (batch axis, head axis) of q/k/v/o/dO per format; the softmax stats are [b, h, s, 1].
_BH_AXES = {QKVFormat.bshd: (0, 2), QKVFormat.sbhd: (1, 2), QKVFormat.bhsd: (0, 1)}


def _split_bwd(prep: _Prepared, split: tuple[str, int], operands: list[torch.Tensor], scales: list[torch.Tensor],
               lens: list[torch.Tensor], amax_dp: torch.Tensor, amax_dqkv: torch.Tensor) -> list[Optional[torch.Tensor]]:
    """The backward as ``parts`` launches over zero-copy views of the batch or of whole GQA head
    groups, as the autotuner measured and recorded (te_cudnn.plans.split). One plan serves every
    part: its configuration keeps the full tensors' strides, so each part reads views of q, k,
    v, O, dO and the stats and writes its gradients straight into views of the full dQ, dK, dV
    (no copies). Each part writes its own amaxes into a scratch row; their maximum goes to the
    caller's ``amax_dp`` / ``amax_dqkv`` slots.

    ``operands``: the full q, k, v, O, softmax stats and dO; ``scales``: :func:`fp8_bwd_scales`
    (shared by every part); ``lens``: the per-sequence lengths of a padding mask ([b, 1, 1, 1]
    each, or none); ``amax_dp`` / ``amax_dqkv``: the caller's one-element metadata slots."""
    cfg = prep.cfg
    dim, parts = split
    plan = _part_plan(prep, split)
    axes = _BH_AXES[layout_info(cfg.layout).q_format]
    sizes = (cfg.b, cfg.h, cfg.hg)
    q, k, v, o, stats, d_o = operands
    grads = alloc_qkv_grads(cfg.layout, q, k, v, zero=prep.varlen, dtype=cfg.do_dtype)  # padding rows stay zero
    amax = torch.empty((parts, 4, 1, 1, 1), dtype=torch.float32, device=prep.device)  # per part: dQ, dK, dV, dP
    for i in range(parts):
        views = [slice_operand(t, dim, i, parts, sizes, axes) for t in (q, k, v, o)]
        views.append(slice_operand(stats, dim, i, parts, sizes, (0, 1)))
        views += [slice_operand(t, dim, i, parts, sizes, axes) for t in (d_o, *grads)]
        views += scales + _fp8_bwd_amaxes(amax[i, :3], _slot(amax[i, 3].view(1), 0))
        views += [slice_operand(t, dim, i, parts, sizes, (0, 1)) for t in lens]  # the lengths are sliced too
        _execute(plan, views, prep.device)
    torch.amax(amax[:, :3].reshape(3 * parts, 1), dim=0, out=amax_dqkv)
    torch.amax(amax[:, 3].reshape(parts, 1), dim=0, out=amax_dp)
    return [*grads, None, None]


def _part_plan(prep: _Prepared, split: tuple[str, int]) -> CompiledPlan:
    """The plan of one part of a split backward (``split_config``: the part's sizes, the full
    tensors' strides), through the plan cache and store like any plan; never tuned itself (the
    whole call's tuning chose this split)."""
    held = prep.split_plan
    if held is not None and held[0] == split and plan_cache.hit(held[1]):
        return held[1]
    if _is_capturing():
        raise CaptureMissError(f"the split backward plan for {prep.cfg.summary()} is not in the plan cache")
    part_cfg = split_config(prep.cfg, *split)
    key = replace(prep.key, config=part_cfg)
    backend, device = prep.backend, prep.device.index
    with torch.cuda.device(device), autotuning(False):
        plan = plan_cache.get_or_build(key, lambda: backend.build(part_cfg, key.direction, handle_for(device)))
    prep.split_plan = (split, plan)
    return plan


def _sink_grad(cfg: AttnConfig, o: torch.Tensor, d_o: torch.Tensor, stats: torch.Tensor, sink: torch.Tensor,
               cu_q: Optional[torch.Tensor]) -> torch.Tensor:
    """d_softmax_offset of learnable sinks for dense F16 tensors (see te_cudnn.sink_grad)."""
    lens = (cu_q[1:] - cu_q[:-1]) if cfg.mask.is_padding and cu_q is not None else None
    return sink_grad(o, d_o, stats, sink, layout_info(cfg.layout).q_format == QKVFormat.sbhd, lens)


def _full_lens(cfg: AttnConfig, prep: _Prepared) -> Optional[list]:
    """The max512 graphs always carry the length mask of TE's pattern; they get sq and skv."""
    if not prep.softmax_aux:
        return None
    return full_lengths(cfg, prep.device)


def _max512_bwd(prep: _Prepared, q, k, v, d_o, dq, dk, dv, aux) -> list[Optional[torch.Tensor]]:
    """The max512 backward: reads the saved softmax S and never overwrites it (dS goes to its
    own scratch, zeroed where a causal mask leaves tiles the engine reads but never writes)."""
    cfg = prep.cfg
    plan = prep.get_plan()
    shape = (cfg.b, cfg.h, cfg.sq, cfg.skv)
    ds = (torch.zeros if cfg.mask.is_causal else torch.empty)(shape, dtype=cfg.dtype, device=prep.device)
    buffers = [q, k, v, aux[0], d_o, dq, dk, dv, ds]
    dbias = None
    if cfg.has_dbias:
        dbias = torch.empty(cfg.bias_shape, dtype=cfg.dtype, device=prep.device)
        buffers.append(dbias)
    _execute(plan, buffers + prep.full_lens, prep.device)
    return [dq, dk, dv, dbias]


def _prepare_bwd(sig: tuple, a: BwdArgs) -> _Prepared:
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


# ================================================================================ selection


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
