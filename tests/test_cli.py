"""The ``te-cudnn`` console tool (``te_cudnn.cli``), run in-process; CPU only.

The stores are written by the tests with ``PlanStore.save``: realistic key descriptions
(``make_key(...).describe()``) and synthetic plan bytes (the store is byte-level).
"""

from __future__ import annotations

import io
import json
import os
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
    assert lines[0].split()[:4] == ["entry", "backend", "direction", "layout"]
    assert len(lines) == 1 + 4
    assert sum("F16_arbitrary_seqlen" in line for line in lines) == 4
    assert "sbhd_sbhd_sbhd" in out and "bshd_bshd_bshd" in out and "eng0_k9" in out
    assert "b=2 h=16/16 sq=512 skv=512 d=64" in out


def test_list_json(capsys, root: Path) -> None:
    rc, out, _ = run(capsys, "plans", "list", "--store", str(root), "--json")
    assert rc == 0
    rows = json.loads(out)
    assert {r["entry"] for r in rows} == {p.stem for p in root.glob("*/*.plan")}
    assert sorted(r["direction"] for r in rows) == ["bwd", "fwd", "fwd", "fwd"]
    assert {r["layout"] for r in rows} == {"bshd_bshd_bshd", "sbhd_sbhd_sbhd"}
    assert {r["cudnn"] for r in rows} == {91900, 91800}
    assert all(r["backend"] == "F16_arbitrary_seqlen" and r["plan"] == "eng0_k9" and r["build_ms"] == 120.5 for r in rows)
    assert all(r["gpu"] == FACTS["gpu"] and r["bytes"] > 300 for r in rows)


def test_list_empty_store(capsys, tmp_path: Path) -> None:
    rc, out, _ = run(capsys, "plans", "list", "--store", str(tmp_path / "nothing"))
    assert rc == 0 and out.strip() == "(no plans)"
    rc, out, _ = run(capsys, "plans", "list", "--store", str(tmp_path / "nothing"), "--json")
    assert rc == 0 and json.loads(out) == []


def test_store_from_environment(capsys, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(root))
    rc, out, _ = run(capsys, "plans", "list", "--json")
    assert rc == 0 and len(json.loads(out)) == 4
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", "off")
    with pytest.raises(SystemExit, match="switched off"):
        main(["plans", "list"])


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
    assert rc == 1 and out == "" and "no single stored plan matches 'zzzz'" in err
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
                     "by_backend": {"F16_arbitrary_seqlen": 4}}  # fmt: skip

    bad = root / PlanStore(root, FACTS).fingerprint / ("0" * 32 + ".plan")
    bad.write_bytes(b"not a plan at all")
    rc, out, _ = run(capsys, "plans", "stats", "--store", str(root), "--json")
    stats = json.loads(out)
    assert rc == 0 and stats["plans"] == 5 and stats["unreadable"] == 1
    assert stats["bytes"] == sum(p.stat().st_size for p in files) + bad.stat().st_size
    rc, out, _ = run(capsys, "plans", "stats", "--store", str(root))
    assert rc == 0 and "plans: 5" in out and "unreadable: 1" in out
    rc, out, _ = run(capsys, "plans", "list", "--store", str(root), "--json")
    (row,) = [r for r in json.loads(out) if "error" in r]
    assert row["entry"] == "0" * 32 and "bad magic" in row["error"]


# ----------------------------------------------------------------------------- plans clear
def test_clear_needs_yes(capsys, root: Path) -> None:
    before = entries(root)
    rc, out, err = run(capsys, "plans", "clear", "--store", str(root))
    assert rc == 2 and "--yes" in err and entries(root) == before
    rc, out, _ = run(capsys, "plans", "clear", "--store", str(root), "--yes", "--json")
    assert rc == 0 and json.loads(out) == {"removed": 4}
    assert entries(root) == {}
    rc, out, _ = run(capsys, "plans", "clear", "--store", str(root), "--yes")
    assert rc == 0 and out.startswith("removed 0 plan(s)")


# ----------------------------------------------------------------------------- export / import
def test_export_import_round_trip(capsys, root: Path, tmp_path: Path) -> None:
    archive = tmp_path / "plans.tar.gz"
    rc, out, _ = run(capsys, "plans", "export", str(archive), "--store", str(root), "--json")
    assert rc == 0 and json.loads(out) == {"exported": 4, "file": str(archive)}
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == sorted(entries(root))

    fresh = tmp_path / "fresh"
    rc, out, _ = run(capsys, "plans", "import", str(archive), "--store", str(fresh), "--json")
    assert rc == 0 and json.loads(out) == {"imported": 4, "skipped": []}
    assert entries(fresh) == entries(root)
    assert not [p for p in fresh.rglob("*") if p.name.startswith(".tmp-")]
    assert PlanStore(fresh, FACTS).load(json.loads(json.dumps(make(Direction.BWD).describe()))).blob == blob(2)


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_import_skips_bad_members(capsys, root: Path, tmp_path: Path) -> None:
    good_path = next(iter(sorted(root.glob("*/*.plan"))))
    good = good_path.read_bytes()
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        _member(tar, f"{good_path.parent.name}/{good_path.name}", good)
        _member(tar, "../escaped.plan", good)  # path traversal
        _member(tar, "fp/../../escaped2.plan", good)
        _member(tar, "fp/corrupt.plan", good[:-1])  # not an intact plan file
        _member(tar, "fp/garbage.plan", b"garbage")
        _member(tar, "fp/readme.txt", good)  # not a .plan
        _member(tar, "a/b/deep.plan", good)  # not <fingerprint>/<entry>.plan
        _member(tar, "top.plan", good)
        link = tarfile.TarInfo("fp/link.plan")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    fresh = tmp_path / "fresh"
    rc, out, _ = run(capsys, "plans", "import", str(archive), "--store", str(fresh), "--json")
    assert rc == 0
    result = json.loads(out)
    assert result["imported"] == 1
    assert sorted(result["skipped"]) == sorted(["../escaped.plan", "fp/../../escaped2.plan", "fp/corrupt.plan",
                                                "fp/garbage.plan", "fp/readme.txt", "a/b/deep.plan", "top.plan",
                                                "fp/link.plan"])  # fmt: skip
    assert entries(fresh) == {f"{good_path.parent.name}/{good_path.name}": good}
    assert not (tmp_path / "escaped.plan").exists() and not (tmp_path / "escaped2.plan").exists()
    assert [p.name for p in fresh.rglob("*") if p.is_file()] == [good_path.name]  # no temporaries, no junk


def test_import_unreadable_archive(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"this is not a tar file")
    rc, _, err = run(capsys, "plans", "import", str(bad), "--store", str(tmp_path / "s"))
    assert rc == 1 and "cannot read" in err
    rc, _, err = run(capsys, "plans", "import", str(tmp_path / "missing.tar.gz"), "--store", str(tmp_path / "s"))
    assert rc == 1 and "cannot read" in err


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
    assert rc == 1 and "cannot read dump" in err
    (tmp_path / "bad.json").write_text("{not json")
    rc, _, err = run(capsys, "plans", "list", "--dump", str(tmp_path / "bad.json"))
    assert rc == 1 and "cannot read dump" in err


# ----------------------------------------------------------------------------- explain
EXPLAIN = ["explain", "--heads", "16", "--sq", "2048", "--d", "128", "--mask", "causal", "--target", "hopper"]


def test_explain_supported(capsys) -> None:
    rc, out, _ = run(capsys, *EXPLAIN)
    assert rc == 0
    assert "-> F16_arbitrary_seqlen" in out and "F16_max512_seqlen: declined" in out
    rc, out, _ = run(capsys, *EXPLAIN, "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["backend"] == "F16_arbitrary_seqlen"
    assert set(data) == {"backend", "reasons", "config", "env"}
    assert "sm90" in data["env"] and "sq=2048" in data["config"]


def test_explain_unsupported(capsys) -> None:
    rc, out, _ = run(capsys, *EXPLAIN, "--bias", "pre_scale_bias")
    assert rc == 1 and "No_Backend" in out and "pre_scale_bias" in out
    rc, out, _ = run(capsys, *EXPLAIN, "--bias", "pre_scale_bias", "--json")
    assert rc == 1 and json.loads(out)["backend"] == "No_Backend"


def test_explain_bad_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--sq", "2048", "--d", "128"])  # --heads is required
    assert exc.value.code == 2
    assert "--heads" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([*EXPLAIN[:-2], "--target", "ampere"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--heads", "many", "--sq", "2048", "--d", "128"])
    assert exc.value.code == 2
    capsys.readouterr()
    rc, _, err = run(capsys, *EXPLAIN, "--dtype", "notadtype")  # checked by the command, not argparse
    assert rc == 2 and "is not a torch dtype" in err
    rc, _, err = run(capsys, *EXPLAIN, "--dtype", "Tensor")  # an attribute of torch that is not a dtype
    assert rc == 2 and "is not a torch dtype" in err


# ----------------------------------------------------------------------------- plans warm
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_warm_needs_cuda(capsys, tmp_path: Path) -> None:
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps([{"b": 1, "h": 4, "sq": 128, "d": 64, "mask": "causal"}]))
    rc, _, err = run(capsys, "plans", "warm", str(configs), "--store", str(tmp_path / "s"))
    assert rc == 1 and "needs a CUDA device" in err
    assert not (tmp_path / "s").exists()


def test_warm_unreadable_configs(capsys, tmp_path: Path) -> None:
    rc, _, err = run(capsys, "plans", "warm", str(tmp_path / "missing.json"))
    assert rc == 2 and "cannot read" in err


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
    capsys.readouterr()


def test_every_subcommand_has_common_options() -> None:
    parser = build_parser()
    for argv in (["plans", "list"], ["plans", "stats"], ["plans", "clear"], ["plans", "show", "x"],
                 ["plans", "export", "f"], ["plans", "import", "f"], ["plans", "warm", "c.json"], EXPLAIN):  # fmt: skip
        args = parser.parse_args([*argv, "--store", "/somewhere", "--json"])
        assert args.store == "/somewhere" and args.json is True and callable(args.func)


def test_module_entry_point() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "te_cudnn.cli", "--help"], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1], env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: te-cudnn") and "plans" in proc.stdout and "explain" in proc.stdout


def test_import_skips_absolute_member_paths(tmp_path, capsys) -> None:
    """A member named '/x.plan' must never be written outside the store."""
    import io
    import tarfile

    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"not even a plan"
        info = tarfile.TarInfo("/x.plan")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    from te_cudnn.cli import main

    assert main(["plans", "import", str(archive), "--store", str(tmp_path / "store"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["imported"] == 0 and out["skipped"]
