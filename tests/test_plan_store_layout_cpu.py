"""The plan store's files (``te_cudnn.plans.store``): layout, header and round trip, entry names,
the store key without the GPU ordinal, and the fingerprint and key checks that keep another
machine's or another key's file from being used; CPU only.

The store is byte-level: it never interprets the serialized plan, so these tests store
synthetic byte strings as "plans".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from te_cudnn.backends import Direction
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans import persist as persist_mod
from te_cudnn.plans.store import MAGIC, PLAN_FORMAT_VERSION, SUFFIX, PlanStore, StoredPlan, fingerprint_of

from _plan_helpers import FACTS
from _plan_store_cpu import BLOB, desc, key, store  # noqa: F401 - store: the fixture


def parse(path: Path) -> tuple[dict[str, Any], bytes]:
    """Parse a plan file by hand, independently of PlanStore.read."""
    data = path.read_bytes()
    assert data[: len(MAGIC)] == MAGIC == b"TECUDNN-PLAN\x01"
    (n,) = struct.unpack("<I", data[len(MAGIC) : len(MAGIC) + 4])
    header = json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + n])
    return header, data[len(MAGIC) + 4 + n :]


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
    assert header["facts"] == FACTS and header["facts"]["plan_format"] == PLAN_FORMAT_VERSION
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
    d = key().describe(device=False)  # exactly what build_or_load_plan passes
    assert any(isinstance(v, list) and v and isinstance(v[0], tuple) for v in d.values())
    store.save(d, BLOB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        entry = store.load(d)
    assert entry is not None and entry.blob == BLOB
    assert store.path_for(d) == store.path_for(json.loads(json.dumps(d)))


# ----------------------------------------------------------------------------- store key: no GPU ordinal
def test_store_key_leaves_out_the_gpu_ordinal(store: PlanStore) -> None:
    k0, k3 = key(device=0), key(device=3)
    assert k0 != k3 and k0.config.device == 0 and k3.config.device == 3  # in memory: one plan per device
    assert k0.describe()["device"] == 0 and k3.describe()["device"] == 3  # tools and logs see the device
    d0, d3 = k0.describe(device=False), k3.describe(device=False)
    assert "device" not in d0 and d0 == d3
    assert store.path_for(d0) == store.path_for(d3)  # eight ranks of a node share one file per plan
    assert store.path_for(d0) != store.path_for(key(device=0, max_seqlen_q=1024).describe(device=False))
    store.save(d0, BLOB)
    assert store.load(d3).blob == BLOB


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


def test_plan_format_version_is_in_the_fingerprint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    facts = cache_mod._machine_facts(-1)  # what a process fingerprints its store with (no GPU: sm and count None)
    assert facts["plan_format"] == PLAN_FORMAT_VERSION and isinstance(PLAN_FORMAT_VERSION, int)
    assert {"gpu", "sm", "sm_count", "cudnn", "frontend", "te_cudnn"} <= set(facts)
    monkeypatch.setattr(persist_mod, "PLAN_FORMAT_VERSION", PLAN_FORMAT_VERSION + 1)
    bumped = cache_mod._machine_facts(-1)
    assert bumped == {**facts, "plan_format": PLAN_FORMAT_VERSION + 1}
    old, new = PlanStore(tmp_path, facts), PlanStore(tmp_path, bumped)
    old.save(desc(), BLOB)
    assert new.dir != old.dir and new.load(desc()) is None  # a builder change retires every stored plan


def test_file_in_wrong_fingerprint_dir_is_skipped(store: PlanStore) -> None:
    d = desc()
    src = store.save(d, BLOB)
    other = PlanStore(store.root, {**FACTS, "gpu": "NVIDIA A100-SXM4-80GB", "sm": 80})
    other.save(desc(max_seqlen_q=1024), BLOB)  # creates other.dir, private
    dst = other.path_for(d)
    dst.write_bytes(src.read_bytes())
    os.chmod(dst, 0o600)
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
