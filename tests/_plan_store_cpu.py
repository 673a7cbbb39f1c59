"""Helpers shared by the CPU plan-store tests: a synthetic "serialized plan", plan keys and their
store descriptions, file modes and leftover temporaries, a warning recorder, a store in
``tmp_path`` (fixture) and a write that fails like a disk filling up."""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest

from te_cudnn.backends import Direction
from te_cudnn.plans import PlanKey
from te_cudnn.plans.store import PlanStore

from _plan_helpers import FACTS, sizes_key

BLOB = bytes(range(256)) * 8  # a synthetic "serialized plan": the store only sees bytes
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def key(direction: Direction = Direction.FWD, **over: Any) -> PlanKey:
    return sizes_key(direction, **over)


def desc(**over: Any) -> dict[str, Any]:
    """A realistic store key, as it reads back from a file's JSON header."""
    return json.loads(json.dumps(key(**over).describe(device=False)))


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


def failing(real, err: int, after: int = 0):
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
