"""Property-based tests (hypothesis) of the public functions given malformed arguments, on the CPU.

``fused_attn_fwd``, ``fused_attn_bwd`` and ``explain`` are driven from well-formed calls (dense,
THD, packed, paged, FP8) with one or two arguments replaced by anything (junk values, wrong
tensors, plausible-but-wrong names and numbers), passed by keyword or by position, with one
positional argument left out, and with each enum-valued argument set to each of its values, by
name and by number. Each call is accepted (on the CPU a well-formed call ends in the ValueError
that asks for a CUDA device), unsupported with every sub-backend's reasons, or ends in a
``TypeError`` / ``ValueError`` naming an argument (the changed one, where one was changed);
``explain`` answers with every sub-backend's reasons. Never another exception type and never a
crash.

The runs are bounded (``settings`` on each test) and use no example database, so CI leaves no
files behind. Hypothesis draws a fresh seed each run and prints it with any failure and in the
summary (``TE_CUDNN_PROPERTY_SEED=N`` replays a run); ``pytest -s`` prints how many examples
each test ran and how they ended. ``TE_CUDNN_PROPERTY_SCALE=10`` runs ten times as many
examples.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import pytest
import torch
from hypothesis import example, given, note, seed, settings
from hypothesis import strategies as st

import te_cudnn
from te_cudnn import UnsupportedConfigError
from te_cudnn.backends import REGISTRY
from te_cudnn.config import FP8_DTYPES
from te_cudnn.enums import AttnBiasType, AttnMaskType, FusedAttnBackend, QKVLayout
from te_cudnn.runtime import HOPPER_CUDNN_919

from _property_helpers import (
    _SCALE, BAD_NAMES, BWD_NAMES, EXPLAIN_NAMES, FP8_FWD_NAMES, FWD_NAMES, FWD_ORDER, JUNK, NEEDS_CUDA, SEED, SETTINGS,
    _record, check_error,
)  # fmt: skip
from _property_helpers import _print_outcomes  # noqa: F401 - autouse: the outcomes and the seed at the module's end


def _junk_tensor() -> st.SearchStrategy:
    """Small tensors of every kind that is wrong somewhere: dtypes, ranks, devices."""
    return st.sampled_from([
        torch.zeros(()), torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int64), torch.zeros(2, 2),
        torch.zeros(0, dtype=torch.int32), torch.zeros(3, dtype=torch.int32, device="meta"),
        torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16), torch.zeros(4, 2, 8, dtype=torch.float16),
        torch.zeros(1, dtype=torch.float32), torch.zeros(2, 16, 4, 64, dtype=torch.bfloat16).to_sparse(),
        torch.nested.nested_tensor([torch.zeros(16, 4, 64), torch.zeros(8, 4, 64)], layout=torch.jagged),
    ])  # fmt: skip


B, S, H, D = 2, 16, 4, 64


def _fwd_baseline(kind: str) -> dict[str, Any]:
    """A well-formed fused_attn_fwd call on CPU tensors (it ends in the CUDA-device ValueError)."""
    bf16 = torch.bfloat16
    if kind == "thd":
        cu = torch.tensor([0, S, 2 * S], dtype=torch.int32)
        q, k, v = (torch.zeros(B * S, H, D, dtype=bf16) for _ in range(3))
        return dict(is_training=True, max_seqlen_q=S, max_seqlen_kv=S, cu_seqlens_q=cu, cu_seqlens_kv=cu, q=q, k=k, v=v,
                    qkv_dtype=bf16, qkv_layout="thd_thd_thd", attn_mask_type="padding_causal")  # fmt: skip
    if kind == "packed":
        q, k, v = torch.zeros(S, B, H, 3, D, dtype=bf16).unbind(-2)
        return dict(is_training=True, max_seqlen_q=S, max_seqlen_kv=S, cu_seqlens_q=None, cu_seqlens_kv=None, q=q, k=k,
                    v=v, qkv_dtype=bf16, qkv_layout="sbh3d", attn_mask_type="causal", dropout=0.1)  # fmt: skip
    if kind in ("paged", "paged_thd"):  # decode: one query token per sequence, k/v in page pools
        pool = torch.zeros(4, 16, 2, D, dtype=bf16)
        table = torch.zeros(B, 2, dtype=torch.int32)
        cu_q, cu_kv = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 20, 32], dtype=torch.int32)
        thd = kind == "paged_thd"
        return dict(is_training=False, max_seqlen_q=1, max_seqlen_kv=32, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                    q=torch.zeros(*((B,) if thd else (B, 1)), H, D, dtype=bf16), k=pool, v=pool.clone(), qkv_dtype=bf16,
                    qkv_layout=f"paged_kv_{'thd' if thd else 'bshd'}_bshd_bshd", attn_mask_type="padding",
                    page_table_k=table, page_table_v=table)  # fmt: skip
    if kind == "fp8":
        e4m3 = FP8_DTYPES[0]
        q, k, v = (torch.zeros(B, S, H, 128, dtype=e4m3) for _ in range(3))
        meta = {n: torch.ones(16) for n in FP8_FWD_NAMES}
        return dict(is_training=True, max_seqlen_q=S, max_seqlen_kv=S, cu_seqlens_q=None, cu_seqlens_kv=None, q=q, k=k,
                    v=v, qkv_dtype=e4m3, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", **meta)  # fmt: skip
    q, k, v = (torch.zeros(B, S, H, D, dtype=bf16) for _ in range(3))
    return dict(is_training=True, max_seqlen_q=S, max_seqlen_kv=S, cu_seqlens_q=None, cu_seqlens_kv=None, q=q, k=k, v=v,
                qkv_dtype=bf16, qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask",
                attn_bias_type="post_scale_bias", attn_bias=torch.zeros(1, H, S, S, dtype=bf16))  # fmt: skip


BASELINES = ["dense", "thd", "packed", "paged", "paged_thd", "fp8"]
#: Values that are wrong for most arguments, and plausible-but-wrong ones.
ANY_VALUE = st.one_of(JUNK, _junk_tensor(), BAD_NAMES, st.integers(-5, 600), st.sampled_from(
    [float("inf"), -0.0, 0.5, (8, 0), [-1, -1], torch.Generator(), torch.float8_e4m3fn, "bshd_bshd_bshd", "causal",
     "post_scale_bias", "F16_arbitrary_seqlen", torch.zeros(B, H, S, 1), torch.zeros(2, dtype=torch.int64)]))  # fmt: skip


def _call(fn, order: tuple[str, ...], kw: dict[str, Any], positional: int) -> Any:
    """``fn`` with the first ``positional`` arguments of ``order`` passed by position."""
    kw = dict(kw)
    args = []
    for name in order[:positional]:
        if name not in kw:
            break
        args.append(kw.pop(name))
    return fn(*args, **kw)


def _expect_named_error(fn, where: str, test: str, *args, **kwargs) -> Optional[BaseException]:
    """Call ``fn``; a returned result or the CUDA-device ValueError means the call was accepted."""
    try:
        fn(*args, **kwargs)
    except (TypeError, ValueError, UnsupportedConfigError) as err:
        if NEEDS_CUDA in str(err):
            _record(test, "accepted-needs-cuda")
            return None
        _record(test, check_error(err, where))
        return err
    except Exception as err:  # noqa: BLE001
        pytest.fail(f"{where} raised {type(err).__name__}: {err!r}")
    _record(test, "returned")
    return None


@seed(SEED)
@settings(max_examples=1000 * _SCALE, **SETTINGS)
@given(kind=st.sampled_from(BASELINES), changes=st.dictionaries(st.sampled_from(FWD_NAMES), ANY_VALUE, min_size=1, max_size=2),
       positional=st.integers(0, len(FWD_ORDER)))  # fmt: skip
@example(kind="paged", changes={"qkv_layout": 20}, positional=0)  # CI seed 1855008386: pools re-read as sbhd
def test_public_forward_with_malformed_arguments(kind: str, changes: dict[str, Any], positional: int) -> None:
    """One or two arguments of a well-formed call replaced by anything: accepted, or a typed
    error; an error caused by a replaced argument names it."""
    note(f"replay with TE_CUDNN_PROPERTY_SEED={SEED}")
    kw = {**_fwd_baseline(kind), **changes}
    note(f"changed {sorted(changes)}")
    err = _expect_named_error(lambda: _call(te_cudnn.fused_attn_fwd, FWD_ORDER, kw, positional), "fused_attn_fwd",
                              "public_fwd_malformed")  # fmt: skip
    if err is not None and len(changes) == 1 and not isinstance(err, UnsupportedConfigError):
        (name,) = changes
        assert _names(str(err), name), f"changing {name} to {changes[name]!r} gave an error that does not name it: {err}"


def _names(message: str, name: str) -> bool:
    """Whether ``message`` names argument ``name`` (or the tensor it describes)."""
    related = {name, *RELATED.get(name, ())}
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", message) for n in related)


#: An error caused by one argument may name its partner: a changed k is reported as
#: "k ... but q ..." and a changed max_seqlen_q as "q holds ... positions".
RELATED: dict[str, tuple[str, ...]] = {
    "window_size_left": ("window_size",), "window_size_right": ("window_size",),  # explain reports the pair
    # explain: sizes that no longer fit the given bias_shape
    "max_seqlen_q": ("bias_shape",), "max_seqlen_kv": ("bias_shape",), "num_attn_heads": ("bias_shape",),
    "batch_size": ("bias_shape",),
}  # fmt: skip
BWD_ORDER = ("max_seqlen_q", "max_seqlen_kv", "cu_seqlens_q", "cu_seqlens_kv", "q", "k", "v", "o", "d_o", "qkv_dtype",
             "aux_ctx_tensors")  # fmt: skip


def _bwd_baseline(kind: str) -> dict[str, Any]:
    """A well-formed fused_attn_bwd call on CPU tensors (it ends in the CUDA-device ValueError)."""
    kw = _fwd_baseline(kind)
    kw.pop("is_training")
    kw.pop("attn_bias", None)
    q = kw["q"]
    kw["o"], kw["d_o"] = torch.zeros_like(q), torch.zeros_like(q)
    stats = torch.zeros(q.shape[0], H, 1) if kind == "thd" else torch.zeros(B, H, S, 1)
    kw["aux_ctx_tensors"] = [stats, torch.zeros(2, dtype=torch.int64)]
    if kind == "dense":
        kw["aux_ctx_tensors"].append(torch.zeros(1, H, S, S, dtype=q.dtype))
    if kind == "fp8":
        for name in FP8_FWD_NAMES:
            kw.pop(name)
        kw.update({n: torch.ones(16) for n in FP8_BWD_NAMES})
        kw["d_o"] = torch.zeros_like(q, dtype=torch.float8_e5m2)
    return kw


FP8_BWD_NAMES = ("d_scale_qkv", "d_scale_s", "d_scale_o", "d_scale_do", "d_scale_dp", "q_scale_s", "q_scale_dp",
                 "q_scale_dqkv", "amax_dp", "amax_dqkv")  # fmt: skip


@seed(SEED)
@settings(max_examples=600 * _SCALE, **SETTINGS)
@given(kind=st.sampled_from(["dense", "thd", "packed", "fp8"]),
       changes=st.dictionaries(st.sampled_from(BWD_NAMES), ANY_VALUE, min_size=1, max_size=2),
       positional=st.integers(0, len(BWD_ORDER)))  # fmt: skip
def test_public_backward_with_malformed_arguments(kind: str, changes: dict[str, Any], positional: int) -> None:
    note(f"replay with TE_CUDNN_PROPERTY_SEED={SEED}")
    kw = {**_bwd_baseline(kind), **changes}
    note(f"changed {sorted(changes)}")
    err = _expect_named_error(lambda: _call(te_cudnn.fused_attn_bwd, BWD_ORDER, kw, positional), "fused_attn_bwd",
                              "public_bwd_malformed")  # fmt: skip
    if err is not None and len(changes) == 1 and not isinstance(err, UnsupportedConfigError):
        (name,) = changes
        assert _names(str(err), name), f"changing {name} to {changes[name]!r} gave an error that does not name it: {err}"


EXPLAIN_ORDER = EXPLAIN_NAMES[:19]  # TE's get_fused_attn_backend arguments; the rest are keyword-only


def _explain_baseline(bias: bool) -> dict[str, Any]:
    return dict(is_training=True, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd",
                attn_bias_type="post_scale_bias" if bias else "no_bias", bias_shape=(1, 16, 512, 512) if bias else None,
                attn_mask_type="causal", softmax_type="vanilla", dropout=0.0, num_attn_heads=16,
                num_gqa_groups=4, max_seqlen_q=512, max_seqlen_kv=512, head_dim_qk=128, head_dim_v=128,
                window_size_left=-1, window_size_right=-1, return_max_logit=False, cuda_graph=False, deterministic=False,
                batch_size=2, env=HOPPER_CUDNN_919)  # fmt: skip


@seed(SEED)
@settings(max_examples=600 * _SCALE, **SETTINGS)
@given(changes=st.dictionaries(st.sampled_from([n for n in EXPLAIN_NAMES if n != "env"]), ANY_VALUE, min_size=1, max_size=2),
       positional=st.integers(0, len(EXPLAIN_ORDER)), bias=st.booleans())  # fmt: skip
def test_explain_with_malformed_arguments(changes: dict[str, Any], positional: int, bias: bool) -> None:
    """explain answers with every sub-backend's reasons (never UnsupportedConfigError), or a
    typed error naming the argument."""
    note(f"replay with TE_CUDNN_PROPERTY_SEED={SEED}")
    kw = {**_explain_baseline(bias), **changes}
    note(f"changed {sorted(changes)}")
    try:
        ex = _call(te_cudnn.explain, EXPLAIN_ORDER, kw, positional)
    except (TypeError, ValueError) as err:
        outcome = check_error(err, "explain")
        if len(changes) == 1:
            (name,) = changes
            assert _names(str(err), name), f"changing {name} to {changes[name]!r} gave an error that does not name it: {err}"
        _record("explain_malformed", outcome)
        return
    assert set(ex.reasons) == {b.name for b in REGISTRY}
    assert (ex.backend == FusedAttnBackend.No_Backend) == all(ex.reasons.values())
    str(ex)  # printable
    _record("explain_malformed", f"explained-{ex.backend.name}")


@seed(SEED)
@settings(max_examples=60 * _SCALE, **SETTINGS)
@given(fn=st.sampled_from(["fwd", "bwd"]), kind=st.sampled_from(BASELINES[:3]), data=st.data())
def test_a_missing_positional_argument_is_named(fn: str, kind: str, data) -> None:
    """Leaving out one positional argument shifts the others (the common mistake of calling
    fused_attn_fwd without is_training): the error names an argument, never a crash."""
    note(f"replay with TE_CUDNN_PROPERTY_SEED={SEED}")
    order, kw = (FWD_ORDER, _fwd_baseline(kind)) if fn == "fwd" else (BWD_ORDER, _bwd_baseline(kind))
    order += ("fused_attention_backend",)  # as the README calls them: the backend (None) by position too
    kw["fused_attention_backend"] = None
    dropped = data.draw(st.sampled_from(order), label="dropped")
    args = [kw.pop(n) for n in order]
    del args[order.index(dropped)]
    target = te_cudnn.fused_attn_fwd if fn == "fwd" else te_cudnn.fused_attn_bwd
    err = _expect_named_error(lambda: target(*args, **kw), f"fused_attn_{fn}", "missing_positional")
    if dropped not in ("qkv_dtype", "fused_attention_backend"):  # else None moved into an argument that takes None
        assert err is not None, f"fused_attn_{fn} without {dropped} was accepted"
    if fn == "fwd" and dropped == "is_training":
        assert "is is_training missing?" in str(err), str(err)


def _enum_changes() -> list:
    """Every value of every enum-valued argument, by name and by number: a small space, so it is
    walked whole rather than sampled (hypothesis found a layout whose error did not name it)."""
    from te_cudnn.enums import SoftmaxType  # noqa: PLC0415

    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2, torch.int32]
    out = []
    for name, enum in (("qkv_layout", QKVLayout), ("attn_mask_type", AttnMaskType), ("attn_bias_type", AttnBiasType),
                       ("softmax_type", SoftmaxType), ("fused_attention_backend", FusedAttnBackend)):  # fmt: skip
        for member in enum:
            out += [(name, member.name), (name, int(member))]
    return out + [("qkv_dtype", dt) for dt in dtypes]


ENUM_CHANGES = _enum_changes()


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("kind", BASELINES)
def test_every_enum_value_is_accepted_or_named(direction: str, kind: str) -> None:
    """Each enum-valued argument of a well-formed call set to each of its values, by name and by
    number: accepted, unsupported (with reasons), or an error that names the argument; a shape
    read through a changed layout included."""
    if direction == "bwd" and kind in ("paged", "paged_thd"):
        pytest.skip("paged layouts have no backward")
    fn, baseline = (te_cudnn.fused_attn_fwd, _fwd_baseline) if direction == "fwd" else (te_cudnn.fused_attn_bwd,
                                                                                        _bwd_baseline)  # fmt: skip
    unnamed = []
    for name, value in ENUM_CHANGES:
        kw = {**baseline(kind), name: value}
        err = _expect_named_error(lambda: fn(**kw), f"fused_attn_{direction}", f"enum_{direction}")
        if err is not None and not isinstance(err, UnsupportedConfigError) and not _names(str(err), name):
            unnamed.append(f"{name}={value!r}: {type(err).__name__}: {err}")
    assert not unnamed, "errors that do not name the changed argument:\n" + "\n".join(unnamed)


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_explain_answers_every_enum_value(bias: bool) -> None:
    """explain with each enum-valued argument set to each value: every sub-backend's reasons,
    or an error that names the argument."""
    changes = [(n, v) for n, v in ENUM_CHANGES if n != "fused_attention_backend"]
    changes = [("q_dtype" if n == "qkv_dtype" else n, v) for n, v in changes] + [
        ("kv_dtype", v) for n, v in changes if n == "qkv_dtype"]  # fmt: skip
    unnamed = []
    for name, value in changes:
        try:
            ex = te_cudnn.explain(**{**_explain_baseline(bias), name: value})
        except (TypeError, ValueError) as err:
            check_error(err, "explain")
            if not _names(str(err), name):
                unnamed.append(f"{name}={value!r}: {type(err).__name__}: {err}")
            continue
        assert set(ex.reasons) == {b.name for b in REGISTRY}
        assert (ex.backend == FusedAttnBackend.No_Backend) == all(ex.reasons.values()), (name, value, str(ex))
    assert not unnamed, "errors that do not name the changed argument:\n" + "\n".join(unnamed)
