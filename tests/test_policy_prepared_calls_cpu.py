"""The per-signature path of ``fused_attn_fwd`` / ``fused_attn_bwd`` under the backend policy: a call
is prepared (and its selection logged) once per signature and policy, prepared again when the
policy or the environment changes, and remembered in a memo whose last entry is only a shortcut;
CPU only.

The path is reached on CPU tensors by standing in for the device check
(``first_call._require_cuda``) and stopping at the plan lookup (``_Prepared.get_plan``): that is
where a GPU would take over.
"""

from __future__ import annotations

import logging

import pytest
import torch

import te_cudnn
from te_cudnn import UnsupportedConfigError, first_call, ops, prepared
from te_cudnn.runtime import HOPPER_CUDNN_919

from _policy_cpu import ARB, BF16, BOTH, M512, cfg, set_env
from _policy_cpu import clean_policy  # noqa: F401 - autouse: no policy variable set, no context leaked
from _policy_cpu import te_records as _te_records


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
