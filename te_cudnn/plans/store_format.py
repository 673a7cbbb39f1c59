"""The plan store's files: what a plan file and a records file hold, and their names.

A plan file is ``MAGIC | u32 header length | JSON header | serialized plan``, the header
holding the plan's SHA-256 and size (checked by :func:`_parse`), its key and the machine
facts whose :func:`fingerprint_of` names its directory; a records file (``<entry>.records``)
is a JSON document of :data:`RECORDS_FORMAT`. How the store reads, writes, trusts and evicts
these files: ``te_cudnn.plans.store``. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MAGIC", "RECORDS_FORMAT", "RECORDS_SUFFIX", "SUFFIX", "TMP_PREFIX", "PlanFileError", "StoredPlan", "fingerprint_of",
]  # fmt: skip

MAGIC = b"TECUDNN-PLAN\x01"
SUFFIX = ".plan"
#: The records kept beside a plan (``<entry>.records``, JSON).
RECORDS_SUFFIX = ".records"
#: What a records file says it is; a file of another format is skipped.
RECORDS_FORMAT = "te_cudnn-records/1"
TMP_PREFIX = ".tmp-"


class PlanFileError(ValueError):
    """A file that is not a whole, intact plan file that may be read. ``cause`` names the kind
    of problem, so that each kind is reported once."""

    def __init__(self, message: str, cause: str):
        super().__init__(message)
        self.cause = cause


def _canon(value: Any) -> Any:
    """The JSON form of a description (tuples become lists, keys strings), so that what is
    compared after a round trip through a file is what was written. Structural, not a JSON
    round trip: a load pays it once per plan."""
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    return value


def fingerprint_of(facts: dict[str, Any]) -> str:
    """A short, stable name for everything a serialized plan depends on."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]


def _parse(path: Path, data: bytes) -> "StoredPlan":
    if not data.startswith(MAGIC):
        raise PlanFileError("not a te_cudnn plan file (bad magic)", "not a plan file")
    start = len(MAGIC) + 4
    if len(data) < start:
        raise PlanFileError("truncated header", "truncated")
    (n,) = struct.unpack("<I", data[len(MAGIC) : start])
    try:
        header = json.loads(data[start : start + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanFileError(f"unreadable header: {exc}", "unreadable header") from None
    except RecursionError:
        raise PlanFileError("unreadable header: nested too deeply", "unreadable header") from None
    if not isinstance(header, dict):
        raise PlanFileError(f"unreadable header: a JSON {type(header).__name__}, not an object", "unreadable header")
    blob = data[start + n :]
    if len(blob) != header.get("size") or hashlib.sha256(blob).hexdigest() != header.get("sha256"):
        raise PlanFileError("plan bytes are truncated or corrupted (size/checksum mismatch)", "corrupted")
    return StoredPlan(Path(path), header, blob)


def _records_of(plan_path: Path) -> Path:
    """The records file beside a plan file (any other path: itself)."""
    if not plan_path.name.endswith(SUFFIX):
        return plan_path
    return plan_path.with_name(plan_path.name[: -len(SUFFIX)] + RECORDS_SUFFIX)


@dataclass
class StoredPlan:
    path: Path
    header: dict[str, Any]
    blob: bytes
