"""The plan cache's tuned/untuned rule (``te_cudnn.plans.cache`` with ``te_cudnn.plans.tune``),
without a GPU: an untuned entry is tuned once autotuning is on, a key whose tuning failed is not
retried, untunable keys and CUDA-graph capture are never tuned, entering autotuning retires the
process cache's untuned plans, and ``put`` replaces within the size bound.
"""

from __future__ import annotations

import json

import pytest

from te_cudnn.plans import CompiledPlan, PlanCache, PlanKey
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.tune import autotuning, tuning_wanted

from _autotune_cpu import no_autotune_env  # noqa: F401 - autouse: TE_CUDNN_AUTOTUNE unset, warnings reset
from _autotune_cpu import stand_in_plan as _plan
from _autotune_cpu import tuned_plan as _tuned_plan
from _plan_helpers import sizes_key


class Builder:
    """A builder that returns tuned plans while autotuning is on (as build_or_load_plan does)."""

    def __init__(self, tunes: bool = True):
        self.calls: list[tuple[PlanKey, bool]] = []
        self.tunes = tunes

    def __call__(self, k: PlanKey, make_spec) -> CompiledPlan:
        on = tuning_wanted(k)
        self.calls.append((k, on))
        return _tuned_plan(k) if on and self.tunes else _plan(k)


def test_cache_tunes_an_untuned_entry_once_autotuning_is_on() -> None:
    builder = Builder()
    cache = PlanCache(maxsize=4, builder=builder)
    k = sizes_key()
    heuristic = cache.get_or_build(k, lambda: None)
    assert heuristic.tuning is None and cache.get_or_build(k, lambda: None) is heuristic  # off: a hit
    with autotuning():
        tuned = cache.get_or_build(k, lambda: None)  # untuned entry: a miss, tuned, replaced
        assert tuned is not heuristic and tuned.tuning is not None and tuned.tune_checked
        assert heuristic.evicted and cache.hit(heuristic) is False  # holders of the old plan look up again
        assert cache.get_or_build(k, lambda: None) is tuned
    assert cache.get_or_build(k, lambda: None) is tuned  # off again: any plan serves
    assert builder.calls == [(k, False), (k, True)]
    s = cache.stats()
    assert (s.entries, s.misses, s.builds, s.evictions) == (1, 2, 2, 0) and s.hits == 1 + 2
    info = tuned.info()
    assert info["tuned"] is True and info["tuning"]["chosen"]["name"] == "eng4_k3=2"
    assert [c["name"] for c in info["tuning"]["candidates"]][:2] == ["eng0_k2=1", "eng4_k3=2"]
    assert heuristic.info()["tuned"] is False and "tuning" not in heuristic.info()
    json.dumps(cache.snapshot())


def test_cache_does_not_retry_a_key_whose_tuning_failed() -> None:
    builder = Builder(tunes=False)  # tuning impossible or failed: the builder returns the heuristic plan
    cache = PlanCache(maxsize=4, builder=builder)
    k = sizes_key()
    with autotuning():
        first = cache.get_or_build(k, lambda: None)
        assert first.tuning is None and first.tune_checked
        assert cache.get_or_build(k, lambda: None) is first
    assert len(builder.calls) == 1


def test_cache_never_tunes_untunable_keys_or_during_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    builder = Builder()
    cache = PlanCache(maxsize=4, builder=builder)
    k, cpu = sizes_key(), sizes_key(device=-1)
    plain = cache.get_or_build(k, lambda: None)
    cache.get_or_build(cpu, lambda: None)
    with autotuning():
        assert cache.get_or_build(cpu, lambda: None).tuning is None
        monkeypatch.setattr(tune_mod, "_capturing", lambda: True)
        assert cache.get_or_build(k, lambda: None) is plain  # during capture the cached plan serves
    assert [on for _, on in builder.calls] == [False, False]


def test_entering_autotuning_retires_untuned_plans_of_the_process_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = PlanCache(maxsize=8, builder=Builder(tunes=False))
    monkeypatch.setattr(cache_mod, "plan_cache", cache)
    k1, k2, cpu = sizes_key(), sizes_key(max_seqlen_q=1024, max_seqlen_kv=1024), sizes_key(device=-1)
    held = [cache.get_or_build(k, lambda: None) for k in (k1, k2, cpu)]
    cache.put(_tuned_plan(k2))  # k2 already tuned (as tune_key leaves it)
    assert held[1].evicted
    tuned_k2 = cache.find(k2)
    with autotuning():
        assert held[0].evicted and not cache.hit(held[0])  # the untuned plan: its holders look up (and tune)
        assert cache.find(k2) is tuned_k2 and not tuned_k2.evicted  # a tuned plan stays
        assert cache.find(cpu) is held[2] and not held[2].evicted  # an untunable one stays
        tried = cache.get_or_build(k1, lambda: None)  # tuning fails here: checked, kept
    with autotuning():
        assert cache.find(k1) is tried  # not retired again
    assert len(cache) == 3 and cache.stats().evictions == 0


def test_put_replaces_and_respects_maxsize() -> None:
    cache = PlanCache(maxsize=1, builder=Builder())
    k1, k2 = sizes_key(), sizes_key(max_seqlen_q=1024, max_seqlen_kv=1024)
    a = cache.get_or_build(k1, lambda: None)
    b = _tuned_plan(k2)
    cache.put(b)
    assert a.evicted and cache.find(k2) is b and len(cache) == 1 and cache.stats().evictions == 1
