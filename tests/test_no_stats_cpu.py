"""Forwards without softmax stats (``fused_attn_fwd(softmax_stats=False)``, the doors' calls
that record no gradient): which calls get a graph without them, the graph the real frontend
validates, the sub-backends' reasons, and the argument checks. No GPU: the slow path runs
against a simulated sm90 / cuDNN 9.19 machine and stops before any launch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import te_cudnn as tc
import te_cudnn.first_call as first_call
from te_cudnn.backends import BY_ENUM, Direction, Uid
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.ops import fwd_call_args
from te_cudnn.prepared import forget_prepared
from te_cudnn.runtime import HOPPER_CUDNN_919

from _plan_helpers import sizes_config

BF16 = torch.bfloat16
ARBITRARY = BY_ENUM[FusedAttnBackend.F16_arbitrary_seqlen]


@pytest.fixture
def hopper(monkeypatch: pytest.MonkeyPatch):
    """The slow path as on an sm90 machine with cuDNN 9.19 (it needs no device until the launch)."""
    monkeypatch.setattr(first_call, "_require_cuda", lambda cfg, q: HOPPER_CUDNN_919)
    forget_prepared()
    yield
    forget_prepared()


def _prepare(sig, softmax_stats=False, mask="causal", cu=False, **over):
    b, s, h, d = 2, 128, 4, 64
    q, k, v = (torch.zeros(b, s, h, d, dtype=BF16) for _ in range(3))
    lens = torch.tensor([0, s, 2 * s], dtype=torch.int32) if cu else None
    args = dict(is_training=False, max_seqlen_q=s, max_seqlen_kv=s, cu_seqlens_q=lens, cu_seqlens_kv=lens, q=q, k=k,
                v=v, qkv_dtype=BF16, qkv_layout="bshd_bshd_bshd", attn_mask_type=mask, softmax_stats=softmax_stats)
    args.update(over)
    return first_call._prepare_fwd(sig, fwd_call_args(**args))


def test_graph_without_stats_validates_and_binds_no_stats() -> None:
    cfg = replace(sizes_config(is_training=False), writes_stats=False)
    assert ARBITRARY.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD) == []
    spec = ARBITRARY.build(cfg, Direction.FWD)
    spec.graph.validate()
    assert Uid.STATS not in spec.uids
    assert list(spec.uids[:4]) == [Uid.Q, Uid.K, Uid.V, Uid.O]  # the order plain_fwd's pointers follow
    with_stats = ARBITRARY.build(replace(cfg, writes_stats=True), Direction.FWD)
    assert list(with_stats.uids[:5]) == [Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS]


def test_other_sub_backends_decline_a_forward_without_stats() -> None:
    cfg = replace(sizes_config(is_training=False), writes_stats=False)
    for enum in (FusedAttnBackend.F16_max512_seqlen, FusedAttnBackend.FP8):
        why = BY_ENUM[enum].not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD)
        assert any("without softmax stats" in w for w in why), (enum, why)
    thd = replace(sizes_config(is_training=False, qkv_layout="thd_thd_thd", attn_mask_type="padding_causal"),
                  writes_stats=False)  # fmt: skip
    assert any("dense q" in w for w in ARBITRARY.not_supported_reasons(thd, HOPPER_CUDNN_919, Direction.FWD))


def test_plain_calls_get_a_graph_without_stats(hopper) -> None:
    prep = _prepare(("no stats",))
    assert prep.plain and prep.stats_template is None
    assert not prep.cfg.writes_stats and not prep.key.config.writes_stats
    kept = _prepare(("stats",), softmax_stats=True)
    assert kept.stats_template is not None and kept.key.config.writes_stats
    assert kept.key != prep.key  # their own plans


def test_other_calls_write_and_return_stats(hopper) -> None:
    """Padding masks (and the other paths that are not the plain one) keep the stats graph."""
    prep = _prepare(("padding",), mask="padding_causal", cu=True)
    assert not prep.plain and prep.cfg.writes_stats and prep.stats_template is not None


def test_arguments_checked(hopper) -> None:
    with pytest.raises(TypeError, match="softmax_stats must be a bool"):
        _prepare(None, softmax_stats=0)
    lse = torch.zeros(2, 4, 128, 1, dtype=torch.float32)
    with pytest.raises(ValueError, match="softmax_lse was given but softmax_stats=False"):
        _prepare(None, softmax_lse=lse)


def test_backward_of_a_forward_without_stats_is_refused() -> None:
    q, k, v = (torch.zeros(2, 128, 4, 64, dtype=BF16) for _ in range(3))
    aux = [None, torch.zeros(2, dtype=torch.int64)]
    with pytest.raises(ValueError, match="softmax_stats=False"):
        tc.fused_attn_bwd(128, 128, None, None, q, k, v, q, q, BF16, aux, qkv_layout="bshd_bshd_bshd",
                          attn_mask_type="causal")  # fmt: skip
