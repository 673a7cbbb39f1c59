"""``te-cudnn``: inspect and manage te_cudnn's plans, and explain sub-backend choices.

    te-cudnn plans list [--json] [--dump FILE]           stored plans (or a process's dump)
    te-cudnn plans show ENTRY [--json]                   one stored plan's header
    te-cudnn plans stats [--json]                        totals of the store
    te-cudnn plans clear --yes                           delete stored plans
    te-cudnn plans export FILE / plans import FILE       ship pre-built plans (a .tar.gz)
    te-cudnn plans warm CONFIGS.json [--check]           build plans ahead of time (needs a GPU;
                                                         --check validates the file anywhere)
    te-cudnn plans tune CONFIGS.json [--retune]          autotune the configurations' plans: time
                                                         every engine, store the fastest (needs a GPU)
    te-cudnn explain --layout bshd_bshd_bshd --mask causal --heads 16 --sq 2048 --d 128 ...
    te-cudnn --version                                   te_cudnn, torch, CUDA, cuDNN, frontend, GPU

Every ``plans`` subcommand takes ``--store DIR`` (default: ``TE_CUDNN_PLAN_STORE`` or
``$XDG_CACHE_HOME/te_cudnn/plans``, i.e. ``~/.cache/te_cudnn/plans``). Exit codes: 0 success,
1 nothing found / not supported / failed, 2 bad arguments. Every error is one line on stderr
starting ``te-cudnn:`` and names the options as typed; ``--debug`` (or ``TE_CUDNN_DEBUG=1``)
shows the traceback of an unexpected one. Output cut short by a closed pipe (``| head``) ends
quietly. ``python -m te_cudnn`` runs the same command line. A running process writes its
in-memory cache with ``te_cudnn.plan_cache.dump(path)`` or, at exit, to ``TE_CUDNN_PLAN_DUMP``;
``plans list --dump FILE`` reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

from .plans.store import SUFFIX, PlanStore, _default_root

__all__ = ["main", "demo_main", "build_parser", "CliError", "DTYPE_NAMES", "WARM_KEYS", "MAX_IMPORT_MEMBER_BYTES",
           "EXPLAIN_FLAGS", "CONFIG_KEYS", "as_typed"]

EXIT_FAILED, EXIT_USAGE = 1, 2

#: The largest member ``plans import`` accepts. Serialized cuDNN plans are kilobytes to a few
#: MiB; a bigger member is not a plan, and reading it would only fill memory.
MAX_IMPORT_MEMBER_BYTES = 64 << 20
#: Fingerprint directories and entry names: hex digests today; no dots, no separators ever.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")


class CliError(Exception):
    """A failure the command reports as one line on stderr, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def _one_line(text: Any) -> str:
    """Messages of several lines (cuDNN's, ``UnsupportedConfigError``'s) joined into one."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


#: ``explain``'s options by the parameter of ``te_cudnn.explain`` each feeds: the library's
#: messages name its parameters, the command's name the options the user typed.
EXPLAIN_FLAGS = {
    "qkv_layout": "--layout", "attn_mask_type": "--mask", "attn_bias_type": "--bias", "softmax_type": "--softmax-type",
    "num_attn_heads": "--heads", "num_gqa_groups": "--gqa-groups", "max_seqlen_q": "--sq", "max_seqlen_kv": "--skv",
    "head_dim_qk": "--d", "head_dim_v": "--d-v", "batch_size": "--batch", "dropout": "--dropout",
    "window_size": "--window", "q_dtype": "--dtype", "kv_dtype": "--dtype", "return_max_logit": "--return-max-logit",
    "deterministic": "--deterministic",
}  # fmt: skip
#: The same for a ``plans warm`` / ``plans tune`` configuration file's keys.
CONFIG_KEYS = {
    "qkv_layout": "layout", "attn_mask_type": "mask", "num_attn_heads": "h", "num_gqa_groups": "hg",
    "max_seqlen_q": "sq", "max_seqlen_kv": "skv", "head_dim_qk": "d", "head_dim_v": "d_v", "batch_size": "b",
    "window_size": "window", "q_dtype": "dtype", "kv_dtype": "dtype", "is_training": "training",
}  # fmt: skip
_PARAMETER = re.compile(r"(?<![\w.-])([a-z][a-z0-9_]*)(?!\w)(=\([^()]*\)|=)?")


def as_typed(message: str, names: dict[str, str]) -> str:
    """``message`` with the library's parameter names replaced by what the user typed: with
    option ``names`` (``--x``), ``num_gqa_groups=3`` becomes ``--gqa-groups 3`` and
    ``window_size=(-1, 0)`` ``--window -1 0``; with file keys, ``hg=3``. A bare name is replaced
    only when it cannot be a plain word (it holds an underscore)."""
    flags = any(v.startswith("-") for v in names.values())
    if flags:
        message = message.replace("is_training=False", "--inference")
    else:
        message = message.replace("is_training=False", "training=false").replace("is_training=True", "training=true")

    def swap(m: re.Match) -> str:
        name, tail = m.group(1), m.group(2)
        typed = names.get(name)
        if typed is None or (tail is None and "_" not in name):
            return m.group(0)
        if tail is None:
            return typed
        if tail.startswith("=("):  # a tuple the user typed as separate words (--window LEFT RIGHT)
            value = [x.strip() for x in tail[2:-1].split(",") if x.strip()]
            return f"{typed} {' '.join(value)}" if flags else f"{typed}=[{', '.join(value)}]"
        return f"{typed} " if flags else f"{typed}="

    return _PARAMETER.sub(swap, message)


# ----------------------------------------------------------------------------- dtypes
def _dtype_table() -> dict[str, Any]:
    import torch  # noqa: PLC0415

    table = {
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    }  # fmt: skip
    if hasattr(torch, "float8_e4m3fn"):
        table.update(float8_e4m3fn=torch.float8_e4m3fn, fp8=torch.float8_e4m3fn, e4m3=torch.float8_e4m3fn,
                     fp8_e4m3=torch.float8_e4m3fn)  # fmt: skip
    if hasattr(torch, "float8_e5m2"):
        table.update(float8_e5m2=torch.float8_e5m2, e5m2=torch.float8_e5m2, fp8_e5m2=torch.float8_e5m2)
    return table


#: Names ``--dtype`` and a warm configuration's ``"dtype"`` accept (``torch.`` prefix allowed).
DTYPE_NAMES = ("bfloat16", "bf16", "float16", "fp16", "half", "float8_e4m3fn", "fp8", "e4m3", "fp8_e4m3",
               "float8_e5m2", "e5m2", "fp8_e5m2")  # fmt: skip


def parse_dtype(name: Any, argument: str = "--dtype") -> Any:
    """A torch dtype from a common name; ``CliError`` (exit 2) listing the accepted names."""
    table = _dtype_table()
    key = name.lower().removeprefix("torch.") if isinstance(name, str) else None
    if key not in table:
        raise CliError(f"{argument} {name!r} is not a dtype fused attention takes; accepted: {', '.join(table)}",
                       EXIT_USAGE)  # fmt: skip
    return table[key]


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
            rows.append({**row, "error": _one_line(exc)})
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
    from .plans.tune import valid_record  # noqa: PLC0415

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


def _emit(args, payload: Any, text: str) -> None:
    print(json.dumps(payload, indent=1, sort_keys=True) if args.json else text)


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
        _emit(args, dump, _table(_dump_rows(dump), cols) + f"\ntotals: {dump.get('stats')}")
        return 0
    root = _root(args)
    rows = _rows(PlanStore(root, facts={}))
    cols = ["entry", "backend", "direction", "layout", "dtype", "shape", "mask", "plan", "tuned", "build_ms", "bytes",
            "last_used"]
    _emit(args, {"store": str(root), "plans": rows}, _store_line(args, root) + "\n" + _table(rows, cols))
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
        raise CliError(f"{path}: {_one_line(exc)}") from None
    key = header.get("key") if isinstance(header.get("key"), dict) else {}
    text = "\n".join(f"{k}: {v}" for k, v in sorted(key.items()))
    text += "\n" + "\n".join(f"{k}: {v}" for k, v in sorted(header.items()) if k not in ("key", "tuning"))
    if "tuning" in header:  # autotuned: the choice and every candidate's time
        from .plans.tune import format_record  # noqa: PLC0415

        text += "\n" + format_record(header["tuning"])
    _emit(args, header, f"{path}\n{text}")
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
    _emit(args, {"store": str(root), **stats}, text)
    return 0


def cmd_clear(args) -> int:
    store = _store(args)
    if not args.yes:
        raise CliError(f"refusing to delete the plans in {store.root} without --yes", EXIT_USAGE)
    n = store.clear(all_fingerprints=True)
    _emit(args, {"removed": n, "store": str(store.root)}, f"removed {n} plan(s) from {store.root}")
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
    _emit(args, {"exported": len(paths), "file": args.file, "store": str(store.root)},
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
        raise CliError(f"cannot read {args.file}: {_one_line(getattr(exc, 'strerror', None) or exc)}") from None
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
    _emit(args, {"imported": imported, "skipped": skipped, "refused": refused, "store": str(store.root)},
          "\n".join(lines))  # fmt: skip
    return EXIT_FAILED if skipped and not imported else 0


# ----------------------------------------------------------------------------- plans warm
_REQUIRED = object()
#: A warm configuration's keys: (accepted types, default, meaning). ``--help`` prints this.
WARM_KEYS: dict[str, tuple[tuple[type, ...], Any, str]] = {
    "b": ((int,), _REQUIRED, "batch size (THD layouts: number of sequences)"),
    "h": ((int,), _REQUIRED, "query heads"),
    "hg": ((int,), "h", "key/value heads (GQA/MQA; must divide h)"),
    "sq": ((int,), _REQUIRED, "query sequence length (THD: tokens per sequence)"),
    "skv": ((int,), "sq", "key/value sequence length"),
    "d": ((int,), _REQUIRED, "head dim of q and k"),
    "d_v": ((int,), "d", "head dim of v"),
    "layout": ((str,), "bshd_bshd_bshd", "qkv_layout: an sbhd, bshd or thd layout, packed or not"),
    "mask": ((str,), "no_mask", "attn_mask_type"),
    "softmax_type": ((str,), "vanilla", "vanilla, off_by_one or learnable (attention sinks)"),
    "dtype": ((str,), "bfloat16", "bfloat16/bf16 or float16/fp16/half"),
    "training": ((bool,), True, "also build the backward plan"),
    "deterministic": ((bool,), False, "the deterministic backward"),
    "dropout": ((float, int), 0.0, "dropout probability"),
    "window": ((list,), [-1, -1], "sliding window [left, right]; -1 is unbounded"),
    "attn_scale": ((float, int, type(None)), None, "softmax scale (null: 1/sqrt(d))"),
    "name": ((str,), "", "a label for the output"),
}
_SIZES = ("b", "h", "hg", "sq", "skv", "d", "d_v")


def _warm_epilog() -> str:
    rows = []
    for key, (types, default, meaning) in WARM_KEYS.items():
        if default is _REQUIRED:
            shown = "required"
        else:
            shown = f"default: same as {default}" if key in ("hg", "skv", "d_v") else f"default: {json.dumps(default)}"
        rows.append(f"  {key:14} {meaning} ({shown})")
    return (
        "CONFIGS is a JSON list of objects (or TOML [[config]] tables); keys:\n" + "\n".join(rows)
        + '\n\nexample: [{"name": "llama-8b train", "b": 2, "h": 32, "hg": 8, "sq": 8192, "d": 128, "mask": "causal"}]'
        "\n(more in examples/warm_configs.json of the source tree). Unknown keys are an error."
    )  # fmt: skip


def _load_configs(name: str) -> list[Any]:
    try:
        text = Path(name).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror or exc}", EXIT_USAGE) from None
    except UnicodeDecodeError as exc:
        raise CliError(f"cannot read {name}: not text ({exc})", EXIT_USAGE) from None
    try:
        if name.endswith(".toml"):
            try:
                import tomllib  # noqa: PLC0415 - Python 3.11+
            except ImportError:
                raise CliError(f"cannot read {name}: TOML needs Python 3.11 or later; use JSON", EXIT_USAGE) from None
            data = tomllib.loads(text).get("config", [])
        else:
            data = json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        raise CliError(f"cannot read {name}: {_one_line(exc)}", EXIT_USAGE) from None
    if not isinstance(data, list):
        raise CliError(f"{name}: expected a JSON list of configurations (or TOML [[config]] tables), "
                       f"got a JSON {'object' if isinstance(data, dict) else type(data).__name__}", EXIT_USAGE)  # fmt: skip
    return data


def _check_config(c: Any) -> dict[str, Any]:
    """One configuration with its defaults filled in; ``ValueError`` naming the key otherwise."""
    from .enums import AttnMaskType, QKVLayout  # noqa: PLC0415
    from .layouts import layout_info  # noqa: PLC0415

    if not isinstance(c, dict):
        raise ValueError(f"a configuration is an object of keys, got {json.dumps(c)}")
    unknown = [k for k in c if k not in WARM_KEYS]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; accepted keys: {', '.join(WARM_KEYS)}")
    missing = [k for k, (_, default, _) in WARM_KEYS.items() if default is _REQUIRED and k not in c]
    if missing:
        raise ValueError(f"missing key {missing[0]!r} (required: b, h, sq, d)")
    for key, value in c.items():
        types = WARM_KEYS[key][0]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"{key}={json.dumps(value)} must be {want}")
    out = {k: c.get(k, d) for k, (_, d, _) in WARM_KEYS.items()}
    for key in ("hg", "skv", "d_v"):
        if key not in c:
            out[key] = out[WARM_KEYS[key][1]]
    for key in _SIZES:
        if out[key] < 1:
            raise ValueError(f"{key}={out[key]} must be >= 1 (a zero-size call builds no plan)")
    w = out["window"]
    if len(w) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in w):
        raise ValueError(f"window={json.dumps(w)} must be [left, right], two integers")
    layout = QKVLayout.coerce(out["layout"], argument="layout")
    info = layout_info(layout)
    if layout.value >= 15:
        raise ValueError(f"layout={layout.name!r}: plans warm makes the 15 sbhd, bshd and thd layouts; mixed-format "
                         "and paged layouts are built by their first call")  # fmt: skip
    AttnMaskType.coerce(out["mask"], argument="mask")
    try:
        dtype = parse_dtype(out["dtype"], argument="dtype")
    except CliError as exc:
        raise ValueError(str(exc)) from None
    if dtype.itemsize == 1:
        raise ValueError(f"dtype={out['dtype']!r}: FP8 plans need FP8 scaling tensors; they are built by the first "
                         "FP8 call")
    if out["h"] % out["hg"]:
        raise ValueError(f"hg={out['hg']} must divide h={out['h']} (GQA/MQA)")
    if (info.packs_qkv or info.packs_kv) and out["d_v"] != out["d"]:
        raise ValueError(f"layout={layout.name!r} packs k and v: it needs d_v == d")
    if info.packs_qkv and (out["sq"] != out["skv"] or out["h"] != out["hg"]):
        raise ValueError(f"layout={layout.name!r} packs q, k and v: it needs sq == skv and h == hg")
    out["layout"], out["torch_dtype"] = layout.name, dtype
    return out


def _check_configs(configs: list[Any]) -> list[dict[str, Any]]:
    """Each configuration checked, in file order: with its defaults filled in, or with a
    ``"problem"`` line (``config N (name): ...``). Both carry a ``"label"``."""
    checked = []
    for i, c in enumerate(configs, 1):
        name = c.get("name") if isinstance(c, dict) else None
        label = f"config {i}" + (f" ({name})" if isinstance(name, str) and name else "")
        try:
            checked.append({**_check_config(c), "label": label})
        except (ValueError, TypeError) as exc:
            checked.append({"label": label, "problem": f"{label}: {_one_line(exc)}"})
    return checked


def _explain_config(c: dict[str, Any], env) -> Any:
    from . import explain  # noqa: PLC0415

    return explain(
        is_training=c["training"], q_dtype=c["torch_dtype"], kv_dtype=c["torch_dtype"], qkv_layout=c["layout"],
        attn_bias_type="no_bias", attn_mask_type=c["mask"], softmax_type=c["softmax_type"], dropout=float(c["dropout"]),
        num_attn_heads=c["h"], num_gqa_groups=c["hg"], max_seqlen_q=c["sq"], max_seqlen_kv=c["skv"],
        head_dim_qk=c["d"], head_dim_v=c["d_v"], window_size_left=c["window"][0], window_size_right=c["window"][1],
        deterministic=c["deterministic"], batch_size=c["b"], env=env,
    )  # fmt: skip


def _warm_check(args, checked: list[dict[str, Any]]) -> int:
    """``--check``: for each configuration, in file order, what is wrong with it or the
    sub-backend that would serve it (or every reason why none would), without a GPU. Exit 2
    when a configuration is malformed, 1 when one is valid but served by no sub-backend."""
    from .runtime import HOPPER_CUDNN_919, current_env  # noqa: PLC0415

    env = current_env()
    env = env if env.can_execute else HOPPER_CUDNN_919
    lines, results = [f"checked {args.configs} against {env.describe()}"], []
    for c in checked:
        if "problem" not in c:
            try:
                ex = _explain_config(c, env)
            except (ValueError, TypeError) as exc:
                c = {"label": c["label"], "problem": f"{c['label']}: {as_typed(_one_line(exc), CONFIG_KEYS)}"}
        if "problem" in c:
            results.append({"config": c["label"], "problem": c["problem"]})
            lines.append(c["problem"])
            continue
        served = ex.backend.name != "No_Backend"
        reasons = {} if served else {n: why for n, why in ex.reasons.items() if why}
        results.append({"config": c["label"], "summary": ex.config.summary(), "backend": ex.backend.name,
                        "reasons": reasons})  # fmt: skip
        lines.append(f"{c['label']}: {ex.config.summary()} -> {ex.backend.name}")
        lines += [f"    {n}: {'; '.join(why)}" for n, why in reasons.items()]
    malformed = sum("problem" in r for r in results)
    declined = sum(r.get("backend") == "No_Backend" for r in results)
    lines.append(f"{len(results) - malformed - declined} of {len(results)} configuration(s) valid and served"
                 + (f"; {malformed} malformed" if malformed else "") + (f"; {declined} not served" if declined else ""))
    _emit(args, {"env": env.describe(), "configs": results}, "\n".join(lines))
    return EXIT_USAGE if malformed else EXIT_FAILED if declined else 0


def _warm_one(c: dict[str, Any]) -> None:
    import torch  # noqa: PLC0415

    from . import fused_attn_bwd, fused_attn_fwd  # noqa: PLC0415
    from .enums import QKVLayout  # noqa: PLC0415
    from .testing import make_qkv  # noqa: PLC0415

    dtype, sq, skv = c["torch_dtype"], c["sq"], c["skv"]
    q, k, v = make_qkv(QKVLayout[c["layout"]], c["b"], c["h"], c["hg"], sq, skv, c["d"], c["d_v"], dtype=dtype)
    cu_q = torch.arange(0, (c["b"] + 1) * sq, sq, dtype=torch.int32, device="cuda")
    cu_kv = torch.arange(0, (c["b"] + 1) * skv, skv, dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout=c["layout"], attn_mask_type=c["mask"], attn_scale=c["attn_scale"], dropout=float(c["dropout"]),
              window_size=tuple(c["window"]), softmax_type=c["softmax_type"])  # fmt: skip
    offset = None if c["softmax_type"] != "learnable" else torch.zeros(1, c["h"], 1, 1, device="cuda")
    out, aux = fused_attn_fwd(c["training"], sq, skv, cu_q, cu_kv, q, k, v, dtype, None, softmax_offset=offset, **kw)
    if c["training"]:
        fused_attn_bwd(sq, skv, cu_q, cu_kv, q, k, v, out, out, dtype, aux, None, deterministic=c["deterministic"],
                       **kw)


def cmd_warm(args) -> int:
    checked = _check_configs(_load_configs(args.configs))
    if args.check:
        return _warm_check(args, checked)
    problems = [c["problem"] for c in checked if "problem" in c]
    if problems:  # before any GPU work
        more = f"; {len(problems) - 1} more problem(s)" if len(problems) > 1 else ""
        raise CliError(f"{args.configs}: {problems[0]}{more}; `te-cudnn plans warm --check {args.configs}` lists "
                       "every configuration", EXIT_USAGE)  # fmt: skip
    configs = checked
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        raise CliError(f"plans warm needs a CUDA device; check the file here with `te-cudnn plans warm --check "
                       f"{args.configs}`")
    if args.store:
        os.environ["TE_CUDNN_PLAN_STORE"] = args.store
    from . import plan_cache  # noqa: PLC0415

    failures = 0
    for i, c in enumerate(configs, 1):
        print(f"\r[{i}/{len(configs)}] {c['label']}", end="", file=sys.stderr, flush=True)
        try:
            _warm_one(c)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next configuration
            failures += 1
            print(f"\nte-cudnn: {c['label']} failed: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
    print(file=sys.stderr)
    s = plan_cache.stats()
    done = len(configs) - failures
    _emit(args, s.as_dict(), f"warmed {done}/{len(configs)} configs: {s.builds} built, {s.loads} loaded")
    return EXIT_FAILED if failures else 0


# ----------------------------------------------------------------------------- plans tune
def _tune_entry(plan: Any, retuned: bool) -> dict[str, Any]:
    """What ``plans tune`` reports of one plan of a configuration."""
    if plan.tuning is not None:
        status = "tuned now" if plan.source == "built" or retuned else "tuned earlier (from the store)"
    else:
        status = "not tuned: " + (plan.tuning_error or "its sub-backend's plans are not tuned (not stored)")
    return {"direction": plan.key.direction.value, "backend": plan.key.backend.name, "plan": plan.plan_name,
            "status": status, "tuned": plan.tuning is not None, "tuning": plan.tuning,
            "key": plan.key.describe()}  # fmt: skip


def cmd_tune(args) -> int:
    checked = _check_configs(_load_configs(args.configs))
    problems = [c["problem"] for c in checked if "problem" in c]
    if problems:  # before any GPU work
        more = f"; {len(problems) - 1} more problem(s)" if len(problems) > 1 else ""
        raise CliError(f"{args.configs}: {problems[0]}{more}; `te-cudnn plans warm --check {args.configs}` lists "
                       "every configuration", EXIT_USAGE)  # fmt: skip
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        raise CliError(f"plans tune needs a CUDA device (it times every engine on it); check the file here with "
                       f"`te-cudnn plans warm --check {args.configs}`")  # fmt: skip
    if args.store:
        os.environ["TE_CUDNN_PLAN_STORE"] = args.store
    if _default_root() is None:
        print("te-cudnn: warning: the plan store is off (TE_CUDNN_PLAN_STORE=off): the tunings are shown, not kept",
              file=sys.stderr)  # fmt: skip
    from . import plan_cache  # noqa: PLC0415
    from .plans.tune import autotuning, format_record, tune_key  # noqa: PLC0415

    failures, results, lines = 0, [], []
    for i, c in enumerate(checked, 1):
        print(f"\r[{i}/{len(checked)}] {c['label']}", end="", file=sys.stderr, flush=True)
        plan_cache.clear()  # what is cached afterwards is this configuration's plans
        entry: dict[str, Any] = {"config": c["label"], "plans": []}
        try:
            with autotuning(True):
                _warm_one(c)
            for plan in sorted(plan_cache.plans(), key=lambda p: p.key.direction.value != "fwd"):
                retuned = False
                if args.retune and plan.source == "store":
                    tune_key(plan.key)
                    plan, retuned = plan_cache.find(plan.key) or plan, True
                entry["plans"].append(_tune_entry(plan, retuned))
        except Exception as exc:  # noqa: BLE001 - report and go on with the next configuration
            entry["error"] = f"{type(exc).__name__}: {_one_line(exc)}"
        results.append(entry)
        failures += "error" in entry or any(not p["tuned"] for p in entry["plans"])
        lines.append(f"{c['label']}:" + (f" failed: {entry['error']}" if "error" in entry else ""))
        for p in entry["plans"]:
            lines.append(f"  {p['direction']} ({p['backend']}): {p['status']}")
            if p["tuning"] is not None:
                lines.append(format_record(p["tuning"], indent="    "))
    print(file=sys.stderr)
    tuned = sum(p["tuned"] for r in results for p in r["plans"])
    lines.append(f"tuned {tuned} plan(s) of {len(checked)} configuration(s)"
                 + (f"; {failures} failed" if failures else ""))
    store = os.environ.get("TE_CUDNN_PLAN_STORE") or str(_default_root())
    _emit(args, {"store": store, "configs": results, "failures": failures}, "\n".join(lines))
    return EXIT_FAILED if failures else 0


# ----------------------------------------------------------------------------- explain
def cmd_explain(args) -> int:
    from . import explain  # noqa: PLC0415
    from .runtime import HOPPER_CUDNN_919, current_env  # noqa: PLC0415

    env = HOPPER_CUDNN_919 if args.target == "hopper" else current_env()
    dtype = parse_dtype(args.dtype)
    skv = args.skv or args.sq
    try:
        ex = explain(
            is_training=not args.inference, q_dtype=dtype, kv_dtype=dtype, qkv_layout=args.layout,
            attn_bias_type=args.bias, attn_mask_type=args.mask, softmax_type=args.softmax_type, dropout=args.dropout,
            num_attn_heads=args.heads, num_gqa_groups=args.gqa_groups or args.heads, max_seqlen_q=args.sq,
            max_seqlen_kv=skv, head_dim_qk=args.d, head_dim_v=args.d_v or args.d, window_size_left=args.window[0],
            window_size_right=args.window[1], deterministic=args.deterministic, batch_size=args.batch, env=env,
            return_max_logit=args.return_max_logit,
        )  # fmt: skip
    except (ValueError, TypeError) as exc:
        raise CliError(as_typed(_one_line(exc), EXPLAIN_FLAGS), EXIT_USAGE) from None
    cfg = ex.config
    planned = {"b": cfg.b, "sq": cfg.sq, "skv": cfg.skv}
    text = str(ex)
    if planned != {"b": args.batch, "sq": args.sq, "skv": skv}:
        text = (f"note: THD plans are keyed on buckets, so --batch {args.batch} --sq {args.sq} --skv {skv} is checked "
                f"as b={cfg.b} sq={cfg.sq} skv={cfg.skv}\n" + text)  # fmt: skip
    payload = {"backend": ex.backend.name, "reasons": ex.reasons, "config": cfg.summary(), "env": env.describe(),
               "batch": args.batch, "planned": planned}  # fmt: skip
    _emit(args, payload, text)
    return 0 if ex.backend.name != "No_Backend" else EXIT_FAILED


# ----------------------------------------------------------------------------- parser
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # a value (--window -1 -1), not an option


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit 2 (argparse prints the whole usage block). An option
    nobody defines is named as such even where argparse would first complain about a missing
    argument (``te-cudnn --bogus`` is not "the following arguments are required")."""

    _argv: list[str] = []

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def _unknown_options(self) -> list[str]:
        """The words of the command line that look like options this parser does not define
        (nor abbreviate); after ``--`` everything is positional."""
        unknown = []
        for word in self._argv:
            if word == "--":
                break
            if not word.startswith("-") or word == "-" or _NEGATIVE_NUMBER.match(word):
                continue
            name = word.split("=", 1)[0]
            known = name in self._option_string_actions or (
                name.startswith("--") and any(s.startswith(name) for s in self._option_string_actions))
            if not known:
                unknown.append(word)
        return unknown

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("the following arguments are required"):
            unknown = self._unknown_options()
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}"
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


class _Help(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's table; adds "(default: X)" to options that have a real default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        quiet = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if "%(default)" not in text and action.option_strings and not quiet:
            text += " (default: %(default)s)"
        return text


class _Version(argparse.Action):
    """``--version``: computed when asked (it imports torch and the frontend)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from .runtime import format_versions  # noqa: PLC0415

        print(format_versions())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    store = argparse.ArgumentParser(add_help=False)  # only the subcommands that read or write the store
    store.add_argument("--store", help="plan store directory (default: $TE_CUDNN_PLAN_STORE, else "
                                       "$XDG_CACHE_HOME/te_cudnn/plans, i.e. ~/.cache/te_cudnn/plans)")  # fmt: skip
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error "
                                                             "(also TE_CUDNN_DEBUG=1)")  # fmt: skip
    p = _Parser(prog="te-cudnn", description=__doc__.splitlines()[0].replace("``", ""), formatter_class=_Help)
    p.add_argument("--version", action=_Version, help="print the versions of te_cudnn, torch, CUDA, cuDNN, the "
                                                      "frontend and the GPU, and exit")  # fmt: skip
    sub = p.add_subparsers(dest="command", metavar="{plans,explain,bench}", required=True)
    plans = sub.add_parser("plans", help="the persistent plan store", formatter_class=_Help)
    plans_sub = plans.add_subparsers(dest="plans_command", metavar="{list,show,stats,clear,export,import,warm,tune}",
                                     required=True)

    def add(name: str, func: Callable[[Any], int], help: str, **kw: Any) -> argparse.ArgumentParser:
        sp = plans_sub.add_parser(name, parents=[store, common], help=help, description=help, formatter_class=_Help, **kw)
        sp.set_defaults(func=func)
        return sp

    add("list", cmd_list, "list stored plans and where the store is (or a process's dump)").add_argument(
        "--dump", help="a JSON dump written by plan_cache.dump() / TE_CUDNN_PLAN_DUMP (not an export archive)")
    add("show", cmd_show, "one stored plan's header").add_argument("entry", help="entry name or a unique prefix of it")
    add("stats", cmd_stats, "where the store is and its totals")
    add("clear", cmd_clear, "delete every stored plan (all fingerprints)").add_argument(
        "--yes", action="store_true", help="really delete")
    add("export", cmd_export, "write the store's plans to a .tar.gz").add_argument("file", help="archive to write")
    add("import", cmd_import, "add the plans of a .tar.gz made by export; only intact plan files named "
        f"<fingerprint>/<entry>{SUFFIX} of at most {MAX_IMPORT_MEMBER_BYTES >> 20} MiB enter the store (no "
        "links, devices, absolute or '..' paths)").add_argument("file", help="archive to read")  # fmt: skip
    wp = add("warm", cmd_warm, "build the plans of configurations ahead of time (needs a GPU; --check does not)",
             epilog=_warm_epilog())  # fmt: skip
    wp.add_argument("configs", help="JSON (or .toml) file of configurations; keys below")
    wp.add_argument("--check", action="store_true", help="only validate the file and say which sub-backend would "
                    "serve each configuration (on this GPU, or the measured Hopper machine without one)")  # fmt: skip
    tp = add("tune", cmd_tune, "autotune the plans of configurations: build every engine cuDNN offers, time each on "
             "this GPU with the real shapes, store the fastest with every candidate's time (needs a GPU)",
             epilog=_warm_epilog().replace("CONFIGS is", "CONFIGS (as for `plans warm`) is", 1)
             + "\n\nA plan already tuned in the store is not tuned again (see --retune); `plans show ENTRY` lists "
               "its candidates. Processes load tuned plans whether or not TE_CUDNN_AUTOTUNE is set.")  # fmt: skip
    tp.add_argument("configs", help="JSON (or .toml) file of configurations, as for `plans warm`")
    tp.add_argument("--retune", action="store_true", help="tune again plans the store already holds tuned")

    xp = sub.add_parser("explain", parents=[common], formatter_class=_Help,
                        help="which sub-backend serves a configuration, and why not the others",
                        description="Which sub-backend serves a configuration, and why the others decline. "
                                    "Needs no GPU (see --target).")  # fmt: skip
    xp.add_argument("--dtype", default="bfloat16", help=f"q/k/v dtype; one of {', '.join(DTYPE_NAMES)}")
    xp.add_argument("--layout", default="bshd_bshd_bshd", help="qkv_layout (one of the 15 sbhd/bshd/thd layouts)")
    xp.add_argument("--mask", default="no_mask", help="attn_mask_type: no_mask, causal, causal_bottom_right, padding, "
                    "padding_causal, padding_causal_bottom_right")  # fmt: skip
    xp.add_argument("--bias", default="no_bias", help="attn_bias_type: no_bias, post_scale_bias, pre_scale_bias, alibi")
    xp.add_argument("--softmax-type", default="vanilla", help="softmax_type: vanilla, off_by_one or learnable "
                    "(attention sinks)")  # fmt: skip
    xp.add_argument("--return-max-logit", action="store_true", help="also return the per-head maximum logit "
                    "(TE 2.x return_max_logit)")  # fmt: skip
    xp.add_argument("--batch", type=int, default=1, help="batch size (THD layouts are planned for its bucket: 32, "
                    "then powers of two)")  # fmt: skip
    xp.add_argument("--heads", type=int, required=True, help="query heads (required)")
    xp.add_argument("--gqa-groups", type=int, default=None, help="key/value heads (default: --heads)")
    xp.add_argument("--sq", type=int, required=True, help="query sequence length (required)")
    xp.add_argument("--skv", type=int, default=None, help="key/value sequence length (default: --sq)")
    xp.add_argument("--d", type=int, required=True, help="head dim of q and k (required)")
    xp.add_argument("--d-v", type=int, default=None, help="head dim of v (default: --d)")
    xp.add_argument("--dropout", type=float, default=0.0, help="dropout probability")
    xp.add_argument("--window", type=int, nargs=2, default=(-1, -1), metavar=("LEFT", "RIGHT"),
                    help="sliding window; -1 is unbounded")  # fmt: skip
    xp.add_argument("--inference", action="store_true", help="forward only (default: training)")
    xp.add_argument("--deterministic", action="store_true", help="deterministic backward (default: off)")
    xp.add_argument("--target", choices=("current", "hopper"), default="current",
                    help="check against this machine, or the measured Hopper machine (sm90, cuDNN 9.19)")  # fmt: skip
    xp.set_defaults(func=cmd_explain)
    from .benchmark.cli import register as register_bench  # noqa: PLC0415 - light: imports no CUDA code

    register_bench(sub, parents=[common])  # te-cudnn bench (te_cudnn/benchmark)
    return p


# ----------------------------------------------------------------------------- entry point
def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (a skipped plan file, a store it will not read) as one line each."""
    text = _one_line(message).removeprefix("te_cudnn: ")
    print(f"te-cudnn: warning: {text}", file=sys.stderr)


def _unexpected(exc: BaseException) -> tuple[str, int]:
    """One line and an exit code for an exception no command turned into a ``CliError``."""
    from .errors import UnsupportedConfigError  # noqa: PLC0415

    if isinstance(exc, UnsupportedConfigError):
        return _one_line(exc), EXIT_FAILED
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or _one_line(exc)}", EXIT_FAILED
    if isinstance(exc, (ValueError, TypeError)):
        return _one_line(exc), EXIT_USAGE
    return (f"unexpected {type(exc).__name__}: {_one_line(exc)} (run with --debug or TE_CUDNN_DEBUG=1 for the "
            "traceback)"), EXIT_FAILED  # fmt: skip


def _run(argv: Optional[list[str]]) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("TE_CUDNN_DEBUG", "") not in ("", "0")
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _show_warning
        try:
            return args.func(args)
        except CliError as exc:
            message, code = str(exc), exc.code
        except KeyboardInterrupt:
            message, code = "interrupted", 130
        except BrokenPipeError:
            raise
        except Exception as exc:  # noqa: BLE001 - one line instead of a traceback
            if debug:
                raise
            message, code = _unexpected(exc)
    print(f"te-cudnn: {_one_line(message)}", file=sys.stderr)
    return code


#: The exit code when the reader of the output went away (``te-cudnn plans list | head``): a
#: shell's for a process that SIGPIPE ended, without its traceback.
EXIT_BROKEN_PIPE = 128 + 13


def quiet_broken_pipe(run: Callable[[], int]) -> int:
    """``run()``'s exit code; when the output's reader closed the pipe (``| head``), stop
    quietly with :data:`EXIT_BROKEN_PIPE` instead of a traceback (and instead of Python's
    "Exception ignored ... BrokenPipeError" when it flushes stdout at exit)."""
    try:
        try:
            code = run()
        except SystemExit:  # --help, --version and usage errors print, then exit
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # inside the try: a pipe's buffered output fails here, not at exit
        return code
    except BrokenPipeError:
        try:  # what is still buffered goes nowhere, quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE


def main(argv: Optional[list[str]] = None) -> int:
    """``te-cudnn`` (and ``python -m te_cudnn``): the exit code."""
    return quiet_broken_pipe(lambda: _run(argv))


def demo_main(argv: Optional[list[str]] = None) -> int:
    """``te-cudnn-demo``: :func:`te_cudnn.demo.main`, quiet when its output is cut short (``| head``)."""

    def run() -> int:
        from .demo import main as demo  # noqa: PLC0415 - imports torch and the frontend

        return demo(argv)

    return quiet_broken_pipe(run)


if __name__ == "__main__":
    sys.exit(main())
