"""Property-based tests (hypothesis) of ``DotProductAttention(...)``'s input validation, on the CPU.

Random constructor calls, each argument drawn well-formed, questionable ("gray": accepting or
rejecting it is fine) or malformed (with the known bug, if any, that value met): the module
constructs and its attributes are the arguments (TE's defaults for those left out), or it
raises ``ValueError`` / ``TypeError`` naming an argument that was drawn wrong; never another
exception type and never a silent acceptance of a malformed value.

Seeds (``TE_CUDNN_PROPERTY_SEED``), run size (``TE_CUDNN_PROPERTY_SCALE``), the outcome table printed
with ``pytest -s`` and the known library bugs (``KNOWN_BUGS``, ``TE_CUDNN_PROPERTY_KNOWN_BUGS``):
see tests/_property_helpers.py.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
import torch
from hypothesis import given, note, seed, settings
from hypothesis import strategies as st

from te_cudnn import DotProductAttention

from _property_helpers import (
    _SCALE, CPU_FP8_META, FORMATS, INF, MASKS, NAN, OUTCOMES, SEED, SETTINGS, _describe, _divisors, _names_in, _record,
    _summarize, _violation,
)  # fmt: skip

CTOR_DEFAULTS = {n: p.default for n, p in inspect.signature(DotProductAttention.__init__).parameters.items()}
DIMS = [8, 16, 32, 64, 72, 96, 128, 256]


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
