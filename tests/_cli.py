"""Helpers shared by the ``te-cudnn`` console tool tests: plan keys and synthetic plan bytes, a
store in ``tmp_path`` with four plans (fixture), an in-process run of the tool that returns its
exit code and output, a store's entries by name, and the ``explain`` command line the tests reuse.

The stores are written with ``PlanStore.save``: realistic key descriptions
(``make_key(...).describe()``) and synthetic plan bytes (the store is byte-level).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from te_cudnn.backends import Direction
from te_cudnn.cli import main
from te_cudnn.plans import PlanKey
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


EXPLAIN = ["explain", "--heads", "16", "--sq", "2048", "--d", "128", "--mask", "causal", "--target", "hopper"]
