"""Debug logging on the ``"te_cudnn"`` logger: the level the debug variables (te_cudnn's and
TransformerEngine's) give, in this process and in a fresh one; what selection and plan builds or
loads log, and that ``explain`` and a quiet logger log nothing; CPU only."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest

import te_cudnn
from te_cudnn import policy
from te_cudnn.backends import Direction
from te_cudnn.config import describe_shapes
from te_cudnn.plans import CompiledPlan, PlanCache, make_key
from te_cudnn.plans.cache import log_plan_outcome
from te_cudnn.policy import select
from te_cudnn.runtime import HOPPER_CUDNN_919

from _policy_cpu import ARB, BF16, BOTH, DEBUG_VARS, ENV_VARS, LONG, M512, cfg, explain
from _policy_cpu import clean_policy  # noqa: F401 - autouse: no policy variable set, no context leaked
from _policy_cpu import te_records as _te_records


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
