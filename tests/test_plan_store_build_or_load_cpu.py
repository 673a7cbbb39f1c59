"""The plan cache's use of the plan store (``build_or_load_plan``, ``store_for``): every store
fault still gives a built plan, with one warning; a built plan is saved and found again; the
devices of one GPU model share one file per plan and one store; stored operand uids that
disagree with the key and plans that cannot be deserialized are rebuilt; the operand uids of a
key are the builder's; CPU only.

The build is replaced and the stored "plans" are synthetic byte strings that never reach cuDNN.
"""

from __future__ import annotations

import errno
import os
import struct
import warnings
from pathlib import Path

import pytest

from te_cudnn.backends import BY_ENUM, Direction
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.plans import CompiledPlan, PlanKey
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans import handles as handles_mod
from te_cudnn.plans import persist as persist_mod
from te_cudnn.plans import store as store_mod
from te_cudnn.plans.store import MAGIC, PlanStore

from _plan_helpers import FACTS, sizes_config
from _plan_store_cpu import BLOB, Recorder, key, temporaries
from _plan_store_cpu import failing as _failing

cfg = sizes_config


# ----------------------------------------------------------------------------- build_or_load_plan: never fails
class _Graph:
    """Stands in for a built cuDNN graph: what build_or_load_plan asks of it is its bytes."""

    def __init__(self, blob: bytes = BLOB):
        self.blob = blob

    def serialize(self, as_bytes: bool = True) -> bytes:
        return self.blob


def _no_spec():
    raise AssertionError("build_plan is replaced in these tests")


@pytest.fixture
def plan_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """build_or_load_plan over a store in tmp_path, with a build that records its keys."""
    store = PlanStore(tmp_path / "plans", FACTS)
    built: list[PlanKey] = []

    def fake_build(k: PlanKey, make_spec) -> CompiledPlan:
        built.append(k)
        uids = BY_ENUM[k.backend].operand_uids(k.config, k.direction)
        return CompiledPlan(k, graph=_Graph(), uids=uids, workspace_size=0, plan_name="fake", build_seconds=0.001)

    def no_handle(device: int):  # synthetic bytes never reach cuDNN's deserializer, on a GPU machine either
        raise RuntimeError("these tests hand no plan to cuDNN")

    monkeypatch.setattr(cache_mod, "build_plan", fake_build)
    monkeypatch.setattr(cache_mod, "store_for", lambda device: store)
    monkeypatch.setattr(handles_mod, "handle_for", no_handle)
    return store, built


@pytest.mark.parametrize("fault", ["ENOSPC", "EDQUOT", "read_only", "untrusted", "nested_header", "load_raises"])
def test_build_or_load_survives_every_store_fault_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, plan_env, fault: str
) -> None:
    store, built = plan_env
    keys = [key(max_seqlen_q=64 * (i + 1)) for i in range(4)]
    expect = {
        "ENOSPC": "No space left on device (ENOSPC)", "EDQUOT": "(EDQUOT)", "read_only": "(EACCES)",
        "untrusted": "chmod 700", "nested_header": "nested too deeply", "load_raises": "RecursionError",
    }[fault]  # fmt: skip
    nested = b""  # for nested_header: what every round finds in place of the plans the last round stored
    if fault in ("ENOSPC", "EDQUOT"):
        monkeypatch.setattr(os, "write", _failing(os.write, getattr(errno, fault), after=100))
    elif fault == "read_only":
        def read_only(*args, **kwargs):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

        monkeypatch.setattr(store_mod.tempfile, "mkstemp", read_only)
    elif fault == "untrusted":
        store.save({"unrelated": 1}, BLOB)
        os.chmod(store.dir, 0o777)
    elif fault == "nested_header":
        store.save({"unrelated": 1}, BLOB)  # the store's directories
        nested = MAGIC + struct.pack("<I", 400_000) + b"[" * 200_000 + b"]" * 200_000
    else:
        def deep(self, key_description):
            raise RecursionError("maximum recursion depth exceeded")

        monkeypatch.setattr(PlanStore, "load", deep)
    with Recorder() as seen:
        for _ in range(3):
            for k in keys if nested else ():
                store.path_for(k.describe(device=False)).write_bytes(nested)
            plans = [cache_mod.build_or_load_plan(k, _no_spec) for k in keys]
    assert [p.source for p in plans] == ["built"] * 4 and len(built) == 12
    assert len(seen) == 1 and expect in seen[0], seen
    assert not temporaries(store.root)


def test_build_or_load_saves_then_finds_the_plan(plan_env) -> None:
    store, built = plan_env
    k = key()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = cache_mod.build_or_load_plan(k, _no_spec)
    entry = store.load(k.describe(device=False))
    assert plan.source == "built" and entry is not None and entry.blob == BLOB
    assert entry.header["uids"] == list(BY_ENUM[k.backend].operand_uids(k.config, k.direction))
    assert entry.header["plan_name"] == "fake"


def test_stored_uids_that_disagree_with_the_key_are_not_used(plan_env) -> None:
    store, built = plan_env
    k = key()
    uids = list(BY_ENUM[k.backend].operand_uids(k.config, k.direction))
    store.save(k.describe(device=False), BLOB, {"uids": uids[::-1], "plan_name": "tampered"})
    with Recorder() as seen:
        plan = cache_mod.build_or_load_plan(k, _no_spec)
    assert plan.source == "built" and built == [k] and tuple(plan.uids) == tuple(uids)
    assert len(seen) == 1 and "operand uids" in seen[0] and "rebuilt" in seen[0]
    assert store.load(k.describe(device=False)).header["uids"] == uids  # the rebuilt plan replaced the file


def test_stored_plan_that_cannot_be_deserialized_is_rebuilt(plan_env) -> None:
    store, built = plan_env
    k = key()
    uids = list(BY_ENUM[k.backend].operand_uids(k.config, k.direction))
    store.save(k.describe(device=False), b"not a cuDNN plan", {"uids": uids})
    with Recorder() as seen:
        plan = cache_mod.build_or_load_plan(k, _no_spec)
        cache_mod.build_or_load_plan(key(max_seqlen_q=1024), _no_spec)  # a second bad plan: no second warning
    assert plan.source == "built" and built[0] == k
    assert len(seen) == 1 and "could not load stored plan" in seen[0], seen


def test_store_setup_failure_is_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(device: int):
        raise RuntimeError("CUDA driver gone")

    monkeypatch.setattr(persist_mod, "_machine_facts", broken)
    monkeypatch.setattr(persist_mod, "_stores", {})
    monkeypatch.setattr(persist_mod, "_warned", set())
    with Recorder() as seen:
        assert cache_mod.store_for(0) is None and cache_mod.store_for(1) is None and cache_mod.store_for(0) is None
    assert len(seen) == 1 and "plan store is not available" in seen[0] and "CUDA driver gone" in seen[0]


def test_devices_of_one_model_share_one_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(tmp_path))
    monkeypatch.setattr(persist_mod, "_machine_facts", lambda device: dict(FACTS))
    monkeypatch.setattr(persist_mod, "_stores", {})
    s0, s1 = cache_mod.store_for(0), cache_mod.store_for(1)
    assert s0 is s1 and s0.root == tmp_path  # and so its once-per-cause warnings
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", "off")
    monkeypatch.setattr(persist_mod, "_stores", {})
    assert cache_mod.store_for(0) is None


# ----------------------------------------------------------------------------- one file for all devices
def test_build_or_load_stores_one_file_for_all_devices(plan_env) -> None:
    store, built = plan_env
    path = store.path_for(key(device=0).describe(device=False))
    with Recorder() as seen:
        for device in (0, 1, 2, 3):
            cache_mod.build_or_load_plan(key(device=device), _no_spec)
    assert [p.name for p in store.entries(all_fingerprints=True)] == [path.name]
    # devices 1-3 found device 0's file (and could not load it, here: rebuilt, said once)
    assert len(seen) == 1 and f"could not load stored plan {path}" in seen[0]
    assert store.load(key(device=5).describe(device=False)) is not None


# ----------------------------------------------------------------------------- operand uids come from the key
def _uid_cases():
    arb, m512, fp8 = FusedAttnBackend.F16_arbitrary_seqlen, FusedAttnBackend.F16_max512_seqlen, FusedAttnBackend.FP8
    yield arb, {}
    yield arb, {"attn_bias_type": "post_scale_bias"}
    yield arb, {"attn_bias_type": "post_scale_bias", "bias_shape": (1, 1, 1, 512)}  # no dBias (111s)
    yield arb, {"dropout": 0.1}
    yield arb, {"attn_mask_type": "padding_causal"}
    yield arb, {"qkv_layout": "thd_thd_thd", "attn_mask_type": "padding"}
    yield m512, {"attn_bias_type": "post_scale_bias", "max_seqlen_q": 256, "max_seqlen_kv": 256}
    yield fp8, {"dtype": __import__("torch").float8_e4m3fn, "head_dim_qk": 128, "head_dim_v": 128, "attn_mask_type": "padding"}


@pytest.mark.parametrize("backend,over", list(_uid_cases()))
@pytest.mark.parametrize("direction", [Direction.FWD, Direction.BWD])
def test_operand_uids_of_the_key_are_the_builders(backend: FusedAttnBackend, over: dict, direction: Direction) -> None:
    """The uids a loaded plan gets (from its key's normalised config) are those the builder
    gives the call's own config: one source of truth."""
    from te_cudnn.plans import make_key

    sub = BY_ENUM[backend]
    call = cfg(**over, deterministic=True)  # the forward's key drops determinism (and dO strides)
    if direction == Direction.BWD:
        call = call.for_backward(call.o_stride, deterministic=True)
    k = make_key(backend, direction, call, 91900, "1.32.0")
    assert sub.operand_uids(k.config, direction) == sub.build(call, direction).uids
