"""``te-cudnn plans list / show / stats / clear / export / import``: reading and writing the plan
store. An import takes only intact plan files named ``<fingerprint>/<entry>.plan`` and writes
nothing outside the store."""

from __future__ import annotations

import json
import os
import re
import stat
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from ..plans.store import SUFFIX, PlanStore, _default_root
from ..plans.tune import format_record, valid_record
from .common import EXIT_FAILED, EXIT_USAGE, CliError, emit, one_line

__all__ = ["MAX_IMPORT_MEMBER_BYTES", "cmd_list", "cmd_show", "cmd_stats", "cmd_clear", "cmd_export", "cmd_import"]

#: The largest member ``plans import`` accepts. Serialized cuDNN plans are kilobytes to a few
#: MiB; a bigger member is not a plan, and reading it would only fill memory.
MAX_IMPORT_MEMBER_BYTES = 64 << 20
#: Fingerprint directories and entry names: hex digests today; no dots, no separators ever.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")


# ----------------------------------------------------------------------------- the store
def _root(args) -> Path:
    root = Path(args.store).expanduser() if args.store else _default_root()
    if root is None:
        raise CliError("the plan store is switched off (TE_CUDNN_PLAN_STORE=off); pass --store DIR", EXIT_USAGE)
    return root


def _store(args) -> PlanStore:
    return PlanStore(_root(args), facts={})  # facts unknown here: the CLI reads every fingerprint


def _store_line(args, root: Path) -> str:
    """Where the store is, how it was chosen, and whether it exists yet."""
    if args.store:
        how = "--store"
    elif os.environ.get("TE_CUDNN_PLAN_STORE"):
        how = "TE_CUDNN_PLAN_STORE"
    else:
        how = "default; set TE_CUDNN_PLAN_STORE to move it"
    exists = "" if root.exists() else "; does not exist yet: the first plan built on a GPU creates it"
    return f"store: {root} ({how}{exists})"


def _rows(store: PlanStore) -> list[dict[str, Any]]:
    rows = []
    for path in store.entries(all_fingerprints=True):
        try:
            st = path.stat()
        except FileNotFoundError:  # evicted or cleared by another process meanwhile
            continue
        row: dict[str, Any] = {"entry": path.stem, "fingerprint": path.parent.name, "bytes": st.st_size,
                               "last_used": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime))}  # fmt: skip
        try:
            entry = PlanStore.read(path)
        except (OSError, ValueError) as exc:
            rows.append({**row, "error": one_line(exc)})
            continue
        k, f = entry.header.get("key", {}), entry.header.get("facts", {})
        k, f = (k if isinstance(k, dict) else {}), (f if isinstance(f, dict) else {})
        rows.append({
            **row, "backend": k.get("backend"), "direction": k.get("direction"), "layout": k.get("layout"),
            "dtype": k.get("dtype"),
            "shape": f"b={k.get('b')} h={k.get('h')}/{k.get('hg')} sq={k.get('sq')} skv={k.get('skv')} d={k.get('d_qk')}",
            "mask": k.get("mask"), "plan": entry.header.get("plan_name"), "build_ms": entry.header.get("build_ms"),
            "gpu": f.get("gpu"), "cudnn": f.get("cudnn"), "tuned": _tuned_cell(entry.header.get("tuning")),
        })  # fmt: skip
    return rows


def _tuned_cell(record: Any) -> str:
    """``plans list``'s "tuned" column: the speed-up over the heuristic plan, or "-"."""
    if not valid_record(record):
        return "-"
    speedup = record.get("speedup")
    return f"{speedup:.2f}x" if isinstance(speedup, (int, float)) else "yes"


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    if not rows:
        return "(no plans)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plans list / show / stats / clear
def _read_dump(name: str) -> dict[str, Any]:
    """The JSON of ``plan_cache.dump()``, or a ``CliError`` saying what the file is instead."""
    try:
        data = Path(name).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read dump {name}: {exc.strerror or exc}") from None
    if data[:2] == b"\x1f\x8b" or data[257:262] == b"ustar":
        raise CliError(
            f"cannot read dump {name}: it is a (gzip) tar archive, such as `plans export` writes, not the JSON of "
            f"plan_cache.dump(); add its plans to a store with `te-cudnn plans import {name}`"
        )
    try:
        dump = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CliError(f"cannot read dump {name}: not JSON text ({exc})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("plans"), list):
        got = f"a JSON {type(dump).__name__}" if not isinstance(dump, dict) else "an object without a 'plans' list"
        raise CliError(f"cannot read dump {name}: plan_cache.dump() writes an object with a 'plans' list, got {got}")
    for i, p in enumerate(dump["plans"]):
        if not isinstance(p, dict) or not isinstance(p.get("key"), dict):
            raise CliError(f"cannot read dump {name}: plan {i} is not an object with a 'key' object")
    return dump


def _dump_rows(dump: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for p in dump["plans"]:
        k = p["key"]
        rows.append({
            "backend": k.get("backend"), "direction": k.get("direction"), "layout": k.get("layout"),
            "shape": f"b={k.get('b')} h={k.get('h')} sq={k.get('sq')} d={k.get('d_qk')}", "mask": k.get("mask"),
            "plan": p.get("plan_name"), "source": p.get("source"), "hits": p.get("hits"),
            "build_ms": p.get("build_ms"), "workspace": p.get("workspace_bytes"),
        })  # fmt: skip
    return rows


def cmd_list(args) -> int:
    if args.dump:
        dump = _read_dump(args.dump)
        cols = ["backend", "direction", "layout", "shape", "mask", "plan", "source", "hits", "build_ms", "workspace"]
        emit(args, dump, _table(_dump_rows(dump), cols) + f"\ntotals: {dump.get('stats')}")
        return 0
    root = _root(args)
    rows = _rows(PlanStore(root, facts={}))
    cols = ["entry", "backend", "direction", "layout", "dtype", "shape", "mask", "plan", "tuned", "build_ms", "bytes",
            "last_used"]
    emit(args, {"store": str(root), "plans": rows}, _store_line(args, root) + "\n" + _table(rows, cols))
    return 0


def _find(store: PlanStore, prefix: str) -> Optional[Path]:
    hits = [p for p in store.entries(all_fingerprints=True) if p.stem.startswith(prefix)]
    return hits[0] if len(hits) == 1 else None


def cmd_show(args) -> int:
    store = _store(args)
    path = _find(store, args.entry)
    if path is None:
        raise CliError(f"no single stored plan matches {args.entry!r} in {store.root}")
    try:
        header = PlanStore.read(path).header
    except (OSError, ValueError) as exc:
        raise CliError(f"{path}: {one_line(exc)}") from None
    key = header.get("key") if isinstance(header.get("key"), dict) else {}
    text = "\n".join(f"{k}: {v}" for k, v in sorted(key.items()))
    text += "\n" + "\n".join(f"{k}: {v}" for k, v in sorted(header.items()) if k not in ("key", "tuning"))
    if "tuning" in header:  # autotuned: the choice and every candidate's time
        text += "\n" + format_record(header["tuning"])
    emit(args, header, f"{path}\n{text}")
    return 0


def cmd_stats(args) -> int:
    root = _root(args)
    rows = _rows(PlanStore(root, facts={}))
    stats = {
        "plans": len(rows), "bytes": sum(r["bytes"] for r in rows), "unreadable": sum("error" in r for r in rows),
        "fingerprints": len({r["fingerprint"] for r in rows}),
        "by_backend": {b: sum(str(r.get("backend")) == b for r in rows) for b in sorted({str(r.get("backend")) for r in rows})},
    }  # fmt: skip
    text = _store_line(args, root) + "\n" + "\n".join(f"{k}: {v}" for k, v in stats.items())
    emit(args, {"store": str(root), **stats}, text)
    return 0


def cmd_clear(args) -> int:
    store = _store(args)
    if not args.yes:
        raise CliError(f"refusing to delete the plans in {store.root} without --yes", EXIT_USAGE)
    n = store.clear(all_fingerprints=True)
    emit(args, {"removed": n, "store": str(store.root)}, f"removed {n} plan(s) from {store.root}")
    return 0


# ----------------------------------------------------------------------------- export / import
def cmd_export(args) -> int:
    store = _store(args)
    dest = Path(args.file).expanduser()
    if not dest.parent.is_dir():
        raise CliError(f"cannot write {args.file}: directory {dest.parent} does not exist", EXIT_USAGE)
    paths = [p for p in store.entries(all_fingerprints=True) if not p.is_symlink()]
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:  # written beside the destination and renamed: a failed export leaves no half archive
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
            for p in paths:
                tar.add(p, arcname=f"{p.parent.name}/{p.name}", recursive=False)
        os.replace(tmp, dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CliError(f"cannot write {args.file}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    emit(args, {"exported": len(paths), "file": args.file, "store": str(store.root)},
          f"exported {len(paths)} plan(s) from {store.root} to {args.file}")  # fmt: skip
    return 0


def _member_parts(name: str) -> list[str]:
    """A member name's components, without the empty and ``.`` ones (``./fp/x.plan`` of a
    hand-made archive is ``fp/x.plan``)."""
    return [p for p in name.split("/") if p not in ("", ".")]


def _too_big() -> str:
    n = MAX_IMPORT_MEMBER_BYTES
    return f"larger than {n >> 20} MiB" if n % (1 << 20) == 0 else f"larger than {n} bytes"


def _refusal(member: tarfile.TarInfo) -> Optional[str]:
    """Why an archive member may not enter the store (None: it may, once its bytes check out).
    Only regular files named ``<fingerprint>/<entry>.plan`` of plain names are taken; the
    destination is built from those two names, so it is always inside the store."""
    if member.issym():
        return "symbolic link"
    if member.islnk():
        return "hard link"
    if member.ischr() or member.isblk() or member.isfifo():
        return "device or fifo"
    if member.isdir():
        return "directory"
    if not member.isfile():
        return "not a regular file"
    name = member.name
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        return "absolute path"
    if ".." in name.split("/") or ".." in name.split("\\"):
        return "'..' in path"
    parts = _member_parts(name)
    if (len(parts) != 2 or not _SAFE_NAME.fullmatch(parts[0]) or not parts[1].endswith(SUFFIX)
            or not _SAFE_NAME.fullmatch(parts[1][: -len(SUFFIX)])):  # fmt: skip
        return f"not named <fingerprint>/<entry>{SUFFIX}"
    if member.size > MAX_IMPORT_MEMBER_BYTES:
        return _too_big()
    return None


def _private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents owner-only (0700); existing ones stay as they are."""
    missing = []
    p = path
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:  # created by a concurrent import or process meanwhile
            continue
        os.chmod(d, 0o700)  # the umask may have taken bits; it never adds any


def _folder_problem(folder: Path) -> Optional[str]:
    """A fingerprint directory the store would not read (a link, not ours, writable by others)
    takes no imported file."""
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        return "its fingerprint directory in the store is a link or not a directory"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid() or st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        return f"its fingerprint directory in the store is not private (mode {mode:04o}, uid {st.st_uid})"
    return None


def _stored_name_matches(header: dict[str, Any], fingerprint: str, entry: str) -> Optional[str]:
    """A plan file must sit where the store would put it: its fingerprint's directory, named
    by its key. Otherwise it is dead weight (never loaded) or planted under another name."""
    if header.get("fingerprint") != fingerprint:
        return "fingerprint in the header differs from its directory"
    try:
        expected = PlanStore.entry_name(header.get("key"))
    except Exception:  # noqa: BLE001 - a crafted key may break hashing in any way
        return "not an intact plan file"
    return None if expected == entry else "entry name differs from its key's"


def _import_member(tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path) -> Optional[str]:
    """Write one checked member into ``root`` (the resolved store root); the refusal reason or
    None. The bytes are checked in a temporary file in the root first, so that a refused member
    leaves nothing behind, not even its fingerprint directory."""
    fingerprint, filename = _member_parts(member.name)
    f = tar.extractfile(member)
    data = f.read(MAX_IMPORT_MEMBER_BYTES + 1) if f is not None else b""
    if len(data) > MAX_IMPORT_MEMBER_BYTES:
        return _too_big()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=root)  # O_EXCL, owner-only (0600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        try:
            header = PlanStore.read(Path(tmp)).header  # only whole, intact plan files enter the store
        except (OSError, ValueError):
            return "not an intact plan file"
        why = _stored_name_matches(header, fingerprint, filename[: -len(SUFFIX)])
        if why:
            return why
        folder = root / fingerprint
        _private_dir(folder)
        why = _folder_problem(folder)
        if why:
            return why
        if folder.resolve().parent != root:  # belt and braces: nothing is written outside the store
            return "would be written outside the store"
        os.replace(tmp, folder / filename)  # replaces a link at the destination, never follows it
        tmp = None
        return None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def cmd_import(args) -> int:
    store = _store(args)
    try:
        tar = tarfile.open(args.file, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise CliError(f"cannot read {args.file}: {one_line(getattr(exc, 'strerror', None) or exc)}") from None
    imported, refused = 0, {}
    with tar:
        members = tar.getmembers()
        root: Optional[Path] = None
        for member in members:
            why = _refusal(member)
            if why is None:
                if root is None:
                    _private_dir(store.root)
                    problem = store.trust_problem()
                    if problem:  # the store would not read what we write: say so once, write nothing
                        raise CliError(f"not importing into {store.root}: {problem}")
                    root = store.root.resolve(strict=True)
                try:
                    why = _import_member(tar, member, root)
                except OSError as exc:
                    why = f"cannot write: {exc.strerror or exc}"
            if why is None:
                imported += 1
            else:
                refused.setdefault(why, []).append(member.name)
    skipped = [name for names in refused.values() for name in names]
    lines = [f"imported {imported} plan(s) into {store.root}; skipped {len(skipped)}"]
    lines += [f"  skipped {len(names)} ({why}): {', '.join(names)}" for why, names in refused.items()]
    emit(args, {"imported": imported, "skipped": skipped, "refused": refused, "store": str(store.root)},
          "\n".join(lines))  # fmt: skip
    return EXIT_FAILED if skipped and not imported else 0

