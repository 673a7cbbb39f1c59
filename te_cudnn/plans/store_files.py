"""The plan store's access to its files and directories, under its trust rules.

A stored plan is handed to cuDNN's deserializer, so only files that nobody but the user could
have written are read (see ``te_cudnn.plans.store``): directories and files owned by the user
and writable by nobody else (:func:`_dir_problem`, :func:`_ownership_problem`), files opened
without following symbolic links and read up to a size limit (:func:`_read_file`). Also the
small file-system helpers of writing and eviction. Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Iterator, Optional

from .store_format import PlanFileError

__all__ = ["DIR_MODE", "FILE_MODE", "MAX_FILE_BYTES", "MAX_RECORDS_BYTES", "UntrustedStoreError"]

#: The largest plan file that is read (a serialized plan is some 10 KB to 2 MB).
MAX_FILE_BYTES = 64 << 20
#: The largest records file that is read (a record is about a kilobyte).
MAX_RECORDS_BYTES = 1 << 20
DIR_MODE = 0o700
FILE_MODE = 0o600

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


class UntrustedStoreError(PermissionError):
    """The store's directories may not be used (owned by another user, writable by group or
    others, or not directories); the message says why and how to fix it."""

    cause = "untrusted store"


# ----------------------------------------------------------------------------- trust and reading
def _euid() -> Optional[int]:
    return os.geteuid() if hasattr(os, "geteuid") else None


def _ownership_problem(st: os.stat_result) -> Optional[str]:
    """Why a file or directory with this status could hold bytes that someone else wrote."""
    uid = _euid()
    if uid is not None and st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by you (uid {uid})"
    if st.st_mode & 0o022:
        who = {0o020: "group", 0o002: "others", 0o022: "group and others"}[st.st_mode & 0o022]
        return f"writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _dir_problem(d: Path) -> Optional[str]:
    """Why the store may not use directory ``d`` (with the fix), or None (fine, or absent)."""
    try:
        st = os.stat(d)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{d} cannot be inspected ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{d} is not a directory; remove it or point TE_CUDNN_PLAN_STORE elsewhere"
    problem = _ownership_problem(st)
    if problem is None:
        return None
    if problem.startswith("owned"):
        return f"{d} is {problem}; use a store of your own (TE_CUDNN_PLAN_STORE=DIR) or `chown -R` it to yourself"
    return f"{d} is {problem}; fix it with `chmod 700 {d}`"


def _read_file(path: Path, check_owner: bool, limit: Optional[int] = None, what: str = "a plan file") -> bytes:
    """The bytes of a regular file, opened without following links, at most ``limit`` bytes
    (default: MAX_FILE_BYTES); with ``check_owner``, only a file owned by the user and writable
    by nobody else."""
    limit = MAX_FILE_BYTES if limit is None else limit
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            message = "a symbolic link, not a regular file (links are not followed)"
            raise PlanFileError(message, "not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PlanFileError("not a regular file", "not a regular file")
        if check_owner and (problem := _ownership_problem(st)) is not None:
            message = f"it is {problem}; only files that you alone can write are handed to cuDNN"
            raise PlanFileError(message, "untrusted file")
        parts, total = [], 0
        while total <= limit:
            chunk = os.read(fd, max(st.st_size - total, 0) + (1 << 16))
            if not chunk:
                break
            parts.append(chunk)
            total += len(chunk)
        if total > limit:
            raise PlanFileError(f"larger than the limit for {what} ({limit} bytes)", "oversized")
        return b"".join(parts)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _regular_files(d: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Regular files directly in ``d`` (links not followed); unreadable entries are skipped."""
    try:
        it = os.scandir(d)
    except OSError:
        return
    with it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield Path(e.path), st


def _unlink(path: Path) -> bool:
    """Remove a file; True when it is gone (also when another process removed it first)."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:  # e.g. PermissionError: not ours to remove
        return False
