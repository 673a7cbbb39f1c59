"""The on-disk plan store (``te_cudnn.plans.store``) and ``PlanCache.dump``; CPU only.

The store is byte-level: it never interprets the serialized plan, so these tests store
synthetic byte strings as "plans". Nothing here needs cuDNN or a GPU.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import struct
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from te_cudnn.backends import Direction
from te_cudnn.plans import CompiledPlan, PlanCache, PlanKey
from te_cudnn.plans import store as store_mod
from te_cudnn.plans.store import MAGIC, SUFFIX, PlanStore, StoredPlan, default_store, fingerprint_of

from _plan_helpers import FACTS, sizes_config, sizes_key

BLOB = bytes(range(256)) * 8  # a synthetic "serialized plan": the store only sees bytes
cfg = sizes_config


def key(direction: Direction = Direction.FWD, **over: Any) -> PlanKey:
    return sizes_key(direction, **over)


def desc(**over: Any) -> dict[str, Any]:
    """A realistic key description, as it reads back from a file's JSON header."""
    return json.loads(json.dumps(key(**over).describe()))


def parse(path: Path) -> tuple[dict[str, Any], bytes]:
    """Parse a plan file by hand, independently of PlanStore.read."""
    data = path.read_bytes()
    assert data[: len(MAGIC)] == MAGIC == b"TECUDNN-PLAN\x01"
    (n,) = struct.unpack("<I", data[len(MAGIC) : len(MAGIC) + 4])
    header = json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + n])
    return header, data[len(MAGIC) + 4 + n :]


@pytest.fixture
def store(tmp_path: Path) -> PlanStore:
    return PlanStore(tmp_path / "plans", FACTS)


# ----------------------------------------------------------------------------- layout and round trip
def test_layout_header_and_round_trip(store: PlanStore) -> None:
    d = desc()
    before = time.time()
    path = store.save(d, BLOB, {"uids": [1, 2, 3], "plan_name": "eng4_k2", "build_ms": 12.5})
    assert path == store.root / store.fingerprint / path.name
    assert re.fullmatch(r"[0-9a-f]{32}\.plan", path.name)
    assert path.name == PlanStore.entry_name(d) + SUFFIX and path == store.path_for(d)
    assert re.fullmatch(r"[0-9a-f]{20}", store.fingerprint) and store.fingerprint == fingerprint_of(FACTS)
    assert list(store.entries()) == [path] and list(store.entries(all_fingerprints=True)) == [path]

    header, blob = parse(path)
    assert blob == BLOB
    assert header["key"] == d
    assert header["facts"] == FACTS
    assert header["fingerprint"] == store.fingerprint
    assert header["sha256"] == hashlib.sha256(BLOB).hexdigest()
    assert header["size"] == len(BLOB)
    assert before - 1 <= header["created"] <= time.time() + 1
    assert header["uids"] == [1, 2, 3] and header["plan_name"] == "eng4_k2" and header["build_ms"] == 12.5

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good entry loads silently
        entry = store.load(d)
    assert isinstance(entry, StoredPlan)
    assert entry.blob == BLOB and entry.path == path and entry.header == header
    assert PlanStore.read(path).blob == BLOB
    assert store.total_bytes() == path.stat().st_size


def test_missing_entry_is_none_without_warning(store: PlanStore) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.load(desc()) is None  # store directory does not even exist
        store.save(desc(), b"x")
        assert store.load(desc(max_seqlen_q=1024)) is None
    assert list(store.entries(all_fingerprints=True)) == [store.path_for(desc())]


def test_overwrite_and_empty_blob(store: PlanStore) -> None:
    d = desc()
    store.save(d, b"first")
    store.save(d, b"")  # an empty plan is still a whole file
    assert store.load(d).blob == b""
    store.save(d, b"second")
    assert store.load(d).blob == b"second"
    assert len(list(store.entries())) == 1


def test_entry_name_stable_regardless_of_key_order() -> None:
    d = desc()
    reordered = dict(reversed(list(d.items())))
    assert list(reordered) != list(d)
    assert PlanStore.entry_name(d) == PlanStore.entry_name(reordered) == PlanStore.entry_name(json.loads(json.dumps(d)))
    assert re.fullmatch(r"[0-9a-f]{32}", PlanStore.entry_name(d))
    assert PlanStore.entry_name(d) != PlanStore.entry_name(desc(max_seqlen_q=1024))
    assert PlanStore.entry_name(d) != PlanStore.entry_name(desc(direction=Direction.BWD))
    assert fingerprint_of(FACTS) == fingerprint_of(dict(reversed(list(FACTS.items()))))
    assert fingerprint_of(FACTS) != fingerprint_of({**FACTS, "cudnn": 91800})


def test_load_with_raw_describe_output(store: PlanStore) -> None:
    # Regression: describe() holds tuples (grad_strides is a list of tuples) that read back from
    # the JSON header as lists; the key comparison in load() must not reject every real key.
    d = key().describe()  # exactly what build_or_load_plan passes
    assert any(isinstance(v, list) and v and isinstance(v[0], tuple) for v in d.values())
    store.save(d, BLOB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        entry = store.load(d)
    assert entry is not None and entry.blob == BLOB
    assert store.path_for(d) == store.path_for(json.loads(json.dumps(d)))


# ----------------------------------------------------------------------------- fingerprint / key mismatch
def test_other_facts_do_not_see_the_entry(store: PlanStore) -> None:
    d = desc()
    store.save(d, BLOB)
    other = PlanStore(store.root, {**FACTS, "cudnn": 91800})
    assert other.fingerprint != store.fingerprint and other.dir != store.dir
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert other.load(d) is None
    assert store.load(d).blob == BLOB
    assert list(other.entries()) == [] and len(list(other.entries(all_fingerprints=True))) == 1


def test_file_in_wrong_fingerprint_dir_is_skipped(store: PlanStore) -> None:
    d = desc()
    src = store.save(d, BLOB)
    other = PlanStore(store.root, {**FACTS, "gpu": "NVIDIA A100-SXM4-80GB", "sm": 80})
    dst = other.path_for(d)
    dst.parent.mkdir(parents=True)
    dst.write_bytes(src.read_bytes())
    with pytest.warns(UserWarning, match="another key or machine"):
        assert other.load(d) is None
    assert dst.exists()  # skipped, not deleted: it is rebuilt and overwritten by the next save
    other.save(d, b"rebuilt")
    assert other.load(d).blob == b"rebuilt" and store.load(d).blob == BLOB


def test_file_with_other_key_is_skipped(store: PlanStore) -> None:
    d1, d2 = desc(), desc(max_seqlen_q=1024)
    src = store.save(d1, BLOB)
    dst = store.path_for(d2)
    dst.write_bytes(src.read_bytes())  # e.g. a hand-copied file under the wrong name
    with pytest.warns(UserWarning, match="another key or machine"):
        assert store.load(d2) is None
    assert store.load(d1).blob == BLOB


# ----------------------------------------------------------------------------- corruption
def _corruptions(good: bytes) -> dict[str, tuple[bytes, str]]:
    head_len = struct.unpack("<I", good[len(MAGIC) : len(MAGIC) + 4])[0]
    body = len(MAGIC) + 4 + head_len
    flipped = bytearray(good)
    flipped[body + 100] ^= 0x01
    out = {
        "flipped_blob_byte": (bytes(flipped), "corrupted"),
        "empty": (b"", "bad magic"),
        "garbage": (os.urandom(64), "bad magic"),
        "garbage_long": (b"\x89PNG\r\n" + os.urandom(4000), "bad magic"),
        "wrong_magic_version": (b"TECUDNN-PLAN\x02" + good[len(MAGIC) :], "bad magic"),
        "huge_header_length": (MAGIC + struct.pack("<I", 1 << 30) + good[len(MAGIC) + 4 :], "unreadable header"),
        "header_not_utf8": (MAGIC + struct.pack("<I", 4) + b"\xff\xfe\xfd\xfc" + BLOB, "unreadable header"),
    }
    cuts = {
        "in_magic_1": (1, "bad magic"), "in_magic_7": (7, "bad magic"), "after_magic": (len(MAGIC), "truncated header"),
        "in_length": (len(MAGIC) + 2, "truncated header"), "after_length": (len(MAGIC) + 4, "unreadable header"),
        "in_header": (len(MAGIC) + 4 + head_len // 2, "unreadable header"), "after_header": (body, "corrupted"),
        "in_blob": (body + len(BLOB) // 2, "corrupted"), "last_byte": (len(good) - 1, "corrupted"),
    }  # fmt: skip
    out.update({f"truncated_{k}": (good[:n], msg) for k, (n, msg) in cuts.items()})
    out["extra_bytes"] = (good + b"\x00", "corrupted")
    return out


CORRUPTIONS = [
    "flipped_blob_byte", "empty", "garbage", "garbage_long", "wrong_magic_version", "huge_header_length",
    "header_not_utf8", "truncated_in_magic_1", "truncated_in_magic_7", "truncated_after_magic", "truncated_in_length",
    "truncated_after_length", "truncated_in_header", "truncated_after_header", "truncated_in_blob", "truncated_last_byte",
    "extra_bytes",
]  # fmt: skip


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corrupt_file_is_skipped_with_warning(store: PlanStore, kind: str) -> None:
    d = desc()
    path = store.save(d, BLOB)
    cases = _corruptions(path.read_bytes())
    assert set(cases) == set(CORRUPTIONS)
    data, message = cases[kind]
    path.write_bytes(data)
    with pytest.warns(UserWarning, match="skipping plan file .*rebuilt"):
        assert store.load(d) is None  # never raises
    with pytest.raises(ValueError, match=message):
        PlanStore.read(path)
    store.save(d, BLOB)  # the rebuilt plan replaces the bad file
    assert store.load(d).blob == BLOB


def test_non_object_header_is_skipped(store: PlanStore) -> None:
    d = desc()
    path = store.save(d, BLOB)
    path.write_bytes(MAGIC + struct.pack("<I", 2) + b"[]" + BLOB)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert store.load(d) is None
    assert any("skipping plan file" in str(w.message) for w in seen)


def test_read_error_messages_are_clear(tmp_path: Path) -> None:
    p = tmp_path / "x.plan"
    p.write_bytes(b"hello world")
    with pytest.raises(ValueError, match=r"^not a te_cudnn plan file \(bad magic\)$"):
        PlanStore.read(p)
    p.write_bytes(MAGIC + b"\x01")
    with pytest.raises(ValueError, match="^truncated header$"):
        PlanStore.read(p)
    p.write_bytes(MAGIC + struct.pack("<I", 3) + b"{x}")
    with pytest.raises(ValueError, match="^unreadable header: "):
        PlanStore.read(p)
    head = json.dumps({"size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}).encode()
    p.write_bytes(MAGIC + struct.pack("<I", len(head)) + head + b"abd")
    with pytest.raises(ValueError, match=r"size/checksum mismatch"):
        PlanStore.read(p)
    p.write_bytes(MAGIC + struct.pack("<I", len(head)) + head + b"abc")
    assert PlanStore.read(p).blob == b"abc"


# ----------------------------------------------------------------------------- concurrent writers
# The children run only the store module (stdlib only), loaded from its file by path: importing
# the te_cudnn package would import torch in each of the 16 spawned children (seconds each).
# ``exec`` is the target so that unpickling it in the child imports nothing from this module.
_WRITER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_plan_store_standalone", store_file)
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
s = mod.PlanStore(root, facts)
barrier.wait(timeout=60)
for _ in range(rounds):
    s.save(key, blob, {"writer": writer})
"""


def test_concurrent_writers(tmp_path: Path) -> None:
    root = tmp_path / "plans"
    ctx = multiprocessing.get_context("spawn")
    n_same, n_diff, rounds = 8, 8, 3
    barrier = ctx.Barrier(n_same + n_diff)
    shared_key, shared_blob = desc(), os.urandom(1 << 16)
    jobs = [(shared_key, shared_blob, "same") for _ in range(n_same)]
    jobs += [(desc(max_seqlen_q=1024 + 64 * i), os.urandom(1 << 15) + bytes([i]), f"diff{i}") for i in range(n_diff)]
    procs = []
    for k, blob, writer in jobs:
        env = {"store_file": store_mod.__file__, "root": str(root), "facts": FACTS, "barrier": barrier, "rounds": rounds,
               "key": k, "blob": blob, "writer": writer}  # fmt: skip
        procs.append(ctx.Process(target=exec, args=(_WRITER, env)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * len(procs)

    store = PlanStore(root, FACTS)
    assert not [p for p in root.rglob("*") if p.name.startswith(".tmp-")], "temporary files left behind"
    assert len(list(store.entries())) == 1 + n_diff
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = store.load(shared_key)
        assert same is not None and same.blob == shared_blob and same.header["writer"] == "same"
        assert PlanStore.read(store.path_for(shared_key)).blob == shared_blob
        for k, blob, writer in jobs[n_same:]:
            entry = store.load(k)
            assert entry is not None and entry.blob == blob and entry.header["writer"] == writer


# ----------------------------------------------------------------------------- eviction
def test_eviction_by_size_oldest_first_and_loads_touch(tmp_path: Path) -> None:
    store = PlanStore(tmp_path / "plans", FACTS, max_bytes=1 << 30)
    descs = [desc(max_seqlen_q=64 * (i + 1)) for i in range(5)]
    paths = [store.save(d, BLOB) for d in descs]
    t0 = time.time() - 1000
    for i, p in enumerate(paths):
        os.utime(p, (t0 + 10 * i, t0 + 10 * i))
    sizes = [p.stat().st_size for p in paths]
    store.max_bytes = 3 * max(sizes) + min(sizes) // 2  # room for three entries, not four

    removed = store.evict()
    assert removed == paths[:2]  # the two oldest, oldest first
    assert [p.exists() for p in paths] == [False, False, True, True, True]
    assert store.total_bytes() <= store.max_bytes
    assert store.evict() == []  # already within the bound

    assert store.load(descs[2]).blob == BLOB  # touches entry 2: now the most recently used
    assert paths[2].stat().st_mtime > paths[4].stat().st_mtime
    new = store.save(desc(max_seqlen_q=2048), BLOB)  # save evicts: entry 3 is now the oldest
    assert [p.exists() for p in paths] == [False, False, True, False, True] and new.exists()
    assert store.total_bytes() <= store.max_bytes
    assert store.load(descs[3]) is None


def test_eviction_covers_all_fingerprints(tmp_path: Path) -> None:
    a = PlanStore(tmp_path, FACTS, max_bytes=1 << 30)
    b = PlanStore(tmp_path, {**FACTS, "cudnn": 91800}, max_bytes=1 << 30)
    old = b.save(desc(), BLOB)
    os.utime(old, (time.time() - 1000,) * 2)
    a.save(desc(), BLOB)
    a.max_bytes = old.stat().st_size + len(BLOB) // 2
    assert a.evict() == [old]
    assert a.load(desc()).blob == BLOB


# ----------------------------------------------------------------------------- clear / default_store
def test_clear(tmp_path: Path) -> None:
    a = PlanStore(tmp_path, FACTS)
    b = PlanStore(tmp_path, {**FACTS, "cudnn": 91800})
    for i in range(3):
        a.save(desc(max_seqlen_q=64 * (i + 1)), BLOB)
    b.save(desc(), BLOB)
    (a.dir / ".tmp-123.plan").write_bytes(b"in flight")  # another writer's temporary: not an entry
    assert len(list(a.entries(all_fingerprints=True))) == 4
    assert b.clear(all_fingerprints=False) == 1 and len(list(a.entries())) == 3
    b.save(desc(), BLOB)
    assert a.clear() == 4
    assert list(a.entries(all_fingerprints=True)) == [] and a.total_bytes() == 0
    assert a.clear() == 0
    assert PlanStore(tmp_path / "never-created", FACTS).clear() == 0


@pytest.mark.parametrize("value", ["off", "OFF", "0", "none", "false"])
def test_default_store_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", value)
    assert default_store(FACTS) is None


def test_default_store_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(tmp_path / "custom"))
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE_MAX_MB", "3")
    s = default_store(FACTS)
    assert s is not None and s.root == tmp_path / "custom" and s.facts == FACTS
    assert s.dir == tmp_path / "custom" / fingerprint_of(FACTS) and s.max_bytes == 3 << 20
    s.save(desc(), BLOB)
    assert default_store(FACTS).load(desc()).blob == BLOB


def test_default_store_xdg_and_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TE_CUDNN_PLAN_STORE", raising=False)
    monkeypatch.delenv("TE_CUDNN_PLAN_STORE_MAX_MB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    s = default_store(FACTS)
    assert s.root == tmp_path / "xdg" / "te_cudnn" / "plans" and s.max_bytes == 512 << 20
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store(FACTS).root == tmp_path / "home" / ".cache" / "te_cudnn" / "plans"


# ----------------------------------------------------------------------------- PlanCache.dump
def test_plan_cache_dump(tmp_path: Path) -> None:
    def builder(k: PlanKey, make_spec) -> CompiledPlan:
        plan = CompiledPlan(k, graph=object(), uids=(), workspace_size=0, plan_name="test", build_seconds=0.001)
        if k.config.sq == 1024:
            plan.source = "store"  # as if deserialized from the plan store
        return plan

    cache = PlanCache(maxsize=8, builder=builder)
    k1, k2, k3 = key(), key(Direction.BWD), key(max_seqlen_q=1024)
    for k in (k1, k2, k1, k3, k1):
        cache.get_or_build(k, lambda: None)
    out = tmp_path / "dump.json"
    cache.dump(str(out))
    assert not list(tmp_path.glob("*.tmp-*"))
    data = json.loads(out.read_text())
    assert data["pid"] == os.getpid() and isinstance(data["time"], float)
    s = data["stats"]
    assert s["loads"] == 1 and s["builds"] == 2 and s["hits"] == 2 and s["misses"] == 3 and s["entries"] == 3
    assert s == cache.stats().as_dict()
    plans = data["plans"]
    assert [p["key"]["direction"] for p in plans] == ["bwd", "fwd", "fwd"]  # least recently used first
    assert [p["key"]["sq"] for p in plans] == [512, 1024, 512]
    assert [p["source"] for p in plans] == ["built", "store", "built"]
    assert [p["hits"] for p in plans] == [0, 0, 2]
    assert all(p["plan_name"] == "test" and p["workspace_bytes"] == 0 and p["build_ms"] == 1.0 for p in plans)
    assert plans[2]["key"]["backend"] == "F16_arbitrary_seqlen" and plans[2]["key"]["layout"] == "bshd_bshd_bshd"
