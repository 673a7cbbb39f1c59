"""A plan store on disk, so built cuDNN plans outlive the process.

Layout: ``<root>/<fingerprint>/<entry>.plan``. The fingerprint directory is named by a hash
of everything a serialized plan depends on (GPU model and compute capability, cuDNN version,
frontend version, te_cudnn version), and every file repeats the fingerprint and its plan
key in its header, so a mismatched entry is never used. A file is::

    b"TECUDNN-PLAN\\x01" | u32 header length | JSON header | serialized plan

with the plan's SHA-256 in the header. Writes go to a temporary file in the same directory
and are renamed into place (atomic; concurrent writers of one entry simply race to the same
content). Unreadable, truncated, foreign or mismatched files are skipped with a warning and
rebuilt. The total size is bounded; the least recently used entries (by mtime; loads touch
it) are evicted.

Configuration: ``TE_CUDNN_PLAN_STORE`` (a directory, or ``off``; default
``$XDG_CACHE_HOME/te_cudnn/plans``), ``TE_CUDNN_PLAN_STORE_MAX_MB`` (default 512).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

__all__ = ["PlanStore", "StoredPlan", "default_store", "fingerprint_of"]

MAGIC = b"TECUDNN-PLAN\x01"
SUFFIX = ".plan"


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


@dataclass
class StoredPlan:
    path: Path
    header: dict[str, Any]
    blob: bytes


class PlanStore:
    def __init__(self, root: os.PathLike | str, facts: dict[str, Any], max_bytes: int = 512 << 20):
        self.root = Path(root)
        self.facts = _canon(dict(facts))
        self.fingerprint = fingerprint_of(self.facts)
        self.dir = self.root / self.fingerprint
        self.max_bytes = max_bytes

    # ------------------------------------------------------------------ names
    @staticmethod
    def entry_name(key_description: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(_canon(key_description), sort_keys=True).encode()).hexdigest()[:32]

    def path_for(self, key_description: dict[str, Any]) -> Path:
        return self.dir / (self.entry_name(key_description) + SUFFIX)

    # ------------------------------------------------------------------ write
    def save(self, key_description: dict[str, Any], blob: bytes, meta: Optional[dict[str, Any]] = None) -> Path:
        """Write one plan atomically; returns its path."""
        key_description = _canon(key_description)
        header = {
            "key": key_description,
            "facts": self.facts,
            "fingerprint": self.fingerprint,
            "sha256": hashlib.sha256(blob).hexdigest(),
            "size": len(blob),
            "created": time.time(),
            **(meta or {}),
        }
        head = json.dumps(header, sort_keys=True).encode()
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path_for(key_description)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(head)) + head + blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        self.evict()
        return path

    # ------------------------------------------------------------------ read
    @staticmethod
    def read(path: Path) -> StoredPlan:
        """Parse one file; raises ValueError when it is not a whole, intact plan file."""
        with open(path, "rb") as f:
            data = f.read()
        if not data.startswith(MAGIC):
            raise ValueError("not a te_cudnn plan file (bad magic)")
        start = len(MAGIC) + 4
        if len(data) < start:
            raise ValueError("truncated header")
        (n,) = struct.unpack("<I", data[len(MAGIC) : start])
        try:
            header = json.loads(data[start : start + n])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"unreadable header: {exc}") from None
        if not isinstance(header, dict):
            raise ValueError(f"unreadable header: a JSON {type(header).__name__}, not an object")
        blob = data[start + n :]
        if len(blob) != header.get("size") or hashlib.sha256(blob).hexdigest() != header.get("sha256"):
            raise ValueError("plan bytes are truncated or corrupted (size/checksum mismatch)")
        return StoredPlan(Path(path), header, blob)

    def load(self, key_description: dict[str, Any]) -> Optional[StoredPlan]:
        """The stored plan for this key and fingerprint, or None (bad files are skipped)."""
        key_description = _canon(key_description)
        path = self.path_for(key_description)
        try:
            entry = self.read(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            warnings.warn(f"te_cudnn: skipping plan file {path}: {exc}; the plan will be rebuilt", stacklevel=2)
            return None
        h = entry.header
        if h.get("fingerprint") != self.fingerprint or h.get("facts") != self.facts or h.get("key") != key_description:
            warnings.warn(f"te_cudnn: skipping plan file {path}: it was written for another key or machine", stacklevel=2)
            return None
        try:
            os.utime(path)  # least-recently-used eviction follows loads too
        except OSError:
            pass
        return entry

    # ------------------------------------------------------------------ management
    def entries(self, all_fingerprints: bool = False) -> Iterator[Path]:
        base = self.root if all_fingerprints else self.dir
        if not base.exists():
            return iter(())
        pattern = f"*/*{SUFFIX}" if all_fingerprints else f"*{SUFFIX}"
        return (p for p in sorted(base.glob(pattern)) if not p.name.startswith(".tmp-"))

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.entries(all_fingerprints=True) if p.exists())

    def evict(self) -> list[Path]:
        """Remove least-recently-used files (any fingerprint) until the store fits its bound."""
        files = []
        for p in self.entries(all_fingerprints=True):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in files)
        removed = []
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            try:
                p.unlink()
                removed.append(p)
            except FileNotFoundError:
                pass
            total -= size
        return removed

    def clear(self, all_fingerprints: bool = True) -> int:
        n = 0
        for p in list(self.entries(all_fingerprints=all_fingerprints)):
            try:
                p.unlink()
                n += 1
            except FileNotFoundError:
                pass
        return n


def _default_root() -> Optional[Path]:
    setting = os.environ.get("TE_CUDNN_PLAN_STORE", "")
    if setting.lower() in ("off", "0", "none", "false"):
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "te_cudnn" / "plans"


def default_store(facts: dict[str, Any]) -> Optional[PlanStore]:
    """The store for these machine facts, or None when switched off."""
    root = _default_root()
    if root is None:
        return None
    max_mb = int(os.environ.get("TE_CUDNN_PLAN_STORE_MAX_MB", "512"))
    return PlanStore(root, facts, max_bytes=max_mb << 20)
