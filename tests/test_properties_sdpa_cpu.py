"""Property-based tests (hypothesis) of ``te_cudnn.scaled_dot_product_attention``'s input validation, on the CPU.

Random calls with [b, h, s, d] tensors (contiguous BHSD, transposed BSHD views, padded / strided
/ expanded views) on the CPU and the meta device, masks of every dtype and broadcast shape,
is_causal, dropout_p, scale and enable_gqa, by keyword or by position, well-formed or with one
or two mutations that make them malformed: a well-formed call reaches te_cudnn's ``ValueError``
that says fused attention "executes on CUDA devices"; a malformed one raises ``ValueError`` /
``TypeError`` naming an argument involved, or ``UnsupportedConfigError`` where the docstring
promises it (float32 / float64 / FP8 inputs, key and value head counts that differ; integer
inputs raise ``TypeError``); never another exception type and never a silent acceptance.

Messages raised by the attention core name its arguments (``q``, ``k``, ``v``, ``attn_bias``,
``attn_scale``); they count as naming the SDPA argument they stand for, and the summary counts
how often only such a core name was given (``named-core-name-only``).

Seeds (``TE_CUDNN_PROPERTY_SEED``), run size (``TE_CUDNN_PROPERTY_SCALE``), the outcome table printed
with ``pytest -s`` and the known library bugs (``KNOWN_BUGS``, ``TE_CUDNN_PROPERTY_KNOWN_BUGS``):
see tests/_property_helpers.py.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest
import torch
from hypothesis import event, given, note, seed, settings
from hypothesis import strategies as st

from te_cudnn import scaled_dot_product_attention

from _property_helpers import (
    _SCALE, BF16, FP16, INF, NAN, OUTCOMES, SEED, SETTINGS, MutationCase, _describe, _divisors, _judge, _moved, _other_device,
    _rarely, _record, _show, _summarize, _with_dim, apply_mutations,
)  # fmt: skip

SDPA_NAMES = frozenset(inspect.signature(scaled_dot_product_attention).parameters)
SDPA_CORE = frozenset({"q", "k", "v", "attn_bias", "attn_scale", "dropout"})


@dataclass
class SdpaCase(MutationCase):
    qkv: list[Any]
    kw: dict[str, Any]
    device: str
    dims: tuple  # (b, h, hk, sq, skv, d, dv, dtype)

    def aliases(self, names: set[str]) -> set[str]:
        core = {n[0] for n in names if n in ("query", "key", "value")}  # the core's q, k, v
        return core | ({"attn_bias"} if "attn_mask" in names else set())  # the core's word for the mask


def _bhsd(draw, b: int, h: int, s: int, d: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """A [b, h, s, d] tensor: contiguous BHSD, a transposed BSHD view, or another strided view."""
    style = draw(st.sampled_from(["bhsd", "bshd", "bshd", "padded", "step", "expanded"]))
    if style == "bshd":
        return torch.empty(b, s, h, d, dtype=dtype, device=device).transpose(1, 2)
    if style == "padded":
        return torch.empty(b, h, s, d + 8, dtype=dtype, device=device)[..., :d]
    if style == "step":
        return torch.empty(b, s, h, 2 * d, dtype=dtype, device=device)[..., ::2].transpose(1, 2)
    if style == "expanded":
        return torch.empty(1, h, s, d, dtype=dtype, device=device).expand(b, h, s, d)
    return torch.empty(b, h, s, d, dtype=dtype, device=device)


@st.composite
def sdpa_cases(draw) -> SdpaCase:
    b = 0 if _rarely(draw, 3) else draw(st.sampled_from([1, 2, 3]))
    h = draw(st.sampled_from([1, 2, 4, 3, 8]))
    gqa = draw(st.booleans())
    hk = draw(st.sampled_from(_divisors(h))) if gqa else h
    sq = 0 if _rarely(draw, 3) else draw(st.sampled_from([16, 1, 5, 64, 128]))
    skv = 0 if _rarely(draw, 3) else (sq if draw(st.booleans()) else draw(st.sampled_from([16, 1, 7, 64, 200])))
    d = draw(st.sampled_from([64, 128, 32, 16, 8, 96, 256]))
    dv = d if draw(st.booleans()) else draw(st.sampled_from([64, 128, 32]))
    odd = _rarely(draw, 5)
    if odd:
        d, dv = draw(st.sampled_from([(7, 7), (12, 12), (64, 7), (4, 4)]))
    dtype = draw(st.sampled_from([BF16, FP16]))
    device = "meta" if _rarely(draw, 5) else "cpu"
    qkv = [_bhsd(draw, b, h, sq, d, dtype, device), _bhsd(draw, b, hk, skv, d, dtype, device),
           _bhsd(draw, b, hk, skv, dv, dtype, device)]  # fmt: skip
    if draw(st.integers(0, 9)) == 9:
        qkv[0].requires_grad_(True) if qkv[0].is_leaf else None
    kw: dict[str, Any] = {}
    if gqa or draw(st.booleans()):
        kw["enable_gqa"] = gqa
    c = SdpaCase(qkv=qkv, kw=kw, device=device, dims=(b, h, hk, sq, skv, d, dv, dtype))
    c.unsupported_ok = odd
    kind = draw(st.sampled_from(["none", "none", "bool", "float"]))
    if kind != "none":
        full = (b, h, sq, skv)
        shape = tuple(n if draw(st.booleans()) else 1 for n in full)[draw(st.integers(0, 2)):]
        mdt = torch.bool if kind == "bool" else draw(st.sampled_from([torch.float32, dtype]))
        mask = torch.zeros(shape, dtype=mdt, device=device)
        if kind == "float" and _rarely(draw, 10):
            mask.requires_grad_(True)
            if b == h == sq == 1:
                c.unsupported_ok = True  # cuDNN gives no dBias for a [1, 1, 1, S] bias (documented)
        kw["attn_mask"] = mask
    elif draw(st.booleans()):
        kw["is_causal"] = draw(st.booleans())
    if draw(st.booleans()):
        kw["dropout_p"] = draw(st.sampled_from([0.0, 0, 0.1, 0.5]))
    if draw(st.booleans()):
        kw["scale"] = draw(st.sampled_from([None, 0.125, 1, 2.0, 0.0, -0.5]))

    return apply_mutations(draw, c, SDPA_MUTATIONS)


QKV_NAMES = ("query", "key", "value")


def _tensors(c: SdpaCase) -> bool:
    return all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.layout == torch.strided for t in c.qkv)


def _s_not_tensor(draw, c: SdpaCase) -> bool:
    i = draw(st.integers(0, 2))
    c.qkv[i] = draw(st.sampled_from([None, [[0.0]], 1.0, "q"]))
    c.error("not-a-tensor", {QKV_NAMES[i]})
    return True


def _s_dims(draw, c: SdpaCase) -> bool:
    i = draw(st.integers(0, 2))
    t = c.qkv[i]
    if not isinstance(t, torch.Tensor):
        return False
    c.qkv[i] = torch.empty(t.shape[1:], dtype=t.dtype, device=t.device) if draw(st.booleans()) else t[None]
    c.error("dims", {QKV_NAMES[i]})
    return True


def _s_sparse(draw, c: SdpaCase) -> bool:
    i = draw(st.integers(0, 2))
    t = c.qkv[i]
    if not isinstance(t, torch.Tensor) or c.device != "cpu" or t.dim() != 4 or t.dtype.itemsize == 1:
        return False  # (to_sparse has no CPU kernel for float8 and int8)
    c.qkv[i] = torch.zeros(t.shape, dtype=t.dtype).to_sparse()
    c.error("sparse", {QKV_NAMES[i]})
    return True


def _s_enable_gqa_type(draw, c: SdpaCase) -> bool:
    c.kw["enable_gqa"] = draw(st.sampled_from([1, 0, None, "yes"]))
    c.error("enable_gqa-type", {"enable_gqa"})
    return True


def _s_dtype_mix(draw, c: SdpaCase) -> bool:
    i = draw(st.integers(1, 2))
    t = c.qkv[i]
    if not isinstance(t, torch.Tensor):
        return False
    c.qkv[i] = t.to(FP16 if t.dtype == BF16 else BF16)
    c.error("dtype-mix", set(QKV_NAMES))
    return True


def _s_dtype(draw, c: SdpaCase) -> bool:
    if not all(isinstance(t, torch.Tensor) for t in c.qkv):
        return False
    dt = draw(st.sampled_from([torch.float32, torch.float64, torch.float8_e4m3fn, torch.int32, torch.int8, torch.bool]))
    c.qkv = [t.detach().to(dt) for t in c.qkv]
    if dt.is_floating_point:  # the docstring: float32 (any non-fp16/bf16 float) -> UnsupportedConfigError
        c.error("dtype-float", set(), unsupported=True)
    else:
        c.error("dtype-int", {"query"})
    return True


def _s_device(draw, c: SdpaCase) -> bool:
    i = draw(st.integers(1, 2))
    t = c.qkv[i]
    if not isinstance(t, torch.Tensor):
        return False
    c.qkv[i] = _moved(t, _other_device(c.device))
    c.error("device-mix", set(QKV_NAMES))
    return True


def _s_batch(draw, c: SdpaCase) -> bool:
    if not _tensors(c):
        return False
    c.qkv[1] = _with_dim(c.qkv[1], 0, c.qkv[1].shape[0] + 1)
    c.qkv[2] = _with_dim(c.qkv[2], 0, c.qkv[2].shape[0] + 1)
    c.error("batch", set(QKV_NAMES))
    return True


def _s_kv_len(draw, c: SdpaCase) -> bool:
    if not _tensors(c):
        return False
    c.qkv[2] = _with_dim(c.qkv[2], 2, c.qkv[2].shape[2] + 1)
    c.error("kv-length", {"key", "value"})
    return True


def _s_head_dim(draw, c: SdpaCase) -> bool:
    if not _tensors(c):
        return False
    c.qkv[1] = _with_dim(c.qkv[1], 3, c.qkv[1].shape[3] + 8)
    c.error("head-dim", {"query", "key"})
    return True


def _s_heads(draw, c: SdpaCase) -> bool:
    if not _tensors(c):
        return False
    h = c.qkv[0].shape[1]
    gqa = c.kw.get("enable_gqa", False) is True
    hk = h + draw(st.sampled_from([1, 2])) if gqa else draw(st.sampled_from([n for n in (h + 1, 1, 2) if n != h]))
    c.qkv[1], c.qkv[2] = _with_dim(c.qkv[1], 1, hk), _with_dim(c.qkv[2], 1, hk)
    c.error("heads", {"query", "key", "value", "enable_gqa"})
    return True


def _s_kv_heads_differ(draw, c: SdpaCase) -> bool:
    if not _tensors(c):
        return False
    h = c.qkv[0].shape[1]
    pairs = [(a, b) for a in _divisors(h) for b in _divisors(h) if a != b]
    if not pairs:
        return False
    hk, hv = draw(st.sampled_from(pairs))
    c.kw["enable_gqa"] = True
    c.qkv[1], c.qkv[2] = _with_dim(c.qkv[1], 1, hk), _with_dim(c.qkv[2], 1, hv)
    c.error("kv-heads-differ", set(), unsupported=True)  # documented: UnsupportedConfigError
    return True


def _s_zero_heads(draw, c: SdpaCase) -> bool:
    if not _tensors(c):
        return False
    if draw(st.booleans()):
        c.qkv = [_with_dim(t, 1, 0) for t in c.qkv]
    else:
        c.qkv = [_with_dim(t, 3, 0) for t in c.qkv]
    c.error("zero-heads-or-head-dim", {"query", "key", "value", "enable_gqa", "attn_mask"})  # a mask of h heads
    return True


def _s_dropout(draw, c: SdpaCase) -> bool:
    c.kw["dropout_p"] = draw(st.sampled_from([1.0, 1, -0.1, 1.5, NAN, INF, "0.1", True, None, torch.tensor(0.1)]))
    c.error("dropout_p-invalid", {"dropout_p"})
    return True


def _s_causal_type(draw, c: SdpaCase) -> bool:
    c.kw["is_causal"] = draw(st.sampled_from([1, 0, None, "yes"]))
    c.error("is_causal-type", {"is_causal"})
    return True


def _s_mask_and_causal(draw, c: SdpaCase) -> bool:
    if not isinstance(c.kw.get("attn_mask"), torch.Tensor):
        return False
    c.kw["is_causal"] = True
    c.error("attn_mask-with-is_causal", {"attn_mask", "is_causal"})
    return True


def _s_scale(draw, c: SdpaCase) -> bool:
    c.kw["scale"] = draw(st.sampled_from([NAN, INF, -INF, "0.1", True, torch.tensor(0.1), [0.1]]))
    c.error("scale-invalid", {"scale"})
    return True


def _s_mask_type(draw, c: SdpaCase) -> bool:
    c.kw.pop("is_causal", None)
    c.kw["attn_mask"] = draw(st.sampled_from([[[True]], 1.0, "mask", (torch.zeros(1),)]))
    c.error("attn_mask-type", {"attn_mask"})
    return True


def _s_mask_dtype(draw, c: SdpaCase) -> bool:
    if not _tensors(c):
        return False
    b, h, hk, sq, skv, d, dv, dtype = c.dims
    mdt = draw(st.sampled_from([torch.int32, torch.int64, torch.float64, FP16 if dtype == BF16 else BF16]))
    c.kw.pop("is_causal", None)
    c.kw["attn_mask"] = torch.zeros(sq, skv, dtype=mdt, device=c.device)
    c.error("attn_mask-dtype", {"attn_mask"})
    return True


def _s_mask_shape(draw, c: SdpaCase) -> bool:
    b, h, hk, sq, skv, d, dv, dtype = c.dims
    shape = draw(st.sampled_from([(sq, skv + 2), (sq + 2, skv), (1, h + 1, sq, skv), (b + 2, 1, sq, skv),
                                  (1, 1, 1, sq, skv), (skv + 2,)]))  # fmt: skip
    c.kw.pop("is_causal", None)
    c.kw["attn_mask"] = torch.zeros(shape, dtype=torch.bool, device=c.device)
    c.error("attn_mask-shape", {"attn_mask"})
    return True


def _s_mask_device(draw, c: SdpaCase) -> bool:
    b, h, hk, sq, skv, d, dv, dtype = c.dims
    c.kw.pop("is_causal", None)
    c.kw["attn_mask"] = torch.zeros(sq, skv, dtype=torch.bool, device=_other_device(c.device))
    c.error("attn_mask-device", {"attn_mask"})
    return True


def _s_mask_sparse(draw, c: SdpaCase) -> bool:
    if c.device != "cpu":
        return False
    b, h, hk, sq, skv, d, dv, dtype = c.dims
    c.kw.pop("is_causal", None)
    mdt = draw(st.sampled_from([torch.bool, torch.float32]))
    c.kw["attn_mask"] = torch.zeros(sq, skv, dtype=mdt).to_sparse()
    c.error("attn_mask-sparse", {"attn_mask"}, "sdpa-sparse-mask")
    return True


SDPA_MUTATIONS: dict[str, Callable[[Any, SdpaCase], bool]] = {
    name.removeprefix("_s_"): fn for name, fn in dict(globals()).items() if name.startswith("_s_")
}


@seed(SEED)
@settings(max_examples=900 * _SCALE, **SETTINGS)
@given(c=sdpa_cases(), positional=st.booleans())
def _sdpa_property(c: SdpaCase, positional: bool) -> None:
    note(f"replay with TE_CUDNN_PROPERTY_SEED={SEED}")
    note(f"dims={c.dims} device={c.device}")
    note(f"q/k/v: {[_show(t) for t in c.qkv]}")
    note(f"kw={ {k: _show(v) for k, v in c.kw.items()} }")
    note(f"errors={sorted(c.errors)}")
    test = "sdpa"
    _record(test, "invalid:drawn" if c.errors else "valid:drawn")
    for tag in c.errors:
        event(f"mutation {tag}")
    kw = dict(c.kw)
    args = list(c.qkv)
    if positional:  # attn_mask, dropout_p, is_causal may go by position (torch's signature)
        for name, default in (("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False)):
            args.append(kw.pop(name, default))
    err: Optional[BaseException] = None
    try:
        scaled_dot_product_attention(*args, **kw)
    except Exception as e:  # noqa: BLE001
        err = e
    note(f"outcome: {_describe(err)[:300]}")
    _judge(test, c, err, SDPA_NAMES | SDPA_CORE, SDPA_CORE,
           "te_cudnn.scaled_dot_product_attention")  # fmt: skip


@pytest.mark.slow
def test_sdpa_reaches_cuda_or_names_the_argument() -> None:
    """Drawn SDPA calls on CPU / meta tensors: well-formed ones end in the CUDA-device
    ValueError; malformed ones in a typed error naming an argument, or UnsupportedConfigError
    where the docstring promises it (non-fp16/bf16 floats, key and value head counts that differ)."""
    OUTCOMES["sdpa"].clear()
    _sdpa_property()
    _summarize("sdpa", "valid:drawn", "invalid:drawn")
