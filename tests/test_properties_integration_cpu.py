"""Property-based tests (hypothesis) of the PyTorch-facing entry points' input validation, on the CPU.

Three entry points, driven with random well-formed calls and random calls with one or two
things wrong (every malformed value is drawn with the reason it is wrong and the argument
names an error may name):

* ``DotProductAttention(...)``: it constructs and its attributes are the arguments (TE's
  defaults for those left out), or it raises ``ValueError`` / ``TypeError`` naming an argument
  that was drawn wrong;
* ``DotProductAttention.forward`` on CPU (and meta) tensors of every format, mask, bias,
  cu_seqlens and FP8 choice: a well-formed call reaches te_cudnn's ``ValueError`` that says
  fused attention "executes on CUDA devices" (what a valid call on the CPU must end in); a
  malformed one raises ``ValueError`` / ``TypeError`` naming an argument involved (a head-count
  mismatch names the layer, query_layer / key_layer / value_layer), or
  ``UnsupportedConfigError`` where that is the documented answer; never another exception type
  and never a silent acceptance;
* ``te_cudnn.scaled_dot_product_attention`` with [b, h, s, d] tensors (contiguous BHSD,
  transposed BSHD views, padded / strided views), masks of every dtype and broadcast shape,
  is_causal, dropout_p, scale and enable_gqa: the same rule, with the docstring's promises
  (float32 / float64 / FP8 inputs raise ``UnsupportedConfigError``; integer inputs ``TypeError``).

Messages raised by the attention core name its arguments (``q``, ``k``, ``v``, ``attn_bias``,
``attn_scale``); they count as naming the module's / SDPA's argument they stand for, and the
summary counts how often only such a core name was given (``named-core-name-only``).

Library bugs this file found are listed in ``KNOWN_BUGS`` (each with a reproducer); all were
fixed in the change that added it, and the table stays so that a regression fails naming the
bug. ``TE_CUDNN_PROPERTY_KNOWN_BUGS=record`` counts them as outcomes instead of failing (for a
bug left open while the rest is measured). Any violation that is not a known bug always fails.

Hypothesis draws a fresh seed each run and prints it in every failure and in the summary
(``TE_CUDNN_PROPERTY_SEED=N`` replays a run); ``pytest -s`` prints how the examples of each test
ended. ``TE_CUDNN_PROPERTY_SCALE=10`` runs ten times as many examples. No example database.
"""

from __future__ import annotations

import collections
import inspect
import math
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pytest
import torch
from hypothesis import HealthCheck, event, given, note, seed, settings
from hypothesis import strategies as st

from te_cudnn import DotProductAttention, Fp8AttentionMeta, UnsupportedConfigError, scaled_dot_product_attention
from te_cudnn.enums import AttnMaskType

_SCALE = max(1, int(os.environ.get("TE_CUDNN_PROPERTY_SCALE", "1")))
SEED = int(os.environ.get("TE_CUDNN_PROPERTY_SEED") or random.SystemRandom().randrange(2**32))
SETTINGS = dict(deadline=None, database=None, derandomize=False, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])  # fmt: skip
RECORD_KNOWN_BUGS = os.environ.get("TE_CUDNN_PROPERTY_KNOWN_BUGS", "") == "record"
NEEDS_CUDA = "fused attention executes on CUDA devices"
BF16, FP16 = torch.bfloat16, torch.float16

#: Library bugs found by these properties (fixed; kept to name a regression): id -> (what the
#: outcome looks like, a reproducer).
#: The signature is matched against "ExceptionType: message", or "accepted" for a call that
#: constructed / reached the CUDA-device error although it is malformed.
KNOWN_BUGS: dict[str, tuple[str, str]] = {
    "ctor-heads-none": (
        r"^TypeError: unsupported operand type\(s\) for %",
        "DotProductAttention(None, 64) -> TypeError: unsupported operand type(s) for %: 'NoneType' and 'NoneType' "
        "(the 'value is not None' guard meant for num_gqa_groups also lets num_attention_heads=None through)"),
    "ctor-softmax_scale-unnamed": (
        r"^(ValueError: could not convert|TypeError: float\(\) argument)",
        "DotProductAttention(8, 64, softmax_scale='abc') -> ValueError: could not convert string to float: 'abc' "
        "(and softmax_scale=[0.1] -> TypeError: float() argument must be ...): no argument named"),
    "window-unnamed": (
        r"^(ValueError: invalid literal for int|TypeError: int\(\) argument)",
        "DotProductAttention(8, 64, window_size=('a', 0)) -> ValueError: invalid literal for int() ...; "
        "window_size=(None, 0) -> TypeError: int() argument must be ... (also per call in forward)"),
    "window-truncated": (
        r"^accepted$",
        "DotProductAttention(8, 64, attn_mask_type='no_mask', window_size=(1.5, 0)).window_size == (1, 0): "
        "a non-integral window is silently truncated (also per call in forward)"),
    "padding-mask-junk": (
        r"^(AttributeError|IndexError):",
        "DotProductAttention(4, 64, qkv_format='bshd', attn_mask_type='padding')(q, q, q, attention_mask=5) -> "
        "AttributeError: 'int' object has no attribute 'dtype'; attention_mask=(m,) -> IndexError; (None, None) -> "
        "AttributeError"),
    "padding-mask-length-unchecked": (
        r"^accepted$",
        "DotProductAttention(4, 64, qkv_format='bshd', attn_mask_type='padding')(q, q, q, "
        "attention_mask=torch.zeros(2, 1, 1, 24, dtype=torch.bool)) with q [2, 16, 4, 64] is accepted: "
        "cu_seqlens of 24 tokens for 16 positions"),
    "arbitrary-mask-shape": (
        r"^RuntimeError: The expanded size",
        "DotProductAttention(4, 64, qkv_format='bshd', attn_mask_type='arbitrary')(q, q, q, "
        "attention_mask=torch.zeros(1, 1, 3, 16, dtype=torch.bool)) -> RuntimeError: The expanded size of the "
        "tensor (16) must match ..."),
    "arbitrary-bias-merge": (
        r"^(accepted$|RuntimeError: The size of tensor|TypeError: (can only concatenate|unsupported operand))",
        "with attn_mask_type='arbitrary', core_attention_bias is added to the mask before it is checked: "
        "a [1, 4, 16, 17] bias -> RuntimeError: The size of tensor a (17) must match ...; a list -> TypeError: "
        "can only concatenate list ...; bias=5 or a 3-D [h, sq, skv] bias is silently accepted"),
    "arbitrary-nonfloat-dtype": (
        r"^TypeError: torch.finfo\(\) requires",
        "DotProductAttention(4, 64, qkv_format='bshd', attn_mask_type='arbitrary')(qi, qi, qi, "
        "attention_mask=torch.zeros(1, 1, 16, 16, dtype=torch.bool)) with int32 qi -> TypeError: torch.finfo() "
        "requires a floating point input type (no argument named)"),
    "arbitrary-alibi-dropped": (
        r"^accepted$",
        "DotProductAttention(4, 64, qkv_format='bshd', attn_mask_type='arbitrary')(q, q, q, attention_mask=m, "
        "core_attention_bias_type='alibi') reaches the core with attn_bias_type='post_scale_bias' (the mask): "
        "ALiBi is silently dropped"),
    "fp8-alibi-dropped": (
        r"^accepted$",
        "DotProductAttention(4, 64, qkv_format='bshd')(q, q, q, fp8_meta=Fp8AttentionMeta('cpu'), "
        "core_attention_bias_type='alibi') reaches attend_fp8 with attn_bias_type='no_bias': ALiBi silently dropped"),
    "fp8-padded-dropped": (
        r"^accepted$",
        "DotProductAttention(4, 64, qkv_format='thd')(x, x, x, cu_seqlens_q=cu, cu_seqlens_q_padded=cu_p, "
        "fp8_meta=meta): attend_fp8 takes no padded offsets, so cu_seqlens_*_padded are silently ignored "
        "(even cu_seqlens_q_padded='junk' is accepted)"),
    "fp8-junk": (
        r"^AttributeError:",
        "DotProductAttention(4, 64, qkv_format='bshd')(q, q, q, fp8_meta=5) -> AttributeError: 'int' object has no "
        "attribute 'quantize' (the constructor accepts fp8_meta=5 too)"),
    "fp8-dtype-unchecked": (
        r"^(accepted$|RuntimeError|NotImplementedError|AttributeError)",
        "DotProductAttention(4, 64, qkv_format='bshd')(qi, qi, qi, fp8_meta=Fp8AttentionMeta('cpu')) with int32 "
        "(or bool) inputs, or q bf16 with k fp16, is accepted (the FP8 path quantizes whatever it gets); float8 "
        "inputs -> NotImplementedError from amax"),
    "fp8-empty-amax": (
        r"^RuntimeError: amax\(\): Expected reduction dim",
        "DotProductAttention(4, 64, qkv_format='bshd').eval()(q0, q0, q0, fp8_meta=Fp8AttentionMeta('cpu')) with "
        "q0 = torch.zeros(0, 16, 4, 64, dtype=torch.bfloat16) -> RuntimeError: amax(): Expected reduction dim to be "
        "specified for input.numel() == 0 (the FP8 cast's amax; fused_attn_fwd itself takes zero-size calls)"),
    "fp8-device-unchecked": (
        r"^RuntimeError",
        "DotProductAttention(4, 64, qkv_format='bshd')(q, q.to('meta'), q, fp8_meta=Fp8AttentionMeta('cpu')) -> "
        "RuntimeError: Tensor on device cpu is not on the expected device meta!"),
    "sdpa-sparse-mask": (
        r"^(RuntimeError|NotImplementedError)",
        "te_cudnn.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool)"
        ".to_sparse()) -> RuntimeError (copy_/masked_fill_ between dense and sparse); query gets a TypeError "
        "naming it, attn_mask does not"),
}  # fmt: skip

#: How the examples of each test ended.
OUTCOMES: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def _record(test: str, outcome: str) -> None:
    OUTCOMES[test][outcome] += 1
    event(outcome)


def _summarize(test: str, valid: str, invalid: str) -> None:
    """Print how the examples ended and check that both branches were exercised."""
    counts = OUTCOMES[test]
    total = sum(v for k, v in counts.items() if not k.startswith(("valid:", "invalid:", "named-")))
    print(f"\nhypothesis seed {SEED} (TE_CUDNN_PROPERTY_SEED={SEED} replays this run)")
    print(f"{test}: {total} examples: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    floor = max(5, total // 20)
    assert counts[valid] >= floor and counts[invalid] >= floor, (
        f"{test}: degenerate strategy: {counts[valid]} well-formed and {counts[invalid]} malformed of {total}"
    )


def _names_in(message: str, names: frozenset[str] | set[str] | tuple[str, ...]) -> set[str]:
    """The names of ``names`` that ``message`` mentions as whole words ("attention_mask[0]" counts)."""
    return {n for n in names if re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", message)}


def _describe(err: Optional[BaseException]) -> str:
    return "accepted" if err is None else f"{type(err).__name__}: {err}"


def _violation(test: str, what: str, outcome: str, bug_ids: list[str]) -> None:
    """A broken property: a known bug (when recording those) or a failure."""
    known = [b for b in bug_ids if re.search(KNOWN_BUGS[b][0], outcome)]
    if known and RECORD_KNOWN_BUGS:
        _record(test, f"known-bug:{known[0]}")
        return
    hint = f" [known bug {known[0]}: {KNOWN_BUGS[known[0]][1]}]" if known else ""
    pytest.fail(f"{what}: {outcome[:600]}{hint} (replay with TE_CUDNN_PROPERTY_SEED={SEED})")


def _rarely(draw, percent: float) -> bool:
    """True in about ``percent`` % of draws (shrinks to False)."""
    return draw(st.integers(0, 999)) >= 1000 - round(percent * 10)


def _show(x: Any) -> Any:
    """A tensor as (shape, strides, dtype, device) for the notes of a failing example."""
    if isinstance(x, torch.Tensor):
        strides = x.stride() if x.layout == torch.strided else x.layout
        return (tuple(x.shape), strides, x.dtype, x.device.type)
    return x


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


FORMATS = ("sbhd", "bshd", "thd")
MASKS = tuple(m.name for m in AttnMaskType)
CPU_FP8_META = Fp8AttentionMeta(device="cpu")


# ============================================================================ 1. the constructor
CTOR_NAMES = tuple(inspect.signature(DotProductAttention.__init__).parameters)[1:]
CTOR_DEFAULTS = {n: p.default for n, p in inspect.signature(DotProductAttention.__init__).parameters.items()}
DIMS = [8, 16, 32, 64, 72, 96, 128, 256]
NAN, INF = float("nan"), float("inf")


@dataclass
class CtorCall:
    args: dict[str, Any] = field(default_factory=dict)
    bad: dict[str, Optional[str]] = field(default_factory=dict)  # argument -> known bug id (or None)
    gray: set[str] = field(default_factory=set)  # questionable values: accepting or rejecting them is fine


@st.composite
def ctor_calls(draw) -> CtorCall:
    """Keyword arguments of a constructor call; each drawn good, questionable ("gray") or bad."""
    c = CtorCall()

    def choose(name, good, bad=(), gray=(), pct_bad=6.0, pct_gray=2.0, optional=True):
        if optional and draw(st.integers(0, 3)) == 3:
            return  # left out: TE's default applies
        r = draw(st.integers(0, 999))
        if bad and r >= 1000 - pct_bad * 10:
            value, bug = draw(st.sampled_from(bad))
            c.bad[name] = bug
        elif gray and r >= 1000 - (pct_bad + pct_gray) * 10:
            value = draw(st.sampled_from(gray))
            c.gray.add(name)
        else:
            value = draw(good)
        c.args[name] = value

    choose("num_attention_heads", st.sampled_from([1, 2, 3, 4, 8, 12, 16]),
           [(0, None), (-1, None), (-8, None), (4.0, None), (True, None), (False, None), ("8", None),
            (None, "ctor-heads-none")],
           optional=False)  # fmt: skip
    heads = c.args["num_attention_heads"]
    valid_heads = isinstance(heads, int) and not isinstance(heads, bool) and heads >= 1
    divisors = _divisors(heads) if valid_heads else [1, 2]
    non_divisors = [v for v in (heads + 1, 2 * heads, 5) if heads % v] if valid_heads else [3]
    choose("kv_channels",
           st.one_of(st.sampled_from(DIMS), st.tuples(st.sampled_from(DIMS), st.sampled_from(DIMS)),
                     st.lists(st.sampled_from(DIMS), min_size=2, max_size=2)),
           [(0, None), (-64, None), (True, None), (64.0, None), ("64", None), ((64,), None), ((64, 0), None),
            ((64, 32, 16), None), ((0, 64), None), ((64.0, 64), None), ((True, 64), None), (None, None),
            ([64, -1], None)],
           optional=False)  # fmt: skip
    choose("num_gqa_groups", st.sampled_from([None, *divisors]),
           [(v, None) for v in non_divisors] + [(0, None), (-2, None), (2.0, None), (True, None), ("2", None)])
    choose("attention_dropout", st.sampled_from([0.0, 0, 0.1, 0.5, 0.999]),
           [(1.0, None), (1, None), (-0.1, None), (1.5, None), (NAN, None), (INF, None), (-INF, None),
            ("0.1", None), (None, None), (True, None)], [False])  # fmt: skip
    choose("qkv_format", st.sampled_from(FORMATS),
           [(v, None) for v in ("bhsd", "BSHD", "", None, 3, "thd_thd_thd", b"bshd")])
    choose("attn_mask_type", st.sampled_from(MASKS),
           [(v, None) for v in ("full", "CAUSAL", "", None, 2, "padding_causal_top_left", "causal ")])
    mask = c.args.get("attn_mask_type", "causal")
    causal = isinstance(mask, str) and "causal" in mask
    right = st.sampled_from([0, -1]) if causal else st.sampled_from([-1, 0, 8])
    pair = st.tuples(st.sampled_from([-1, 0, 8, 128]), right)
    choose("window_size", st.one_of(st.none(), pair, pair.map(list)),
           [(5, None), ((128,), None), ((1, 2, 3), None), ("ab", None), (torch.tensor([4, 0]), None), ({}, None),
            ((1.5, 0), "window-truncated"), ((0, 2.5), "window-truncated"), (("a", 0), "window-unnamed"),
            ((None, 0), "window-unnamed"), ((0, "b"), "window-unnamed")],
           [(-3, 0), (8, 8), (64.0, 0)])  # fmt: skip
    choose("attention_type", st.sampled_from(["self", "cross"]),
           [(v, None) for v in ("decoder", None, "", "Self", 1)])
    choose("layer_number", st.sampled_from([None, 1, 12]))
    choose("softmax_scale", st.sampled_from([None, 0.125, 1, 0.5, 2.0]),
           [("abc", "ctor-softmax_scale-unnamed"), ([0.1], "ctor-softmax_scale-unnamed"),
            (object(), "ctor-softmax_scale-unnamed")],
           [NAN, INF, -1.0, 0, "0.5", True])  # fmt: skip
    choose("deterministic", st.sampled_from([None, True, False]), gray=[0, 1])
    choose("fp8_meta", st.sampled_from([None, None, CPU_FP8_META]), gray=["fp8", 5])
    return c


def _expected_attributes(args: dict[str, Any]) -> dict[str, Any]:
    a = {**CTOR_DEFAULTS, **args}
    kv = a["kv_channels"]
    d_qk, d_v = (kv, kv) if isinstance(kv, int) else tuple(kv)
    mask = a["attn_mask_type"]
    w = a["window_size"]
    window = ((-1, 0) if "causal" in mask else (-1, -1)) if w is None else tuple(w)
    det = a["deterministic"]
    scale = a["softmax_scale"]
    return {
        "num_attention_heads": a["num_attention_heads"],
        "num_gqa_groups": a["num_gqa_groups"] or a["num_attention_heads"],
        "hidden_size_per_attention_head_k": d_qk, "hidden_size_per_attention_head_v": d_v,
        "attention_dropout": float(a["attention_dropout"]), "qkv_format": a["qkv_format"], "attn_mask_type": mask,
        "window_size": window, "attention_type": a["attention_type"], "layer_number": a["layer_number"],
        "softmax_scale": 1.0 / math.sqrt(d_qk) if scale is None else float(scale),
        "deterministic": os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1") == "0" if det is None else bool(det),
        "fp8_meta": a["fp8_meta"],
    }  # fmt: skip


def _same(x: float, y: float) -> bool:
    """Equal floats, NaN included."""
    return x == y or (math.isnan(x) and math.isnan(y))


@seed(SEED)
@settings(max_examples=500 * _SCALE, **SETTINGS)
@given(c=ctor_calls())
def _constructor_property(c: CtorCall) -> None:
    note(f"DotProductAttention(**{c.args!r}); bad={c.bad} gray={sorted(c.gray)}")
    note(f"replay with TE_CUDNN_PROPERTY_SEED={SEED}")
    test = "constructor"
    bugs = [b for b in c.bad.values() if b]
    _record(test, "invalid:drawn" if c.bad else "valid:drawn")
    try:
        m = DotProductAttention(**c.args)
    except Exception as err:  # noqa: BLE001 - the classification below is the property
        outcome = _describe(err)
        if type(err) not in (ValueError, TypeError):
            return _violation(test, "the constructor raised another exception type", outcome, bugs)
        if "\n" in str(err).strip():
            return _violation(test, "a multi-line message", outcome, bugs)
        allowed = set(c.bad) | c.gray
        if "num_gqa_groups" in c.bad:
            allowed.add("num_attention_heads")  # "num_gqa_groups=3 must divide num_attention_heads=8"
        if not allowed:
            return _violation(test, "a well-formed constructor call was rejected", outcome, bugs)
        if not _names_in(str(err), allowed):
            return _violation(test, f"the error names none of the offending arguments {sorted(allowed)}", outcome, bugs)
        _record(test, f"rejected-{type(err).__name__}" + ("" if c.bad else "-gray"))
        return
    if c.bad:
        return _violation(test, f"malformed {sorted(c.bad)} were accepted", "accepted", bugs)
    want = _expected_attributes(c.args)
    for name, value in want.items():
        got = getattr(m, name)
        if name in ("softmax_scale", "attention_dropout"):
            assert type(got) is float and _same(got, value), f"{name}: {got!r} != {value!r}"
        elif name in ("fp8_meta", "layer_number"):
            assert got is value, f"{name}: {got!r} is not {value!r}"
        else:
            assert got == value and type(got) is type(value), f"{name}: {got!r} != {value!r}"
    assert m.training and list(m.parameters()) == [] and list(m.buffers()) == []
    repr(m)
    _record(test, "constructed" + ("-gray" if c.gray else ""))


@pytest.mark.slow
def test_constructor_constructs_or_names_the_argument() -> None:
    """Drawn constructor arguments: constructed with matching attributes (TE defaults for the
    omitted ones), or ValueError / TypeError naming a drawn-bad argument."""
    OUTCOMES["constructor"].clear()
    _constructor_property()
    _summarize("constructor", "valid:drawn", "invalid:drawn")


# ============================================================================ 2. the forward
LAYER = {"q": "query_layer", "k": "key_layer", "v": "value_layer"}
#: What the module's tensors are called by the attention core (its messages use these).
CORE_ALIASES = {"query_layer": "q", "key_layer": "k", "value_layer": "v", "core_attention_bias": "attn_bias",
                "softmax_scale": "attn_scale"}  # fmt: skip
FWD_NAMES = frozenset(inspect.signature(DotProductAttention.forward).parameters) - {"self"}
MODULE_NAMES = FWD_NAMES | set(CTOR_NAMES)
CORE_NAMES = frozenset(CORE_ALIASES.values()) | {"max_seqlen_q", "max_seqlen_kv", "window_size", "d_scale_qkv"}


@dataclass
class FwdCase:
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
    #: mutation tag -> (names an error may name, known bug id or None, UnsupportedConfigError allowed)
    errors: dict[str, tuple[frozenset[str], Optional[str], bool]] = field(default_factory=dict)
    #: questionable parts of a call that is otherwise well-formed: tag -> names an error may name
    gray: dict[str, frozenset[str]] = field(default_factory=dict)
    unsupported_ok: bool = False
    #: known bugs a call of this kind may meet although it is well-formed
    known: list[str] = field(default_factory=list)

    def error(self, tag: str, names, bug: Optional[str] = None, unsupported: bool = False) -> None:
        names = set(names)
        names |= {CORE_ALIASES[n] for n in names if n in CORE_ALIASES}
        self.errors[tag] = (frozenset(names), bug, unsupported)


def _cu(lengths: list[int], device: str) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def _padding_mask(lengths: list[int], s: int, device: str) -> torch.Tensor:
    """TE's [b, 1, 1, s] padding mask: True = padding, at the end of each sequence."""
    pos = torch.arange(s)[None, :] >= torch.tensor(lengths, dtype=torch.long)[:, None]
    return pos.view(len(lengths), 1, 1, s).to(device)


def _layer_shape(fmt: str, b: int, s: int, h: int, d: int, t: int) -> tuple[int, ...]:
    return {"sbhd": (s, b, h, d), "bshd": (b, s, h, d), "thd": (t, h, d)}[fmt]


def _moved(t: torch.Tensor, device: str) -> torch.Tensor:
    """``t``'s shape and dtype on ``device`` (meta tensors hold no data to copy)."""
    return torch.empty(t.shape, dtype=t.dtype, device=device)


def _other_device(device: str) -> str:
    return "cpu" if device == "meta" else "meta"


def _with_dim(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = size
    return torch.empty(shape, dtype=t.dtype, device=t.device)


@st.composite
def forward_cases(draw) -> FwdCase:
    """A well-formed forward call, then zero, one or two mutations that make it malformed."""
    fmt = draw(st.sampled_from(FORMATS))
    mask = draw(st.sampled_from([m for m in MASKS if not (fmt == "thd" and m == "arbitrary")]))
    padding = "padding" in mask
    cross = draw(st.booleans())
    h = draw(st.sampled_from([1, 2, 4, 3, 8]))
    hg = draw(st.sampled_from(_divisors(h)))
    d_qk = draw(st.sampled_from([64, 128, 32, 16, 8, 96, 256]))
    d_v = d_qk if draw(st.booleans()) else draw(st.sampled_from([64, 128, 32]))
    odd_dims = _rarely(draw, 5)
    if odd_dims:  # head dims torch takes but cuDNN may not (rows not 16-byte multiples)
        d_qk, d_v = draw(st.sampled_from([(7, 7), (12, 12), (64, 7), (4, 4)]))
    dtype = draw(st.sampled_from([BF16, FP16]))
    b = 0 if _rarely(draw, 2) else draw(st.sampled_from([1, 2, 3]))
    sq = draw(st.sampled_from([16, 1, 64, 100, 128]))
    skv = sq
    if cross or (not padding and _rarely(draw, 10)):
        skv = draw(st.sampled_from([16, 1, 64, 128, 200]))
    training = draw(st.booleans())
    grad = draw(st.booleans())
    dropout = draw(st.sampled_from([0.0, 0.0, 0.1]))
    causal = "causal" in mask
    window = None
    if _rarely(draw, 25):
        window = (draw(st.sampled_from([-1, 0, 8, 64])), draw(st.sampled_from([0, -1] if causal else [-1, 0, 8])))
    bias_type = draw(st.sampled_from(["no_bias"] * 7 + ["post_scale_bias"] * 2 + ["alibi"]))
    if mask == "arbitrary" and bias_type == "alibi":
        bias_type = "no_bias"  # ALiBi with an arbitrary mask is a mutation below
    fp8 = (_rarely(draw, 15) and bias_type == "no_bias" and window is None and mask != "arbitrary"
           and not (training and dropout))  # fmt: skip
    device = "meta" if not fp8 and _rarely(draw, 5) else "cpu"

    ctor: dict[str, Any] = dict(num_attention_heads=h, kv_channels=d_qk if d_qk == d_v else (d_qk, d_v),
                                attention_dropout=dropout, attention_type="cross" if cross else "self")  # fmt: skip
    if hg != h or draw(st.booleans()):
        ctor["num_gqa_groups"] = hg
    kw: dict[str, Any] = {}
    if _rarely(draw, 15):  # the format per call, another one in the constructor
        ctor["qkv_format"] = draw(st.sampled_from([f for f in FORMATS if f != fmt]))
        kw["qkv_format"] = fmt
    else:
        ctor["qkv_format"] = fmt
    mask_per_call = _rarely(draw, 15)
    if mask_per_call:
        ctor["attn_mask_type"] = draw(st.sampled_from([m for m in MASKS if m != mask]))
        kw["attn_mask_type"] = mask
    elif mask != "causal" or draw(st.booleans()):
        ctor["attn_mask_type"] = mask
    if window is not None:
        if mask_per_call or draw(st.booleans()):
            kw["window_size"] = window
        else:
            ctor["window_size"] = window
    if fp8:
        if draw(st.booleans()):
            ctor["fp8_meta"] = CPU_FP8_META
        else:
            kw["fp8_meta"] = CPU_FP8_META

    # ---- lengths and tensors
    lens_q = draw(st.lists(st.integers(0, sq), min_size=b, max_size=b))
    lens_kv = draw(st.lists(st.integers(0, skv), min_size=b, max_size=b)) if cross else lens_q
    tight = draw(st.booleans())
    t_q = sum(lens_q) if tight else b * sq
    t_kv = (sum(lens_kv) if tight else b * skv) if cross else t_q
    packable = h == hg and d_qk == d_v and sq == skv and t_q == t_kv and not odd_dims
    style = draw(st.sampled_from(["plain"] * 5 + ["packed", "permuted"]))
    if style == "packed" and packable:
        if fmt == "thd":
            qkv = list(torch.empty(t_q, 3, h, d_qk, dtype=dtype, device=device).unbind(1))
        else:
            lead = (sq, b) if fmt == "sbhd" else (b, sq)
            qkv = list(torch.empty(*lead, 3, h, d_qk, dtype=dtype, device=device).unbind(2))
    elif style == "permuted" and fmt != "thd":  # allocated [b, h, s, d], viewed in the format

        def view(s: int, heads: int, d: int) -> torch.Tensor:
            x = torch.empty(b, heads, s, d, dtype=dtype, device=device)
            return x.permute(2, 0, 1, 3) if fmt == "sbhd" else x.transpose(1, 2)

        qkv = [view(sq, h, d_qk), view(skv, hg, d_qk), view(skv, hg, d_v)]
    else:
        qkv = [torch.empty(_layer_shape(fmt, b, sq, h, d_qk, t_q), dtype=dtype, device=device),
               torch.empty(_layer_shape(fmt, b, skv, hg, d_qk, t_kv), dtype=dtype, device=device),
               torch.empty(_layer_shape(fmt, b, skv, hg, d_v, t_kv), dtype=dtype, device=device)]  # fmt: skip

    c = FwdCase(ctor=ctor, qkv=qkv, kw=kw, training=training, grad=grad, fmt=fmt, mask=mask, cross=cross, fp8=fp8,
                device=device, dims=(b, sq, skv, h, hg, d_qk, d_v, dtype))  # fmt: skip
    c.unsupported_ok = odd_dims
    if fp8 and 0 in (b, sq, skv, t_q, t_kv):
        c.known.append("fp8-empty-amax")
    if fmt == "thd":
        kw["cu_seqlens_q"] = _cu(lens_q, device)
        if cross or draw(st.booleans()):
            kw["cu_seqlens_kv"] = _cu(lens_kv, device)
        if draw(st.booleans()):
            kw["max_seqlen_q"] = max([sq, *lens_q])
            kw["max_seqlen_kv"] = max([skv, *lens_kv])
        if not tight and not fp8 and draw(st.booleans()):
            kw["cu_seqlens_q_padded"] = _cu([sq] * b, device)
            kw["cu_seqlens_kv_padded"] = _cu([skv] * b, device)
    elif padding:
        if draw(st.booleans()):
            kw["cu_seqlens_q"] = _cu(lens_q, device)
            if cross or draw(st.booleans()):
                kw["cu_seqlens_kv"] = _cu(lens_kv, device)
        elif cross or _rarely(draw, 25):
            kw["attention_mask"] = (_padding_mask(lens_q, sq, device), _padding_mask(lens_kv, skv, device))
        else:
            kw["attention_mask"] = _padding_mask(lens_q, sq, device)
    elif mask == "arbitrary":
        shape = tuple(n if draw(st.booleans()) else 1 for n in (b, h, sq, skv))
        kw["attention_mask"] = torch.zeros(shape, dtype=torch.bool, device=device)
    kw["core_attention_bias_type"] = bias_type
    if bias_type == "post_scale_bias":
        if fmt == "thd":  # checked against the core's bucketed lengths: questionable (see the report)
            kw["core_attention_bias"] = torch.empty(1, h, max([sq, *lens_q]), max([skv, *lens_kv]), dtype=dtype,
                                                    device=device)  # fmt: skip
            c.gray["thd-bias"] = frozenset({"attn_bias", "core_attention_bias"})
            c.unsupported_ok = True
        else:
            shape = draw(st.sampled_from([(1, h, sq, skv), (1, 1, sq, skv), (b, 1, sq, skv), (b, h, sq, skv),
                                          (1, 1, 1, skv)]))  # fmt: skip
            kw["core_attention_bias"] = torch.empty(shape, dtype=dtype, device=device)

    n = draw(st.sampled_from([0] * 10 + [1] * 8 + [2] * 3))
    applied: set[str] = set()  # each mutation once (a second one could undo the first)
    for _ in range(n):
        for _attempt in range(8):
            name = draw(st.sampled_from(sorted(FWD_MUTATIONS)))
            if name not in applied and FWD_MUTATIONS[name](draw, c):
                applied.add(name)
                break
    return c


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


def _judge(test: str, c: Any, err: Optional[BaseException], all_names: frozenset[str], core_names: frozenset[str],
           what: str) -> None:  # fmt: skip
    """The outcome rule shared by the forward and the SDPA properties."""
    c_errors, gray, unsupported_ok = c.errors, c.gray, c.unsupported_ok
    outcome = _describe(err)
    bugs = [bug for _, bug, _ in c_errors.values() if bug] + c.known
    malformed = bool(c_errors)
    if err is None:
        return _violation(test, f"{what} returned on the CPU", outcome, bugs)
    if isinstance(err, UnsupportedConfigError):
        assert err.reasons and all(err.reasons.values()), f"UnsupportedConfigError without reasons: {err}"
        ok = any(u for _, _, u in c_errors.values()) if malformed else unsupported_ok
        if not ok:
            return _violation(test, f"{what}: UnsupportedConfigError where it was not expected", outcome, bugs)
        _record(test, "unsupported")
        return
    if type(err) is ValueError and NEEDS_CUDA in str(err):
        if malformed:
            return _violation(test, f"{what}: malformed call ({sorted(c_errors)}) accepted", "accepted", bugs)
        _record(test, "needs-cuda")
        return
    if type(err) not in (ValueError, TypeError):
        return _violation(test, f"{what} raised another exception type", outcome, bugs)
    msg = str(err)
    if "\n" in msg.strip():
        return _violation(test, f"{what}: a multi-line message", outcome, bugs)
    named = _names_in(msg, all_names)
    if not named:
        return _violation(test, f"{what}: the error names no argument", outcome, bugs)
    allowed = set().union(*(names for names, _, _ in c_errors.values())) if malformed else set()
    allowed |= set().union(*gray.values()) if gray else set()
    if not allowed:
        return _violation(test, f"{what}: a well-formed call was rejected", outcome, bugs)
    if not named & allowed:
        return _violation(test, f"{what}: the error names {sorted(named)}, none of {sorted(allowed)}", outcome, bugs)
    if named <= core_names:
        _record(test, "named-core-name-only")
    _record(test, type(err).__name__ + ("" if malformed else "-gray"))


@seed(SEED)
@settings(max_examples=1000 * _SCALE, **SETTINGS)
@given(c=forward_cases())
def _forward_property(c: FwdCase) -> None:
    note(f"replay with TE_CUDNN_PROPERTY_SEED={SEED}")
    note(f"ctor={c.ctor!r}")
    note(f"fmt={c.fmt} mask={c.mask} cross={c.cross} fp8={c.fp8} device={c.device} training={c.training} "
         f"grad={c.grad} dims={c.dims}")  # fmt: skip
    note(f"q/k/v: {[_show(t) for t in c.qkv]}")
    note(f"kw={ {k: _show(v) for k, v in c.kw.items()} }")
    note(f"errors={sorted(c.errors)} gray={sorted(c.gray)}")
    test = "forward"
    _record(test, "invalid:drawn" if c.errors else "valid:drawn")
    for tag in c.errors:
        event(f"mutation {tag}")
    err: Optional[BaseException] = None
    try:  # a drawn-bad constructor value (a non-finite softmax_scale) may already be refused here
        m = DotProductAttention(**c.ctor).train(c.training)
        with torch.set_grad_enabled(c.grad):
            m(*c.qkv, **c.kw)
    except Exception as e:  # noqa: BLE001
        err = e
    note(f"outcome: {_describe(err)[:300]}")
    if len(c.errors) == 1 and err is not None and type(err) in (ValueError, TypeError) and NEEDS_CUDA not in str(err):
        (tag,) = c.errors
        if tag.startswith("shape-heads") or tag == "shape-head-dim":  # the clear-cut case: the layer
            names, _, _ = c.errors[tag]
            assert type(err) is ValueError and _names_in(str(err), names), f"{tag}: {err}"
    _judge(test, c, err, MODULE_NAMES | CORE_NAMES | {"q", "k", "v"},
           CORE_NAMES | {"q", "k", "v"}, "DotProductAttention.forward")  # fmt: skip


@pytest.mark.slow
def test_forward_reaches_cuda_or_names_the_argument() -> None:
    """Drawn forward calls on CPU / meta tensors: well-formed ones end in the CUDA-device
    ValueError; malformed ones in a typed error naming an argument involved."""
    OUTCOMES["forward"].clear()
    _forward_property()
    _summarize("forward", "valid:drawn", "invalid:drawn")


# ============================================================================ 3. the SDPA drop-in
SDPA_NAMES = frozenset(inspect.signature(scaled_dot_product_attention).parameters)
SDPA_CORE = frozenset({"q", "k", "v", "attn_bias", "attn_scale", "dropout"})


@dataclass
class SdpaCase:
    qkv: list[Any]
    kw: dict[str, Any]
    device: str
    dims: tuple  # (b, h, hk, sq, skv, d, dv, dtype)
    errors: dict[str, tuple[frozenset[str], Optional[str], bool]] = field(default_factory=dict)
    gray: dict[str, frozenset[str]] = field(default_factory=dict)
    unsupported_ok: bool = False
    known: list[str] = field(default_factory=list)

    def error(self, tag: str, names, bug: Optional[str] = None, unsupported: bool = False) -> None:
        names = set(names)
        names |= {n[0] for n in names if n in ("query", "key", "value")}  # the core's q, k, v
        names |= {"attn_bias"} if "attn_mask" in names else set()  # the core's word for the mask
        self.errors[tag] = (frozenset(names), bug, unsupported)


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

    n = draw(st.sampled_from([0] * 10 + [1] * 8 + [2] * 3))
    applied: set[str] = set()  # each mutation once (a second one could undo the first)
    for _ in range(n):
        for _attempt in range(8):
            name = draw(st.sampled_from(sorted(SDPA_MUTATIONS)))
            if name not in applied and SDPA_MUTATIONS[name](draw, c):
                applied.add(name)
                break
    return c


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

