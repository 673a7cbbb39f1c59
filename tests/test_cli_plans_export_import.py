"""``te-cudnn plans export`` and ``plans import``: the round trip, and the archive members an import
refuses (paths out of the store, links and devices, oversized or corrupted plans, a store others
can write), run in-process; CPU only."""

from __future__ import annotations

import io
import json
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from te_cudnn.backends import Direction
from te_cudnn.plans.store import PlanStore

from _cli import blob, entries, make, root, run  # noqa: F401 - root: the fixture
from _plan_helpers import FACTS


# ----------------------------------------------------------------------------- export / import
def test_export_import_round_trip(capsys, root: Path, tmp_path: Path) -> None:
    archive = tmp_path / "plans.tar.gz"
    rc, out, _ = run(capsys, "plans", "export", str(archive), "--store", str(root), "--json")
    assert rc == 0 and json.loads(out) == {"exported": 4, "file": str(archive), "store": str(root)}
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == sorted(entries(root))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary archive left

    fresh = tmp_path / "fresh"
    rc, out, _ = run(capsys, "plans", "import", str(archive), "--store", str(fresh), "--json")
    assert rc == 0 and json.loads(out) == {"imported": 4, "skipped": [], "refused": {}, "store": str(fresh)}
    assert entries(fresh) == entries(root)
    assert not [p for p in fresh.rglob("*") if p.name.startswith(".tmp-")]
    # owner-only, whatever the umask: the store would not read group- or world-writable files
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in fresh.iterdir()} == {0o700}
    assert {stat.S_IMODE(p.stat().st_mode) for p in fresh.glob("*/*.plan")} == {0o600}
    assert PlanStore(fresh, FACTS).load(json.loads(json.dumps(make(Direction.BWD).describe()))).blob == blob(2)


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _special(tar: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    tar.addfile(info)


def _import(capsys, archive: Path, store: Path) -> tuple[int, dict[str, Any]]:
    rc, out, err = run(capsys, "plans", "import", str(archive), "--store", str(store), "--json")
    assert err == ""
    return rc, json.loads(out)


def _files_under(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() or p.is_symlink()}


@pytest.fixture
def plan_file(tmp_path: Path) -> tuple[str, bytes]:
    """A valid plan file ("<fingerprint>/<entry>.plan", bytes), written by PlanStore.save."""
    path = PlanStore(tmp_path / "source", FACTS).save(make().describe(), blob(7), {"plan_name": "eng0"})
    return f"{path.parent.name}/{path.name}", path.read_bytes()


def test_import_skips_bad_members(capsys, root: Path, tmp_path: Path) -> None:
    good_path = next(iter(sorted(root.glob("*/*.plan"))))
    good = good_path.read_bytes()
    fp = good_path.parent.name
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        _member(tar, f"{fp}/{good_path.name}", good)
        _member(tar, "../escaped.plan", good)  # path traversal
        _member(tar, "fp/../../escaped2.plan", good)
        _member(tar, f"{fp}/corrupt.plan", good[:-1])  # not an intact plan file
        _member(tar, f"{fp}/garbage.plan", b"garbage")
        _member(tar, f"{fp}/{'0' * 32}.plan", good)  # intact, but not named by its key
        _member(tar, f"{'f' * 20}/{good_path.name}", good)  # intact, but under another fingerprint
        _member(tar, "fp/readme.txt", good)  # not a .plan
        _member(tar, "a/b/deep.plan", good)  # not <fingerprint>/<entry>.plan
        _member(tar, "top.plan", good)
        _member(tar, "fp/.hidden.plan", good)
        _special(tar, "fp/link.plan", tarfile.SYMTYPE, "/etc/passwd")
    fresh = tmp_path / "fresh"
    rc, result = _import(capsys, archive, fresh)
    assert rc == 0 and result["imported"] == 1
    assert result["refused"] == {
        "'..' in path": ["../escaped.plan", "fp/../../escaped2.plan"],
        "not an intact plan file": [f"{fp}/corrupt.plan", f"{fp}/garbage.plan"],
        "entry name differs from its key's": [f"{fp}/{'0' * 32}.plan"],
        "fingerprint in the header differs from its directory": [f"{'f' * 20}/{good_path.name}"],
        "not named <fingerprint>/<entry>.plan": ["fp/readme.txt", "a/b/deep.plan", "top.plan", "fp/.hidden.plan"],
        "symbolic link": ["fp/link.plan"],
    }
    assert sorted(result["skipped"]) == sorted(n for names in result["refused"].values() for n in names)
    assert entries(fresh) == {f"{fp}/{good_path.name}": good}
    assert not (tmp_path / "escaped.plan").exists() and not (tmp_path / "escaped2.plan").exists()
    assert _files_under(fresh) == {f"{fp}/{good_path.name}"}  # no temporaries, no junk
    assert [p.name for p in fresh.iterdir()] == [fp]  # refused members leave no directories either
    # the text summary: one line per reason
    rc, out, _ = run(capsys, "plans", "import", str(archive), "--store", str(fresh))
    lines = out.splitlines()
    assert lines[0] == f"imported 1 plan(s) into {fresh}; skipped 11"
    assert "  skipped 2 ('..' in path): ../escaped.plan, fp/../../escaped2.plan" in lines
    assert "  skipped 1 (symbolic link): fp/link.plan" in lines
    assert len(lines) == 1 + 6


def test_import_refuses_absolute_member_paths(capsys, tmp_path: Path, plan_file: tuple[str, bytes]) -> None:
    """A valid plan named with an absolute path is refused for that reason alone: without the
    absolute-path check, '/<fingerprint>/<entry>.plan' would be a well-formed, importable member
    (checked by hand: deleting the check makes this test fail with imported == 1)."""
    name, data = plan_file
    archive = tmp_path / "abs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _member(tar, "/" + name, data)
        _member(tar, "./" + name, data)  # the same member, relative: shows that the name is otherwise fine
    store = tmp_path / "store"
    rc, result = _import(capsys, archive, store)
    assert result["refused"] == {"absolute path": ["/" + name]}
    assert result["imported"] == 1 and rc == 0
    assert entries(store) == {name: data}  # the relative one, and nothing else

    only_abs = tmp_path / "only_abs.tar.gz"
    with tarfile.open(only_abs, "w:gz") as tar:
        _member(tar, "/" + name, data)
    store2 = tmp_path / "store2"
    rc, result = _import(capsys, only_abs, store2)
    assert rc == 1  # nothing imported, something refused
    assert result == {"imported": 0, "skipped": ["/" + name], "refused": {"absolute path": ["/" + name]},
                      "store": str(store2)}  # fmt: skip
    assert not store2.exists()  # nothing written, not even the store
    assert not Path("/" + name).exists() and not Path("/" + name.split("/")[0]).exists()


@pytest.mark.parametrize(
    ("kind", "reason"),
    [(tarfile.SYMTYPE, "symbolic link"), (tarfile.LNKTYPE, "hard link"), (tarfile.CHRTYPE, "device or fifo"),
     (tarfile.BLKTYPE, "device or fifo"), (tarfile.FIFOTYPE, "device or fifo"), (tarfile.DIRTYPE, "directory")],
    ids=["symlink", "hardlink", "chardev", "blockdev", "fifo", "dir"],
)  # fmt: skip
def test_import_refuses_links_and_devices(capsys, tmp_path: Path, plan_file: tuple[str, bytes], kind: bytes,
                                          reason: str) -> None:  # fmt: skip
    """Links, devices and fifos named like plans never enter the store, not even after a real
    member with the link's target name (a link to it would alias a store file)."""
    name, data = plan_file
    outside = tmp_path / "outside.plan"
    archive = tmp_path / "special.tar"
    with tarfile.open(archive, "w") as tar:
        _member(tar, name, data)
        link_name = name.replace(".plan", "") [:-1] + "0.plan"  # another well-formed entry name
        _special(tar, link_name, kind, str(outside) if kind == tarfile.SYMTYPE else name)
    store = tmp_path / "store"
    rc, result = _import(capsys, archive, store)
    assert rc == 0 and result["imported"] == 1
    assert result["refused"] == {reason: [link_name]}
    assert _files_under(store) == {name}
    assert not outside.exists()
    assert not any(p.is_symlink() for p in store.rglob("*"))


def test_import_refuses_oversized_members(capsys, tmp_path: Path, plan_file: tuple[str, bytes],
                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    name, data = plan_file
    archive = tmp_path / "big.tar"
    with tarfile.open(archive, "w") as tar:
        _member(tar, name, data)
    from te_cudnn.cli import store as cli_store  # where `plans import` reads the cap

    monkeypatch.setattr(cli_store, "MAX_IMPORT_MEMBER_BYTES", len(data) - 1)
    store = tmp_path / "store"
    rc, result = _import(capsys, archive, store)
    assert rc == 1 and result["imported"] == 0
    assert result["refused"] == {f"larger than {len(data) - 1} bytes": [name]}
    assert not store.exists()
    monkeypatch.setattr(cli_store, "MAX_IMPORT_MEMBER_BYTES", len(data))  # exactly at the cap is fine
    rc, result = _import(capsys, archive, store)
    assert rc == 0 and result["imported"] == 1 and entries(store) == {name: data}
    assert cli_store.MAX_IMPORT_MEMBER_BYTES == len(data)


def test_import_cap_is_64_mib() -> None:
    import te_cudnn.cli as cli

    assert cli.MAX_IMPORT_MEMBER_BYTES == 64 << 20


def test_import_does_not_follow_a_planted_fingerprint_link(capsys, tmp_path: Path, plan_file: tuple[str, bytes]) -> None:
    """A fingerprint directory in the store that is a symlink (to somewhere outside) takes no file."""
    name, data = plan_file
    fp = name.split("/")[0]
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store.mkdir(mode=0o700)
    elsewhere.mkdir()
    (store / fp).symlink_to(elsewhere, target_is_directory=True)
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        _member(tar, name, data)
    rc, result = _import(capsys, archive, store)
    assert rc == 1 and result["imported"] == 0
    assert list(result["refused"]) == ["its fingerprint directory in the store is a link or not a directory"]
    assert list(elsewhere.iterdir()) == []


def test_import_refuses_a_store_others_can_write(capsys, tmp_path: Path, plan_file: tuple[str, bytes]) -> None:
    """Importing into a store the store itself would not read (group/world-writable) writes nothing."""
    name, data = plan_file
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o777)
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        _member(tar, name, data)
    rc, out, err = run(capsys, "plans", "import", str(archive), "--store", str(store))
    assert rc == 1 and out == ""
    assert err.startswith(f"te-cudnn: not importing into {store}: ") and "writable" in err
    assert err.count("\n") == 1
    assert list(store.iterdir()) == []


def test_import_unreadable_archive(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"this is not a tar file")
    rc, _, err = run(capsys, "plans", "import", str(bad), "--store", str(tmp_path / "s"))
    assert rc == 1 and err.startswith(f"te-cudnn: cannot read {bad}: ") and err.count("\n") == 1
    rc, _, err = run(capsys, "plans", "import", str(tmp_path / "missing.tar.gz"), "--store", str(tmp_path / "s"))
    assert rc == 1 and err == f"te-cudnn: cannot read {tmp_path / 'missing.tar.gz'}: No such file or directory\n"
    assert not (tmp_path / "s").exists()


def test_export_into_missing_directory(capsys, root: Path, tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "dir" / "plans.tar.gz"
    rc, out, err = run(capsys, "plans", "export", str(target), "--store", str(root))
    assert rc == 2 and out == ""
    assert err == f"te-cudnn: cannot write {target}: directory {target.parent} does not exist\n"
    assert not (tmp_path / "no").exists()
