"""Plan keys and the plan cache's mechanics (LRU, statistics, threads); CPU only.

The cache tests use ``PlanCache(builder=...)`` with a trivial builder that returns a
``CompiledPlan`` around a dummy graph: they test the cache itself, not cuDNN planning.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import torch

from te_cudnn.backends import Direction
from te_cudnn.config import describe_shapes
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.plans import CompiledPlan, PlanCache, PlanKey, make_key

BF16 = torch.bfloat16
ARB = FusedAttnBackend.F16_arbitrary_seqlen
FE = "1.32.0"
CUDNN = 91900


def cfg(**over: Any):
    a: dict[str, Any] = dict(
        is_training=True, dtype=BF16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias", attn_mask_type="causal",
        softmax_type="vanilla", dropout=0.0, num_attn_heads=16, num_gqa_groups=16, max_seqlen_q=512,
        max_seqlen_kv=512, head_dim_qk=64, head_dim_v=64, window_size=(-1, -1), batch_size=2, device=0,
    )  # fmt: skip
    a.update(over)
    return describe_shapes(**a)


def key(direction: Direction = Direction.FWD, backend: FusedAttnBackend = ARB, cudnn: int = CUDNN, fe: str = FE, **over: Any) -> PlanKey:
    return make_key(backend, direction, cfg(**over), cudnn, fe)


# ----------------------------------------------------------------------------- PlanKey
@pytest.mark.parametrize("direction", [Direction.FWD, Direction.BWD], ids=["fwd", "bwd"])
def test_same_config_same_key(direction: Direction) -> None:
    k1, k2 = key(direction), key(direction)
    assert k1 is not k2 and k1.config is not k2.config
    assert k1 == k2
    assert hash(k1) == hash(k2)
    assert {k1: "plan"}[k2] == "plan"


DIFFERENT = [
    # id, (kwargs of key A), (kwargs of key B)
    ("direction", dict(direction=Direction.FWD), dict(direction=Direction.BWD)),
    ("backend", dict(backend=ARB), dict(backend=FusedAttnBackend.F16_max512_seqlen)),
    ("dtype", dict(dtype=BF16), dict(dtype=torch.float16)),
    ("layout", dict(qkv_layout="bshd_bshd_bshd"), dict(qkv_layout="sbhd_sbhd_sbhd")),
    ("layout_packed", dict(qkv_layout="bshd_bshd_bshd"), dict(qkv_layout="bs3hd")),
    ("mask", dict(attn_mask_type="causal"), dict(attn_mask_type="no_mask")),
    ("bias_type", dict(attn_bias_type="no_bias"), dict(attn_bias_type="post_scale_bias")),
    ("bias_shape", dict(attn_bias_type="post_scale_bias", bias_shape=(1, 16, 512, 512)),
     dict(attn_bias_type="post_scale_bias", bias_shape=(2, 16, 512, 512))),
    ("dropout", dict(dropout=0.0), dict(dropout=0.1)),
    ("dropout_value", dict(dropout=0.1), dict(dropout=0.2)),
    ("window", dict(window_size=(-1, -1)), dict(window_size=(128, 0))),
    ("window_left", dict(window_size=(64, 0)), dict(window_size=(128, 0))),
    ("deterministic_bwd", dict(direction=Direction.BWD, deterministic=False),
     dict(direction=Direction.BWD, deterministic=True)),
    ("device", dict(device=0), dict(device=1)),
    ("cudnn_version", dict(cudnn=91900), dict(cudnn=91800)),
    ("frontend_version", dict(fe="1.32.0"), dict(fe="1.31.0")),
    ("attn_scale", dict(attn_scale=0.125), dict(attn_scale=0.25)),
    ("is_training_fwd", dict(is_training=True), dict(is_training=False)),
    ("heads_gqa", dict(num_gqa_groups=16), dict(num_gqa_groups=4)),
    ("head_dim", dict(head_dim_qk=64, head_dim_v=64), dict(head_dim_qk=128, head_dim_v=128)),
    ("seqlen_q", dict(max_seqlen_q=512), dict(max_seqlen_q=256)),
    ("seqlen_kv", dict(max_seqlen_kv=512), dict(max_seqlen_kv=1024)),
    ("batch", dict(batch_size=2), dict(batch_size=4)),
    ("softmax", dict(softmax_type="vanilla"), dict(softmax_type="off_by_one")),
]  # fmt: skip


@pytest.mark.parametrize(("a", "b"), [c[1:] for c in DIFFERENT], ids=[c[0] for c in DIFFERENT])
def test_keys_differ(a: dict, b: dict) -> None:
    ka, kb = key(**a), key(**b)
    assert ka != kb
    assert kb != ka
    assert len({ka, kb}) == 2


def test_fwd_key_ignores_deterministic() -> None:
    kf, kt = key(Direction.FWD, deterministic=False), key(Direction.FWD, deterministic=True)
    assert kf == kt and hash(kf) == hash(kt)
    assert kt.config.deterministic is False
    assert kt.config.do_stride is None


def test_fwd_key_ignores_do_stride() -> None:
    c = cfg()
    bwd_like = c.for_backward(c.o_stride, deterministic=True)
    k1 = make_key(ARB, Direction.FWD, bwd_like, CUDNN, FE)
    assert k1 == make_key(ARB, Direction.FWD, c, CUDNN, FE)


def test_bwd_key_normalises_is_training() -> None:
    # the backward graph is the same whatever the forward's flag was
    k_train, k_inf = key(Direction.BWD, is_training=True), key(Direction.BWD, is_training=False)
    assert k_train == k_inf and hash(k_train) == hash(k_inf)
    assert k_inf.config.is_training is True


def test_bwd_key_depends_on_do_stride() -> None:
    c = cfg()
    contiguous = c.for_backward(c.o_stride, deterministic=False)
    other = c.for_backward((512 * 16 * 64, 64, 16 * 64 * 2, 1), deterministic=False)
    assert make_key(ARB, Direction.BWD, contiguous, CUDNN, FE) != make_key(ARB, Direction.BWD, other, CUDNN, FE)


def test_key_is_immutable_and_describable() -> None:
    k = key(attn_bias_type="post_scale_bias")
    with pytest.raises(AttributeError):
        k.cudnn_version = 1  # type: ignore[misc]
    d = k.describe()
    json.dumps(d)  # JSON-friendly
    assert d["backend"] == "F16_arbitrary_seqlen"
    assert d["direction"] == "fwd"
    assert d["dtype"] == "bfloat16"
    assert d["layout"] == "bshd_bshd_bshd"
    assert d["mask"] == "causal"
    assert d["bias_type"] == "post_scale_bias"
    assert d["bias_shape"] == [1, 16, 512, 512]
    assert d["cudnn_version"] == CUDNN and d["frontend_version"] == FE
    assert "F16_arbitrary_seqlen fwd" in str(k) and "cuda:0" in str(k)


# ----------------------------------------------------------------------------- PlanCache
class Builder:
    """Trivial builder: a CompiledPlan around a dummy graph (tests the cache, not cuDNN)."""

    def __init__(self, delay: float = 0.0, fail_first: int = 0):
        self.calls: list[PlanKey] = []
        self.delay = delay
        self.fail_first = fail_first
        self._lock = threading.Lock()

    def __call__(self, k: PlanKey, make_spec) -> CompiledPlan:
        with self._lock:
            self.calls.append(k)
            n = len(self.calls)
        if self.delay:
            time.sleep(self.delay)
        if n <= self.fail_first:
            raise RuntimeError(f"build {n} failed")
        return CompiledPlan(k, graph=object(), uids=(), workspace_size=0, plan_name="test", build_seconds=0.001)


def _no_spec():
    raise AssertionError("the trivial builder never asks for a graph spec")


def _keys(n: int) -> list[PlanKey]:
    return [key(max_seqlen_q=64 * (i + 1), max_seqlen_kv=64 * (i + 1)) for i in range(n)]


def test_miss_then_hits() -> None:
    builder = Builder()
    cache = PlanCache(maxsize=4, builder=builder)
    (k,) = _keys(1)
    p1 = cache.get_or_build(k, _no_spec)
    assert isinstance(p1, CompiledPlan) and p1.key is k
    s = cache.stats()
    assert (s.entries, s.hits, s.misses, s.builds, s.build_failures, s.evictions) == (1, 0, 1, 1, 0, 0)
    assert s.build_seconds == pytest.approx(0.001)
    p2 = cache.get_or_build(key(max_seqlen_q=64, max_seqlen_kv=64), _no_spec)  # an equal, distinct key object
    assert p2 is p1
    assert cache.get(k) is p1
    assert cache.hit(p1) is True
    s = cache.stats()
    assert (s.hits, s.misses, s.builds) == (3, 1, 1)
    assert p1.hits == 3
    assert len(builder.calls) == 1
    assert k in cache and len(cache) == 1
    # get() on an absent key returns None and counts nothing
    assert cache.get(_keys(2)[1]) is None
    assert cache.stats().hits == 3 and cache.stats().misses == 1
    assert s.as_dict() == dict(entries=1, maxsize=4, hits=3, misses=1, builds=1, loads=0, build_failures=0,
                               build_seconds=pytest.approx(0.001), evictions=0)  # fmt: skip


def test_lru_eviction_order() -> None:
    builder = Builder()
    cache = PlanCache(maxsize=2, builder=builder)
    k1, k2, k3 = _keys(3)
    p1 = cache.get_or_build(k1, _no_spec)
    p2 = cache.get_or_build(k2, _no_spec)
    assert cache.get(k1) is p1  # k1 becomes most recently used; k2 is now the LRU
    p3 = cache.get_or_build(k3, _no_spec)
    assert k2 not in cache and k1 in cache and k3 in cache
    assert p2.evicted is True and p1.evicted is False and p3.evicted is False
    assert cache.stats().evictions == 1 and len(cache) == 2
    assert cache.hit(p2) is False  # a holder of an evicted plan must look it up again
    assert cache.hit(p3) is True  # k1 is now the LRU
    p2b = cache.get_or_build(k2, _no_spec)
    assert p2b is not p2
    assert p1.evicted is True and k1 not in cache
    assert cache.hit(p1) is False
    s = cache.stats()
    assert (s.builds, s.misses, s.evictions, s.entries) == (4, 4, 2, 2)
    assert [c for c in builder.calls] == [k1, k2, k3, k2]


def test_hit_refreshes_recency() -> None:
    cache = PlanCache(maxsize=2, builder=Builder())
    k1, k2, k3 = _keys(3)
    p1 = cache.get_or_build(k1, _no_spec)
    p2 = cache.get_or_build(k2, _no_spec)
    assert cache.hit(p1)
    cache.get_or_build(k3, _no_spec)
    assert p2.evicted and not p1.evicted


def test_clear() -> None:
    cache = PlanCache(maxsize=4, builder=Builder())
    plans = [cache.get_or_build(k, _no_spec) for k in _keys(3)]
    cache.get_or_build(_keys(1)[0], _no_spec)
    cache.clear()
    assert len(cache) == 0
    assert all(p.evicted for p in plans)
    assert all(cache.hit(p) is False for p in plans)
    s = cache.stats()
    assert (s.entries, s.hits, s.misses, s.builds, s.build_failures, s.evictions, s.build_seconds) == (0, 0, 0, 0, 0, 0, 0.0)
    assert s.maxsize == 4


def test_resize() -> None:
    cache = PlanCache(maxsize=4, builder=Builder())
    ks = _keys(4)
    plans = [cache.get_or_build(k, _no_spec) for k in ks]
    cache.resize(2)
    assert cache.maxsize == 2 and cache.stats().maxsize == 2
    assert [k in cache for k in ks] == [False, False, True, True]
    assert [p.evicted for p in plans] == [True, True, False, False]
    assert cache.stats().evictions == 2
    cache.resize(8)
    assert len(cache) == 2 and cache.stats().evictions == 2
    with pytest.raises(ValueError, match=r"maxsize=0 must be >= 1"):
        cache.resize(0)
    with pytest.raises(ValueError, match=r"maxsize=0 must be >= 1"):
        PlanCache(maxsize=0, builder=Builder())


def test_snapshot() -> None:
    cache = PlanCache(maxsize=4, builder=Builder())
    k1, k2 = _keys(2)
    cache.get_or_build(k1, _no_spec)
    cache.get_or_build(k2, _no_spec)
    cache.get_or_build(k1, _no_spec)  # k1 hit: most recent
    snap = cache.snapshot()
    json.dumps(snap)
    assert [s["key"] for s in snap] == [k2.describe(), k1.describe()]  # least recently used first
    expected = dict(key=k1.describe(), plan_name="test", workspace_bytes=0, build_ms=1.0, hits=1)
    assert {f: snap[1][f] for f in expected} == expected  # (further informational fields allowed)
    assert snap[0]["hits"] == 0
    assert PlanCache(builder=Builder()).snapshot() == []


def test_builder_failure_not_cached() -> None:
    builder = Builder(fail_first=1)
    cache = PlanCache(maxsize=4, builder=builder)
    (k,) = _keys(1)
    with pytest.raises(RuntimeError, match="build 1 failed"):
        cache.get_or_build(k, _no_spec)
    assert k not in cache
    s = cache.stats()
    assert (s.misses, s.builds, s.build_failures, s.entries) == (1, 0, 1, 0)
    p = cache.get_or_build(k, _no_spec)  # tried again, not a cached failure
    assert p.key == k
    s = cache.stats()
    assert (s.misses, s.builds, s.build_failures, s.entries) == (2, 1, 1, 1)
    assert len(builder.calls) == 2


def _run_threads(n: int, target) -> tuple[list[Any], list[BaseException]]:
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted on
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()
    return results, errors


def test_concurrent_same_key_builds_once() -> None:
    builder = Builder(delay=0.05)
    cache = PlanCache(maxsize=4, builder=builder)
    (k,) = _keys(1)
    results, errors = _run_threads(8, lambda i: cache.get_or_build(k, _no_spec))
    assert errors == []
    assert len(builder.calls) == 1
    assert all(r is results[0] for r in results)
    s = cache.stats()
    assert (s.builds, s.misses, s.hits, s.entries) == (1, 1, 7, 1)
    assert results[0].hits == 7


def test_concurrent_distinct_keys_all_build() -> None:
    builder = Builder(delay=0.05)
    cache = PlanCache(maxsize=16, builder=builder)
    ks = _keys(8)
    start = time.perf_counter()
    results, errors = _run_threads(8, lambda i: cache.get_or_build(ks[i], _no_spec))
    elapsed = time.perf_counter() - start
    assert errors == []
    assert [r.key for r in results] == ks
    assert sorted(map(id, builder.calls)) == sorted(map(id, ks))
    s = cache.stats()
    assert (s.builds, s.misses, s.hits, s.entries) == (8, 8, 0, 8)
    assert elapsed < 8 * 0.05  # builds run outside the lock, in parallel


def test_concurrent_failed_build_is_retried_by_a_waiter() -> None:
    builder = Builder(delay=0.05, fail_first=1)
    cache = PlanCache(maxsize=4, builder=builder)
    (k,) = _keys(1)
    results, errors = _run_threads(8, lambda i: cache.get_or_build(k, _no_spec))
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
    plans = [r for r in results if r is not None]
    assert len(plans) == 7 and all(p is plans[0] for p in plans)
    assert len(builder.calls) == 2
    s = cache.stats()
    assert (s.builds, s.build_failures, s.entries) == (1, 1, 1)


def test_hits_of_evicted_plans_still_count() -> None:
    """Hits are counted on the plans without a lock; the cache total keeps those of evicted plans."""
    cache = PlanCache(maxsize=1, builder=Builder())
    k1, k2 = _keys(2)
    p1 = cache.get_or_build(k1, _no_spec)
    for _ in range(5):
        assert cache.hit(p1)
    cache.get_or_build(k2, _no_spec)  # evicts k1
    assert p1.evicted and cache.stats().hits == 5
    assert cache.hit(p1) is False and p1.hits == 5
    cache.clear()
    assert cache.stats().hits == 0


def test_snapshot_names_launch_mode_and_stages() -> None:
    class Launch:
        mode = "raw"

    def builder(k: PlanKey, make_spec) -> CompiledPlan:
        return CompiledPlan(k, graph=object(), uids=(), workspace_size=0, plan_name="test", build_seconds=0.002,
                            launch=Launch(), stages={"validate": 0.0005, "build_plans": 0.0015})  # fmt: skip

    cache = PlanCache(maxsize=2, builder=builder)
    cache.get_or_build(_keys(1)[0], _no_spec)
    (info,) = cache.snapshot()
    assert info["launch"] == "raw"
    assert info["stages_ms"] == {"validate": 0.5, "build_plans": 1.5}


def test_non_persistable_plans_skip_the_plan_store(monkeypatch, tmp_path) -> None:
    """max512 plans (Capabilities.persistable=False) are built, never stored or loaded."""
    from te_cudnn.plans import cache as cache_module

    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(tmp_path))
    built: list[PlanKey] = []

    def fake_build(k, make_spec):
        built.append(k)
        return CompiledPlan(k, graph=object(), uids=(), workspace_size=0, plan_name="test", build_seconds=0.0)

    def no_store(device):
        raise AssertionError("a non-persistable plan must not reach the plan store")

    monkeypatch.setattr(cache_module, "build_plan", fake_build)
    monkeypatch.setattr(cache_module, "store_for", no_store)
    k = key(backend=FusedAttnBackend.F16_max512_seqlen)
    plan = cache_module.build_or_load_plan(k, _no_spec)
    assert plan.source == "built" and built == [k]
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- builds apart from the caller
def _planner_with_a_cycle(k: PlanKey, make_spec: Any) -> CompiledPlan:
    """What cudnn-frontend 1.32's planner does: it catches an error and keeps it in a local,
    so exception -> traceback -> this frame -> exception is a reference cycle."""
    try:
        raise RuntimeError("No valid engine configs")
    except RuntimeError as exc:
        kept = exc  # noqa: F841 - the cycle
    return CompiledPlan(k, graph=object(), uids=(), workspace_size=0, plan_name="test", build_seconds=0.0)


class _Result:
    """Stands for a call's output tensor."""


@pytest.fixture
def build_apart(monkeypatch):
    from te_cudnn.plans import cache as cache_module

    monkeypatch.setattr(cache_module, "BUILD_APART", True)


def test_a_planner_cycle_holds_the_callers_frames_when_built_in_place(monkeypatch) -> None:
    """The leak itself (TE_CUDNN_BUILD_APART off): the caller's local outlives the call."""
    import gc
    import weakref

    from te_cudnn.plans import cache as cache_module

    monkeypatch.setattr(cache_module, "BUILD_APART", False)
    cache = PlanCache(builder=_planner_with_a_cycle)

    def call() -> _Result:
        out = _Result()
        cache.get_or_build(key(), lambda: None)
        return out

    gc.disable()
    try:
        result = weakref.ref(call())
        assert result() is not None  # held by the planner's cycle through the frames
        gc.collect()
        assert result() is None
    finally:
        gc.enable()


def test_a_planner_cycle_does_not_hold_the_callers_frames(build_apart) -> None:
    """A reference cycle made while building holds its frames, and each frame its caller: built
    in the calling thread, the caller's locals (a call's results) would outlive the call until a
    full garbage collection. te_cudnn builds in a thread of its own, so they die with the call."""
    import gc
    import weakref

    cache = PlanCache(builder=_planner_with_a_cycle)

    def call() -> _Result:
        out = _Result()
        cache.get_or_build(key(), lambda: None)  # the first call of a key builds its plan
        return out

    gc.disable()
    try:
        result = weakref.ref(call())
        assert result() is None, "the caller's frame outlived the call"
    finally:
        gc.enable()


def test_builds_run_with_the_callers_context_and_raise_in_the_caller(build_apart) -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen = []

    def builder(k: PlanKey, make_spec: Any) -> CompiledPlan:
        seen.append((var.get(), threading.current_thread() is not threading.main_thread()))
        if k.config.sq == 256:
            raise ValueError("declined")
        return CompiledPlan(k, graph=object(), uids=(), workspace_size=0, plan_name="test", build_seconds=0.0)

    cache = PlanCache(builder=builder)
    var.set("caller's")
    assert cache.get_or_build(key(), lambda: None).plan_name == "test"
    with pytest.raises(ValueError, match="declined"):
        cache.get_or_build(key(max_seqlen_q=256, max_seqlen_kv=256), lambda: None)
    assert seen == [("caller's", True), ("caller's", True)]
    assert cache.stats().build_failures == 1


@pytest.mark.parametrize("setting, expected", [(None, True), ("1", True), ("0", False), ("off", False), ("yes", True)],
                         ids=["unset", "1", "0", "off", "yes"])  # fmt: skip
@pytest.mark.slow
def test_builds_apart_by_default_and_the_environment_turns_it_off(setting, expected) -> None:
    """The module reads ``TE_CUDNN_BUILD_APART`` once, at import: checked in a fresh interpreter."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TE_CUDNN_BUILD_APART"}
    if setting is not None:
        env["TE_CUDNN_BUILD_APART"] = setting
    probe = "from te_cudnn.plans import cache; print(cache.BUILD_APART)"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(expected)
