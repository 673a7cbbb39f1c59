"""Which plans prefer engine configurations without a workspace (``te_cudnn.plans.one_row``):
one-row inference forwards of the F16 arbitrary-seqlen sub-backend up to ``MAX_KEYS`` keys,
nothing else; the choice is part of the plan key (memory and store), the switch forgets the
prepared calls, and the build keeps only such configurations, falling back to the
heuristics' plan where none builds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from te_cudnn import prepared
from te_cudnn.backends.base import Direction
from te_cudnn.enums import AttnBiasType, FusedAttnBackend
from te_cudnn.errors import GraphBuildError
from te_cudnn.plans import build as plan_build
from te_cudnn.plans import make_key
from te_cudnn.plans.one_row import MAX_KEYS, keep_without_workspace, lean_one_row, prefers_no_workspace

from _plan_helpers import sizes_config

ARBITRARY = FusedAttnBackend.F16_arbitrary_seqlen


@pytest.fixture(autouse=True)
def _on():
    was = lean_one_row(True)
    yield
    lean_one_row(was)


def decode(**over):
    """A decode step's forward as the doors without a gradient describe it."""
    a = dict(is_training=False, attn_mask_type="no_mask", max_seqlen_q=1, max_seqlen_kv=600, num_attn_heads=32,
             num_gqa_groups=8)  # fmt: skip
    a.update(over)
    return replace(sizes_config(**a), writes_stats=False)


def key(cfg, backend=ARBITRARY, direction=Direction.FWD):
    return make_key(backend, direction, cfg, 91900, "1.32.0")


def test_a_decode_step_prefers_no_workspace_up_to_max_keys():
    assert key(decode()).no_workspace
    assert key(decode(max_seqlen_kv=MAX_KEYS)).no_workspace
    assert not key(decode(max_seqlen_kv=MAX_KEYS + 1)).no_workspace


@pytest.mark.parametrize("why, cfg", [
    ("two query rows", lambda: decode(max_seqlen_q=2)),
    ("softmax stats for a backward", lambda: replace(decode(), writes_stats=True)),
    ("a bias", lambda: replace(decode(), bias_type=AttnBiasType.post_scale_bias, bias_shape=(1, 1, 1, 600))),
    ("dropout", lambda: replace(decode(), dropout=0.1)),
    ("declared to run in a CUDA graph", lambda: replace(decode(), cuda_graph=True)),
    ("paged", lambda: replace(decode(), paged=(64, 16, 40))),
    ("ragged", lambda: replace(decode(), ragged_kv=True)),
])  # fmt: skip
def test_other_forwards_keep_the_heuristics_plan(why, cfg):
    assert not key(cfg()).no_workspace, why


def test_only_the_arbitrary_seqlen_forward_and_only_while_on():
    cfg = decode()
    assert not key(cfg, backend=FusedAttnBackend.F16_max512_seqlen).no_workspace
    assert not prefers_no_workspace(ARBITRARY, Direction.BWD, cfg)
    lean_one_row(False)
    assert not key(cfg).no_workspace
    assert lean_one_row(True) is False


def test_the_preference_is_part_of_the_key():
    cfg = decode()
    on = key(cfg)
    lean_one_row(False)
    off = key(cfg)
    assert on != off and hash(on) != hash(off)
    assert on.describe(device=False)["no_workspace"] is True and off.describe(device=False)["no_workspace"] is False


def test_switching_forgets_the_prepared_calls_and_checks_its_argument():
    prepared._fwd_memo.remember(("a signature",), object(), 0)
    lean_one_row(True)  # unchanged: nothing forgotten
    assert len(prepared._fwd_memo) == 1
    lean_one_row(False)
    assert len(prepared._fwd_memo) == 0
    with pytest.raises(TypeError, match="on must be a bool or None, got int 1"):
        lean_one_row(1)


class _Graph:
    """Records the frontend calls of a build; ``check_support`` fails after the workspace filter
    when ``declines`` (no configuration without a workspace)."""

    def __init__(self, calls, declines):
        self.calls, self.declines, self.filtered = calls, declines, False

    def __getattr__(self, name):
        def step(*args):
            self.calls.append(name)
            if name == "deselect_workspace_greater_than":
                assert args == (0,)
                self.filtered = True
            if name == "check_support" and self.filtered and self.declines:
                raise RuntimeError("no engine configuration left")
            return 0

        return step


class _Spec:
    def __init__(self, graph):
        self.graph, self.uids = graph, (1, 2, 3, 4)


@pytest.mark.parametrize("declines", [False, True])
def test_the_build_filters_after_planning_and_falls_back_when_nothing_is_left(declines):
    calls: list[str] = []
    plan = plan_build.build_plan(key(decode()), lambda: _Spec(_Graph(calls, declines)))
    first = calls[:calls.index("build_plans") + 1] if not declines else calls[:calls.index("check_support") + 1]
    assert first == ["validate", "build_operation_graph", "create_execution_plans", "deselect_workspace_greater_than",
                     "check_support"] + ([] if declines else ["build_plans"])  # fmt: skip
    if declines:  # built again, without the filter
        assert calls[len(first):].count("deselect_workspace_greater_than") == 0 and "build_plans" in calls
    assert plan.workspace_size == 0 and plan.key.no_workspace


def test_the_build_of_any_other_key_does_not_filter():
    calls: list[str] = []
    plan_build.build_plan(key(decode(max_seqlen_q=2)), lambda: _Spec(_Graph(calls, True)))
    assert "deselect_workspace_greater_than" not in calls


def test_the_autotuner_filter_follows_the_key():
    calls: list[str] = []
    keep_without_workspace(key(decode()), _Graph(calls, False))
    keep_without_workspace(key(decode(max_seqlen_kv=MAX_KEYS + 1)), _Graph(calls, False))
    assert calls == ["deselect_workspace_greater_than"]


def test_a_build_error_names_the_stage():
    calls: list[str] = []
    graph = _Graph(calls, True)
    with pytest.raises(GraphBuildError, match="keep the plans without a workspace of|check support of"):
        plan_build._build(key(decode()), lambda: _Spec(graph), True)
