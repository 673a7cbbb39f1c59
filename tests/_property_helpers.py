"""Shared pieces of the property-based (hypothesis) CPU tests (tests/test_properties_*_cpu.py).

For every property test: the run's size (``TE_CUDNN_PROPERTY_SCALE=10`` runs ten times as many
examples), its seed (a fresh one per run unless ``TE_CUDNN_PROPERTY_SEED=N`` replays a run), the
hypothesis settings (no example database, so CI leaves no files behind) and the table of how the
examples of each test ended.

For the tests of the public functions (``fused_attn_fwd``, ``fused_attn_bwd``, ``explain``): their
argument names, the one rule for failures (:func:`check_error`) and values that are wrong for
most arguments.

For the tests of the PyTorch-facing entry points (``DotProductAttention`` and
``te_cudnn.scaled_dot_product_attention``): the outcome rule of the forward and SDPA properties
(:func:`_judge`), the library bugs these properties found (``KNOWN_BUGS``, each with a
reproducer; all were fixed in the change that added the table, which stays so that a regression
fails naming the bug; ``TE_CUDNN_PROPERTY_KNOWN_BUGS=record`` counts them as outcomes instead of
failing) and small tensor helpers.
"""

from __future__ import annotations

import collections
import inspect
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
import torch
from hypothesis import HealthCheck, currently_in_test_context, event
from hypothesis import strategies as st

import te_cudnn
from te_cudnn import Fp8AttentionMeta, UnsupportedConfigError
from te_cudnn.enums import AttnMaskType
# ============================================================================ every property test
_SCALE = max(1, int(os.environ.get("TE_CUDNN_PROPERTY_SCALE", "1")))
#: A fresh seed per run unless given; every failure report and the summary print it, and
#: TE_CUDNN_PROPERTY_SEED=N replays the run.
SEED = int(os.environ.get("TE_CUDNN_PROPERTY_SEED") or random.SystemRandom().randrange(2**32))
#: No example database (CI stays clean).
SETTINGS = dict(deadline=None, database=None, derandomize=False, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])  # fmt: skip
NEEDS_CUDA = "fused attention executes on CUDA devices"

#: How the examples of each test ended (printed at the end of the module with ``pytest -s``).
OUTCOMES: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def _record(test: str, outcome: str) -> None:
    OUTCOMES[test][outcome] += 1
    if currently_in_test_context():  # the exhaustive enum tests run outside hypothesis
        event(outcome)


@pytest.fixture(scope="module", autouse=True)
def _print_outcomes():
    """Autouse in the modules that import it: the table starts empty for each module, and at its
    end the seed and how the examples of its tests ended are printed (``pytest -s`` shows them)."""
    OUTCOMES.clear()
    yield
    print(f"\nhypothesis seed {SEED} (TE_CUDNN_PROPERTY_SEED={SEED} replays this run)")
    for test, counts in OUTCOMES.items():
        print(f"\n{test}: {sum(counts.values())} examples: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))


# ============================================================================ the public functions
FWD_NAMES = tuple(inspect.signature(te_cudnn.fused_attn_fwd).parameters)
BWD_NAMES = tuple(inspect.signature(te_cudnn.fused_attn_bwd).parameters)
EXPLAIN_NAMES = tuple(inspect.signature(te_cudnn.explain).parameters)
#: What a message may name: the public functions' arguments (aux_ctx_tensors[1] counts as
#: aux_ctx_tensors; messages call the page pools k and v, as the arguments are named).
ARG_NAMES = frozenset(FWD_NAMES + BWD_NAMES + EXPLAIN_NAMES) - {"args", "kwargs", "env"}
_NAMES_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(map(re.escape, ARG_NAMES), key=len, reverse=True)) + r")(?![A-Za-z0-9_])")
FP8_FWD_NAMES = ("d_scale_qkv", "d_scale_s", "q_scale_s", "q_scale_o", "amax_s", "amax_o")
FWD_ORDER = ("is_training", "max_seqlen_q", "max_seqlen_kv", "cu_seqlens_q", "cu_seqlens_kv", "q", "k", "v", "qkv_dtype")
BAD_NAMES = st.sampled_from(["", "causal_top_left", "bshd", "post_bias", "none", "CAUSAL", "No_Mask", "thd"])
JUNK = st.sampled_from([None, True, 3, -1, 2**40, 1.5, float("nan"), "", "x", [], [1, 2], (1,), {}, b"q",
                        torch.bfloat16, torch.int32, object()])  # fmt: skip


def names_an_argument(message: str) -> Optional[str]:
    """The first argument name ``message`` mentions as a whole word, or None."""
    m = _NAMES_RE.search(message)
    return m.group(1) if m else None


def check_error(err: BaseException, where: str) -> str:
    """The one rule for failures: TypeError / ValueError naming an argument, or
    UnsupportedConfigError carrying reasons; returns the outcome's label."""
    if isinstance(err, UnsupportedConfigError):
        assert err.reasons and all(err.reasons.values()), f"{where}: UnsupportedConfigError without reasons: {err}"
        assert str(err).startswith("No cuDNN fused-attention sub-backend supports"), str(err)
        return "unsupported"
    assert type(err) in (TypeError, ValueError), f"{where}: {type(err).__name__} is not TypeError/ValueError: {err!r}"
    msg = str(err)
    assert names_an_argument(msg), f"{where}: {type(err).__name__} names no argument: {msg!r}"
    assert "\n" not in msg.strip(), f"{where}: a message of one line, got {msg!r}"
    return type(err).__name__


# ============================================================================ DotProductAttention and SDPA
RECORD_KNOWN_BUGS = os.environ.get("TE_CUDNN_PROPERTY_KNOWN_BUGS", "") == "record"
BF16, FP16 = torch.bfloat16, torch.float16
NAN, INF = float("nan"), float("inf")
FORMATS = ("sbhd", "bshd", "thd")
MASKS = tuple(m.name for m in AttnMaskType)
CPU_FP8_META = Fp8AttentionMeta(device="cpu")

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


def _moved(t: torch.Tensor, device: str) -> torch.Tensor:
    """``t``'s shape and dtype on ``device`` (meta tensors hold no data to copy)."""
    return torch.empty(t.shape, dtype=t.dtype, device=device)


def _other_device(device: str) -> str:
    return "cpu" if device == "meta" else "meta"


def _with_dim(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = size
    return torch.empty(shape, dtype=t.dtype, device=t.device)


@dataclass
class MutationCase:
    """What a property example may raise, filled in as its strategy mutates a well-formed call:
    ``errors`` maps a mutation tag to (names an error may name, known bug id or None,
    UnsupportedConfigError allowed); ``gray`` holds questionable parts of an otherwise well-formed
    call (tag -> names an error may name); ``known`` the known bugs a well-formed call of this kind
    may meet. Subclasses add the call's own fields and :meth:`aliases`."""

    errors: dict[str, tuple[frozenset[str], Optional[str], bool]] = field(default_factory=dict, kw_only=True)
    gray: dict[str, frozenset[str]] = field(default_factory=dict, kw_only=True)
    unsupported_ok: bool = field(default=False, kw_only=True)
    known: list[str] = field(default_factory=list, kw_only=True)

    def aliases(self, names: set[str]) -> set[str]:
        """What the attention core calls the entry point's arguments in ``names``."""
        return set()

    def error(self, tag: str, names, bug: Optional[str] = None, unsupported: bool = False) -> None:
        names = set(names)
        self.errors[tag] = (frozenset(names | self.aliases(names)), bug, unsupported)


def apply_mutations(draw, case: MutationCase, mutations: dict) -> MutationCase:
    """Apply none, one or two of ``mutations`` (name -> ``fn(draw, case)``, True when it applied)
    to ``case``, each at most once (a second one could undo the first); returns ``case``."""
    n = draw(st.sampled_from([0] * 10 + [1] * 8 + [2] * 3))
    applied: set[str] = set()
    for _ in range(n):
        for _attempt in range(8):
            name = draw(st.sampled_from(sorted(mutations)))
            if name not in applied and mutations[name](draw, case):
                applied.add(name)
                break
    return case


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
