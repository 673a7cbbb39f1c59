"""Helpers shared by the CPU backend-policy and logging tests: the autouse fixture that clears the
policy variables (and checks no ``backend_policy`` context leaks), configurations served by both
F16 sub-backends or by F16_arbitrary_seqlen only, the sub-backend chosen or explained on the
measured Hopper machine (``HOPPER_CUDNN_919``), and the ``"te_cudnn"`` logger's records."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import te_cudnn
from te_cudnn import FusedAttnBackend, policy
from te_cudnn.config import describe_shapes
from te_cudnn.policy import select
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


def te_records(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "te_cudnn" and r.levelno == level]
