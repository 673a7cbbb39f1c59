"""Malformed ``DotProductAttention.forward`` calls, for tests/test_properties_module_forward_cpu.py.

``FwdCase`` is a drawn forward call with what an error may say about it: for each mutation
applied, the argument names an error may name, the known bug (``KNOWN_BUGS`` in
tests/_property_helpers.py) it may meet and whether ``UnsupportedConfigError`` is a right
answer. The mutations (``FWD_MUTATIONS``) each make a well-formed call malformed in one way:
shapes, dtypes, devices, biases, padding and arbitrary masks, cu_seqlens, formats, windows,
FP8 metadata and conflicts, lengths, a non-finite softmax_scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from hypothesis import strategies as st

from _property_helpers import BF16, FP16, INF, NAN, MutationCase, _moved, _other_device, _with_dim

LAYER = {"q": "query_layer", "k": "key_layer", "v": "value_layer"}
#: What the module's tensors are called by the attention core (its messages use these).
CORE_ALIASES = {"query_layer": "q", "key_layer": "k", "value_layer": "v", "core_attention_bias": "attn_bias",
                "softmax_scale": "attn_scale"}  # fmt: skip


@dataclass
class FwdCase(MutationCase):
    ctor: dict[str, Any]
    qkv: list[Any]
    kw: dict[str, Any]
    training: bool
    grad: bool
    fmt: str
    mask: str
    cross: bool
    fp8: bool
    device: str
    dims: tuple  # (b, sq, skv, h, hg, d_qk, d_v, dtype)

    def aliases(self, names: set[str]) -> set[str]:
        return {CORE_ALIASES[n] for n in names if n in CORE_ALIASES}


def _cu(lengths: list[int], device: str) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def _padding_mask(lengths: list[int], s: int, device: str) -> torch.Tensor:
    """TE's [b, 1, 1, s] padding mask: True = padding, at the end of each sequence."""
    pos = torch.arange(s)[None, :] >= torch.tensor(lengths, dtype=torch.long)[:, None]
    return pos.view(len(lengths), 1, 1, s).to(device)


# ---- mutations: each makes the call malformed (or returns False where it does not apply)


def _m_shape(draw, c: FwdCase) -> bool:
    which = draw(st.sampled_from("qkv"))
    i = "qkv".index(which)
    t = c.qkv[i]
    if not isinstance(t, torch.Tensor):
        return False
    kind = draw(st.sampled_from(["more-dims", "fewer-dims", "heads", "head-dim"]))
    if kind == "more-dims":
        c.qkv[i] = t.unsqueeze(0)
    elif kind == "fewer-dims":
        c.qkv[i] = torch.empty(t.shape[1:], dtype=t.dtype, device=t.device)
    elif kind == "heads":
        c.qkv[i] = _with_dim(t, -2, t.shape[-2] + draw(st.sampled_from([1, 2])))
    else:
        c.qkv[i] = _with_dim(t, -1, t.shape[-1] + 8)
    c.error(f"shape-{kind}", {LAYER[which]})
    return True


def _m_not_tensor(draw, c: FwdCase) -> bool:
    which = draw(st.sampled_from("qkv"))
    c.qkv["qkv".index(which)] = draw(st.sampled_from([None, [[0.0]], 1.0, "q"]))
    c.error("not-a-tensor", {LAYER[which]})
    return True


def _m_dtype(draw, c: FwdCase) -> bool:
    if not all(isinstance(t, torch.Tensor) for t in c.qkv):
        return False
    dt = draw(st.sampled_from([torch.float32, torch.float64, torch.int32, torch.int8, torch.bool,
                               torch.float8_e4m3fn]))  # fmt: skip
    c.qkv = [t.to(dt) for t in c.qkv]
    names = {"query_layer", "key_layer", "value_layer", "q", "k", "v", "core_attention_bias"}
    if dt == torch.float8_e4m3fn:
        names.add("d_scale_qkv")  # the core asks for FP8 metadata (the module's word for it is fp8_meta)
    if c.fp8 and dt in (torch.float32, torch.float64):
        c.gray["fp8-float-inputs"] = frozenset(names | {"fp8_meta"})  # quantized like fp16/bf16 ones
        return True
    bug = None
    if c.fp8:
        bug = "fp8-dtype-unchecked"
    elif c.mask == "arbitrary" and not dt.is_floating_point:
        bug = "arbitrary-nonfloat-dtype"
    c.error("dtype", names, bug, unsupported=dt == torch.float8_e4m3fn and not c.fp8)
    return True


def _m_dtype_mix(draw, c: FwdCase) -> bool:
    which = draw(st.sampled_from("kv"))
    i = "qkv".index(which)
    if not isinstance(c.qkv[i], torch.Tensor):
        return False
    c.qkv[i] = c.qkv[i].to(FP16 if c.qkv[i].dtype == BF16 else BF16)
    c.error("dtype-mix", {LAYER[which], "q", "query_layer"}, "fp8-dtype-unchecked" if c.fp8 else None)
    return True


def _m_device(draw, c: FwdCase) -> bool:
    which = draw(st.sampled_from("kv"))
    i = "qkv".index(which)
    if not isinstance(c.qkv[i], torch.Tensor):
        return False
    c.qkv[i] = _moved(c.qkv[i], _other_device(c.device))
    c.error("device", {LAYER[which], "q", "query_layer"}, "fp8-device-unchecked" if c.fp8 else None)
    return True


BIAS_NAMES = {"core_attention_bias_type", "core_attention_bias"}


def _m_bias_type_without_tensor(draw, c: FwdCase) -> bool:
    c.kw["core_attention_bias_type"] = "post_scale_bias"
    c.kw.pop("core_attention_bias", None)
    c.gray.pop("thd-bias", None)
    c.error("bias-type-without-tensor", BIAS_NAMES)
    return True


def _m_bias_tensor_without_type(draw, c: FwdCase) -> bool:
    b, sq, skv, h, *_, dtype = c.dims
    c.kw["core_attention_bias_type"] = draw(st.sampled_from(["no_bias", "alibi"]))
    c.kw["core_attention_bias"] = torch.empty(1, h, sq, skv, dtype=dtype, device=c.device)
    c.gray.pop("thd-bias", None)
    c.error("bias-tensor-without-type", BIAS_NAMES)
    return True


def _m_bias_type_invalid(draw, c: FwdCase) -> bool:
    c.kw["core_attention_bias_type"] = draw(st.sampled_from(["pre_scale_bias", "POST_SCALE_BIAS", "", None, 1,
                                                             "bias"]))  # fmt: skip
    c.error("bias-type-invalid", {"core_attention_bias_type"})
    return True


def _m_bias_shape(draw, c: FwdCase) -> bool:
    if c.fmt == "thd" or c.fp8:
        return False
    b, sq, skv, h, *_, dtype = c.dims
    shape = draw(st.sampled_from([(1, h, sq, skv + 1), (b + 2, 1, sq, skv), (h, sq, skv), (1, h + 1, sq, skv),
                                  (1, 1, sq + 1, skv)]))  # fmt: skip
    c.kw["core_attention_bias_type"] = "post_scale_bias"
    c.kw["core_attention_bias"] = torch.empty(shape, dtype=dtype, device=c.device)
    c.error("bias-shape", BIAS_NAMES, "arbitrary-bias-merge" if c.mask == "arbitrary" else None)
    return True


def _m_bias_dtype(draw, c: FwdCase) -> bool:
    if c.fmt == "thd" or c.fp8:
        return False
    b, sq, skv, h, *_, dtype = c.dims
    other = draw(st.sampled_from([torch.float32, FP16 if dtype == BF16 else BF16]))
    c.kw["core_attention_bias_type"] = "post_scale_bias"
    c.kw["core_attention_bias"] = torch.empty(1, h, sq, skv, dtype=other, device=c.device)
    c.error("bias-dtype", BIAS_NAMES)
    return True


def _m_bias_junk(draw, c: FwdCase) -> bool:
    c.kw["core_attention_bias_type"] = "post_scale_bias"
    c.kw["core_attention_bias"] = draw(st.sampled_from([5, 0.5, [[0.0]], "bias"]))
    c.gray.pop("thd-bias", None)
    names = BIAS_NAMES | ({"fp8_meta"} if c.fp8 else set())
    c.error("bias-junk", names, "arbitrary-bias-merge" if c.mask == "arbitrary" else None)
    return True


def _m_padding_without_lengths(draw, c: FwdCase) -> bool:
    if c.fmt == "thd" or "padding" not in c.mask:
        return False
    for name in ("attention_mask", "cu_seqlens_q", "cu_seqlens_kv"):
        c.kw.pop(name, None)
    c.error("padding-without-lengths", {"attn_mask_type", "attention_mask", "cu_seqlens_q"})
    return True


def _m_unused_mask(draw, c: FwdCase) -> bool:
    if c.fmt == "thd" or "padding" in c.mask or c.mask == "arbitrary":
        return False
    b, sq, skv, *_ = c.dims
    c.kw["attention_mask"] = _padding_mask([skv] * b, skv, c.device)
    c.error("mask-not-used", {"attention_mask"})
    return True


def _m_thd_mask(draw, c: FwdCase) -> bool:
    if c.fmt != "thd":
        return False
    b, sq, *_ = c.dims
    c.kw["attention_mask"] = _padding_mask([sq] * b, sq, c.device)
    c.error("thd-with-attention_mask", {"attention_mask", "qkv_format"})
    return True


def _m_thd_without_cu(draw, c: FwdCase) -> bool:
    if c.fmt != "thd":
        return False
    if c.cross:
        c.kw.pop(draw(st.sampled_from(["cu_seqlens_q", "cu_seqlens_kv"])), None)
    else:
        c.kw.pop("cu_seqlens_q", None)
        c.kw.pop("cu_seqlens_kv", None)
    c.error("thd-without-cu_seqlens", {"cu_seqlens_q", "cu_seqlens_kv", "qkv_format"})
    return True


def _mask_path(c: FwdCase) -> bool:
    """A non-THD padding call that takes its lengths from attention_mask (turned into one if not)."""
    if c.fmt == "thd" or "padding" not in c.mask:
        return False
    b, sq, skv, *_ = c.dims
    if "attention_mask" not in c.kw:
        c.kw.pop("cu_seqlens_q", None)
        c.kw.pop("cu_seqlens_kv", None)
        full = (_padding_mask([sq] * b, sq, c.device), _padding_mask([skv] * b, skv, c.device))
        c.kw["attention_mask"] = full if c.cross else full[0]
    return True


def _m_cross_single_mask(draw, c: FwdCase) -> bool:
    if not c.cross or not _mask_path(c):
        return False
    b, sq, *_ = c.dims
    c.kw["attention_mask"] = _padding_mask([sq] * b, sq, c.device)
    c.error("cross-single-mask", {"attention_mask"})
    return True


def _replace_q_mask(c: FwdCase, bad: torch.Tensor) -> bool:
    """Put ``bad`` where the case's query padding mask is (alone, or first of a (q, kv) pair);
    False when an earlier mutation left no mask there to replace (the junk of
    :func:`_m_padding_mask_junk`: a 1-tuple, an empty tuple, a list, an int)."""
    m = c.kw["attention_mask"]
    if isinstance(m, tuple):
        if len(m) != 2:
            return False
        c.kw["attention_mask"] = (bad, m[1])
    elif isinstance(m, torch.Tensor):
        c.kw["attention_mask"] = bad
    else:
        return False
    return True


def _m_padding_mask_bad(draw, c: FwdCase) -> bool:
    if not _mask_path(c):
        return False
    b, sq, *_ = c.dims
    candidates = [
        torch.zeros(b, 1, 1, sq, dtype=torch.int32), torch.zeros(b, 1, sq, dtype=torch.bool),
        torch.zeros(b, 1, sq, sq, dtype=torch.bool), torch.zeros(b, 1, 1, sq), torch.zeros(b, sq, dtype=torch.bool),
    ]  # fmt: skip
    # with sq = 1 a [b, 1, sq, sq] bool mask is the well-formed [b, 1, 1, sq] one (seed 1923347629)
    well_formed = ((b, 1, 1, sq), torch.bool)
    bad = draw(st.sampled_from([t for t in candidates if (tuple(t.shape), t.dtype) != well_formed])).to(c.device)
    if not _replace_q_mask(c, bad):
        return False
    c.error("padding-mask-malformed", {"attention_mask"})
    return True


def _m_padding_mask_junk(draw, c: FwdCase) -> bool:
    if not _mask_path(c):
        return False
    m = c.kw["attention_mask"]
    one = m[0] if isinstance(m, tuple) else m
    c.kw["attention_mask"] = draw(st.sampled_from([5, [[True]], (one,), (None, None), (one, "kv"), ()]))
    c.error("padding-mask-junk", {"attention_mask"}, "padding-mask-junk")
    return True


def _m_padding_mask_batch(draw, c: FwdCase) -> bool:
    if not _mask_path(c):
        return False
    b, sq, *_ = c.dims
    bad = _padding_mask([sq] * (b + 1), sq, c.device)
    if not _replace_q_mask(c, bad):
        return False
    c.error("padding-mask-batch", {"attention_mask", "cu_seqlens_q", "cu_seqlens_kv"})
    return True


def _m_padding_mask_length(draw, c: FwdCase) -> bool:
    if not _mask_path(c):
        return False
    b, sq, *_ = c.dims
    bad = _padding_mask([sq + 8] * b, sq + 8, c.device)  # more positions (and tokens) than q has
    if not _replace_q_mask(c, bad):
        return False
    c.error("padding-mask-length", {"attention_mask"}, "padding-mask-length-unchecked")
    return True


def _m_arbitrary_without_mask(draw, c: FwdCase) -> bool:
    if c.mask != "arbitrary":
        return False
    c.kw.pop("attention_mask", None)
    c.error("arbitrary-without-mask", {"attention_mask", "attn_mask_type"})
    return True


def _m_arbitrary_not_bool(draw, c: FwdCase) -> bool:
    if c.mask != "arbitrary":
        return False
    b, sq, skv, *_ = c.dims
    m = torch.zeros(1, 1, sq, skv, device=c.device)
    c.kw["attention_mask"] = draw(st.sampled_from([m, m.int(), (m.bool(), m.bool()), [[True]]]))
    c.error("arbitrary-not-bool", {"attention_mask"})
    return True


def _m_arbitrary_shape(draw, c: FwdCase) -> bool:
    if c.mask != "arbitrary":
        return False
    b, sq, skv, h, *_ = c.dims
    kind = draw(st.sampled_from(["sq", "skv", "2d", "5d", "batch"]))
    shape = {"sq": (1, 1, sq + 1, skv), "skv": (1, 1, sq, skv + 2), "2d": (sq, skv), "5d": (1, 1, 1, sq, skv),
             "batch": (b + 2, 1, sq, skv)}[kind]  # fmt: skip
    c.kw["attention_mask"] = torch.zeros(shape, dtype=torch.bool, device=c.device)
    names = {"attention_mask"} | ({"attn_bias"} if kind == "batch" else set())
    c.error(f"arbitrary-shape-{kind}", names, "arbitrary-mask-shape" if kind in ("sq", "skv") else None)
    return True


def _m_arbitrary_thd(draw, c: FwdCase) -> bool:
    if c.fmt != "thd":
        return False
    b, sq, skv, *_ = c.dims
    c.kw["attn_mask_type"] = "arbitrary"
    c.kw["attention_mask"] = torch.zeros(1, 1, sq, skv, dtype=torch.bool, device=c.device)
    c.error("arbitrary-thd", {"attn_mask_type", "qkv_format"})
    return True


def _m_arbitrary_alibi(draw, c: FwdCase) -> bool:
    if c.mask != "arbitrary" or "core_attention_bias" in c.kw:
        return False
    c.kw["core_attention_bias_type"] = "alibi"
    c.error("arbitrary-alibi", {"core_attention_bias_type", "attn_mask_type", "attention_mask"},
            "arbitrary-alibi-dropped", unsupported=True)  # fmt: skip
    return True


def _m_cu_bad(draw, c: FwdCase) -> bool:
    names = [n for n in ("cu_seqlens_q", "cu_seqlens_kv") if n in c.kw]
    if not names:
        return False
    name = draw(st.sampled_from(names))
    good = c.kw[name]
    n = good.shape[0]
    kinds = ["int64", "float", "2d", "list", "device", "0d"] + (["short", "long"] if c.fmt != "thd" else [])
    kind = draw(st.sampled_from(kinds))
    c.kw[name] = {
        "int64": lambda: good.long(), "float": lambda: good.float(), "2d": lambda: good[None],
        "list": lambda: [0] * n, "device": lambda: _moved(good, _other_device(c.device)),
        "0d": lambda: good[0], "short": lambda: good[:-1], "long": lambda: torch.cat([good, good[-1:]]),
    }[kind]()  # fmt: skip
    c.error(f"cu_seqlens-{kind}", {"cu_seqlens_q", "cu_seqlens_kv"})
    return True


def _m_format_invalid(draw, c: FwdCase) -> bool:
    c.kw["qkv_format"] = draw(st.sampled_from(["bhsd", "BSHD", "", 5, "thd_thd_thd"]))
    c.error("qkv_format-invalid", {"qkv_format"})
    return True


def _m_mask_type_invalid(draw, c: FwdCase) -> bool:
    c.kw["attn_mask_type"] = draw(st.sampled_from(["full", "CAUSAL", "", 5, "padding_top_left"]))
    c.error("attn_mask_type-invalid", {"attn_mask_type"})
    return True


def _m_window_invalid(draw, c: FwdCase) -> bool:
    values = [(5, None), ((1,), None), ((1, 2, 3), None), ("ab", None), (torch.tensor([4, 0]), None),
              ((-5, 0), None), ((0, -3), None), (("a", 0), "window-unnamed"), ((None, 0), "window-unnamed"),
              ((1.5, 0), "window-truncated")]  # fmt: skip
    if "causal" in c.mask and c.mask != "arbitrary":
        values.append(((8, 4), None))
    value, bug = draw(st.sampled_from(values))
    c.kw["window_size"] = value
    if bug == "window-truncated" and not c.fp8:
        c.kw["window_size"] = (1.5, 0 if "causal" in c.mask else -1)
    names = {"window_size"} | ({"fp8_meta"} if c.fp8 else set())
    c.error("window_size-invalid", names, bug)
    return True


def _m_fp8_conflict(draw, c: FwdCase) -> bool:
    if not c.fp8:
        return False
    b, sq, skv, h, *_, dtype = c.dims
    kind = draw(st.sampled_from(["dropout", "bias", "window", "alibi"] + (["padded"] if c.fmt == "thd" else [])))
    if kind == "dropout":
        c.ctor["attention_dropout"] = 0.1
        c.training = True
        c.error("fp8-dropout", {"fp8_meta", "attention_dropout"})
    elif kind == "bias":
        c.kw["core_attention_bias_type"] = "post_scale_bias"
        c.kw["core_attention_bias"] = torch.empty(1, h, sq, skv, dtype=dtype, device=c.device)
        c.error("fp8-bias", {"fp8_meta", "core_attention_bias"})
    elif kind == "window":
        c.kw["window_size"] = (8, 0)
        c.error("fp8-window", {"fp8_meta", "window_size"})
    elif kind == "alibi":
        c.kw["core_attention_bias_type"] = "alibi"
        c.kw.pop("core_attention_bias", None)
        c.error("fp8-alibi", {"fp8_meta", "core_attention_bias_type"}, "fp8-alibi-dropped", unsupported=True)
    else:
        c.kw["cu_seqlens_q_padded"] = _cu([sq] * b, c.device)
        c.kw["cu_seqlens_kv_padded"] = _cu([skv] * b, c.device)
        c.error("fp8-padded", {"fp8_meta", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"}, "fp8-padded-dropped")
    return True


def _m_fp8_junk(draw, c: FwdCase) -> bool:
    junk = draw(st.sampled_from(["fp8", 5, torch.ones(3), {"scale": 1.0}]))
    if draw(st.booleans()):
        c.kw["fp8_meta"] = junk
    else:
        c.ctor["fp8_meta"] = junk
        c.kw.pop("fp8_meta", None)
    c.fp8 = True
    c.error("fp8_meta-junk", {"fp8_meta"}, "fp8-junk")
    return True


def _m_max_seqlen_junk(draw, c: FwdCase) -> bool:
    if c.fmt != "thd":
        return False
    c.kw[draw(st.sampled_from(["max_seqlen_q", "max_seqlen_kv"]))] = draw(st.sampled_from(["16", 1.5, -1, [16]]))
    c.error("max_seqlen-junk", {"max_seqlen_q", "max_seqlen_kv"})
    return True


def _m_padded_junk(draw, c: FwdCase) -> bool:
    if c.fmt != "thd" or c.fp8:
        return False
    c.kw[draw(st.sampled_from(["cu_seqlens_q_padded", "cu_seqlens_kv_padded"]))] = draw(st.sampled_from([5, "x", [0]]))
    c.error("cu_seqlens_padded-junk", {"cu_seqlens_q_padded", "cu_seqlens_kv_padded"})
    return True


def _m_softmax_scale(draw, c: FwdCase) -> bool:
    c.ctor["softmax_scale"] = draw(st.sampled_from([NAN, INF, -INF]))
    c.error("softmax_scale-not-finite", {"softmax_scale"})
    return True


FWD_MUTATIONS: dict[str, Callable[[Any, FwdCase], bool]] = {
    name.removeprefix("_m_"): fn for name, fn in dict(globals()).items() if name.startswith("_m_")
}
