"""``te-cudnn plans list``, ``show``, ``stats`` and ``clear`` on a plan store (given with --store,
TE_CUDNN_PLAN_STORE or the default location), and ``plans list --dump`` on a plan-cache dump,
run in-process; CPU only."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from te_cudnn.backends import Direction
from te_cudnn.cli import main
from te_cudnn.plans import CompiledPlan, PlanCache, PlanKey
from te_cudnn.plans.store import PlanStore

from _cli import blob, entries, make, root, run  # noqa: F401 - root: the fixture
from _plan_helpers import FACTS


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
