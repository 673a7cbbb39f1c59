"""Writing to the plan store (``te_cudnn.plans.store``): a full disk, an exceeded quota or a
read-only directory leaves no partial or temporary file behind, and concurrent writers and
readers in separate processes only ever see whole files of one writer; CPU only.

Faults the file system would produce are injected at the system calls the store makes.
"""

from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
import warnings
from pathlib import Path

import pytest

from te_cudnn.plans import store as store_mod
from te_cudnn.plans.store import PlanStore

from _plan_helpers import FACTS
from _plan_store_cpu import BLOB, IS_ROOT, desc, mode, store, temporaries  # noqa: F401 - the fixture
from _plan_store_cpu import failing as _failing


# ----------------------------------------------------------------------------- write faults
@pytest.mark.parametrize("where", ["write", "fsync"])
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
def test_disk_full_leaves_no_file_behind(monkeypatch: pytest.MonkeyPatch, store: PlanStore, where: str, err: int) -> None:
    d, other = desc(), desc(max_seqlen_q=1024)
    store.save(other, BLOB)
    with monkeypatch.context() as m:
        m.setattr(os, where, _failing(os.write, err, after=len(BLOB) // 3))
        with pytest.raises(OSError) as info:
            store.save(d, BLOB)
    assert info.value.errno == err
    assert not store.path_for(d).exists() and not temporaries(store.root), "a partial or temporary file was left"
    assert [p.name for p in store.entries()] == [store.path_for(other).name] and store.load(other).blob == BLOB


def test_read_only_store_directory(monkeypatch: pytest.MonkeyPatch, store: PlanStore) -> None:
    store.save(desc(), BLOB)
    os.chmod(store.dir, 0o500)
    try:
        if IS_ROOT:  # root writes anyway: make the system call fail as on a read-only directory or file system
            def read_only(*args, **kwargs):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(store.dir))

            monkeypatch.setattr(store_mod.tempfile, "mkstemp", read_only)
        with pytest.raises(PermissionError):
            store.save(desc(max_seqlen_q=1024), BLOB)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert store.load(desc()).blob == BLOB  # reading a read-only store works, silently
    finally:
        os.chmod(store.dir, 0o700)
    assert [p.name for p in store.entries()] == [store.path_for(desc()).name] and not temporaries(store.root)


# ----------------------------------------------------------------------------- concurrent writers and readers
# The children run only the store's modules (stdlib only), loaded from their directory as a
# package of their own: importing the te_cudnn package would import torch in each spawned child
# (seconds each). ``exec`` is the target so that unpickling it in the child imports nothing from
# this module.
_CHILD = """
import hashlib, importlib, os, sys, types, warnings
pkg = types.ModuleType("_plan_store_standalone")
pkg.__path__ = [os.path.dirname(store_file)]  # store.py and the sibling modules it imports
sys.modules[pkg.__name__] = pkg
mod = importlib.import_module(pkg.__name__ + "." + os.path.splitext(os.path.basename(store_file))[0])
s = mod.PlanStore(root, facts)
barrier.wait(timeout=60)
if role == "writer":
    for r in range(rounds):
        for i, (k, blob) in enumerate(zip(keys, blobs)):
            s.save(k, blob, {"writer": writer, "k": i})
else:
    ok, bad = 0, []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        while not stop.is_set():
            for i, k in enumerate(keys):
                e = s.load(k)
                if e is None:
                    continue
                if e.header["k"] != i or hashlib.sha256(e.blob).hexdigest() != expected[(e.header["writer"], i)]:
                    bad.append((e.header["writer"], i))
                ok += 1
    result.put((ok, bad, [str(w.message) for w in seen]))
"""


def test_concurrent_writers_of_different_payloads_leave_whole_files(tmp_path: Path) -> None:
    root = tmp_path / "plans"
    ctx = multiprocessing.get_context("spawn")
    n_writers, n_readers, rounds = 6, 2, 4
    keys = [desc(max_seqlen_q=64 * (i + 1)) for i in range(3)]
    # every writer has its own, differently sized payload per key: a mixed or partial file cannot pass
    blobs = {w: [os.urandom((96 + 61 * w + 17 * i) << 10) for i in range(len(keys))] for w in range(n_writers)}
    expected = {(w, i): hashlib.sha256(b).hexdigest() for w, bl in blobs.items() for i, b in enumerate(bl)}
    barrier, stop, result = ctx.Barrier(n_writers + n_readers), ctx.Event(), ctx.Queue()
    common = {"store_file": store_mod.__file__, "root": str(root), "facts": FACTS, "barrier": barrier, "keys": keys,
              "rounds": rounds, "stop": stop, "result": result, "expected": expected}  # fmt: skip
    writers = [ctx.Process(target=exec, args=(_CHILD, {**common, "role": "writer", "writer": w, "blobs": blobs[w]}))
               for w in range(n_writers)]  # fmt: skip
    readers = [ctx.Process(target=exec, args=(_CHILD, {**common, "role": "reader"})) for _ in range(n_readers)]
    for p in writers + readers:
        p.start()
    for p in writers:
        p.join(120)
    stop.set()
    summaries = [result.get(timeout=60) for _ in readers]
    for p in readers:
        p.join(60)
    assert [p.exitcode for p in writers + readers] == [0] * (n_writers + n_readers)

    assert [(bad, seen) for _, bad, seen in summaries] == [([], [])] * n_readers, "a reader saw a partial or mixed file"
    loads = sum(ok for ok, _, _ in summaries)
    assert loads > 0, "the readers never saw a file: the race was not exercised"
    print(f"concurrent store: {n_writers} writers x {rounds} rounds x {len(keys)} plans, {loads} loads by {n_readers} readers")
    assert not temporaries(root), "temporary files left behind"
    store = PlanStore(root, FACTS)
    assert sorted(p.name for p in store.entries()) == sorted(store.path_for(k).name for k in keys)
    for i, k in enumerate(keys):
        entry = PlanStore.read(store.path_for(k))  # whole and intact ...
        w = entry.header["writer"]
        assert entry.header["k"] == i and entry.blob == blobs[w][i], "the file mixes two writers"  # ... and one writer's
        assert mode(store.path_for(k)) == 0o600
