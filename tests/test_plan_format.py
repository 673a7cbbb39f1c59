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
from pathlib import Path

from te_cudnn.plans.store import PLAN_FORMAT_VERSION

BACKENDS = Path(__file__).resolve().parents[1] / "te_cudnn" / "backends"

#: (PLAN_FORMAT_VERSION, SHA-256 of te_cudnn/backends/*.py) -- update both together.
RECORDED = (2, "475684f265a7ce3ba86721e33c12d4ae6a8080bb04664e19ccd8a00ca190c2a1")


def builders_hash() -> str:
    """SHA-256 over every ``te_cudnn/backends/*.py``, by name, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(BACKENDS.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def test_builders_hashed() -> None:
    names = sorted(p.name for p in BACKENDS.glob("*.py"))
    assert {"base.py", "f16_arbitrary.py", "f16_max512.py", "fp8.py"} <= set(names)
    assert len(builders_hash()) == 64 and builders_hash() == builders_hash()


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
