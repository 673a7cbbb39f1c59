"""Forcing and forbidding sub-backends (``te_cudnn.backend_policy``, the environment): precedence
of the argument, the context and the variables, TransformerEngine's preference variable, the
errors a forced or forbidden sub-backend gives, argument checks, and malformed variables; CPU only.

Selection is checked through ``te_cudnn.policy.select`` (the declared rules of
``te_cudnn.backends`` under the policy; what ``fused_attn_fwd`` / ``fused_attn_bwd`` call) and
``explain`` against the measured Hopper machine (``HOPPER_CUDNN_919``).
"""

from __future__ import annotations

import logging
import warnings

import pytest

import te_cudnn
from te_cudnn import FusedAttnBackend, UnsupportedConfigError, policy
from te_cudnn import backends
from te_cudnn.backends import Direction
from te_cudnn.config import describe_shapes
from te_cudnn.policy import explain_config, select
from te_cudnn.runtime import HOPPER_CUDNN_919

from _policy_cpu import ARB, BF16, BOTH, FP8, FP8_DTYPE, LONG, M512, cfg, chosen, explain, set_env
from _policy_cpu import clean_policy  # noqa: F401 - autouse: no policy variable set, no context leaked


def test_declared_rules_alone_ignore_the_policy() -> None:
    """te_cudnn.backends.select is the sub-backends' declared rules only (hashed into the plan
    format); the policy applies on top of it, in te_cudnn.policy.select."""
    with te_cudnn.backend_policy(force=M512, forbid=[ARB]):
        assert backends.select(cfg(**BOTH), HOPPER_CUDNN_919).enum is ARB
        assert backends.explain_config(cfg(**BOTH), HOPPER_CUDNN_919)[ARB] == []
        assert select(cfg(**BOTH), HOPPER_CUDNN_919).enum is M512


def test_both_f16_sub_backends_serve_the_baseline() -> None:
    """The configurations below rely on this: sq = 256 is served by both F16 sub-backends
    (arbitrary chosen), sq = 1024 by F16_arbitrary_seqlen only."""
    reasons = explain_config(cfg(**BOTH), HOPPER_CUDNN_919)
    assert reasons[ARB] == [] and reasons[M512] == [] and reasons[FP8]
    assert chosen(**BOTH) is ARB
    long = explain_config(cfg(**LONG), HOPPER_CUDNN_919)
    assert long[ARB] == [] and long[M512] and long[FP8]


# ----------------------------------------------------------------------------- precedence
def test_precedence_argument_over_context_over_env(monkeypatch) -> None:
    set_env(monkeypatch, TE_CUDNN_FUSED_ATTN_BACKEND="F16_max512_seqlen")
    assert chosen(**BOTH) is M512  # env forces
    assert explain().backend is M512
    assert policy.current().force_origin == "TE_CUDNN_FUSED_ATTN_BACKEND=F16_max512_seqlen"
    with te_cudnn.backend_policy(force=ARB):
        assert chosen(**BOTH) is ARB  # the context beats the env
        assert explain().backend is ARB
        # the explicit argument beats both
        assert select(cfg(**BOTH), HOPPER_CUDNN_919, M512).enum is M512
        assert policy.resolve(M512).force_origin == policy.ARGUMENT
    with te_cudnn.backend_policy(force="No_Backend"):  # automatic selection inside, whatever the env says
        assert chosen(**BOTH) is ARB
    assert chosen(**BOTH) is M512  # the env again after the context


def test_env_force_by_te_int(monkeypatch) -> None:
    set_env(monkeypatch, TE_CUDNN_FUSED_ATTN_BACKEND="0")
    assert policy.current().force is M512 and chosen(**BOTH) is M512
    set_env(monkeypatch, TE_CUDNN_FUSED_ATTN_BACKEND=" 1 ")
    assert policy.current().force is ARB
    set_env(monkeypatch, TE_CUDNN_FUSED_ATTN_BACKEND="fp8")
    assert policy.current().force is FP8
    set_env(monkeypatch, TE_CUDNN_FUSED_ATTN_BACKEND="-1")  # TE's No_Backend: automatic
    assert policy.current().force is None and chosen(**BOTH) is ARB


def test_nvte_backend_is_a_preference_as_in_transformer_engine(monkeypatch) -> None:
    """NVTE_FUSED_ATTN_BACKEND picks among sub-backends that serve (as TE's C++ does), never raises."""
    set_env(monkeypatch, NVTE_FUSED_ATTN_BACKEND="0")
    assert policy.current().force is None and policy.current().prefer is M512
    assert chosen(**BOTH) is M512 and explain().backend is M512
    assert chosen(**LONG) is ARB and explain(sq=1024).backend is ARB  # max512 cannot: automatic selection
    fp8 = dict(dtype=FP8_DTYPE, head_dim_qk=128, head_dim_v=128)
    assert chosen(**fp8) is FP8 and explain(FP8_DTYPE, d=128).backend is FP8
    set_env(monkeypatch, NVTE_FUSED_ATTN_BACKEND="1")
    assert chosen(**BOTH) is ARB and chosen(**fp8) is FP8
    # the te_cudnn variable wins when both are set
    set_env(monkeypatch, NVTE_FUSED_ATTN_BACKEND="0", TE_CUDNN_FUSED_ATTN_BACKEND="1")
    assert policy.current().prefer is None and chosen(**BOTH) is ARB
    # and a context's force wins over the preference
    monkeypatch.delenv("TE_CUDNN_FUSED_ATTN_BACKEND")
    policy.reload_env()
    with te_cudnn.backend_policy(force=ARB):
        assert chosen(**BOTH) is ARB


def test_preference_is_logged_as_such(monkeypatch, caplog) -> None:
    set_env(monkeypatch, NVTE_FUSED_ATTN_BACKEND="0")
    with caplog.at_level(logging.INFO, logger="te_cudnn"):
        select(cfg(**BOTH), HOPPER_CUDNN_919)
    assert "selected F16_max512_seqlen (fwd)" in caplog.text
    assert "[preferred by NVTE_FUSED_ATTN_BACKEND=0]" in caplog.text


# ----------------------------------------------------------------------------- forbid and force errors
def test_forbidding_one_of_two_picks_the_other() -> None:
    with te_cudnn.backend_policy(forbid=[ARB]):
        assert chosen(**BOTH) is M512
        ex = explain()
        assert ex.backend is M512
        assert "forbidden by te_cudnn.backend_policy(forbid=...)" in ex.reasons[ARB.name]


def test_forbidding_the_only_eligible_backend_raises_naming_the_forbid() -> None:
    with te_cudnn.backend_policy(forbid=[ARB]):
        with pytest.raises(UnsupportedConfigError) as ei:
            select(cfg(**LONG), HOPPER_CUDNN_919)
        assert explain(sq=1024).backend is FusedAttnBackend.No_Backend
    err = ei.value
    assert err.reasons[ARB] == ["forbidden by te_cudnn.backend_policy(forbid=...)"]
    assert "F16_arbitrary_seqlen declined because:\n    - forbidden by te_cudnn.backend_policy(forbid=...)" in str(err)
    assert any("exceed 512" in r for r in err.reasons[M512])  # the others keep their own reasons


def test_env_forbid_raises_naming_the_variable(monkeypatch) -> None:
    set_env(monkeypatch, TE_CUDNN_FORBID_BACKENDS="F16_arbitrary_seqlen, 0")
    assert set(policy.current().forbid) == {ARB, M512}
    with pytest.raises(UnsupportedConfigError, match=r"forbidden by TE_CUDNN_FORBID_BACKENDS") as ei:
        select(cfg(**BOTH), HOPPER_CUDNN_919)
    assert ei.value.reasons[M512] == ["forbidden by TE_CUDNN_FORBID_BACKENDS"]
    with te_cudnn.backend_policy(forbid=[ARB]):  # both origins are named
        assert policy.current().reasons(ARB) == ["forbidden by te_cudnn.backend_policy(forbid=...)",
                                                 "forbidden by TE_CUDNN_FORBID_BACKENDS"]  # fmt: skip


def test_forcing_a_forbidden_backend_raises() -> None:
    with te_cudnn.backend_policy(force=ARB, forbid=[ARB]):
        with pytest.raises(UnsupportedConfigError, match=r"with the requested F16_arbitrary_seqlen \(forced by "
                                                         r"te_cudnn\.backend_policy\(force=\.\.\.\)\)") as ei:  # fmt: skip
            select(cfg(**BOTH), HOPPER_CUDNN_919)
        assert ei.value.reasons == {ARB: ["forbidden by te_cudnn.backend_policy(forbid=...)"]}
    with te_cudnn.backend_policy(forbid=[M512]):  # the explicit argument cannot override a forbid either
        with pytest.raises(UnsupportedConfigError, match=r"forbidden by"):
            select(cfg(**BOTH), HOPPER_CUDNN_919, M512)


def test_forcing_an_ineligible_backend_raises_with_its_reasons(monkeypatch) -> None:
    with te_cudnn.backend_policy(force=M512):
        with pytest.raises(UnsupportedConfigError, match=r"with the requested F16_max512_seqlen") as ei:
            select(cfg(**LONG), HOPPER_CUDNN_919)
        ex = explain(sq=1024)
    assert list(ei.value.reasons) == [M512]
    assert any("exceed 512" in r for r in ei.value.reasons[M512])
    assert ex.backend is FusedAttnBackend.No_Backend
    assert ex.reasons[ARB.name] == ["F16_max512_seqlen is forced by te_cudnn.backend_policy(force=...)"]
    set_env(monkeypatch, TE_CUDNN_FUSED_ATTN_BACKEND="2")
    with pytest.raises(UnsupportedConfigError, match=r"requested FP8 \(forced by TE_CUDNN_FUSED_ATTN_BACKEND=2\)") as ei:
        select(cfg(**BOTH), HOPPER_CUDNN_919)
    assert any("dtype=bfloat16" in r for r in ei.value.reasons[FP8])


def test_force_applies_to_the_backward() -> None:
    """A backward reads its forward's aux (fp32 stats here): forcing max512 there raises."""
    bwd = describe_shapes(is_training=True, dtype=BF16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias",
                          attn_mask_type="causal", softmax_type="vanilla", dropout=0.0, num_attn_heads=8,
                          num_gqa_groups=8, max_seqlen_q=256, max_seqlen_kv=256, head_dim_qk=64, head_dim_v=64,
                          window_size=(-1, -1), batch_size=2).for_backward((256 * 8 * 64, 8 * 64, 64, 1), False)  # fmt: skip
    assert select(bwd, HOPPER_CUDNN_919, direction=Direction.BWD).enum is ARB
    with te_cudnn.backend_policy(force=M512):
        with pytest.raises(UnsupportedConfigError, match="fp32 softmax stats"):
            select(bwd, HOPPER_CUDNN_919, direction=Direction.BWD)


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(force="banana"), ValueError, r"force='banana' is not a valid FusedAttnBackend"),
        (dict(force=7), ValueError, r"force=7 is not a valid FusedAttnBackend value"),
        (dict(force=True), TypeError, r"force must be a FusedAttnBackend"),
        (dict(forbid=["FP8", "nope"]), ValueError, r"forbid='nope' is not a valid FusedAttnBackend"),
        (dict(forbid=[-1]), ValueError, r"forbid=No_Backend means nothing"),
        (dict(forbid=3.5), TypeError, r"forbid must be an iterable of sub-backends, got float"),
    ],
)
def test_backend_policy_checks_its_arguments_before_the_block(kw, exc, match) -> None:
    with pytest.raises(exc, match=match):
        te_cudnn.backend_policy(**kw)


def test_single_forbid_is_one_backend() -> None:
    with te_cudnn.backend_policy(forbid="F16_max512_seqlen") as p:
        assert set(p.forbid) == {M512}


def test_backend_policy_is_exported() -> None:
    assert "backend_policy" in te_cudnn.__all__ and te_cudnn.backend_policy is policy.backend_policy


# ----------------------------------------------------------------------------- malformed environment
def test_malformed_policy_env_warns_once_and_is_ignored(monkeypatch) -> None:
    monkeypatch.setenv("TE_CUDNN_FUSED_ATTN_BACKEND", "banana")
    monkeypatch.setenv("NVTE_FUSED_ATTN_BACKEND", "0")
    with pytest.warns(UserWarning, match=r"TE_CUDNN_FUSED_ATTN_BACKEND='banana' is not a sub-backend name"):
        policy.reload_env()
    # ignored as if unset: TE's variable applies
    assert policy.current().force is None and policy.current().prefer is M512
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same value again: no second warning
        policy.reload_env()
    monkeypatch.setenv("TE_CUDNN_FUSED_ATTN_BACKEND", "")  # blank: unset, silently
    monkeypatch.setenv("NVTE_FUSED_ATTN_BACKEND", "7")
    with pytest.warns(UserWarning, match=r"NVTE_FUSED_ATTN_BACKEND='7'"):
        policy.reload_env()
    assert policy.current() == policy.Policy()
    monkeypatch.setenv("TE_CUDNN_FORBID_BACKENDS", "FP8,,nonsense,-1")
    with pytest.warns(UserWarning, match=r"TE_CUDNN_FORBID_BACKENDS='FP8,,nonsense,-1' is not a comma-separated list "
                                         r"of sub-backends \('nonsense', '-1': use .*; ignoring those entries"):  # fmt: skip
        policy.reload_env()
    assert set(policy.current().forbid) == {FP8}  # the good entries still count
