"""A plan store on disk, so built cuDNN plans outlive the process.

Layout: ``<root>/<fingerprint>/<entry>.plan``. The fingerprint directory is named by a hash
of everything a serialized plan depends on (GPU model, SM count and compute capability, cuDNN,
frontend and te_cudnn versions, :data:`PLAN_FORMAT_VERSION`), and every file repeats the
fingerprint and its plan key in its header, so a mismatched entry is never used. The key holds
no GPU ordinal: the ranks of one node share one file per plan. A file is::

    b"TECUDNN-PLAN\\x01" | u32 header length | JSON header | serialized plan

with the plan's SHA-256 in the header (and, for an autotuned plan, its tuning record under
``"tuning"``: every candidate's time and the choice, see ``te_cudnn.plans.tune``; the record
lives under the fingerprint, so another GPU model or version never sees it). Writes go to a
temporary file in the same directory
and are renamed into place (atomic: concurrent writers of one entry race, and the file is
always one writer's whole file).

Beside a plan, ``<entry>.records`` holds what was checked about its key on this kind of
machine (:meth:`PlanStore.save_record` / :meth:`PlanStore.load_record`): JSON records by kind
and by name, e.g. ``te_cudnn.plans.padded_rows``' verdict per engine configuration. The file repeats
the fingerprint, the facts and the plan key, and is read only where all three match, under
the same ownership rules as plan files. It is written atomically with a read-modify-write (two
processes recording at once may lose one record, which is then checked again). Eviction takes
a plan's records with it; ``te-cudnn plans export`` does not carry them, so plans brought in
from elsewhere are checked again here.

Trust. A stored plan is handed to cuDNN's deserializer, which is not built to take hostile
bytes (and the frontend's python-engine plans carry compiled kernels: native code), so a plan
file is treated like code: only files that nobody but the user could have written are read:

* the store root and the fingerprint directory must be directories owned by the user and not
  writable by group or others (the store creates them 0700, its files 0600, whatever the
  umask); otherwise the store is neither read nor written;
* a file is opened without following symbolic links (``O_NOFOLLOW``) and must be a regular
  file owned by the user, not writable by group or others, of at most :data:`MAX_FILE_BYTES`.

The SHA-256 detects truncation and corruption (integrity), not tampering: whoever can write a
file can write a matching checksum. The ownership checks are what keep other users' bytes
out. Not covered: processes running as the user (or root), the directories above the store
root, and archives brought in with ``te-cudnn plans import`` (trust their source).

Faults never fail a call: a file that is unreadable, truncated, corrupted, foreign, untrusted
or too large is skipped and the plan rebuilt; a store that cannot be written (read-only, disk
full, quota) leaves no partial file. Each kind of problem is reported once per store with a
warning that names the file or directory and the fix (:meth:`PlanStore.warn_once`).

Eviction (:meth:`PlanStore.evict`, after each save) keeps the store within its size bound:
this fingerprint's least recently used files go first (by mtime; loads touch it), then other
fingerprints' files that no process has used for :data:`FOREIGN_GRACE_SECONDS`. Plans of
another GPU model or version that are still in use are never deleted to make room, so the
bound can be exceeded by them. The file just written is kept. Temporary files older than
:data:`STALE_TMP_SECONDS` (writers that were killed) are removed.

Configuration: ``TE_CUDNN_PLAN_STORE`` (a directory, or ``off``; default
``$XDG_CACHE_HOME/te_cudnn/plans``), ``TE_CUDNN_PLAN_STORE_MAX_MB`` (default 512; fractions
allowed). A malformed value is reported once and the default used.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import struct
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

from .store_files import (  # noqa: F401 - also importable from here, as before the split
    _OPEN_FLAGS, DIR_MODE, FILE_MODE, MAX_FILE_BYTES, MAX_RECORDS_BYTES, UntrustedStoreError, _dir_problem, _euid,
    _ownership_problem, _read_file, _regular_files, _unlink, _write_all,
)  # fmt: skip
from .store_format import (  # noqa: F401 - also importable from here, as before the split
    MAGIC, RECORDS_FORMAT, RECORDS_SUFFIX, SUFFIX, TMP_PREFIX, PlanFileError, StoredPlan, _canon, _parse, _records_of,
    fingerprint_of,
)  # fmt: skip

__all__ = [
    "PLAN_FORMAT_VERSION", "MAX_FILE_BYTES", "MAX_RECORDS_BYTES", "RECORDS_FORMAT", "RECORDS_SUFFIX", "PlanFileError",
    "PlanStore", "StoredPlan", "UntrustedStoreError", "default_store", "env_number", "fingerprint_of",
]  # fmt: skip

#: The version of what the graph builders (``te_cudnn/backends/``) put into a plan. It is part
#: of the fingerprint, so bumping it retires every stored plan. Bump it with any change to the
#: builders; ``tests/test_plan_format.py`` fails until it is bumped and its recorded hash updated.
PLAN_FORMAT_VERSION = 6

DEFAULT_MAX_MB = 512
#: A temporary file this old belongs to a writer that was killed: eviction removes it.
STALE_TMP_SECONDS = 3600
#: Another fingerprint's plan unused for this long may be evicted to make room.
FOREIGN_GRACE_SECONDS = 7 * 24 * 3600

_FURTHER = " (further files with this problem are skipped without another warning)"


# ----------------------------------------------------------------------------- environment
_env_warned: set[tuple[str, str]] = set()


def env_number(name: str, default: float, *, integer: bool, what: str) -> float:
    """The positive number in environment variable ``name``, or ``default`` (with one warning
    per variable and value) when it is malformed: a bad setting never breaks an import or a call."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value: float = int(raw) if integer else float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0:
        return value
    if (name, raw) not in _env_warned:
        _env_warned.add((name, raw))
        warnings.warn(f"te_cudnn: {name}={raw!r} is not {what}; using the default {default}", stacklevel=3)
    return default


class PlanStore:
    def __init__(self, root: os.PathLike | str, facts: dict[str, Any], max_bytes: int = DEFAULT_MAX_MB << 20):
        self.root = Path(root)
        self.facts = _canon(dict(facts))
        self.fingerprint = fingerprint_of(self.facts)
        self.dir = self.root / self.fingerprint
        self.max_bytes = max_bytes
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._records_lock = threading.Lock()  # this process's read-modify-write of records files

    # ------------------------------------------------------------------ reporting
    def warn_once(self, cause: str, message: str) -> bool:
        """Warn about ``cause`` unless this store already did; True when it warned. Every
        fault of the store goes through here, so a broken store costs one warning per kind of
        problem, not one per call."""
        with self._lock:
            if cause in self._warned:
                return False
            self._warned.add(cause)
        warnings.warn(message, stacklevel=3)
        return True

    def trust_problem(self) -> Optional[str]:
        """Why this store's directories may not be used, with the fix; None when they may (or
        do not exist yet: :meth:`save` creates them private)."""
        return _dir_problem(self.root) or _dir_problem(self.dir)

    def _untrusted_message(self, problem: str) -> str:
        return (f"te_cudnn: not using the plan store {self.root}: {problem}. Only files that you alone can write are "
                f"handed to cuDNN; plans are built, not loaded or stored, until this is fixed")  # fmt: skip

    # ------------------------------------------------------------------ names
    @staticmethod
    def entry_name(key_description: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(_canon(key_description), sort_keys=True).encode()).hexdigest()[:32]

    def path_for(self, key_description: dict[str, Any]) -> Path:
        return self.dir / (self.entry_name(key_description) + SUFFIX)

    def records_path(self, key_description: dict[str, Any]) -> Path:
        """The file of the records kept beside this key's plan."""
        return self.dir / (self.entry_name(key_description) + RECORDS_SUFFIX)

    # ------------------------------------------------------------------ write
    def _make_dirs(self) -> None:
        """Create the root and fingerprint directories owner-only (whatever the umask) and
        check them; raises UntrustedStoreError when an existing one may not be used."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        for d in (self.root, self.dir):
            try:
                os.mkdir(d, DIR_MODE)
                os.chmod(d, DIR_MODE)  # mkdir's mode is filtered by the umask
            except FileExistsError:
                pass
            problem = _dir_problem(d)
            if problem is not None:
                raise UntrustedStoreError(self._untrusted_message(problem))

    def save(self, key_description: dict[str, Any], blob: bytes, meta: Optional[dict[str, Any]] = None) -> Path:
        """Write one plan atomically (a 0600 file); returns its path. Raises OSError when it
        cannot (UntrustedStoreError for a store that may not be used), leaving no file behind."""
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
        self._make_dirs()
        path = self.path_for(key_description)
        self._write_atomic(path, MAGIC + struct.pack("<I", len(head)) + head + blob)
        self.evict(keep=path)
        return path

    def _write_atomic(self, path: Path, data: bytes) -> None:
        """``data`` into ``path`` (a 0600 file) through a temporary file renamed into place;
        no file is left behind when it fails."""
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=path.suffix, dir=self.dir)
        try:
            os.fchmod(fd, FILE_MODE)  # mkstemp's 0600 is filtered by the umask, too
            _write_all(fd, data)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
        except BaseException:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
            _unlink(Path(tmp))
            raise

    # ------------------------------------------------------------------ records beside a plan
    def save_record(self, key_description: dict[str, Any], kind: str, name: str, record: dict[str, Any]) -> Path:
        """Keep ``record`` (a JSON object) as the record ``name`` of ``kind`` for this key,
        beside its plan, replacing an earlier one of that name; returns the file's path. Raises
        OSError when it cannot (UntrustedStoreError for a store that may not be used)."""
        key_description = _canon(key_description)
        if not isinstance(record, dict):
            raise TypeError(f"a record is a JSON object (dict), got {type(record).__name__}")
        with self._records_lock:
            records = self._read_records(key_description)
            records.setdefault(str(kind), {})[str(name)] = _canon(record)
            doc = {"format": RECORDS_FORMAT, "key": key_description, "facts": self.facts,
                   "fingerprint": self.fingerprint, "records": records}  # fmt: skip
            data = json.dumps(doc, sort_keys=True).encode()
            self._make_dirs()
            path = self.records_path(key_description)
            self._write_atomic(path, data)
        return path

    def load_records(self, key_description: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
        """The records of ``kind`` kept for this key, by name ({} when there are none). Bad,
        foreign and untrusted files are skipped (warned once per cause); never raises for the
        store's contents."""
        return self._read_records(_canon(key_description)).get(str(kind), {})

    def load_record(self, key_description: dict[str, Any], kind: str, name: str) -> Optional[dict[str, Any]]:
        """The record ``name`` of ``kind`` kept for this key, or None."""
        return self.load_records(key_description, kind).get(str(name))

    def _read_records(self, key_description: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
        """Every record of this key by kind and name; {} when the file is absent or skipped."""
        path = self.records_path(key_description)
        problem = self.trust_problem()
        if problem is not None:
            self.warn_once(UntrustedStoreError.cause, self._untrusted_message(problem))
            return {}

        def skipped(why: object) -> str:
            return f"te_cudnn: skipping records file {path}: {why}; what it records will be checked again{_FURTHER}"

        try:
            data = _read_file(path, check_owner=True, limit=MAX_RECORDS_BYTES, what="a records file")
        except FileNotFoundError:
            return {}
        except PlanFileError as exc:
            self.warn_once(f"records:{exc.cause}", skipped(exc))
            return {}
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            self.warn_once(f"records-read:{name}", skipped(f"{exc.strerror or exc} ({name})"))
            return {}
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            self.warn_once("records:unreadable", skipped(f"unreadable ({type(exc).__name__})"))
            return {}
        if (not isinstance(doc, dict) or doc.get("format") != RECORDS_FORMAT or doc.get("fingerprint") != self.fingerprint
                or doc.get("facts") != self.facts or doc.get("key") != key_description):  # fmt: skip
            self.warn_once("records:foreign", skipped("it was written for another key, machine or format"))
            return {}
        records = doc.get("records")
        if not isinstance(records, dict):
            return {}
        try:
            os.utime(path, follow_symlinks=False)  # eviction follows use, as for plans
        except (OSError, NotImplementedError):
            pass
        return {str(kind): {str(n): r for n, r in named.items() if isinstance(r, dict)}
                for kind, named in records.items() if isinstance(named, dict)}  # fmt: skip

    # ------------------------------------------------------------------ read
    @staticmethod
    def read(path: os.PathLike | str) -> StoredPlan:
        """Parse one file; raises PlanFileError (a ValueError) when it is not a whole, intact
        plan file of at most MAX_FILE_BYTES (symbolic links are not followed), OSError when it
        cannot be opened. Ownership is not checked here (:meth:`load` checks it)."""
        return _parse(Path(path), _read_file(Path(path), check_owner=False))

    def load(self, key_description: dict[str, Any]) -> Optional[StoredPlan]:
        """The stored plan for this key and fingerprint, or None. Bad, foreign and untrusted
        files are skipped (warned once per cause); never raises for the store's contents."""
        key_description = _canon(key_description)
        path = self.path_for(key_description)
        problem = self.trust_problem()
        if problem is not None:
            self.warn_once(UntrustedStoreError.cause, self._untrusted_message(problem))
            return None
        try:
            entry = _parse(path, _read_file(path, check_owner=True))
        except FileNotFoundError:
            return None
        except PlanFileError as exc:
            then = "the plan will be rebuilt" + (" and the file replaced" if exc.cause == "untrusted file" else "")
            self.warn_once(exc.cause, f"te_cudnn: skipping plan file {path}: {exc}; {then}{_FURTHER}")
            return None
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            self.warn_once(f"read:{name}", f"te_cudnn: skipping plan file {path}: {exc.strerror or exc} ({name}); "
                                           f"the plan will be rebuilt{_FURTHER}")  # fmt: skip
            return None
        h = entry.header
        if h.get("fingerprint") != self.fingerprint or h.get("facts") != self.facts or h.get("key") != key_description:
            self.warn_once("foreign", f"te_cudnn: skipping plan file {path}: it was written for another key or machine; "
                                      f"the plan will be rebuilt{_FURTHER}")  # fmt: skip
            return None
        try:
            os.utime(path, follow_symlinks=False)  # least-recently-used eviction follows loads too
        except (OSError, NotImplementedError):
            pass
        return entry

    # ------------------------------------------------------------------ management
    def entries(self, all_fingerprints: bool = False) -> Iterator[Path]:
        base = self.root if all_fingerprints else self.dir
        if not base.exists():
            return iter(())
        pattern = f"*/*{SUFFIX}" if all_fingerprints else f"*{SUFFIX}"
        return (p for p in sorted(base.glob(pattern)) if not p.name.startswith(TMP_PREFIX))

    def total_bytes(self) -> int:
        total = 0
        for p in self.entries(all_fingerprints=True):
            try:
                total += p.lstat().st_size
            except OSError:
                pass
        return total

    def _fingerprint_dirs(self) -> list[Path]:
        try:
            with os.scandir(self.root) as it:
                return [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            return []

    def evict(self, keep: Optional[Path] = None, now: Optional[float] = None) -> list[Path]:
        """Bring the store within ``max_bytes``; returns the files removed (plans and records).

        Victims, least recently used first: this fingerprint's files (except ``keep``, the file
        just written, and its records), then other fingerprints' files unused for
        FOREIGN_GRACE_SECONDS; a plan takes its records with it. Each file is removed on its
        own: one that cannot be (PermissionError, ...) is passed over. Temporary files of
        killed writers (older than STALE_TMP_SECONDS) are removed first."""
        now = time.time() if now is None else now
        own: list[tuple[float, int, Path]] = []
        foreign: list[tuple[float, int, Path]] = []
        for d in self._fingerprint_dirs():
            for p, st in _regular_files(d):
                if p.name.startswith(TMP_PREFIX):
                    if now - st.st_mtime > STALE_TMP_SECONDS:
                        _unlink(p)
                    continue
                if p.name.endswith(SUFFIX) or p.name.endswith(RECORDS_SUFFIX):
                    (own if d == self.dir else foreign).append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in own) + sum(size for _, size, _ in foreign)
        if total <= self.max_bytes:
            return []
        sizes = {p: size for _, size, p in own + foreign}
        spared = set() if keep is None else {keep, _records_of(keep)}
        victims = sorted(f for f in own if f[2] not in spared)
        victims += sorted(f for f in foreign if now - f[0] > FOREIGN_GRACE_SECONDS)
        removed: list[Path] = []
        gone: set[Path] = set()
        for _, size, p in victims:
            if total <= self.max_bytes:
                break
            if p in gone:
                continue
            if _unlink(p):
                removed.append(p)
                gone.add(p)
                total -= size
                records = _records_of(p)
                if records in sizes and records not in gone and _unlink(records):
                    removed.append(records)
                    gone.add(records)
                    total -= sizes[records]
        return removed

    def clear(self, all_fingerprints: bool = True) -> int:
        """Remove the plans (of every fingerprint, or of this one) and the records beside
        them; returns how many plans were removed."""
        n = 0
        for p in list(self.entries(all_fingerprints=all_fingerprints)):
            try:
                p.unlink()
                n += 1
            except FileNotFoundError:
                pass
        base = self.root if all_fingerprints else self.dir
        if base.exists():
            for p in sorted(base.glob(f"*/*{RECORDS_SUFFIX}" if all_fingerprints else f"*{RECORDS_SUFFIX}")):
                if not p.name.startswith(TMP_PREFIX):
                    _unlink(p)
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
    max_mb = env_number("TE_CUDNN_PLAN_STORE_MAX_MB", DEFAULT_MAX_MB, integer=False,
                        what="a positive number of megabytes")
    return PlanStore(root, facts, max_bytes=int(max_mb * (1 << 20)))
