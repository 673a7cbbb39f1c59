"""Tuning records in a real plan store (``te_cudnn.plans.tune``), without a GPU: stored with the
plan, read back in a fresh process, never seen under another fingerprint; and
``build_or_load_plan`` with autotuning off and on (the heuristic build and the tuner are
replaced; the tuner's timings come from a fake timer).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from te_cudnn.plans import CompiledPlan, PlanCache, PlanKey
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans import handles as handles_mod
from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.store import PlanStore
from te_cudnn.plans.tune import autotuning, tuning_record

from _autotune_cpu import fake_result
from _autotune_cpu import no_autotune_env  # noqa: F401 - autouse: TE_CUDNN_AUTOTUNE unset, warnings reset
from _autotune_cpu import stand_in_plan as _plan
from _autotune_cpu import tuned_plan as _tuned_plan
from _plan_helpers import FACTS, sizes_key


@pytest.mark.parametrize("other", [{"gpu": "NVIDIA H200"}, {"cudnn": 92000}, {"sm_count": 114}, {"frontend": "1.33.0"}])
def test_record_is_stored_read_back_and_invalidated_by_another_fingerprint(tmp_path: Path, other: dict) -> None:
    k = sizes_key()
    store = PlanStore(tmp_path / "plans", FACTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache_mod._save_built(store, k, k.describe(device=False), _tuned_plan(k))
    header = store.load(k.describe(device=False)).header
    assert header["plan_name"] == "eng4_k3=2" == header["tuning"]["chosen"]["name"]
    assert header["tuning"] == json.loads(json.dumps(fake_result().to_record()))
    # a fresh process: an empty cache, the same store
    assert tuning_record(k, cache=PlanCache(builder=lambda *a: None), store=PlanStore(tmp_path / "plans", FACTS)) == header["tuning"]
    # another GPU model or version: another fingerprint, another directory; the record is never seen
    foreign = PlanStore(tmp_path / "plans", {**FACTS, **other})
    assert foreign.fingerprint != store.fingerprint
    assert foreign.load(k.describe(device=False)) is None
    assert tuning_record(k, cache=PlanCache(builder=lambda *a: None), store=foreign) is None
    # an untuned plan of the same key has no record
    cache_mod._save_built(store, k, k.describe(device=False), _plan(k))
    assert tuning_record(k, cache=PlanCache(builder=lambda *a: None), store=store) is None


def test_tuning_record_prefers_the_cached_tuned_plan(tmp_path: Path) -> None:
    k = sizes_key()
    cache = PlanCache(builder=lambda key, make_spec: _tuned_plan(key))
    cache.get_or_build(k, lambda: None)
    assert tuning_record(k, cache=cache, store=PlanStore(tmp_path, FACTS)) == cache.find(k).tuning
    assert tuning_record(sizes_key(device=-1), cache=PlanCache(builder=lambda *a: None)) is None  # no device, no store


@pytest.fixture
def plan_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """build_or_load_plan over a store in tmp_path. The heuristic build and the tuner are
    replaced (no GPU): the fake tuner runs the real bookkeeping with the fake timer."""
    store = PlanStore(tmp_path / "plans", FACTS)
    calls: list[tuple[str, PlanKey]] = []

    def fake_build(k: PlanKey, make_spec) -> CompiledPlan:
        calls.append(("build", k))
        return _plan(k)

    def fake_tune(k: PlanKey, make_spec) -> CompiledPlan:
        calls.append(("tune", k))
        plan = _tuned_plan(k)
        plan.tune_checked = True
        return plan

    deserialized: list[Path] = []

    def no_handle(device: int):  # synthetic bytes never reach cuDNN's deserializer
        deserialized.append(device)
        raise RuntimeError("these tests hand no plan to cuDNN")

    monkeypatch.setattr(cache_mod, "build_plan", fake_build)
    monkeypatch.setattr(tune_mod, "tune_plan", fake_tune)
    monkeypatch.setattr(cache_mod, "store_for", lambda device: store)
    monkeypatch.setattr(handles_mod, "handle_for", no_handle)
    return store, calls, deserialized


def test_off_builds_as_before_and_stores_no_record(plan_env) -> None:
    store, calls, _ = plan_env
    k = sizes_key()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = cache_mod.build_or_load_plan(k, lambda: None)
    assert calls == [("build", k)] and plan.tuning is None
    assert "tuning" not in store.load(k.describe(device=False)).header


def test_on_tunes_and_replaces_an_untuned_stored_plan_without_deserializing_it(plan_env) -> None:
    store, calls, deserialized = plan_env
    k = sizes_key()
    cache_mod._save_built(store, k, k.describe(device=False), _plan(k))  # an untuned plan from an earlier process
    with autotuning():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the untuned file is passed over quietly, before cuDNN sees it
            plan = cache_mod.build_or_load_plan(k, lambda: None)
    assert calls == [("tune", k)] and deserialized == [] and plan.tuning is not None
    header = store.load(k.describe(device=False)).header
    assert header["tuning"]["chosen"]["name"] == header["plan_name"] == "eng4_k3=2"
    # a later process with autotuning on goes for the tuned file (deserializing it needs a GPU here)
    with autotuning(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cache_mod.build_or_load_plan(k, lambda: None)
    assert deserialized == [0] and any("could not load stored plan" in str(w.message) for w in seen)


def test_untunable_keys_are_built_as_before_with_autotuning_on(plan_env) -> None:
    _, calls, _ = plan_env
    k = sizes_key(device=-1)
    with autotuning():
        cache_mod.build_or_load_plan(k, lambda: None)
    assert calls == [("build", k)]
