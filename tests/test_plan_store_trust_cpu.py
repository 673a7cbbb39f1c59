"""The plan store's trust checks (``te_cudnn.plans.store``): its directories and files are
created owner-only whatever the umask; a directory writable by others or owned by another user
is not used; a file writable by others or owned by another user, a symbolic link, a file that is
not a regular file and a file over the size cap are skipped; CPU only.

Ownership is changed for real when the tests run as root and simulated (another effective uid)
otherwise.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from te_cudnn.plans import store as store_mod
from te_cudnn.plans import store_files as store_files_mod
from te_cudnn.plans.store import PlanFileError, PlanStore, UntrustedStoreError

from _plan_helpers import FACTS
from _plan_store_cpu import BLOB, IS_ROOT, Recorder, desc, mode, store, temporaries  # noqa: F401 - store: the fixture


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
