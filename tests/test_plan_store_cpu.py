"""The on-disk plan store (``te_cudnn.plans.store``), its use by the plan cache
(``build_or_load_plan``) and ``PlanCache.dump``; CPU only.

The store is byte-level: it never interprets the serialized plan, so these tests store
synthetic byte strings as "plans". Faults the file system would produce (disk full, quota,
read-only) are injected at the system calls the store makes; ownership is changed for real
when the tests run as root and simulated (another effective uid) otherwise.
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import re
import stat
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from te_cudnn.backends import BY_ENUM, Direction
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.plans import CompiledPlan, PlanCache, PlanKey
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans import handles as handles_mod
from te_cudnn.plans import persist as persist_mod
from te_cudnn.plans import store as store_mod
from te_cudnn.plans import store_files as store_files_mod
from te_cudnn.plans.store import (
    MAGIC, PLAN_FORMAT_VERSION, SUFFIX, PlanFileError, PlanStore, StoredPlan, UntrustedStoreError, default_store,
    env_number, fingerprint_of,
)  # fmt: skip

from _plan_helpers import FACTS, sizes_config, sizes_key

BLOB = bytes(range(256)) * 8  # a synthetic "serialized plan": the store only sees bytes
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
cfg = sizes_config


def key(direction: Direction = Direction.FWD, **over: Any) -> PlanKey:
    return sizes_key(direction, **over)


def desc(**over: Any) -> dict[str, Any]:
    """A realistic store key, as it reads back from a file's JSON header."""
    return json.loads(json.dumps(key(**over).describe(device=False)))


def parse(path: Path) -> tuple[dict[str, Any], bytes]:
    """Parse a plan file by hand, independently of PlanStore.read."""
    data = path.read_bytes()
    assert data[: len(MAGIC)] == MAGIC == b"TECUDNN-PLAN\x01"
    (n,) = struct.unpack("<I", data[len(MAGIC) : len(MAGIC) + 4])
    header = json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + n])
    return header, data[len(MAGIC) + 4 + n :]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".tmp-")]


class Recorder:
    """Warnings raised inside ``with`` (all of them: no once-per-location filtering)."""

    def __enter__(self) -> list[str]:
        self._cm = warnings.catch_warnings(record=True)
        self._seen = self._cm.__enter__()
        warnings.simplefilter("always")
        self.messages: list[str] = []
        return self.messages

    def __exit__(self, *exc: Any) -> None:
        self.messages.extend(str(w.message) for w in self._seen)
        self._cm.__exit__(*exc)


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
        "header_nested_deeply": (MAGIC + struct.pack("<I", 200_000) + b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
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
    "header_not_utf8", "header_nested_deeply", "truncated_in_magic_1", "truncated_in_magic_7", "truncated_after_magic",
    "truncated_in_length", "truncated_after_length", "truncated_in_header", "truncated_after_header",
    "truncated_in_blob", "truncated_last_byte", "extra_bytes",
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
    with pytest.raises(PlanFileError, match=message):
        PlanStore.read(path)
    store.save(d, BLOB)  # the rebuilt plan replaces the bad file
    assert store.load(d).blob == BLOB


def test_non_object_header_is_skipped(store: PlanStore) -> None:
    d = desc()
    path = store.save(d, BLOB)
    path.write_bytes(MAGIC + struct.pack("<I", 2) + b"[]" + BLOB)
    with Recorder() as seen:
        assert store.load(d) is None
    assert len(seen) == 1 and "skipping plan file" in seen[0] and "not an object" in seen[0]


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


def test_one_warning_per_cause_not_per_call(store: PlanStore) -> None:
    descs = [desc(max_seqlen_q=64 * (i + 1)) for i in range(6)]
    paths = [store.save(d, BLOB) for d in descs]
    for p in paths[:3]:  # truncated in the plan bytes (the same cause as a flipped bit)
        p.write_bytes(p.read_bytes()[:-10])
    flipped = bytearray(paths[3].read_bytes())
    flipped[-5] ^= 0x40
    paths[3].write_bytes(bytes(flipped))
    paths[4].write_bytes(b"")  # zero length
    with Recorder() as seen:
        for _ in range(5):
            assert [store.load(d) for d in descs[:5]] == [None] * 5
    assert len(seen) == 2, seen
    assert "size/checksum mismatch" in seen[0] and str(paths[0]) in seen[0] and "without another warning" in seen[0]
    assert "bad magic" in seen[1] and str(paths[4]) in seen[1]
    assert store.load(descs[5]).blob == BLOB  # good files are unaffected
    # another store object (another process) reports again
    with Recorder() as seen:
        assert PlanStore(store.root, FACTS).load(descs[0]) is None
    assert len(seen) == 1


# ----------------------------------------------------------------------------- trust: modes, owners, links, sizes
@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077, 0o277])
def test_store_is_created_owner_only_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    s = PlanStore(tmp_path / "plans", FACTS)
    old = os.umask(umask)
    try:
        path = s.save(desc(), BLOB)
    finally:
        os.umask(old)
    assert (mode(s.root), mode(s.dir), mode(path)) == (0o700, 0o700, 0o600)
    assert s.load(desc()).blob == BLOB


@pytest.mark.parametrize("which", ["root", "fingerprint"])
@pytest.mark.parametrize("perm", [0o770, 0o707, 0o777, 0o720])
def test_directory_writable_by_others_is_not_used(store: PlanStore, which: str, perm: int) -> None:
    d = desc()
    store.save(d, BLOB)
    target = store.root if which == "root" else store.dir
    os.chmod(target, perm)
    with Recorder() as seen:
        assert store.load(d) is None
        assert store.load(d) is None
        with pytest.raises(UntrustedStoreError, match=re.escape(f"chmod 700 {target}")):
            store.save(desc(max_seqlen_q=1024), BLOB)
    assert len(seen) == 1, seen  # one warning, not one per call
    assert f"not using the plan store {store.root}" in seen[0] and "writable by" in seen[0]
    assert f"chmod 700 {target}" in seen[0] and f"{perm:04o}" in seen[0]
    assert not store.path_for(desc(max_seqlen_q=1024)).exists() and not temporaries(store.root)
    os.chmod(target, 0o700)  # the fix the warning names
    assert store.load(d).blob == BLOB


def _as_another_user(monkeypatch: pytest.MonkeyPatch, path: Path, how: str) -> None:
    if how == "chown":
        if not IS_ROOT:
            pytest.skip("changing a file's owner needs root")
        os.chown(path, 54321, 54321, follow_symlinks=False)
    else:  # the process runs as another user than the one owning everything here
        monkeypatch.setattr(store_files_mod, "_euid", lambda: os.geteuid() + 4321)  # where the checks read it


@pytest.mark.parametrize("how", ["chown", "euid"])
def test_directory_owned_by_another_user_is_not_used(monkeypatch: pytest.MonkeyPatch, store: PlanStore, how: str) -> None:
    d = desc()
    store.save(d, BLOB)
    _as_another_user(monkeypatch, store.root, how)
    with Recorder() as seen:
        assert store.load(d) is None
        assert store.load(d) is None
    assert len(seen) == 1 and "owned by uid" in seen[0] and "not by you" in seen[0] and "chown" in seen[0]
    with pytest.raises(UntrustedStoreError, match="owned by uid"):
        store.save(d, b"not written")
    assert PlanStore.read(store.path_for(d)).blob == BLOB


@pytest.mark.parametrize("how", ["chmod", "chown"])
def test_file_writable_by_others_or_foreign_is_skipped_then_replaced(
    monkeypatch: pytest.MonkeyPatch, store: PlanStore, how: str
) -> None:
    d = desc()
    path = store.save(d, BLOB)
    if how == "chmod":
        os.chmod(path, 0o666)
        expected = "writable by group and others (mode 0666)"
    else:
        _as_another_user(monkeypatch, path, "chown")
        expected = "owned by uid 54321"
    with Recorder() as seen:
        assert store.load(d) is None and store.load(d) is None
    assert len(seen) == 1 and expected in seen[0] and "replaced" in seen[0]
    store.save(d, BLOB)  # the rebuild replaces it with the user's own, private file
    assert mode(path) == 0o600 and os.lstat(path).st_uid == os.geteuid()
    assert store.load(d).blob == BLOB


def test_symbolic_link_is_not_followed(store: PlanStore, tmp_path: Path) -> None:
    d = desc()
    elsewhere = PlanStore(tmp_path / "elsewhere", FACTS).save(d, BLOB)  # a valid plan for this very key
    store.save(desc(max_seqlen_q=1024), BLOB)
    store.path_for(d).symlink_to(elsewhere)
    with Recorder() as seen:
        assert store.load(d) is None
    assert len(seen) == 1 and "symbolic link" in seen[0]
    with pytest.raises(PlanFileError, match="symbolic link"):
        PlanStore.read(store.path_for(d))
    store.save(d, BLOB)  # replaces the link itself, not its target
    assert not store.path_for(d).is_symlink() and PlanStore.read(elsewhere).blob == BLOB


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_only_regular_files_are_read(store: PlanStore, kind: str) -> None:
    d = desc()
    store.save(desc(max_seqlen_q=1024), BLOB)
    path = store.path_for(d)
    os.mkfifo(path) if kind == "fifo" else path.mkdir()  # a FIFO must not block the load
    with Recorder() as seen:
        assert store.load(d) is None
    assert len(seen) == 1 and "not a regular file" in seen[0]


def test_size_cap(monkeypatch: pytest.MonkeyPatch, store: PlanStore) -> None:
    assert store_mod.MAX_FILE_BYTES == 64 << 20
    small, big = desc(), desc(max_seqlen_q=1024)
    store.save(small, b"s" * 1000)
    path = store.save(big, b"b" * 10_000)
    monkeypatch.setattr(store_files_mod, "MAX_FILE_BYTES", 5000)  # where _read_file reads it
    with Recorder() as seen:
        assert store.load(big) is None
    assert len(seen) == 1 and "limit for a plan file" in seen[0] and str(path) in seen[0]
    with pytest.raises(PlanFileError, match="limit"):
        PlanStore.read(path)
    assert store.load(small).blob == b"s" * 1000


# ----------------------------------------------------------------------------- write faults
def _failing(real, err: int, after: int = 0):
    """``real`` that fails with ``err`` once ``after`` bytes went through (a disk filling up)."""
    done = [0]

    def call(fd, data=None):
        if data is None:  # fsync(fd)
            raise OSError(err, os.strerror(err))
        if done[0] >= after:
            raise OSError(err, os.strerror(err))
        n = real(fd, bytes(data)[: max(1, (after - done[0]))])
        done[0] += n
        return n

    return call


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


# ----------------------------------------------------------------------------- clear / default_store / environment
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


def test_test_suite_uses_a_temporary_store() -> None:
    root = store_mod._default_root()
    home = Path(os.path.expanduser("~")) / ".cache" / "te_cudnn"
    assert root is not None and "te_cudnn-test-plans-" in str(root) and home not in root.parents


def test_plan_store_max_mb_accepts_fractions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(tmp_path))
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE_MAX_MB", "1.5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert default_store(FACTS).max_bytes == 3 << 19


@pytest.mark.parametrize("value", ["abc", "-3", "0", "nan", "inf", "1 MB"])
def test_bad_plan_store_max_mb_warns_once_and_uses_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(tmp_path))
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE_MAX_MB", value)
    monkeypatch.setattr(store_mod, "_env_warned", set())
    with Recorder() as seen:
        stores = [default_store(FACTS) for _ in range(3)]
    assert [s.max_bytes for s in stores] == [512 << 20] * 3
    assert seen == [f"te_cudnn: TE_CUDNN_PLAN_STORE_MAX_MB={value!r} is not a positive number of megabytes; "
                    f"using the default 512"]  # fmt: skip
    stores[0].save(desc(), BLOB)  # and the store works
    assert stores[1].load(desc()).blob == BLOB


@pytest.mark.parametrize(
    "value,expected", [("64", 64), (" 8 ", 8), ("", 512), ("abc", None), ("0", None), ("-1", None), ("1.5", None)]
)
def test_env_number_for_the_plan_cache_size(monkeypatch: pytest.MonkeyPatch, value: str, expected: int | None) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_CACHE_SIZE", value)
    monkeypatch.setattr(store_mod, "_env_warned", set())
    with Recorder() as seen:
        got = env_number("TE_CUDNN_PLAN_CACHE_SIZE", 512, integer=True, what="a positive whole number of plans")
    assert got == (expected or 512) and isinstance(got, int)
    if expected is None:
        assert seen == [f"te_cudnn: TE_CUDNN_PLAN_CACHE_SIZE={value!r} is not a positive whole number of plans; "
                        f"using the default 512"]  # fmt: skip
    else:
        assert seen == []


@pytest.mark.slow
def test_bad_plan_cache_size_does_not_break_import() -> None:
    code = "import te_cudnn; print(te_cudnn.plan_cache.maxsize)"
    env = dict(os.environ, TE_CUDNN_PLAN_CACHE_SIZE="abc")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "512"
    assert res.stderr.count("TE_CUDNN_PLAN_CACHE_SIZE='abc' is not a positive whole number of plans; using the default 512") == 1


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
