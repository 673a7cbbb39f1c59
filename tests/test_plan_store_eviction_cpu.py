"""Removing plans from the plan store (``te_cudnn.plans.store``): eviction by size (oldest
first, loads count as use; the store's own fingerprint first, another GPU's plans in use spared),
a plan's records going with it, eviction going on past a file it cannot remove, stale
temporaries of killed writers, and ``clear``; CPU only.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest

from te_cudnn.plans import store as store_mod
from te_cudnn.plans.store import PlanStore

from _plan_helpers import FACTS
from _plan_store_cpu import BLOB, desc


# ----------------------------------------------------------------------------- eviction
def _aged(store: PlanStore, n: int, start_age: float, **over_base: Any) -> list[Path]:
    """``n`` plans in ``store``, the first the oldest (ages start_age, start_age - 10, ...)."""
    paths = []
    now = time.time()
    for i in range(n):
        p = store.save(desc(max_seqlen_q=64 * (i + 1), **over_base), BLOB)
        os.utime(p, (now - start_age + 10 * i,) * 2)
        paths.append(p)
    return paths


def test_eviction_by_size_oldest_first_and_loads_touch(tmp_path: Path) -> None:
    store = PlanStore(tmp_path / "plans", FACTS, max_bytes=1 << 30)
    paths = _aged(store, 5, 1000)
    descs = [desc(max_seqlen_q=64 * (i + 1)) for i in range(5)]
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


def test_eviction_takes_own_fingerprint_first_and_spares_others_in_use(tmp_path: Path) -> None:
    week = store_mod.FOREIGN_GRACE_SECONDS
    mine = PlanStore(tmp_path, FACTS, max_bytes=1 << 30)
    a100 = PlanStore(tmp_path, {**FACTS, "gpu": "NVIDIA A100-SXM4-80GB", "sm": 80}, max_bytes=1 << 30)
    old_version = PlanStore(tmp_path, {**FACTS, "te_cudnn": "0.0.9"}, max_bytes=1 << 30)
    in_use = _aged(a100, 3, 5000)  # another GPU model's plans, used recently, and older than all of mine
    stale = _aged(old_version, 2, week + 5000)  # an old version's plans, unused for longer than the grace period
    own = _aged(mine, 3, 1000)
    size = own[0].stat().st_size
    mine.max_bytes = 5 * size + size // 2  # 8 files, room for 5

    new = mine.save(desc(max_seqlen_q=4096), BLOB)  # 9 files: 4 must go
    assert all(p.exists() for p in in_use), "another GPU's plans in use were evicted"
    assert new.exists(), "the plan just written was evicted"
    assert [p.exists() for p in own] == [False, False, False]  # all of mine first, oldest first ...
    assert [p.exists() for p in stale] == [False, True]  # ... then the oldest stale foreign file
    assert mine.total_bytes() <= mine.max_bytes

    mine.max_bytes = size  # a tiny bound: still no plan in use by another GPU is deleted
    mine.save(desc(max_seqlen_q=8192), BLOB)
    assert all(p.exists() for p in in_use) and not stale[1].exists()
    assert [p.name for p in mine.entries()] == [mine.path_for(desc(max_seqlen_q=8192)).name]


def test_a_plans_records_go_with_it_and_are_kept_with_the_plan_just_written(tmp_path: Path) -> None:
    store = PlanStore(tmp_path, FACTS, max_bytes=1 << 30)
    paths = _aged(store, 4, 1000)
    descs = [desc(max_seqlen_q=64 * (i + 1)) for i in range(4)]
    now = time.time()
    records = []
    for i, d in enumerate(descs):
        r = store.save_record(d, "padded_rows", "eng0", {"ok": True, "i": i})
        os.utime(r, (now - 1000 + 10 * i,) * 2)
        records.append(r)
    orphan = store.save_record(desc(max_seqlen_q=4096), "padded_rows", "eng0", {"ok": True})  # no plan beside it
    os.utime(orphan, (now - 5000,) * 2)
    size = paths[0].stat().st_size
    store.max_bytes = 2 * size + 3 * records[0].stat().st_size  # two plans and their records fit
    removed = store.evict(keep=paths[0])
    assert paths[0].exists() and records[0].exists(), "the plan just written keeps its records"
    assert orphan in removed and not orphan.exists()
    assert [p.exists() for p in paths[1:]] == [False, False, True]
    assert [r.exists() for r in records[1:]] == [False, False, True]
    assert set(removed) == {orphan, paths[1], records[1], paths[2], records[2]}


def test_clear_removes_records_too(tmp_path: Path) -> None:
    a = PlanStore(tmp_path, FACTS)
    b = PlanStore(tmp_path, {**FACTS, "cudnn": 91800})
    a.save(desc(), BLOB)
    ra = a.save_record(desc(), "padded_rows", "eng0", {"ok": True})
    rb = b.save_record(desc(), "padded_rows", "eng0", {"ok": True})
    assert b.clear(all_fingerprints=False) == 0 and not rb.exists() and ra.exists()
    assert a.clear() == 1 and not ra.exists() and a.load_records(desc(), "padded_rows") == {}


def test_eviction_goes_on_past_a_file_it_cannot_remove(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = PlanStore(tmp_path, FACTS, max_bytes=1 << 30)
    paths = _aged(store, 5, 1000)
    size = paths[0].stat().st_size
    store.max_bytes = 2 * size + size // 2  # room for two
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if Path(path) == paths[0]:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    removed = store.evict()
    assert removed == paths[1:4]  # the oldest could not be removed: the next three went instead
    assert [p.exists() for p in paths] == [True, False, False, False, True]
    assert store.total_bytes() <= store.max_bytes


def test_stale_temporaries_of_killed_writers_are_removed(tmp_path: Path) -> None:
    store = PlanStore(tmp_path, FACTS)
    other = PlanStore(tmp_path, {**FACTS, "cudnn": 91800})
    store.save(desc(), BLOB)
    other.save(desc(), BLOB)
    old = time.time() - store_mod.STALE_TMP_SECONDS - 60
    stale = [store.dir / ".tmp-killed1.plan", other.dir / ".tmp-killed2.plan", store.dir / ".tmp-4242-x.plan"]
    fresh = store.dir / ".tmp-inflight.plan"  # a writer that is still running
    for p in stale + [fresh]:
        p.write_bytes(b"partial")
    for p in stale:
        os.utime(p, (old, old))
    store.save(desc(max_seqlen_q=1024), BLOB)  # well within the bound: temporaries go anyway
    assert [p.exists() for p in stale] == [False, False, False] and fresh.exists()
    assert len(list(store.entries(all_fingerprints=True))) == 3


# ----------------------------------------------------------------------------- clear
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
