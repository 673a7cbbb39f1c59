"""``te-cudnn``: inspect and manage te_cudnn's plans, and explain sub-backend choices.

    te-cudnn plans list [--json] [--all] [--dump FILE]   stored plans (or a process's dump)
    te-cudnn plans show ENTRY [--json]                   one stored plan's header
    te-cudnn plans stats [--json]                        totals of the store
    te-cudnn plans clear [--yes]                         delete stored plans
    te-cudnn plans export FILE / plans import FILE       ship pre-built plans (a .tar.gz)
    te-cudnn plans warm CONFIGS.json                     build plans ahead of time (needs a GPU)
    te-cudnn explain --layout bshd_bshd_bshd --mask causal --heads 16 --sq 2048 --d 128 ...

Every subcommand takes ``--store DIR`` (default: ``TE_CUDNN_PLAN_STORE`` or the user cache
directory). Exit codes: 0 success, 1 nothing found / not supported, 2 bad arguments.
A running process writes its in-memory cache with ``te_cudnn.plan_cache.dump(path)`` or, at
exit, to ``TE_CUDNN_PLAN_DUMP``; ``plans list --dump FILE`` reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Optional

from .plans.store import SUFFIX, PlanStore, _default_root

__all__ = ["main"]


def _store(args) -> PlanStore:
    root = Path(args.store) if args.store else _default_root()
    if root is None:
        raise SystemExit("te-cudnn: the plan store is switched off (TE_CUDNN_PLAN_STORE=off); pass --store DIR")
    return PlanStore(root, facts={})  # facts unknown here: the CLI reads every fingerprint


def _rows(store: PlanStore) -> list[dict[str, Any]]:
    rows = []
    for path in store.entries(all_fingerprints=True):
        try:
            entry = PlanStore.read(path)
        except (OSError, ValueError) as exc:
            rows.append({"entry": path.stem, "fingerprint": path.parent.name, "error": str(exc), "bytes": path.stat().st_size})
            continue
        k, f = entry.header.get("key", {}), entry.header.get("facts", {})
        rows.append({
            "entry": path.stem, "fingerprint": path.parent.name, "backend": k.get("backend"),
            "direction": k.get("direction"), "layout": k.get("layout"), "dtype": k.get("dtype"),
            "shape": f"b={k.get('b')} h={k.get('h')}/{k.get('hg')} sq={k.get('sq')} skv={k.get('skv')} d={k.get('d_qk')}",
            "mask": k.get("mask"), "plan": entry.header.get("plan_name"), "build_ms": entry.header.get("build_ms"),
            "bytes": path.stat().st_size, "gpu": f.get("gpu"), "cudnn": f.get("cudnn"),
            "last_used": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime)),
        })  # fmt: skip
    return rows


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    if not rows:
        return "(no plans)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def _emit(args, payload: Any, text: str) -> None:
    print(json.dumps(payload, indent=1, sort_keys=True) if args.json else text)


def cmd_list(args) -> int:
    if args.dump:
        try:
            dump = json.loads(Path(args.dump).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"te-cudnn: cannot read dump {args.dump}: {exc}", file=sys.stderr)
            return 1
        rows = [{"backend": p["key"]["backend"], "direction": p["key"]["direction"], "layout": p["key"]["layout"],
                 "shape": f"b={p['key']['b']} h={p['key']['h']} sq={p['key']['sq']} d={p['key']['d_qk']}",
                 "mask": p["key"]["mask"], "plan": p["plan_name"], "source": p.get("source"), "hits": p["hits"],
                 "build_ms": p["build_ms"], "workspace": p["workspace_bytes"]} for p in dump.get("plans", [])]  # fmt: skip
        _emit(args, dump, _table(rows, ["backend", "direction", "layout", "shape", "mask", "plan", "source", "hits",
                                        "build_ms", "workspace"]) + f"\ntotals: {dump.get('stats')}")  # fmt: skip
        return 0
    rows = _rows(_store(args))
    _emit(args, rows, _table(rows, ["entry", "backend", "direction", "layout", "dtype", "shape", "mask", "plan",
                                    "build_ms", "bytes", "last_used"]))  # fmt: skip
    return 0


def _find(store: PlanStore, prefix: str) -> Optional[Path]:
    hits = [p for p in store.entries(all_fingerprints=True) if p.stem.startswith(prefix)]
    return hits[0] if len(hits) == 1 else None


def cmd_show(args) -> int:
    store = _store(args)
    path = _find(store, args.entry)
    if path is None:
        print(f"te-cudnn: no single stored plan matches {args.entry!r}", file=sys.stderr)
        return 1
    try:
        header = PlanStore.read(path).header
    except (OSError, ValueError) as exc:
        print(f"te-cudnn: {path}: {exc}", file=sys.stderr)
        return 1
    text = "\n".join(f"{k}: {v}" for k, v in sorted(header.get("key", {}).items()))
    text += "\n" + "\n".join(f"{k}: {v}" for k, v in sorted(header.items()) if k != "key")
    _emit(args, header, f"{path}\n{text}")
    return 0


def cmd_stats(args) -> int:
    rows = _rows(_store(args))
    stats = {
        "plans": len(rows), "bytes": sum(r["bytes"] for r in rows), "unreadable": sum("error" in r for r in rows),
        "fingerprints": len({r["fingerprint"] for r in rows}),
        "by_backend": {b: sum(r.get("backend") == b for r in rows) for b in sorted({str(r.get("backend")) for r in rows})},
    }  # fmt: skip
    _emit(args, stats, "\n".join(f"{k}: {v}" for k, v in stats.items()))
    return 0


def cmd_clear(args) -> int:
    store = _store(args)
    if not args.yes:
        print("te-cudnn: refusing to delete without --yes", file=sys.stderr)
        return 2
    n = store.clear(all_fingerprints=True)
    _emit(args, {"removed": n}, f"removed {n} plan(s) from {store.root}")
    return 0


def cmd_export(args) -> int:
    store = _store(args)
    paths = list(store.entries(all_fingerprints=True))
    with tarfile.open(args.file, "w:gz") as tar:
        for p in paths:
            tar.add(p, arcname=f"{p.parent.name}/{p.name}")
    _emit(args, {"exported": len(paths), "file": args.file}, f"exported {len(paths)} plan(s) to {args.file}")
    return 0


def cmd_import(args) -> int:
    store = _store(args)
    imported, skipped = 0, []
    try:
        tar = tarfile.open(args.file, "r:*")
    except (OSError, tarfile.TarError) as exc:
        print(f"te-cudnn: cannot read {args.file}: {exc}", file=sys.stderr)
        return 1
    with tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            plain = all(part not in ("", ".", "..", "/") and "/" not in part and "\\" not in part for part in parts)
            if not member.isfile() or Path(member.name).is_absolute() or len(parts) != 2 or not plain or not parts[1].endswith(SUFFIX):
                skipped.append(member.name)
                continue
            data = tar.extractfile(member).read()
            dest = store.root / parts[0] / parts[1]
            tmp = dest.with_name(f".tmp-{os.getpid()}-{parts[1]}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            try:
                PlanStore.read(tmp)  # only whole, intact plan files enter the store
            except ValueError:
                tmp.unlink()
                skipped.append(member.name)
                continue
            os.replace(tmp, dest)
            imported += 1
    _emit(args, {"imported": imported, "skipped": skipped}, f"imported {imported} plan(s); skipped {len(skipped)}")
    return 0


def cmd_warm(args) -> int:
    import torch  # noqa: PLC0415

    from . import fused_attn_bwd, fused_attn_fwd, plan_cache  # noqa: PLC0415
    from .testing import make_qkv  # noqa: PLC0415

    try:
        text = Path(args.configs).read_text()
        configs = json.loads(text) if not args.configs.endswith(".toml") else _toml(text)
    except (OSError, ValueError) as exc:
        print(f"te-cudnn: cannot read {args.configs}: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("te-cudnn: plans warm needs a CUDA device", file=sys.stderr)
        return 1
    if args.store:
        os.environ["TE_CUDNN_PLAN_STORE"] = args.store
    failures = 0
    for i, c in enumerate(configs, 1):
        print(f"\r[{i}/{len(configs)}] {c}", end="", file=sys.stderr, flush=True)
        try:
            layout = c.get("layout", "bshd_bshd_bshd")
            dtype = getattr(torch, c.get("dtype", "bfloat16"))
            q, k, v = make_qkv(__import__("te_cudnn").QKVLayout.coerce(layout), c["b"], c["h"], c.get("hg", c["h"]),
                               c["sq"], c.get("skv", c["sq"]), c["d"], dtype=dtype)  # fmt: skip
            cu_q = torch.arange(0, (c["b"] + 1) * c["sq"], c["sq"], dtype=torch.int32, device="cuda")
            cu_kv = torch.arange(0, (c["b"] + 1) * c.get("skv", c["sq"]), c.get("skv", c["sq"]), dtype=torch.int32, device="cuda")
            kw = dict(qkv_layout=layout, attn_mask_type=c.get("mask", "no_mask"))
            training = c.get("training", True)
            out, aux = fused_attn_fwd(training, c["sq"], c.get("skv", c["sq"]), cu_q, cu_kv, q, k, v, dtype, None, **kw)
            if training:
                fused_attn_bwd(c["sq"], c.get("skv", c["sq"]), cu_q, cu_kv, q, k, v, out, out, dtype, aux, None, **kw)
        except Exception as exc:  # report and go on with the next configuration
            failures += 1
            print(f"\nte-cudnn: config {i} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    print(file=sys.stderr)
    s = plan_cache.stats()
    _emit(args, s.as_dict(), f"warmed {len(configs) - failures}/{len(configs)} configs: {s.builds} built, {s.loads} loaded")
    return 1 if failures else 0


def _toml(text: str) -> list:
    import tomllib  # noqa: PLC0415 - Python 3.11+

    data = tomllib.loads(text)
    return data.get("config", [])


def cmd_explain(args) -> int:
    import torch  # noqa: PLC0415

    from . import explain  # noqa: PLC0415
    from .runtime import HOPPER_CUDNN_919, current_env  # noqa: PLC0415

    env = HOPPER_CUDNN_919 if args.target == "hopper" else current_env()
    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        print(f"te-cudnn: --dtype {args.dtype!r} is not a torch dtype", file=sys.stderr)
        return 2
    try:
        ex = explain(not args.inference, dtype, dtype, args.layout, args.bias, args.mask, "vanilla", args.dropout, args.heads,
                     args.gqa_groups or args.heads, args.sq, args.skv or args.sq, args.d, args.d_v or args.d,
                     args.window[0], args.window[1], deterministic=args.deterministic, batch_size=args.batch, env=env)  # fmt: skip
    except (ValueError, TypeError) as exc:
        print(f"te-cudnn: {exc}", file=sys.stderr)
        return 2
    _emit(args, {"backend": ex.backend.name, "reasons": ex.reasons, "config": ex.config.summary(), "env": env.describe()},
          str(ex))  # fmt: skip
    return 0 if ex.backend.name != "No_Backend" else 1


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", help="plan store directory (default: TE_CUDNN_PLAN_STORE or the user cache)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    p = argparse.ArgumentParser(prog="te-cudnn", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    plans = sub.add_parser("plans", help="the persistent plan store").add_subparsers(dest="plans_command", required=True)
    lp = plans.add_parser("list", parents=[common], help="list stored plans (or a process's dump)")
    lp.add_argument("--dump", help="a JSON dump written by plan_cache.dump() / TE_CUDNN_PLAN_DUMP")
    lp.set_defaults(func=cmd_list)
    sp = plans.add_parser("show", parents=[common], help="one stored plan's header")
    sp.add_argument("entry", help="entry name or a unique prefix of it")
    sp.set_defaults(func=cmd_show)
    plans.add_parser("stats", parents=[common], help="totals of the store").set_defaults(func=cmd_stats)
    cp = plans.add_parser("clear", parents=[common], help="delete every stored plan")
    cp.add_argument("--yes", action="store_true", help="really delete")
    cp.set_defaults(func=cmd_clear)
    ep = plans.add_parser("export", parents=[common], help="write the store to a .tar.gz")
    ep.add_argument("file")
    ep.set_defaults(func=cmd_export)
    ip = plans.add_parser("import", parents=[common], help="add plans from a .tar.gz made by export")
    ip.add_argument("file")
    ip.set_defaults(func=cmd_import)
    wp = plans.add_parser("warm", parents=[common], help="build plans for configurations ahead of time (GPU)")
    wp.add_argument("configs", help='JSON list (or TOML [[config]] tables) of {"b","h","hg","sq","skv","d","layout","mask","dtype","training"}')
    wp.set_defaults(func=cmd_warm)
    xp = sub.add_parser("explain", parents=[common], help="which sub-backend serves a configuration, and why not the others")
    xp.add_argument("--dtype", default="bfloat16")
    xp.add_argument("--layout", default="bshd_bshd_bshd")
    xp.add_argument("--mask", default="no_mask")
    xp.add_argument("--bias", default="no_bias")
    xp.add_argument("--batch", type=int, default=1)
    xp.add_argument("--heads", type=int, required=True)
    xp.add_argument("--gqa-groups", type=int, default=None)
    xp.add_argument("--sq", type=int, required=True)
    xp.add_argument("--skv", type=int, default=None)
    xp.add_argument("--d", type=int, required=True)
    xp.add_argument("--d-v", type=int, default=None)
    xp.add_argument("--dropout", type=float, default=0.0)
    xp.add_argument("--window", type=int, nargs=2, default=(-1, -1), metavar=("LEFT", "RIGHT"))
    xp.add_argument("--inference", action="store_true")
    xp.add_argument("--deterministic", action="store_true")
    xp.add_argument("--target", choices=("current", "hopper"), default="current",
                    help="check against this machine, or the measured Hopper machine (sm90, cuDNN 9.19)")  # fmt: skip
    xp.set_defaults(func=cmd_explain)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
