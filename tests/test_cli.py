"""The ``te-cudnn`` console tool (``te_cudnn.cli``), run in-process (and a few times as a
process); CPU only.

The stores are written by the tests with ``PlanStore.save``: realistic key descriptions
(``make_key(...).describe()``) and synthetic plan bytes (the store is byte-level).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch

from te_cudnn.backends import Direction
from te_cudnn.cli import build_parser, main
from te_cudnn.plans import CompiledPlan, PlanCache, PlanKey
from te_cudnn.plans.store import PlanStore

from _plan_helpers import FACTS, sizes_key

FACTS_OLD = {**FACTS, "cudnn": 91800}


def make(direction: Direction = Direction.FWD, **over: Any) -> PlanKey:
    return sizes_key(direction, **over)


def blob(i: int) -> bytes:
    return bytes([i]) * 300 + b"synthetic serialized plan"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A store with three plans under one fingerprint and one under another."""
    r = tmp_path / "store"
    s, old = PlanStore(r, FACTS), PlanStore(r, FACTS_OLD)
    meta = {"uids": [1, 2, 3], "plan_name": "eng0_k9", "build_ms": 120.5}
    s.save(make().describe(), blob(1), meta)
    s.save(make(Direction.BWD).describe(), blob(2), meta)
    s.save(make(qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="no_mask").describe(), blob(3), meta)
    old.save(make().describe(), blob(4), meta)
    return r


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def entries(r: Path) -> dict[str, bytes]:
    return {str(p.relative_to(r)): p.read_bytes() for p in r.glob("*/*.plan")}


# ----------------------------------------------------------------------------- plans list / show / stats
def test_list_table(capsys, root: Path) -> None:
    rc, out, _ = run(capsys, "plans", "list", "--store", str(root))
    assert rc == 0
    lines = out.strip().splitlines()
    assert lines[0] == f"store: {root} (--store)"
    lines = lines[1:]
    assert lines[0].split()[:4] == ["entry", "backend", "direction", "layout"]
    assert len(lines) == 1 + 4
    assert sum("F16_arbitrary_seqlen" in line for line in lines) == 4
    assert "sbhd_sbhd_sbhd" in out and "bshd_bshd_bshd" in out and "eng0_k9" in out
    assert "b=2 h=16/16 sq=512 skv=512 d=64" in out


def test_list_json(capsys, root: Path) -> None:
    rc, out, _ = run(capsys, "plans", "list", "--store", str(root), "--json")
    assert rc == 0
    listing = json.loads(out)
    assert set(listing) == {"store", "plans"} and listing["store"] == str(root)
    rows = listing["plans"]
    assert {r["entry"] for r in rows} == {p.stem for p in root.glob("*/*.plan")}
    assert sorted(r["direction"] for r in rows) == ["bwd", "fwd", "fwd", "fwd"]
    assert {r["layout"] for r in rows} == {"bshd_bshd_bshd", "sbhd_sbhd_sbhd"}
    assert {r["cudnn"] for r in rows} == {91900, 91800}
    assert all(r["backend"] == "F16_arbitrary_seqlen" and r["plan"] == "eng0_k9" and r["build_ms"] == 120.5 for r in rows)
    assert all(r["gpu"] == FACTS["gpu"] and r["bytes"] > 300 for r in rows)


def test_list_empty_store(capsys, tmp_path: Path) -> None:
    nothing = tmp_path / "nothing"
    rc, out, _ = run(capsys, "plans", "list", "--store", str(nothing))
    assert rc == 0
    assert out.splitlines() == [
        f"store: {nothing} (--store; does not exist yet: the first plan built on a GPU creates it)", "(no plans)"
    ]
    rc, out, _ = run(capsys, "plans", "list", "--store", str(nothing), "--json")
    assert rc == 0 and json.loads(out) == {"store": str(nothing), "plans": []}
    assert not nothing.exists()  # listing never creates the store


def test_store_from_environment(capsys, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(root))
    rc, out, _ = run(capsys, "plans", "list", "--json")
    assert rc == 0 and len(json.loads(out)["plans"]) == 4 and json.loads(out)["store"] == str(root)
    rc, out, _ = run(capsys, "plans", "stats")
    assert rc == 0 and out.splitlines()[0] == f"store: {root} (TE_CUDNN_PLAN_STORE)"
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", "off")
    rc, out, err = run(capsys, "plans", "list")
    assert rc == 2 and out == ""
    assert err == "te-cudnn: the plan store is switched off (TE_CUDNN_PLAN_STORE=off); pass --store DIR\n"


def test_store_default_location(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --store or TE_CUDNN_PLAN_STORE the store is under $XDG_CACHE_HOME, and list/stats say so."""
    monkeypatch.delenv("TE_CUDNN_PLAN_STORE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    expected = tmp_path / "xdg" / "te_cudnn" / "plans"
    for cmd in ("list", "stats"):
        rc, out, _ = run(capsys, "plans", cmd)
        assert rc == 0
        assert out.splitlines()[0].startswith(f"store: {expected} (default; set TE_CUDNN_PLAN_STORE to move it; ")
        rc, out, _ = run(capsys, "plans", cmd, "--json")
        assert rc == 0 and json.loads(out)["store"] == str(expected)


def test_show(capsys, root: Path) -> None:
    path = PlanStore(root, FACTS).path_for(make(Direction.BWD).describe())
    rc, out, _ = run(capsys, "plans", "show", path.stem[:12], "--store", str(root))
    assert rc == 0
    assert out.splitlines()[0] == str(path)
    assert "direction: bwd" in out and "plan_name: eng0_k9" in out and "layout: bshd_bshd_bshd" in out
    rc, out, _ = run(capsys, "plans", "show", path.stem, "--store", str(root), "--json")
    assert rc == 0
    header = json.loads(out)
    assert header["key"] == json.loads(json.dumps(make(Direction.BWD).describe()))
    assert header["facts"] == FACTS and header["size"] == len(blob(2)) and header["uids"] == [1, 2, 3]


def test_show_unknown_or_ambiguous(capsys, root: Path) -> None:
    rc, out, err = run(capsys, "plans", "show", "zzzz", "--store", str(root))
    assert rc == 1 and out == "" and err == f"te-cudnn: no single stored plan matches 'zzzz' in {root}\n"
    # the same entry name exists under both fingerprints: a prefix is ambiguous
    stem = PlanStore(root, FACTS).path_for(make().describe()).stem
    rc, _, err = run(capsys, "plans", "show", stem, "--store", str(root))
    assert rc == 1 and "no single stored plan" in err


def test_show_corrupted(capsys, root: Path) -> None:
    path = PlanStore(root, FACTS).path_for(make(Direction.BWD).describe())
    path.write_bytes(path.read_bytes()[:-5])
    rc, _, err = run(capsys, "plans", "show", path.stem, "--store", str(root))
    assert rc == 1 and "corrupted" in err


def test_stats(capsys, root: Path) -> None:
    rc, out, _ = run(capsys, "plans", "stats", "--store", str(root), "--json")
    assert rc == 0
    stats = json.loads(out)
    files = list(root.glob("*/*.plan"))
    assert stats == {"plans": 4, "bytes": sum(p.stat().st_size for p in files), "unreadable": 0, "fingerprints": 2,
                     "by_backend": {"F16_arbitrary_seqlen": 4}, "store": str(root)}  # fmt: skip

    bad = root / PlanStore(root, FACTS).fingerprint / ("0" * 32 + ".plan")
    bad.write_bytes(b"not a plan at all")
    rc, out, _ = run(capsys, "plans", "stats", "--store", str(root), "--json")
    stats = json.loads(out)
    assert rc == 0 and stats["plans"] == 5 and stats["unreadable"] == 1
    assert stats["bytes"] == sum(p.stat().st_size for p in files) + bad.stat().st_size
    rc, out, _ = run(capsys, "plans", "stats", "--store", str(root))
    assert rc == 0 and "plans: 5" in out and "unreadable: 1" in out
    assert out.splitlines()[0] == f"store: {root} (--store)"
    rc, out, _ = run(capsys, "plans", "list", "--store", str(root), "--json")
    (row,) = [r for r in json.loads(out)["plans"] if "error" in r]
    assert row["entry"] == "0" * 32 and "bad magic" in row["error"]


# ----------------------------------------------------------------------------- plans clear
def test_clear_needs_yes(capsys, root: Path) -> None:
    before = entries(root)
    rc, out, err = run(capsys, "plans", "clear", "--store", str(root))
    assert rc == 2 and err == f"te-cudnn: refusing to delete the plans in {root} without --yes\n"
    assert entries(root) == before
    rc, out, _ = run(capsys, "plans", "clear", "--store", str(root), "--yes", "--json")
    assert rc == 0 and json.loads(out) == {"removed": 4, "store": str(root)}
    assert entries(root) == {}
    rc, out, _ = run(capsys, "plans", "clear", "--store", str(root), "--yes")
    assert rc == 0 and out.startswith("removed 0 plan(s)")


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


# ----------------------------------------------------------------------------- plans list --dump
def test_list_dump(capsys, tmp_path: Path) -> None:
    def builder(k: PlanKey, make_spec) -> CompiledPlan:
        return CompiledPlan(k, graph=object(), uids=(), workspace_size=4096, plan_name="test", build_seconds=0.001)

    cache = PlanCache(builder=builder)
    for k in (make(), make(Direction.BWD), make()):
        cache.get_or_build(k, lambda: None)
    dump = tmp_path / "dump.json"
    cache.dump(str(dump))

    rc, out, _ = run(capsys, "plans", "list", "--dump", str(dump))
    assert rc == 0
    lines = out.strip().splitlines()
    assert lines[0].split() == ["backend", "direction", "layout", "shape", "mask", "plan", "source", "hits", "build_ms",
                                "workspace"]  # fmt: skip
    assert len(lines) == 1 + 2 + 1 and lines[-1].startswith("totals: ")
    assert "'loads': 0" in lines[-1] and "'builds': 2" in lines[-1]
    assert all("F16_arbitrary_seqlen" in line and "causal" in line and "4096" in line for line in lines[1:3])
    rc, out, _ = run(capsys, "plans", "list", "--dump", str(dump), "--json")
    assert rc == 0 and json.loads(out) == json.loads(dump.read_text())

    rc, _, err = run(capsys, "plans", "list", "--dump", str(tmp_path / "missing.json"))
    assert rc == 1 and err == f"te-cudnn: cannot read dump {tmp_path / 'missing.json'}: No such file or directory\n"
    (tmp_path / "bad.json").write_text("{not json")
    rc, _, err = run(capsys, "plans", "list", "--dump", str(tmp_path / "bad.json"))
    assert rc == 1 and err.startswith("te-cudnn: cannot read dump") and "not JSON text" in err


def test_list_dump_wrong_files(capsys, root: Path, tmp_path: Path) -> None:
    """What a first-time user hands to --dump by mistake: one line each, exit 1, never a traceback."""
    archive = tmp_path / "plans.tar.gz"
    assert main(["plans", "export", str(archive), "--store", str(root)]) == 0
    plain_tar = tmp_path / "plans.tar"
    with tarfile.open(plain_tar, "w") as tar:
        tar.add(next(root.glob("*/*.plan")), arcname="x/y.plan")
    cases = {
        archive: "it is a (gzip) tar archive, such as `plans export` writes",
        plain_tar: "it is a (gzip) tar archive",
        tmp_path / "list.json": "plan_cache.dump() writes an object with a 'plans' list, got a JSON list",
        tmp_path / "obj.json": "plan_cache.dump() writes an object with a 'plans' list, got an object without",
        tmp_path / "plans_not_objects.json": "plan 0 is not an object with a 'key' object",
        tmp_path / "binary.bin": "not JSON text",
        next(root.glob("*/*.plan")): "not JSON text",  # a plan file
    }
    (tmp_path / "list.json").write_text("[1, 2, 3]")
    (tmp_path / "obj.json").write_text('{"stats": {}}')
    (tmp_path / "plans_not_objects.json").write_text('{"plans": [[1]]}')
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)))
    capsys.readouterr()
    for path, message in cases.items():
        rc, out, err = run(capsys, "plans", "list", "--dump", str(path))
        assert rc == 1 and out == "", path
        assert err.startswith(f"te-cudnn: cannot read dump {path}: ") and message in err, err
        assert err.count("\n") == 1, err


# ----------------------------------------------------------------------------- explain
EXPLAIN = ["explain", "--heads", "16", "--sq", "2048", "--d", "128", "--mask", "causal", "--target", "hopper"]


def test_explain_supported(capsys) -> None:
    rc, out, _ = run(capsys, *EXPLAIN)
    assert rc == 0
    assert "-> F16_arbitrary_seqlen" in out and "F16_max512_seqlen: declined" in out
    assert not out.startswith("note:")  # dense: the batch is what was asked for
    rc, out, _ = run(capsys, *EXPLAIN, "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["backend"] == "F16_arbitrary_seqlen"
    assert set(data) == {"backend", "reasons", "config", "env", "batch", "planned"}
    assert data["batch"] == 1 and data["planned"] == {"b": 1, "sq": 2048, "skv": 2048}
    assert "sm90" in data["env"] and "sq=2048" in data["config"]


def test_explain_thd_says_which_batch_it_checks(capsys) -> None:
    rc, out, _ = run(capsys, "explain", "--heads", "16", "--sq", "1000", "--d", "128", "--layout", "thd_thd_thd",
                     "--mask", "padding_causal", "--batch", "3", "--target", "hopper")  # fmt: skip
    assert rc == 0
    assert out.splitlines()[0] == ("note: THD plans are keyed on buckets, so --batch 3 --sq 1000 --skv 1000 is checked "
                                   "as b=32 sq=1024 skv=1024")  # fmt: skip
    rc, out, _ = run(capsys, "explain", "--heads", "16", "--sq", "1000", "--d", "128", "--layout", "thd_thd_thd",
                     "--mask", "padding_causal", "--batch", "3", "--target", "hopper", "--json")  # fmt: skip
    data = json.loads(out)
    assert data["batch"] == 3 and data["planned"] == {"b": 32, "sq": 1024, "skv": 1024}


def test_explain_unsupported(capsys) -> None:
    rc, out, _ = run(capsys, *EXPLAIN, "--bias", "pre_scale_bias")
    assert rc == 1 and "No_Backend" in out and "pre_scale_bias" in out
    rc, out, _ = run(capsys, *EXPLAIN, "--bias", "pre_scale_bias", "--json")
    assert rc == 1 and json.loads(out)["backend"] == "No_Backend"


@pytest.mark.parametrize(
    ("name", "expected"),
    [("bf16", "bfloat16"), ("BF16", "bfloat16"), ("bfloat16", "bfloat16"), ("torch.bfloat16", "bfloat16"),
     ("fp16", "float16"), ("half", "float16"), ("float16", "float16"), ("fp8", "float8_e4m3fn"),
     ("e4m3", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e4m3fn"), ("e5m2", "float8_e5m2")],
)  # fmt: skip
def test_explain_dtype_aliases(capsys, name: str, expected: str) -> None:
    rc, out, err = run(capsys, *EXPLAIN, "--dtype", name, "--json")
    assert err == "" and rc in (0, 1)
    assert json.loads(out)["config"].split(",")[0] == f"bshd_bshd_bshd {expected}"


def test_explain_bad_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--sq", "2048", "--d", "128"])  # --heads is required
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == ("te-cudnn explain: the following arguments are required: --heads (see `te-cudnn explain "
                   "--help`)\n")  # fmt: skip
    for argv in ([*EXPLAIN[:-2], "--target", "ampere"], ["explain", "--heads", "many", "--sq", "2048", "--d", "128"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1
    for bad in ("notadtype", "Tensor", "float32", "int8"):
        rc, _, err = run(capsys, *EXPLAIN, "--dtype", bad)  # checked by the command, not argparse
        assert rc == 2
        assert err == (f"te-cudnn: --dtype {bad!r} is not a dtype fused attention takes; accepted: bfloat16, bf16, "
                       "float16, fp16, half, float8_e4m3fn, fp8, e4m3, fp8_e4m3, float8_e5m2, e5m2, fp8_e5m2\n")  # fmt: skip
    rc, _, err = run(capsys, *EXPLAIN, "--gqa-groups", "3")
    assert rc == 2 and err == "te-cudnn: --gqa-groups 3 does not divide --heads 16\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [(("--heads", "0"), "--heads 0 must be >= 1"),
     (("--d", "0"), "--d 0 must be >= 1"),
     (("--batch", "-1"), "--batch -1 must be >= 0"),
     (("--dropout", "1.5"), "--dropout 1.5 must be in [0, 1)"),
     (("--dropout", "0.5", "--inference"), "--dropout 0.5 during inference (--inference)"),
     (("--window", "-3", "-1"), "--window -3 -1 entries must be >= -1"),
     (("--window", "-1", "4"), "--window -1 4 has right=4 but --mask causal allows no keys right of the diagonal"),
     (("--layout", "bshd"), "--layout 'bshd' is not a valid QKVLayout"),
     (("--layout", "bs3hd", "--gqa-groups", "4"), "--sq == --skv and --heads == --gqa-groups, got"),
     (("--layout", "bshd_bs2hd", "--d-v", "64"), "packs k and v, so --d 128 must equal --d-v 64"),
     (("--softmax-type", "sinks"), "--softmax-type 'sinks' is not a valid SoftmaxType"),
     (("--bias", "x"), "--bias 'x' is not a valid AttnBiasType")],
)  # fmt: skip
def test_explain_errors_name_the_options_typed(capsys, extra: tuple[str, ...], message: str) -> None:
    """The library's messages name its parameters (num_gqa_groups=3); the command's name the
    options the user typed (--gqa-groups 3)."""
    from te_cudnn.cli import EXPLAIN_FLAGS

    rc, out, err = run(capsys, *EXPLAIN, *extra)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("te-cudnn: ") and message in err, err
    assert not any(f"{name}=" in err or ("_" in name and name in err) for name in EXPLAIN_FLAGS), err


def test_warm_check_names_the_file_keys(capsys, tmp_path: Path) -> None:
    configs = _configs(tmp_path, [{"b": 1, "h": 16, "sq": 128, "d": 64, "dropout": 0.5, "training": False},
                                  {"b": 1, "h": 16, "sq": 128, "d": 64, "mask": "causal", "window": [-1, 4]}])  # fmt: skip
    rc, out, _ = run(capsys, "plans", "warm", "--check", str(configs))
    assert rc == 2
    assert "config 1: dropout=0.5 during inference (training=false)" in out
    assert "config 2: window=[-1, 4] has right=4 but mask=causal" in out
    assert "is_training" not in out and "window_size" not in out and "attn_mask_type" not in out


def test_explain_help_documents_every_option(capsys) -> None:
    """Every option of `explain` has help text, and those with a default say it."""
    parser = build_parser()
    xp = parser._subparsers._group_actions[0].choices["explain"]  # noqa: SLF001 - argparse offers no public way
    for action in xp._actions:  # noqa: SLF001
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, action.option_strings
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: bfloat16)", "(default: bshd_bshd_bshd)", "(default: no_mask)", "(default: no_bias)",
                  "(default: 1)", "(default: 0.0)", "(default: (-1, -1))", "(default: current)", "(default: --heads)",
                  "(default: --sq)", "(default: --d)", "bf16", "fp16", "e4m3"):  # fmt: skip
        assert shown in text, shown


# ----------------------------------------------------------------------------- plans warm
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "warm_configs.json"


def _configs(tmp_path: Path, configs: Any) -> Path:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(configs))
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_warm_needs_cuda(capsys, tmp_path: Path) -> None:
    configs = _configs(tmp_path, [{"b": 1, "h": 4, "sq": 128, "d": 64, "mask": "causal"}])
    rc, _, err = run(capsys, "plans", "warm", str(configs), "--store", str(tmp_path / "s"))
    assert rc == 1
    assert err == (f"te-cudnn: plans warm needs a CUDA device; check the file here with `te-cudnn plans warm --check "
                   f"{configs}`\n")  # fmt: skip
    assert not (tmp_path / "s").exists()


def test_warm_unreadable_configs(capsys, tmp_path: Path) -> None:
    rc, _, err = run(capsys, "plans", "warm", str(tmp_path / "missing.json"))
    assert rc == 2 and err == f"te-cudnn: cannot read {tmp_path / 'missing.json'}: No such file or directory\n"
    (tmp_path / "obj.json").write_text('{"b": 1}')
    rc, _, err = run(capsys, "plans", "warm", str(tmp_path / "obj.json"), "--check")
    assert rc == 2 and "expected a JSON list of configurations" in err and "got a JSON object" in err


def test_warm_example_file_checks_on_cpu(capsys) -> None:
    """The shipped example is valid, and every configuration in it is served on the measured Hopper machine."""
    raw = json.loads(EXAMPLES.read_text())
    assert len(raw) >= 5
    layouts = {c.get("layout", "bshd_bshd_bshd") for c in raw}
    assert {"bshd_bshd_bshd", "thd_thd_thd"} <= layouts
    assert any(c.get("hg", c["h"]) != c["h"] for c in raw)  # GQA
    assert any(c.get("training") is False for c in raw)  # inference
    assert any("padding" in c.get("mask", "") for c in raw)
    rc, out, err = run(capsys, "plans", "warm", "--check", str(EXAMPLES), "--json")
    assert rc == 0 and err == ""
    report = json.loads(out)
    assert [r["backend"] for r in report["configs"]] == ["F16_arbitrary_seqlen"] * len(raw)
    assert [r["config"] for r in report["configs"]] == [f"config {i} ({c['name']})" for i, c in enumerate(raw, 1)]
    rc, out, _ = run(capsys, "plans", "warm", "--check", str(EXAMPLES))
    assert rc == 0 and out.splitlines()[-1] == f"{len(raw)} of {len(raw)} configuration(s) valid and served"


BAD_CONFIGS = [
    ({"b": 2, "heads": 16, "sq": 128, "d": 64}, "unknown key 'heads'; accepted keys: b, h, hg, sq, skv, d, d_v, layout, "
                                                "mask, softmax_type, dtype, training, deterministic, dropout, window, attn_scale, name"),
    ({"b": 2, "h": 16, "d": 64}, "missing key 'sq' (required: b, h, sq, d)"),
    ({"b": 2, "h": 16, "sq": "128", "d": 64}, 'sq="128" must be int'),
    ({"b": 2, "h": 16, "sq": 128, "d": 64, "training": 1}, "training=1 must be bool"),
    ({"b": True, "h": 16, "sq": 128, "d": 64}, "b=true must be int"),
    ({"b": 0, "h": 16, "sq": 128, "d": 64}, "b=0 must be >= 1 (a zero-size call builds no plan)"),
    ({"b": 1, "h": 16, "hg": 3, "sq": 128, "d": 64}, "hg=3 must divide h=16 (GQA/MQA)"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "layout": "bshd"}, "layout='bshd' is not a valid QKVLayout"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "layout": "paged_kv_bshd_bshd_bshd"}, "mixed-format and paged layouts"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "mask": "causl"}, "mask='causl' is not a valid AttnMaskType"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "dtype": "float32"}, "dtype 'float32' is not a dtype fused attention takes"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "dtype": "fp8"}, "FP8 plans need FP8 scaling tensors"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "window": [1]}, "window=[1] must be [left, right], two integers"),
    ({"b": 1, "h": 16, "hg": 4, "sq": 128, "d": 64, "layout": "bs3hd"}, "packs q, k and v: it needs sq == skv and h == hg"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "d_v": 32, "layout": "bshd_bs2hd"}, "packs k and v: it needs d_v == d"),
    ("x", 'a configuration is an object of keys, got "x"'),
]  # fmt: skip


def test_warm_check_names_each_problem(capsys, tmp_path: Path) -> None:
    good = {"name": "fine", "b": 1, "h": 16, "sq": 128, "d": 64}
    declined = {"b": 1, "h": 16, "sq": 128, "d": 264}  # valid, but no sub-backend takes d=264
    configs = _configs(tmp_path, [c for c, _ in BAD_CONFIGS] + [good, declined])
    rc, out, err = run(capsys, "plans", "warm", "--check", str(configs))
    assert rc == 2 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"checked {configs} against ")
    for i, (_, message) in enumerate(BAD_CONFIGS, 1):
        (line,) = [line for line in lines if line.startswith(f"config {i}: ")]
        assert message in line, (line, message)
    n = len(BAD_CONFIGS)
    assert any(line.startswith(f"config {n + 1} (fine): bshd_bshd_bshd bfloat16") and line.endswith("-> F16_arbitrary_seqlen")
               for line in lines)  # fmt: skip
    assert any(line.startswith(f"config {n + 2}: ") and line.endswith("-> No_Backend") for line in lines)
    assert any("F16_arbitrary_seqlen:" in line and "d_qk=264" in line for line in lines)
    assert lines[-1] == f"1 of {n + 2} configuration(s) valid and served; {n} malformed; 1 not served"

    rc, out, err = run(capsys, "plans", "warm", "--check", str(_configs(tmp_path, [good, declined])))
    assert rc == 1 and err == ""  # valid, one not served


def test_warm_rejects_unknown_keys_before_any_gpu_work(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A normal run checks the whole file first: a wrong key is an error (exit 2) even where a GPU is present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the check comes before any GPU question
    configs = _configs(tmp_path, [{"b": 1, "h": 4, "sq": 128, "d": 64}, {"b": 1, "h": 4, "sq": 128, "d": 64, "mask_type": "causal"},
                                  {"b": 1, "h": 4, "sq": 128}])  # fmt: skip
    rc, out, err = run(capsys, "plans", "warm", str(configs), "--store", str(tmp_path / "s"))
    assert rc == 2 and out == ""
    assert err == (f"te-cudnn: {configs}: config 2: unknown key 'mask_type'; accepted keys: b, h, hg, sq, skv, d, d_v, "
                   "layout, mask, softmax_type, dtype, training, deterministic, dropout, window, attn_scale, name; 1 more problem(s); "
                   f"`te-cudnn plans warm --check {configs}` lists every configuration\n")  # fmt: skip
    assert not (tmp_path / "s").exists()


def test_warm_help_names_every_key_and_default(capsys) -> None:
    from te_cudnn.cli import WARM_KEYS

    with pytest.raises(SystemExit) as exc:
        main(["plans", "warm", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and line.split()[0] in WARM_KEYS}
    assert set(rows) == set(WARM_KEYS)
    for key, (_, default, _) in WARM_KEYS.items():
        if key in ("b", "h", "sq", "d"):
            assert rows[key].endswith("(required)"), rows[key]
        elif key in ("hg", "skv", "d_v"):
            assert rows[key].endswith(f"(default: same as {default})"), rows[key]
        else:
            assert rows[key].endswith(f"(default: {json.dumps(default)})"), rows[key]
    assert "examples/warm_configs.json" in out and "--check" in out


def test_warm_toml(capsys, tmp_path: Path) -> None:
    pytest.importorskip("tomllib")
    path = tmp_path / "c.toml"
    path.write_text('[[config]]\nb = 1\nh = 8\nsq = 256\nd = 64\nmask = "causal"\n\n[[config]]\nb = 1\nh = 8\nsq = 256\nd = 64\nheads = 2\n')
    rc, out, _ = run(capsys, "plans", "warm", "--check", str(path))
    assert rc == 2
    assert "config 1: bshd_bshd_bshd bfloat16, b=1 h=8" in out and "config 2: unknown key 'heads'" in out


# ----------------------------------------------------------------------------- parser / help / entry point
HELPS = [[], ["plans"], ["explain"]] + [["plans", c] for c in ("list", "show", "stats", "clear", "export", "import", "warm")]


@pytest.mark.parametrize("prefix", HELPS, ids=lambda p: "-".join(p) or "top")
def test_help_exits_zero(capsys, prefix: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*prefix, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: te-cudnn")


def test_missing_subcommand_exits_two(capsys) -> None:
    for argv in ([], ["plans"], ["plans", "frobnicate"], ["plans", "show"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("te-cudnn") and err.count("\n") == 1, err  # one line, no usage block


def test_every_subcommand_has_common_options() -> None:
    parser = build_parser()
    for argv in (["plans", "list"], ["plans", "stats"], ["plans", "clear"], ["plans", "show", "x"],
                 ["plans", "export", "f"], ["plans", "import", "f"], ["plans", "warm", "c.json"],
                 ["plans", "tune", "c.json"]):  # fmt: skip
        args = parser.parse_args([*argv, "--store", "/somewhere", "--json", "--debug"])
        assert args.store == "/somewhere" and args.json is True and args.debug is True and callable(args.func)
    for argv in (EXPLAIN, ["bench"]):
        args = parser.parse_args([*argv, "--json", "--debug"])
        assert args.json is True and args.debug is True and callable(args.func)


@pytest.mark.parametrize("argv", [EXPLAIN, ["bench", "--list"]], ids=["explain", "bench"])
def test_store_only_where_it_is_used(capsys, argv: list[str]) -> None:
    """explain and bench read no plan store: --store is an unknown option there, not one ignored."""
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--store", "/somewhere"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --store /somewhere" in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("argv", "prog"),
    [(["--bogus"], "te-cudnn"), (["--bogus=1"], "te-cudnn"), (["plans", "--bogus"], "te-cudnn plans"),
     (["explain", "--bogus"], "te-cudnn explain"), (["explain", "--sq", "128", "--bogus"], "te-cudnn explain"),
     (["plans", "list", "--bogus"], "te-cudnn"), (["explain", *EXPLAIN[1:], "--bogus"], "te-cudnn")],
)  # fmt: skip
def test_unknown_option_is_named(capsys, argv: list[str], prog: str) -> None:
    """An option nobody defines is named, even where an argument is also missing."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    bogus = next(a for a in argv if a.startswith("--bogus"))
    assert capsys.readouterr().err == f"{prog}: unrecognized arguments: {bogus} (see `{prog} --help`)\n"


def test_missing_arguments_still_say_so(capsys) -> None:
    """Abbreviations and negative numbers are not unknown options: the missing argument is reported."""
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--hea", "16", "--window", "-1", "-1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("te-cudnn explain: the following arguments are required: --sq, --d (see "
                                       "`te-cudnn explain --help`)\n")  # fmt: skip


def test_version(capsys) -> None:
    from te_cudnn.runtime import format_versions

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out == format_versions() + "\n"
    assert out.startswith("te_cudnn ") and "torch " in out and "CUDA " in out and "cuDNN " in out and "frontend " in out


def test_unexpected_errors_are_one_line(capsys, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a command raises comes out as one line with an exit code; --debug or
    TE_CUDNN_DEBUG=1 lets the traceback through."""
    from te_cudnn.cli import store as cli

    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(cli, "_rows", boom)
    rc, out, err = run(capsys, "plans", "stats", "--store", str(root))
    assert rc == 1 and out == ""
    assert err == ("te-cudnn: unexpected RuntimeError: first line; second line (run with --debug or TE_CUDNN_DEBUG=1 "
                   "for the traceback)\n")  # fmt: skip
    with pytest.raises(RuntimeError, match="first line"):
        main(["plans", "stats", "--store", str(root), "--debug"])
    monkeypatch.setenv("TE_CUDNN_DEBUG", "1")
    with pytest.raises(RuntimeError, match="first line"):
        main(["plans", "stats", "--store", str(root)])
    monkeypatch.delenv("TE_CUDNN_DEBUG")

    def denied(*_: Any, **__: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(root / "x"))

    monkeypatch.setattr(cli, "_rows", denied)
    rc, _, err = run(capsys, "plans", "list", "--store", str(root))
    assert rc == 1 and err == f"te-cudnn: {root / 'x'}: Permission denied\n"

    def bad_value(*_: Any, **__: Any) -> Any:
        raise ValueError("x=3 is wrong")

    monkeypatch.setattr(cli, "_rows", bad_value)
    rc, _, err = run(capsys, "plans", "list", "--store", str(root))
    assert rc == 2 and err == "te-cudnn: x=3 is wrong\n"


def test_store_warnings_are_one_line(capsys, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    from te_cudnn.cli import store as cli

    real_rows = cli._rows

    def warn_then_list(store: PlanStore) -> Any:
        warnings.warn("te_cudnn: not using the plan store X: it is\nwritable by others")
        return real_rows(store)

    monkeypatch.setattr(cli, "_rows", warn_then_list)
    rc, _, err = run(capsys, "plans", "stats", "--store", str(root))
    assert rc == 0 and err == "te-cudnn: warning: not using the plan store X: it is; writable by others\n"


def _cli_process(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "te_cudnn.cli", *argv], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ, **env})  # fmt: skip


@pytest.mark.slow
def test_module_entry_point() -> None:
    proc = _cli_process("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: te-cudnn") and "plans" in proc.stdout and "explain" in proc.stdout
    if importlib.util.find_spec("numpy"):  # numpy is a dependency; without it torch warns at import
        assert proc.stderr == ""


@pytest.mark.slow
def test_python_dash_m_te_cudnn() -> None:
    """``python -m te_cudnn`` is the command line."""
    proc = subprocess.run([sys.executable, "-m", "te_cudnn", "--bogus"], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == "te-cudnn: unrecognized arguments: --bogus (see `te-cudnn --help`)"
    proc = subprocess.run([sys.executable, "-m", "te_cudnn", *EXPLAIN], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "-> F16_arbitrary_seqlen" in proc.stdout


BROKEN_PIPE = [
    ("plans-list", ["-m", "te_cudnn", "plans", "list"]),
    ("bench-list", ["-m", "te_cudnn", "bench", "--list"]),
    ("explain", ["-m", "te_cudnn", *EXPLAIN]),
    ("demo", ["-c", "import sys; from te_cudnn.cli import demo_main; sys.exit(demo_main(['--configs', 'test_0']))"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv", [a for _, a in BROKEN_PIPE], ids=[n for n, _ in BROKEN_PIPE])
def test_closed_pipe_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    """``te-cudnn plans list | head``: the reader is gone before the output is written; the
    command stops without a traceback (exit 141, as a shell reports SIGPIPE, or 0)."""
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[1],
                            env={**os.environ, "TE_CUDNN_PLAN_STORE": str(tmp_path / "store")})  # fmt: skip
    proc.stdout.close()  # before the process writes anything (importing torch takes far longer)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141), err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


@pytest.mark.slow
def test_process_errors_are_one_line_without_traceback(root: Path, tmp_path: Path) -> None:
    """As a user runs it: the plausible mistakes give one line on stderr and a non-zero exit."""
    archive = tmp_path / "plans.tar.gz"
    assert main(["plans", "export", str(archive), "--store", str(root)]) == 0
    cases = [  # a few, each a process start; test_list_dump_wrong_files and others cover the rest in-process
        (("plans", "list", "--dump", str(archive)), 1),
        (("plans", "export", str(tmp_path / "missing" / "x.tar.gz"), "--store", str(root)), 2),
    ]
    for argv, code in cases:
        proc = _cli_process(*argv)
        assert proc.returncode == code, (argv, proc.stderr)
        assert proc.stdout == "", argv
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("te-cudnn"), proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
