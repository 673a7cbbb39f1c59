"""Stored plans must never outlive the graph builders that made them.

The plan store's fingerprint holds ``PLAN_FORMAT_VERSION``; a process only loads plans stored
under its own fingerprint. Any change to ``te_cudnn/backends/`` may change the graphs (and so
what a stored plan computes, or which operands it binds), so it must come with a bump of
``PLAN_FORMAT_VERSION``, which retires every stored plan (each is rebuilt once). This test
records the builders' hash next to the version it was taken for and fails when the code
changed but the version did not.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from te_cudnn.plans.store import PLAN_FORMAT_VERSION

BACKENDS = Path(__file__).resolve().parents[1] / "te_cudnn" / "backends"

#: (PLAN_FORMAT_VERSION, SHA-256 of te_cudnn/backends/*.py) -- update both together.
RECORDED = (6, "2b42a2410e9daa3b08bc45ec6fbfa1824c209657b4087ac5ff11764c6c7dd2a0")


def builders_hash() -> str:
    """SHA-256 over every ``te_cudnn/backends/*.py``, by name, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(BACKENDS.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def test_builders_hashed() -> None:
    names = sorted(p.name for p in BACKENDS.glob("*.py"))
    assert {"base.py", "f16_arbitrary.py", "f16_max512.py", "fp8.py"} <= set(names)
    assert re.fullmatch(r"[0-9a-f]{64}", builders_hash())


def test_builders_hash_follows_every_source_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash reads every builder file: an edit of one byte of any of them, a renamed file and
    a new file each change it, and restoring the sources restores it."""
    copy = tmp_path / "backends"
    shutil.copytree(BACKENDS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    original = builders_hash()
    monkeypatch.setattr(sys.modules[__name__], "BACKENDS", copy)
    assert builders_hash() == original  # the copy hashes as the sources do
    seen = {original}
    for path in sorted(copy.glob("*.py")):
        source = path.read_bytes()
        path.write_bytes(source.replace(b"cfg.", b"cfg .", 1) if b"cfg." in source else source + b"\n")
        changed = builders_hash()
        assert changed not in seen, f"editing {path.name} did not change the builders' hash"
        seen.add(changed)
        path.write_bytes(source)
        assert builders_hash() == original, f"restoring {path.name} did not restore the hash"
    (copy / "fp8.py").rename(copy / "fp8_renamed.py")
    assert builders_hash() not in seen, "renaming a builder file did not change the hash"
    (copy / "fp8_renamed.py").rename(copy / "fp8.py")
    (copy / "new_backend.py").write_text("")
    assert builders_hash() not in seen, "a new (even empty) builder file did not change the hash"


def test_builders_hash_is_the_same_in_another_interpreter() -> None:
    """The recorded hash is compared across processes and machines: two fresh interpreters with
    different hash seeds compute the value this one does (no dependence on set or dict order)."""
    script = "\n".join(["import hashlib", "from pathlib import Path", f"BACKENDS = Path({str(BACKENDS)!r})",
                        textwrap.dedent(inspect.getsource(builders_hash)), "print(builders_hash())"])  # fmt: skip
    results = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        results.append(done.stdout.strip())
    assert results == [builders_hash()] * 2


def test_plan_format_version_follows_the_builders() -> None:
    version, recorded = RECORDED
    current = builders_hash()
    how = (f"Set PLAN_FORMAT_VERSION = {version + 1} in te_cudnn/plans/store.py and "
           f"RECORDED = ({version + 1}, \"{current}\") in tests/test_plan_format.py")  # fmt: skip
    assert version == PLAN_FORMAT_VERSION, (
        f"PLAN_FORMAT_VERSION is {PLAN_FORMAT_VERSION} but tests/test_plan_format.py records {version}: "
        f"record the version together with the builders' hash, RECORDED = ({PLAN_FORMAT_VERSION}, \"{current}\")"
    )
    assert current == recorded, (
        f"te_cudnn/backends/ changed (SHA-256 {current}, recorded {recorded} for plan format {version}) without a "
        f"bump of the plan format: plans stored by the old builders would still be loaded. {how}."
    )
