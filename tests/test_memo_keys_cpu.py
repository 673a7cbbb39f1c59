"""Every argument that changes what a call computes is part of its call signature.

``fused_attn_fwd``, ``fused_attn_bwd`` and ``fused_attn_decode`` remember the prepared call
(validated, selected, keyed) of each call signature and skip all of that when the signature
comes again. An argument that changes the answer, or that the first call's validation would
have refused, but is missing from the signature reuses another call's preparation: a silently
wrong answer, or a read that nothing checked.

Each case starts from a well-formed call on CPU tensors (the signature is computed before any
CUDA check), captures its signature from the memo lookup (the memo is replaced by a recorder
that always misses, and the slow path by one that stops the call), changes one parameter to
values of the same kind (another number, layout or mask; a tensor of another shape with the
same strides, of the same shape with other strides, of another dtype; None against a tensor)
and requires every value to give a different signature. The parameters the library declares
per-call data (``FWD_PER_CALL``, ``BWD_PER_CALL``, ``DECODE_PER_CALL``: name -> reason) are
called with the same values but not required to differ. Every public parameter of each function
must be varied here or declared, so a new parameter fails until it is keyed or declared.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import pytest
import torch

from te_cudnn import decode, ops
from te_cudnn.enums import META_DO, META_DP, META_DQKV, META_O, META_QKV, META_S, FusedAttnBackend
from te_cudnn.varlen import BatchLengths

B, S, H, HG, D = 2, 16, 4, 2, 64
BF16, F32, I32, I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2

#: The dtype a tensor is varied to: another one the parameter could plausibly hold.
OTHER_DTYPE = {torch.bfloat16: torch.float16, torch.float16: torch.bfloat16, F32: torch.float64, I32: I64, I64: I32,
               E4M3: E5M2, E5M2: E4M3}  # fmt: skip


# ------------------------------------------------------------------------------ values


def _misaligned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor of ``shape`` that starts one element past a 16-byte boundary."""
    n = 1
    for s in shape:
        n *= s
    base = torch.zeros(n + 16, dtype=dtype)
    assert base.data_ptr() % 16 == 0
    t = base[1 : n + 1].view(shape)
    assert t.data_ptr() % 16
    return t


def tensor_values(name: str, t: torch.Tensor, *, optional: bool, baseline: Optional[torch.Tensor] = None,
                  misaligned: bool = False) -> list[tuple[str, Any]]:  # fmt: skip
    """``(label, value)`` pairs for a tensor parameter, the baseline first: ``baseline`` (``t``
    unless given; None for an optional tensor the baseline call leaves out), then ``t``, ``t``
    narrowed in its first dim of size > 1 (another shape, the same strides: a batch of one is
    contiguous with the strides of a batch of two), ``t``'s shape with other strides (a padded
    last dim or a step-2 view; a transposed allocation), ``t``'s shape and strides in another
    dtype, and with ``misaligned`` a start off a 16-byte boundary."""
    shape = tuple(t.shape)
    out: list[tuple[str, Any]] = []
    if baseline is not None or not optional:
        out.append((f"{name} (baseline)", t if baseline is None else baseline))
    else:
        out += [(f"{name}=None (baseline)", None), (f"{name} given", t)]
    dim = next((i for i, n in enumerate(shape) if n > 1), None)
    if dim is not None:
        narrow = t.narrow(dim, 0, shape[dim] - 1)
        assert narrow.stride() == t.stride()
        out.append((f"{name} shape {list(narrow.shape)}, same strides", narrow))
    if len(shape) == 1:
        step = torch.zeros(2 * shape[0], dtype=t.dtype)[::2]
        out.append((f"{name} stride {step.stride()}", step))
    else:
        padded = torch.zeros((*shape[:-1], shape[-1] + 8), dtype=t.dtype)[..., : shape[-1]]
        out.append((f"{name} stride {padded.stride()} (padded rows)", padded))
        big = [i for i, n in enumerate(shape) if n > 1]
        if len(big) >= 2:  # two dims allocated in the other order, as a transposed tensor is
            i, j = big[0], big[1]
            alloc = list(shape)
            alloc[i], alloc[j] = alloc[j], alloc[i]
            moved = torch.zeros(alloc, dtype=t.dtype).transpose(i, j)
            assert tuple(moved.shape) == shape and moved.stride() != t.stride()
            out.append((f"{name} stride {moved.stride()} (transposed allocation)", moved))
    other = torch.empty_strided(shape, t.stride(), dtype=OTHER_DTYPE[t.dtype])
    out.append((f"{name} dtype {str(other.dtype).removeprefix('torch.')}", other))
    if misaligned:
        out.append((f"{name} data_ptr % 16 != 0", _misaligned(shape, t.dtype)))
    if optional and baseline is not None:
        out.append((f"{name}=None", None))
    return out


def plain_values(name: str, *values: Any) -> list[tuple[str, Any]]:
    """``(label, value)`` pairs for a non-tensor parameter, the baseline first."""
    return [(f"{name}={v!r}" + (" (baseline)" if i == 0 else ""), v) for i, v in enumerate(values)]


def _table(n: int = 16) -> torch.Tensor:
    return torch.ones(n, dtype=F32)


def _cu() -> torch.Tensor:
    return torch.tensor([0, S, 2 * S], dtype=I32)


def _shared_options(cu: torch.Tensor) -> dict[str, list[tuple[str, Any]]]:
    """The options fused_attn_fwd and fused_attn_bwd share, varied alike for both (F16 baseline)."""
    return {
        "cu_seqlens_q_padded": tensor_values("cu_seqlens_q_padded", cu, optional=True),
        "cu_seqlens_kv_padded": tensor_values("cu_seqlens_kv_padded", cu, optional=True),
        "attn_scale": plain_values("attn_scale", None, 0.125, 0.25),
        "dropout": plain_values("dropout", 0.0, 0.1, 0.25),
        "fast_zero_fill": plain_values("fast_zero_fill", True, False),
        "qkv_layout": plain_values("qkv_layout", "bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bshd_sbhd_sbhd", "thd_thd_thd"),
        "attn_bias_type": plain_values("attn_bias_type", "no_bias", "post_scale_bias", "alibi"),
        "attn_mask_type": plain_values("attn_mask_type", "causal", "no_mask", "causal_bottom_right", "padding_causal"),
        "softmax_type": plain_values("softmax_type", "vanilla", "off_by_one", "learnable"),
        "window_size": plain_values("window_size", (-1, -1), (8, 0), (4, 4)),
        "bottom_right_diagonal": plain_values("bottom_right_diagonal", None, True, False),
    }


def _sequence_values(q, k, v, cu=None) -> dict[str, list[tuple[str, Any]]]:
    """The leading arguments fused_attn_fwd and fused_attn_bwd share: sequence lengths, q, k, v
    (``cu=None``: cu_seqlens only given or not, as the FP8 calls take them)."""
    def lengths(name: str) -> list[tuple[str, Any]]:
        return plain_values(name, None, _cu()) if cu is None else tensor_values(name, cu, optional=True)

    return {
        "max_seqlen_q": plain_values("max_seqlen_q", S, S // 2),
        "max_seqlen_kv": plain_values("max_seqlen_kv", S, S // 2),
        "cu_seqlens_q": lengths("cu_seqlens_q"),
        "cu_seqlens_kv": lengths("cu_seqlens_kv"),
        "q": tensor_values("q", q, optional=False),
        "k": tensor_values("k", k, optional=False),
        "v": tensor_values("v", v, optional=False),
    }


def _f16_fwd_values() -> dict[str, list[tuple[str, Any]]]:
    """fused_attn_fwd: dense bshd bf16 self-attention, causal, no bias."""
    q, k, v = (torch.zeros(B, S, H, D, dtype=BF16) for _ in range(3))
    cu = _cu()
    table = torch.zeros(B, 2, dtype=I32)
    vals: dict[str, list[tuple[str, Any]]] = {
        "is_training": plain_values("is_training", True, False),
        **_sequence_values(q, k, v, cu),
        "qkv_dtype": plain_values("qkv_dtype", BF16, None, torch.float16),
        "fused_attention_backend": plain_values("fused_attention_backend", None, FusedAttnBackend.F16_arbitrary_seqlen,
                                                FusedAttnBackend.F16_max512_seqlen, FusedAttnBackend.FP8),  # fmt: skip
        "attn_bias": tensor_values("attn_bias", torch.zeros(1, H, S, S, dtype=BF16), optional=True, misaligned=True),
        "page_table_k": tensor_values("page_table_k", table, optional=True),
        "page_table_v": tensor_values("page_table_v", table, optional=True),
        **_shared_options(cu),
        "rng_gen": plain_values("rng_gen", None, torch.Generator()),
        "softmax_offset": tensor_values("softmax_offset", torch.zeros(1, H, 1, 1, dtype=F32), optional=True,
                                        misaligned=True),  # fmt: skip
        "return_max_logit": plain_values("return_max_logit", False, True),
        "cuda_graph": plain_values("cuda_graph", False, True),
        "out": tensor_values("out", torch.zeros(B, S, H, D, dtype=BF16), optional=True),
        "softmax_lse": tensor_values("softmax_lse", torch.zeros(B, H, S, 1, dtype=F32), optional=True),
        "rng_state": tensor_values("rng_state", torch.zeros(2, dtype=I64), optional=True),
        "lengths": plain_values("lengths", None, BatchLengths(cu)),
        "softmax_stats": plain_values("softmax_stats", True, False),
    }
    # F16 calls take no FP8 scaling tensors: given or not is the difference (their offsets are
    # varied with the FP8 baseline, where they select a slot)
    for name in FP8_FWD:
        vals[name] = plain_values(name, None, _table())
    return vals


FP8_FWD = {"d_scale_qkv": META_QKV, "d_scale_s": META_S, "q_scale_s": META_S, "q_scale_o": META_O, "amax_s": META_S,
           "amax_o": META_O}  # fmt: skip
FP8_BWD = {"d_scale_qkv": META_QKV, "d_scale_s": META_S, "d_scale_o": META_O, "d_scale_do": META_DO,
           "d_scale_dp": META_DP, "q_scale_s": META_S, "q_scale_dp": META_DP, "q_scale_dqkv": META_DQKV,
           "amax_dp": META_DP, "amax_dqkv": META_DQKV}  # fmt: skip


def _fp8_values(names: dict[str, int]) -> dict[str, list[tuple[str, Any]]]:
    """The FP8 scaling tensors (each an fp32 [16] metadata table) and their slot offsets."""
    vals: dict[str, list[tuple[str, Any]]] = {}
    for name, slot in names.items():
        vals[name] = tensor_values(name, _table(), optional=True, baseline=_table())
        vals[f"{name}_offset"] = plain_values(f"{name}_offset", slot, slot + 1)
    return vals


def _fp8_fwd_values() -> dict[str, list[tuple[str, Any]]]:
    """fused_attn_fwd: FP8 (E4M3) bshd, causal, d = 128, every scaling tensor given."""
    q, k, v = (torch.zeros(B, S, H, 128, dtype=E4M3) for _ in range(3))
    return {
        "is_training": plain_values("is_training", True, False),
        **_sequence_values(q, k, v),
        "qkv_dtype": plain_values("qkv_dtype", E4M3, None, E5M2),
        "qkv_layout": plain_values("qkv_layout", "bshd_bshd_bshd", "sbhd_sbhd_sbhd"),
        "attn_mask_type": plain_values("attn_mask_type", "causal", "no_mask", "padding_causal"),
        "out": tensor_values("out", torch.zeros(B, S, H, 128, dtype=E4M3), optional=True),
        **_fp8_values(FP8_FWD),
    }


def _f16_bwd_values() -> dict[str, list[tuple[str, Any]]]:
    """fused_attn_bwd: dense bshd bf16, causal, no bias: aux_ctx_tensors = [stats, rng_state]."""
    q, k, v, o, d_o = (torch.zeros(B, S, H, D, dtype=BF16) for _ in range(5))
    stats, rng = torch.zeros(B, H, S, 1, dtype=F32), torch.zeros(2, dtype=I64)
    bias, sink = torch.zeros(1, H, S, S, dtype=BF16), torch.zeros(1, H, 1, 1, dtype=F32)
    cu = _cu()
    aux: list[tuple[str, Any]] = [("aux_ctx_tensors=[stats, rng_state] (baseline)", [stats, rng])]
    aux += [(f"aux_ctx_tensors[0]: {label}", [t, rng])
            for label, t in tensor_values("stats", stats, optional=False)[1:]]  # fmt: skip
    aux += [(f"aux_ctx_tensors[1]: {label}", [stats, t])
            for label, t in tensor_values("rng_state", rng, optional=False)[1:]]  # fmt: skip
    aux += [(f"aux_ctx_tensors[2]: {label}", [stats, rng, t])
            for label, t in tensor_values("bias", bias, optional=False, misaligned=True)]  # fmt: skip
    aux += [(f"aux_ctx_tensors[2]: {label}", [stats, rng, t])
            for label, t in tensor_values("softmax_offset", sink, optional=False, misaligned=True)]  # fmt: skip
    aux += [(f"aux_ctx_tensors[3]: {label}", [stats, rng, bias, t])
            for label, t in tensor_values("softmax_offset", sink, optional=False, misaligned=True)]  # fmt: skip
    vals: dict[str, list[tuple[str, Any]]] = {
        **_sequence_values(q, k, v, cu),
        "o": tensor_values("o", o, optional=False),
        "d_o": tensor_values("d_o", d_o, optional=False),
        "qkv_dtype": plain_values("qkv_dtype", BF16, None, torch.float16),
        "aux_ctx_tensors": aux,
        "fused_attention_backend": plain_values("fused_attention_backend", None, FusedAttnBackend.F16_arbitrary_seqlen,
                                                FusedAttnBackend.F16_max512_seqlen, FusedAttnBackend.FP8),  # fmt: skip
        **_shared_options(cu),
        "deterministic": plain_values("deterministic", False, True),
        "cuda_graph": plain_values("cuda_graph", False, True),
        "lengths": plain_values("lengths", None, BatchLengths(cu)),
    }
    for name in FP8_BWD:
        vals[name] = plain_values(name, None, _table())
    return vals


def _fp8_bwd_values() -> dict[str, list[tuple[str, Any]]]:
    """fused_attn_bwd: FP8 bshd, causal, d = 128; q, k, v, O in E4M3, dO in E5M2 (TE's HYBRID)."""
    q, k, v, o = (torch.zeros(B, S, H, 128, dtype=E4M3) for _ in range(4))
    d_o = torch.zeros(B, S, H, 128, dtype=E5M2)
    stats, rng = torch.zeros(B, H, S, 1, dtype=F32), torch.zeros(2, dtype=I64)
    return {
        **_sequence_values(q, k, v),
        "o": tensor_values("o", o, optional=False),
        "d_o": tensor_values("d_o", d_o, optional=False),
        "qkv_dtype": plain_values("qkv_dtype", E4M3, None, E5M2),
        "aux_ctx_tensors": [("aux_ctx_tensors=[stats, rng_state] (baseline)", [stats, rng])] + [
            (f"aux_ctx_tensors[0]: {label}", [t, rng])
            for label, t in tensor_values("stats", stats, optional=False)[1:]],
        "qkv_layout": plain_values("qkv_layout", "bshd_bshd_bshd", "sbhd_sbhd_sbhd"),
        "attn_mask_type": plain_values("attn_mask_type", "causal", "no_mask", "padding_causal"),
        "deterministic": plain_values("deterministic", False, True),
        **_fp8_values(FP8_BWD),
    }  # fmt: skip


def _decode_values(paged: bool) -> dict[str, list[tuple[str, Any]]]:
    """fused_attn_decode: one bf16 query token per sequence, GQA, a dense or paged cache."""
    q = torch.zeros(B, 1, H, D, dtype=BF16)
    cache = torch.zeros(4, 16, HG, D, dtype=BF16) if paged else torch.zeros(B, S, HG, D, dtype=BF16)
    table = torch.arange(4, dtype=I32).view(B, 2)
    return {
        "q": tensor_values("q", q, optional=False),
        "k_cache": tensor_values("k_cache", cache, optional=False),
        "v_cache": tensor_values("v_cache", cache.clone(), optional=False),
        "cache_seqlens": tensor_values("cache_seqlens", torch.full((B,), 8, dtype=I32), optional=False),
        "page_table": tensor_values("page_table", table, optional=True, baseline=table if paged else None),
        "attn_scale": plain_values("attn_scale", None, 0.125, 0.25),
        "window_size": plain_values("window_size", (-1, -1), (8, 0), (4, 0)),
        "out": tensor_values("out", torch.zeros(B, 1, H, D, dtype=BF16), optional=True),
        "return_softmax_lse": plain_values("return_softmax_lse", False, True),
    }


# ------------------------------------------------------------------------------ capture


class _SlowPath(Exception):
    """Raised in place of the slow path (validation, selection): the memo lookup missed."""

    def __init__(self, sig: Optional[tuple]) -> None:
        super().__init__("slow path")
        self.sig = sig


class _Recorder:
    """A memo that records every signature it is asked for and never finds one."""

    def __init__(self) -> None:
        self.asked: list[tuple] = []

    def find(self, sig: tuple) -> None:
        self.asked.append(sig)
        return None

    get = find


def _stop(sig: Optional[tuple], *args: Any, **kwargs: Any) -> Any:
    raise _SlowPath(sig)


#: entry point -> (function, its memo's module and attribute, its slow path's attribute, declared per-call data)
ENTRIES: dict[str, tuple[Callable, Any, str, str, dict[str, str]]] = {
    "fwd": (ops.fused_attn_fwd, ops, "_fwd_memo", "_prepare_fwd", ops.FWD_PER_CALL),
    "bwd": (ops.fused_attn_bwd, ops, "_bwd_memo", "_prepare_bwd", ops.BWD_PER_CALL),
    "decode": (decode.fused_attn_decode, decode, "_memo", "_prepare", decode.DECODE_PER_CALL),
}

#: (entry point, baseline name) -> the values of each parameter varied there, baseline first.
BASELINES: dict[tuple[str, str], Callable[[], dict[str, list[tuple[str, Any]]]]] = {
    ("fwd", "f16"): _f16_fwd_values,
    ("fwd", "fp8"): _fp8_fwd_values,
    ("bwd", "f16"): _f16_bwd_values,
    ("bwd", "fp8"): _fp8_bwd_values,
    ("decode", "dense"): lambda: _decode_values(paged=False),
    ("decode", "paged"): lambda: _decode_values(paged=True),
}


def _signature(entry: str, kwargs: dict[str, Any], what: str) -> tuple:
    """The call signature ``entry`` computes for ``kwargs`` (memo and slow path replaced)."""
    fn, module, memo, _, _ = ENTRIES[entry]
    recorder = getattr(module, memo)
    assert isinstance(recorder, _Recorder)
    recorder.asked.clear()
    with pytest.raises(_SlowPath) as stopped:
        fn(**kwargs)
    assert len(recorder.asked) == 1 and stopped.value.sig is not None, (
        f"{entry} with {what}: no call signature was computed (the value is not of the parameter's kind)"
    )
    assert stopped.value.sig is recorder.asked[0], f"{entry} with {what}: the slow path got another signature"
    return recorder.asked[0]


@pytest.fixture(autouse=True)
def _recording(monkeypatch: pytest.MonkeyPatch) -> None:
    for _, module, memo, slow, _ in ENTRIES.values():
        monkeypatch.setattr(module, memo, _Recorder())
        monkeypatch.setattr(module, slow, _stop)


def _public(fn: Callable) -> list[str]:
    """The parameters a caller passes (``_prepared``-style internal ones are not the call's
    data: they receive results, as ``ops._call_record`` also leaves them out)."""
    return [n for n in inspect.signature(fn).parameters if not n.startswith("_")]


CASES = [pytest.param(entry, base, name, id=f"{entry}-{base}-{name}")
         for (entry, base), make in BASELINES.items() for name in make()]  # fmt: skip


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("entry,base,name", CASES)
def test_parameter_is_in_the_call_signature(entry: str, base: str, name: str) -> None:
    """Each value of ``name`` gives its own call signature, unless ``name`` is declared per-call."""
    values = BASELINES[(entry, base)]()
    baseline = {n: vs[0][1] for n, vs in values.items()}
    per_call = ENTRIES[entry][4]
    sigs = [(label, _signature(entry, {**baseline, name: value}, label)) for label, value in values[name]]
    assert len(sigs) >= 2
    if name in per_call:
        return  # per-call data: read or checked by every call (the reason is in the library's declaration)
    same = [(a, b) for i, (a, sa) in enumerate(sigs) for b, sb in sigs[i + 1 :] if sa == sb]
    assert not same, (
        f"{entry}: the call signature does not tell these values of {name!r} apart, so a call with the second "
        f"reuses the first's prepared call without validating it: " + "; ".join(f"{a!r} and {b!r}" for a, b in same)
        + f". Key {name} in the signature, or declare it per-call data with the reason"
    )


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_every_parameter_is_keyed_or_declared_per_call(entry: str) -> None:
    """A parameter the cases above never vary must be declared per-call data (with a reason), and
    the declaration names only real parameters."""
    fn, _, _, _, per_call = ENTRIES[entry]
    params = _public(fn)
    exercised = {name for (e, _), make in BASELINES.items() if e == entry for name in make()}
    unknown = exercised - set(params)
    assert not unknown, f"the cases vary {sorted(unknown)}, which {fn.__name__} does not take"
    stale = set(per_call) - set(params)
    assert not stale, f"{fn.__name__}'s per-call declaration names {sorted(stale)}, which it does not take"
    missing = [n for n in params if n not in exercised and n not in per_call]
    assert not missing, (
        f"{fn.__name__} parameters {missing} are neither varied by tests/test_memo_keys_cpu.py nor declared per-call "
        f"data: add their values to a baseline here (the test then checks the call signature keys them), or "
        f"declare them in the per-call dict with the reason"
    )
    for name, reason in per_call.items():
        assert isinstance(reason, str) and reason.strip() and "\n" not in reason, f"{name}: a one-line reason"


@pytest.mark.parametrize("entry,base", list(BASELINES), ids=[f"{e}-{b}" for e, b in BASELINES])
def test_baseline_calls_are_memoised(entry: str, base: str) -> None:
    """The baseline call is looked up under a hashable signature (a call without one would never
    be remembered, and would validate on every call), the same one twice, and with the FP8
    baselines the F16 and FP8 calls never share one."""
    values = BASELINES[(entry, base)]()
    baseline = {n: vs[0][1] for n, vs in values.items()}
    first = _signature(entry, baseline, "the baseline")
    hash(first)
    assert _signature(entry, dict(baseline), "the baseline again") == first
    if base == "fp8":
        f16 = BASELINES[(entry, "f16")]()
        assert _signature(entry, {n: vs[0][1] for n, vs in f16.items()}, "the F16 baseline") != first
