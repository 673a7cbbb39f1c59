"""Forcing and forbidding sub-backends (``te_cudnn.backend_policy``, the environment) and debug
logging on the ``"te_cudnn"`` logger; CPU only.

Selection is checked through ``te_cudnn.policy.select`` (the declared rules of
``te_cudnn.backends`` under the policy; what ``fused_attn_fwd`` / ``fused_attn_bwd`` call) and
``explain`` against the measured Hopper machine (``HOPPER_CUDNN_919``). The per-signature path of ``fused_attn_fwd`` / ``fused_attn_bwd`` is
reached on CPU tensors by standing in for the device check (``first_call._require_cuda``) and stopping
at the plan lookup (``_Prepared.get_plan``): that is where a GPU would take over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import warnings
from typing import Any

import pytest
import torch

import te_cudnn
from te_cudnn import FusedAttnBackend, UnsupportedConfigError, first_call, ops, policy, prepared
from te_cudnn import backends
from te_cudnn.backends import Direction
from te_cudnn.config import describe_shapes
from te_cudnn.plans import CompiledPlan, PlanCache, make_key
from te_cudnn.plans.cache import log_plan_outcome
from te_cudnn.policy import explain_config, select
from te_cudnn.runtime import HOPPER_CUDNN_919

BF16 = torch.bfloat16
FP8_DTYPE = torch.float8_e4m3fn
ARB = FusedAttnBackend.F16_arbitrary_seqlen
M512 = FusedAttnBackend.F16_max512_seqlen
FP8 = FusedAttnBackend.FP8
ENV_VARS = ("TE_CUDNN_FUSED_ATTN_BACKEND", "NVTE_FUSED_ATTN_BACKEND", "TE_CUDNN_FORBID_BACKENDS")
DEBUG_VARS = ("TE_CUDNN_DEBUG", "TE_CUDNN_DEBUG_LEVEL", "NVTE_DEBUG", "NVTE_DEBUG_LEVEL")


@pytest.fixture(autouse=True)
def clean_policy(monkeypatch):
    """No policy variable set and no context active; the process's own setting comes back after."""
    saved = dict(os.environ)
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    policy._env_warned.clear()
    policy.reload_env()
    assert policy.token() is policy.NO_CONTEXT
    yield
    assert policy.token() is policy.NO_CONTEXT, "a backend_policy context leaked out of the test"
    policy.reload_env(saved)


def set_env(monkeypatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    policy.reload_env()


def cfg(**over: Any):
    a: dict[str, Any] = dict(
        is_training=True, dtype=BF16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias", attn_mask_type="causal",
        softmax_type="vanilla", dropout=0.0, num_attn_heads=8, num_gqa_groups=8, max_seqlen_q=256,
        max_seqlen_kv=256, head_dim_qk=64, head_dim_v=64, window_size=(-1, -1), batch_size=2,
    )  # fmt: skip
    a.update(over)
    return describe_shapes(**a)


BOTH = dict()  # sq = skv = 256: F16_arbitrary_seqlen and F16_max512_seqlen both serve
LONG = dict(max_seqlen_q=1024, max_seqlen_kv=1024)  # only F16_arbitrary_seqlen serves


def explain(dtype: torch.dtype = BF16, sq: int = 256, d: int = 64) -> te_cudnn.Explanation:
    return te_cudnn.explain(True, dtype, dtype, "bshd_bshd_bshd", "no_bias", "causal", "vanilla", 0.0, 8, 8, sq, sq, d,
                            d, batch_size=2, env=HOPPER_CUDNN_919)  # fmt: skip


def chosen(**over: Any) -> FusedAttnBackend:
    return select(cfg(**over), HOPPER_CUDNN_919).enum


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


# ----------------------------------------------------------------------------- nesting, threads, tasks
def test_nesting_merges_and_restores() -> None:
    with te_cudnn.backend_policy(force=M512, forbid=[FP8]) as outer:
        assert outer.force is M512 and set(outer.forbid) == {FP8}
        outer_token = policy.token()
        with te_cudnn.backend_policy(forbid=["F16_arbitrary_seqlen"]) as inner:
            assert inner.force is M512  # force=None keeps the enclosing force
            assert set(inner.forbid) == {FP8, ARB}  # forbid sets add up
            with te_cudnn.backend_policy(force=2) as innermost:
                assert innermost.force is FP8 and set(innermost.forbid) == {FP8, ARB}
            assert policy.current() == inner
        assert policy.token() == outer_token and policy.current() == outer
    assert policy.token() is policy.NO_CONTEXT
    assert policy.current() == policy.Policy()


def test_context_restores_after_an_exception() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with te_cudnn.backend_policy(force=M512):
            with te_cudnn.backend_policy(forbid=[ARB]):
                raise RuntimeError("boom")
    assert policy.token() is policy.NO_CONTEXT and chosen(**BOTH) is ARB


def test_equal_policies_share_one_token() -> None:
    """Prepared calls are keyed on the token: re-entering the same policy must hit them again."""
    with te_cudnn.backend_policy(force="F16_max512_seqlen", forbid=["FP8"]):
        first = policy.token()
    with te_cudnn.backend_policy(force=M512, forbid=(2,)):
        second = policy.token()
    assert first == second and hash(first) == hash(second) and first is not policy.NO_CONTEXT
    with te_cudnn.backend_policy():  # nothing forced or forbidden: the default token
        assert policy.token() is policy.NO_CONTEXT


def test_token_is_a_c_call_on_the_hot_path() -> None:
    """fused_attn_fwd / fused_attn_bwd add ``_policy_token()`` to their signature tuples: it must
    stay a C-level ContextVar read (measured ~20 ns), never a Python function."""
    assert ops._policy_token is policy.token
    assert type(policy.token).__name__ == "builtin_function_or_method"


def test_context_does_not_leak_into_other_threads() -> None:
    inside, release = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def worker() -> None:
        with te_cudnn.backend_policy(force=M512, forbid=[FP8]):
            seen["worker"] = policy.current()
            inside.set()
            release.wait(10)
        seen["worker_after"] = policy.token()

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    try:  # while the worker is inside its context, this thread sees none
        assert policy.token() is policy.NO_CONTEXT and chosen(**BOTH) is ARB
    finally:
        release.set()
        t.join(10)
    assert seen["worker"].force is M512 and seen["worker_after"] is policy.NO_CONTEXT

    def observer() -> None:
        seen["observer"] = (policy.token(), chosen(**BOTH))

    with te_cudnn.backend_policy(force=M512):  # nor does this thread's context reach a new thread
        t = threading.Thread(target=observer)
        t.start()
        t.join(10)
    assert seen["observer"] == (policy.NO_CONTEXT, ARB)


def test_asyncio_tasks_are_isolated() -> None:
    async def task(force: FusedAttnBackend) -> list[FusedAttnBackend]:
        out = []
        with te_cudnn.backend_policy(force=force):
            for _ in range(3):
                await asyncio.sleep(0)  # interleave with the other task
                out.append(policy.current().force)
        return out

    async def main() -> tuple:
        return await asyncio.gather(task(M512), task(ARB))

    a, b = asyncio.run(main())
    assert a == [M512] * 3 and b == [ARB] * 3


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


@pytest.mark.parametrize(
    "env, level",
    [
        ({}, None),
        ({"TE_CUDNN_DEBUG": "0", "TE_CUDNN_DEBUG_LEVEL": "2"}, None),
        ({"TE_CUDNN_DEBUG": "1"}, logging.WARNING),
        ({"TE_CUDNN_DEBUG": "on", "TE_CUDNN_DEBUG_LEVEL": "0"}, logging.WARNING),
        ({"TE_CUDNN_DEBUG": "1", "TE_CUDNN_DEBUG_LEVEL": "1"}, logging.INFO),
        ({"TE_CUDNN_DEBUG": "1", "TE_CUDNN_DEBUG_LEVEL": "2"}, logging.DEBUG),
        ({"TE_CUDNN_DEBUG": "yes", "TE_CUDNN_DEBUG_LEVEL": "5"}, logging.DEBUG),  # > 2 is DEBUG, as in TE
        ({"NVTE_DEBUG": "1", "NVTE_DEBUG_LEVEL": "1"}, logging.INFO),
        ({"NVTE_DEBUG": "1"}, logging.WARNING),
        ({"TE_CUDNN_DEBUG": "0", "NVTE_DEBUG": "1", "NVTE_DEBUG_LEVEL": "2"}, None),  # te_cudnn's own says off
        ({"TE_CUDNN_DEBUG": "1", "NVTE_DEBUG_LEVEL": "2"}, logging.DEBUG),  # each variable falls back on its own
        ({"TE_CUDNN_DEBUG": "1", "TE_CUDNN_DEBUG_LEVEL": "1", "NVTE_DEBUG_LEVEL": "2"}, logging.INFO),
    ],
)
def test_debug_level_from_env(env, level) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert policy.debug_level_from_env(env) == level


def test_malformed_debug_env_warns_and_is_ignored() -> None:
    with pytest.warns(UserWarning, match=r"TE_CUDNN_DEBUG='maybe' is not a non-negative integer"):
        assert policy.debug_level_from_env({"TE_CUDNN_DEBUG": "maybe", "NVTE_DEBUG": "1", "NVTE_DEBUG_LEVEL": "1"}) == logging.INFO
    with pytest.warns(UserWarning, match=r"TE_CUDNN_DEBUG_LEVEL='-3'"):
        assert policy.debug_level_from_env({"TE_CUDNN_DEBUG": "1", "TE_CUDNN_DEBUG_LEVEL": "-3"}) == logging.WARNING


# ----------------------------------------------------------------------------- logging: selection
def test_select_logs_choice_and_declines(caplog) -> None:
    c = cfg(**LONG)
    with caplog.at_level(logging.DEBUG, logger="te_cudnn"):
        select(c, HOPPER_CUDNN_919)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.name == "te_cudnn"]
    assert infos == [f"selected F16_arbitrary_seqlen (fwd) for {c.summary()} [automatic selection]"]
    debugs = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(m.startswith("  F16_max512_seqlen declined: ") and "exceed 512" in m for m in debugs), debugs
    assert any(m.startswith("  FP8 declined: dtype=bfloat16") for m in debugs), debugs
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="te_cudnn"), te_cudnn.backend_policy(forbid=[M512]):
        select(c, HOPPER_CUDNN_919)
    assert "[automatic selection; forbidden: F16_max512_seqlen]" in caplog.text
    assert "declined" not in caplog.text  # reasons are DEBUG details


def test_explain_does_not_log(caplog) -> None:
    """explain / get_fused_attn_backend may run per step (TE asks per forward): they stay quiet."""
    with caplog.at_level(logging.DEBUG, logger="te_cudnn"):
        assert explain().backend is ARB
    assert not [r for r in caplog.records if r.name == "te_cudnn"]


# ----------------------------------------------------------------------------- logging: per call signature
class _Stop(Exception):
    """Raised where a GPU would take over (the plan lookup)."""


@pytest.fixture
def cpu_prepare(monkeypatch):
    """fused_attn_fwd / fused_attn_bwd on CPU tensors up to the plan lookup: the device check
    answers with the Hopper environment; fresh memos; counts the prepares."""
    monkeypatch.setattr(first_call, "_require_cuda", lambda cfg, q: HOPPER_CUDNN_919)
    monkeypatch.setattr(first_call, "_is_capturing", lambda: False)  # CPU-only torch has no capture query
    memos = {"_fwd_memo": ops.SigMemo(), "_bwd_memo": ops.SigMemo()}
    for module in (ops, first_call, prepared):  # looked up, filled and cleared (forget_prepared) there
        for name, memo in memos.items():
            monkeypatch.setattr(module, name, memo)

    def stop(self):
        raise _Stop(self.backend.name)

    monkeypatch.setattr(ops._Prepared, "get_plan", stop)
    counts = {"fwd": 0, "bwd": 0}
    for name, real in (("fwd", ops._prepare_fwd), ("bwd", ops._prepare_bwd)):
        def counted(sig, a, _real=real, _name=name):
            counts[_name] += 1
            return _real(sig, a)

        monkeypatch.setattr(ops, f"_prepare_{name}", counted)
    return counts


B, S, H, D = 2, 256, 8, 64
KW = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")


def _qkv():
    return [torch.zeros(B, S, H, D, dtype=BF16) for _ in range(3)]


def run_fwd(q, k, v, backend=None) -> str:
    """The sub-backend the forward prepared (the name _Stop carries)."""
    with pytest.raises(_Stop) as ei:
        te_cudnn.fused_attn_fwd(True, S, S, None, None, q, k, v, BF16, backend, **KW)
    return str(ei.value)


def run_bwd(q, k, v) -> str:
    aux = [torch.zeros(B, H, S, 1, dtype=torch.float32), torch.zeros(2, dtype=torch.int64)]
    with pytest.raises(_Stop) as ei:
        te_cudnn.fused_attn_bwd(S, S, None, None, q, k, v, q, q, BF16, aux, None, **KW)
    return str(ei.value)


def _te_records(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "te_cudnn" and r.levelno == level]


def test_first_prepare_logs_backend_and_summary_once(cpu_prepare, caplog) -> None:
    q, k, v = _qkv()
    summary = cfg(**BOTH).summary()
    with caplog.at_level(logging.DEBUG, logger="te_cudnn"):
        assert run_fwd(q, k, v) == ARB.name
    assert _te_records(caplog, logging.INFO) == [f"selected F16_arbitrary_seqlen (fwd) for {summary} [automatic selection]"]
    debug = _te_records(caplog, logging.DEBUG)
    assert any(m.startswith("plan for PlanKey(F16_arbitrary_seqlen fwd:") and "not cached yet" in m for m in debug), debug
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="te_cudnn"):
        for _ in range(3):
            assert run_fwd(q, k, v) == ARB.name  # remembered: no selection, no logging
    assert cpu_prepare["fwd"] == 1 and not [r for r in caplog.records if r.name == "te_cudnn"]


def test_policy_change_prepares_again_and_reuses_per_policy(cpu_prepare, caplog) -> None:
    """The policy token is part of the forward's call signature: a call prepared under one policy
    is never used under another, and each is remembered."""
    q, k, v = _qkv()
    assert run_fwd(q, k, v) == ARB.name
    with caplog.at_level(logging.INFO, logger="te_cudnn"):
        with te_cudnn.backend_policy(force=M512):
            assert run_fwd(q, k, v) == M512.name
        with te_cudnn.backend_policy(forbid=[ARB]):
            assert run_fwd(q, k, v) == M512.name
    assert cpu_prepare["fwd"] == 3
    assert "[forced by te_cudnn.backend_policy(force=...)]" in caplog.text
    assert "[automatic selection; forbidden: F16_arbitrary_seqlen]" in caplog.text
    assert run_fwd(q, k, v) == ARB.name  # outside again: the first preparation, not the last
    with te_cudnn.backend_policy(force="F16_max512_seqlen"):  # the same policy again: remembered
        assert run_fwd(q, k, v) == M512.name
        assert run_fwd(q, k, v, ARB) == ARB.name  # the explicit argument wins over the context
    assert cpu_prepare["fwd"] == 4


def test_env_change_with_reload_env_prepares_again(cpu_prepare, monkeypatch) -> None:
    q, k, v = _qkv()
    assert run_fwd(q, k, v) == ARB.name
    set_env(monkeypatch, TE_CUDNN_FUSED_ATTN_BACKEND="0")  # reload_env forgets prepared calls
    assert run_fwd(q, k, v) == M512.name and cpu_prepare["fwd"] == 2
    set_env(monkeypatch, TE_CUDNN_FORBID_BACKENDS="F16_max512_seqlen")
    with pytest.raises(UnsupportedConfigError, match=r"requested F16_max512_seqlen \(forced by "
                                                     r"TE_CUDNN_FUSED_ATTN_BACKEND=0\)"):  # fmt: skip
        te_cudnn.fused_attn_fwd(True, S, S, None, None, q, k, v, BF16, None, **KW)


def test_backward_prepare_logs_and_honours_the_policy(cpu_prepare, caplog) -> None:
    q, k, v = _qkv()
    with caplog.at_level(logging.INFO, logger="te_cudnn"):
        assert run_bwd(q, k, v) == ARB.name
        assert run_bwd(q, k, v) == ARB.name
    assert cpu_prepare["bwd"] == 1
    assert _te_records(caplog, logging.INFO) == [f"selected F16_arbitrary_seqlen (bwd) for {cfg(**BOTH).summary()} "
                                                 "[automatic selection]"]  # fmt: skip
    # prepared outside a context, so not reused inside one: the forced max512 sees fp32 stats and declines
    aux = [torch.zeros(B, H, S, 1, dtype=torch.float32), torch.zeros(2, dtype=torch.int64)]
    with te_cudnn.backend_policy(force=M512):
        with pytest.raises(UnsupportedConfigError, match=r"requested F16_max512_seqlen.*\n(.*\n)*.*fp32 softmax stats"):
            te_cudnn.fused_attn_bwd(S, S, None, None, q, k, v, q, q, BF16, aux, None, **KW)
    assert cpu_prepare["bwd"] == 2


# ----------------------------------------------------------------------------- logging: plan outcome
def _plan_key():
    c = describe_shapes(is_training=True, dtype=BF16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias",
                        attn_mask_type="causal", softmax_type="vanilla", dropout=0.0, num_attn_heads=8,
                        num_gqa_groups=8, max_seqlen_q=256, max_seqlen_kv=256, head_dim_qk=64, head_dim_v=64,
                        window_size=(-1, -1), batch_size=2, device=0)  # fmt: skip
    return make_key(ARB, Direction.FWD, c, 91900, "1.32.0")


@pytest.mark.parametrize("source, verb", [("built", "built plan for"), ("store", "loaded plan for")])
def test_plan_build_or_load_is_logged_once_with_its_time(caplog, source, verb) -> None:
    key = _plan_key()

    def builder(k, make_spec):
        return CompiledPlan(k, graph=object(), uids=(), workspace_size=4096, plan_name="eng0", build_seconds=0.0123,
                            source=source, stages={"graph": 0.001})  # fmt: skip

    cache = PlanCache(maxsize=2, builder=builder)
    with caplog.at_level(logging.DEBUG, logger="te_cudnn"):
        log_plan_outcome(key, cache)
        cache.get_or_build(key, lambda: None)
    info = _te_records(caplog, logging.INFO)
    suffix = " from the plan store in 12.3 ms" if source == "store" else " in 12.3 ms"
    assert info == [f"{verb} {key}{suffix}"]
    debug = _te_records(caplog, logging.DEBUG)
    assert debug[0] == f"plan for {key}: not cached yet; built or loaded from the plan store at the first launch"
    assert "  plan name eng0, workspace 4096 bytes, stages: graph 1.0 ms" in debug
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="te_cudnn"):
        cache.get_or_build(key, lambda: None)  # a hit: not logged by the cache
        log_plan_outcome(key, cache)  # a new call signature whose plan is cached: a hit, at DEBUG
    how = "loaded from the plan store" if source == "store" else "built"
    assert _te_records(caplog, logging.DEBUG) == [
        f"plan for {key}: already cached (hit; {how}, plan name eng0, workspace 4096 bytes, 1 hits so far)"]
    assert not _te_records(caplog, logging.INFO)


def test_nothing_is_logged_or_formatted_when_the_logger_is_quiet(caplog) -> None:
    key = _plan_key()
    cache = PlanCache(maxsize=2, builder=lambda k, s: CompiledPlan(k, object(), (), 0, "x", 0.001))
    with caplog.at_level(logging.WARNING, logger="te_cudnn"):
        log_plan_outcome(key, cache)
        cache.get_or_build(key, lambda: None)
        select(cfg(**BOTH), HOPPER_CUDNN_919)
    assert not [r for r in caplog.records if r.name == "te_cudnn"]


# ----------------------------------------------------------------------------- env switches logging on
_PROBE = ("import logging, te_cudnn; from te_cudnn import policy; log = logging.getLogger('te_cudnn'); "
          "policy._configure_logging(); "  # a second call adds no second handler
          "print(log.level, [(type(h).__name__, getattr(getattr(h, 'stream', None), 'name', None)) for h in log.handlers]); "
          "{extra}")  # fmt: skip
_SELECT = ("import torch; from te_cudnn.policy import select; from te_cudnn.config import describe_shapes; "
           "from te_cudnn.runtime import HOPPER_CUDNN_919 as H; "
           "select(describe_shapes(is_training=True, dtype=torch.bfloat16, qkv_layout='bshd_bshd_bshd', "
           "attn_bias_type='no_bias', attn_mask_type='causal', softmax_type='vanilla', dropout=0.0, num_attn_heads=8, "
           "num_gqa_groups=8, max_seqlen_q=1024, max_seqlen_kv=1024, head_dim_qk=64, head_dim_v=64, "
           "window_size=(-1, -1), batch_size=2), H)")  # fmt: skip


def _probes(*cases: tuple[dict[str, str], str]) -> list[tuple[str, str]]:
    """(stdout, stderr) of a fresh ``python -c`` per (environment, extra code), run side by side."""
    base = {k: v for k, v in os.environ.items() if k not in DEBUG_VARS + ENV_VARS}
    procs = [subprocess.Popen([sys.executable, "-c", _PROBE.format(extra=extra)], env={**base, **env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for env, extra in cases]  # fmt: skip
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        out.append((stdout.strip(), stderr))
    return out


@pytest.mark.slow
def test_env_debug_levels_configure_the_logger_in_a_fresh_process() -> None:
    off, info, debug = _probes(
        ({}, _SELECT),
        ({"TE_CUDNN_DEBUG": "1", "TE_CUDNN_DEBUG_LEVEL": "1"}, _SELECT),
        ({"NVTE_DEBUG": "1", "NVTE_DEBUG_LEVEL": "2"}, _SELECT),  # TransformerEngine's variables
    )
    assert off == ("0 []", "")  # nothing added, nothing printed: the application decides
    assert info[0] == "20 [('StreamHandler', '<stderr>')]"
    lines = info[1].splitlines()
    assert len(lines) == 1 and lines[0].startswith("[INFO     | te_cudnn | pid "), info[1]
    assert "]: selected F16_arbitrary_seqlen (fwd) for bshd_bshd_bshd bfloat16, b=2 h=8" in lines[0]
    assert debug[0] == "10 [('StreamHandler', '<stderr>')]"
    assert "[DEBUG    | te_cudnn" in debug[1] and "F16_max512_seqlen declined: " in debug[1]


def test_signature_memo_last_entry_is_only_a_shortcut(cpu_prepare) -> None:
    """A repeated signature matches the memo's ``last`` pair; another signature is looked up in
    the memo (and becomes ``last``); clearing the memo (forget_prepared) clears ``last`` too, so
    the next call prepares again. Both directions."""
    q, k, v = _qkv()
    run_fwd(q, k, v)
    run_fwd(q, k, v)  # found in the memo: becomes last
    sig, prep = ops._fwd_memo.last
    assert ops._fwd_memo[sig] is prep and prep.backend.name == ARB.name and cpu_prepare["fwd"] == 1
    run_fwd(q, k, v)
    assert ops._fwd_memo.last[1] is prep
    assert run_fwd(q, k, v, M512) == M512.name  # another signature: prepared, then found
    assert run_fwd(q, k, v, M512) == M512.name and ops._fwd_memo.last[1].backend.name == M512.name
    assert run_fwd(q, k, v) == ARB.name and ops._fwd_memo.last[1] is prep and cpu_prepare["fwd"] == 2
    run_bwd(q, k, v)
    run_bwd(q, k, v)
    assert ops._bwd_memo.last[1] is ops._bwd_memo[ops._bwd_memo.last[0]] and cpu_prepare["bwd"] == 1
    ops.forget_prepared()
    assert ops._fwd_memo.last == ops.SigMemo().last and ops._bwd_memo.last == ops.SigMemo().last
    run_fwd(q, k, v)
    run_bwd(q, k, v)
    assert cpu_prepare["fwd"] == 3 and cpu_prepare["bwd"] == 2
