"""Command line: ``te-cudnn bench ...`` (through :func:`register`) and ``python -m te_cudnn.benchmark``.

    python -m te_cudnn.benchmark --quick --out bench/        # one case of each kind
    python -m te_cudnn.benchmark --out bench/                # every default case
    python -m te_cudnn.benchmark --cases llama,decode_kv8k --contenders te_cudnn,sdpa
    python -m te_cudnn.benchmark --list                      # cases and contenders (no GPU needed)
    python -m te_cudnn.benchmark --out bench/ --front-doors   # and the front doors (front_doors.*)

Exit codes: 0 done (contenders that declined or failed are in the results, with reasons), 1 no
CUDA GPU, 2 bad arguments. Nothing here imports CUDA-only code before it is needed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from . import front_doors, front_doors_report, report
from .cases import DEFAULT_GROUPS, GROUPS, QUICK, all_cases, select_cases
from .contenders import CONTENDER_GROUPS, all_contenders, select_contenders
from .runner import Settings, run_benchmark

__all__ = ["main", "register", "build_parser", "add_arguments", "run_from_args"]

EXIT_NO_GPU, EXIT_USAGE = 1, 2
#: ``--front-doors`` values: every section, or all but Hugging Face
FRONT_DOOR_CHOICES = ("all", "no-hf")
DESCRIPTION = ("Time te_cudnn against the same cuDNN graph built by hand, torch SDPA (cuDNN, flash, efficient) and "
               "FlexAttention, side by side in one process on the same inputs; write a table, CSV, JSON and a chart.")  # fmt: skip


def _epilog() -> str:
    return (f"case groups: {', '.join(GROUPS)} (default: {', '.join(DEFAULT_GROUPS)}); --quick: {', '.join(QUICK)}. "
            f"contenders: {', '.join(c.key for c in all_contenders())}; groups: {', '.join(CONTENDER_GROUPS)}. "
            "--list shows every case.")  # fmt: skip


def add_arguments(p: argparse.ArgumentParser, taken: Sequence[str] = ()) -> None:
    """The options; any whose option string is in ``taken`` (given by a parent parser) is left out."""

    def add(*names: str, **kw: Any) -> None:
        if not set(names) & set(taken):
            p.add_argument(*names, **kw)

    _add_options(add)


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _seconds_or_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or a finite number > 0, got {text}")
    return value


def _store_setting(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected fresh, default, off or a directory, got an empty string")
    return text


def _add_options(add: Any) -> None:
    add("--quick", action="store_true", help="a small subset: one case of each kind")
    add("--cases", default=None, help="comma-separated case names or groups (default: the default groups; "
                                      "'all' adds max512, 'none' runs only the ceilings and host time)")
    add("--contenders", default=None, help="comma-separated contenders or groups (default: all)")
    add("--out", default=None, metavar="DIR", help="write results.json, results.csv, table.md, chart.png here")
    add("--json", dest="json_path", default=None, metavar="FILE", help="also write the results JSON here")
    add("--rounds", type=int, default=None, help="at most this many interleaved timing rounds per case and mode "
                                                 "(default 20; --quick 10)")
    add("--mode-seconds", type=_seconds, default=None, help="timing seconds per case and mode (fwd, bwd, fwd+bwd); "
        "more seconds give more rounds and narrower intervals (default 1.2; --quick 0.4; at least 5 rounds, 3 with "
        "--quick, at most --rounds)")
    add("--max-seconds", type=float, default=None, help="start no case after this many seconds (default 600; "
                                                        "--quick 150)")
    add("--no-graphs", action="store_true", help="eager timing only (no CUDA-graph replay)")
    add("--lead-ms", type=_milliseconds, default=None, help="untimed work of the same contender before each timed sample, "
                                                    "in ms (default 20; 0: one untimed eager call, none for graphs)")
    add("--pair-seconds", type=_seconds_or_zero, default=None,
        help="timing seconds per case for each comparison of te_cudnn with a hand-built graph from adjacent "
             "samples in a, b, b, a order, in the headline mode, eager and replayed (default 1.0; --quick 0.3; "
             "0: none)")
    add("--no-host", action="store_true", help="skip the host-time section")
    add("--front-doors", nargs="?", const="all", choices=FRONT_DOOR_CHOICES, default=None,
        help="also measure the front doors: host µs per cached forward of every door, the SDPA drop-in's fwd+bwd and "
             "(with transformers installed) Hugging Face generate, prefill and a training step; writes "
             "front_doors.json, .md and .png to --out (about seven minutes more on an H200). 'no-hf' leaves Hugging "
             "Face out. The front doors alone: python -m te_cudnn.benchmark.front_doors --out DIR")  # fmt: skip
    add("--plan-store", type=_store_setting, default=None, metavar="WHERE",
        help="the plan store of the run: 'fresh' (default: a private empty store, deleted afterwards, so untuned "
             "contenders run untuned plans), 'default' (TE_CUDNN_PLAN_STORE or the user's store), 'off', or a "
             "directory")
    add("--every-case", action="store_true", help="run FlexAttention (compiles per case) and te_cudnn autotuned "
                                                  "(tunes per new plan) on every case, not on their default subsets")
    add("--list", action="store_true", help="list the cases and contenders, then exit (no GPU needed)")


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog or "python -m te_cudnn.benchmark", description=DESCRIPTION,
                                epilog=_epilog())  # fmt: skip
    add_arguments(p)
    return p


def register(subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to an argparse subparsers object (``te-cudnn bench``); it
    sets ``func`` (returning an exit code) and, unless a parent gives one, ``debug``. Options a
    parent already defines (e.g. a ``--json`` flag) are left to the parent."""
    sp = subparsers.add_parser("bench", parents=list(parents), help="time te_cudnn against the alternatives "
                               "(table, CSV, JSON, chart)", description=DESCRIPTION, epilog=_epilog())  # fmt: skip
    taken = [s for parent in parents for a in parent._actions for s in a.option_strings]
    add_arguments(sp, taken)
    if not any(a.dest == "debug" for parent in parents for a in parent._actions):
        sp.set_defaults(debug=False)
    sp.set_defaults(func=run_from_args, json_path=None)
    return sp


def _err(message: str) -> None:
    print(f"te-cudnn bench: {message}", file=sys.stderr)


def _list() -> int:
    for c in all_cases():
        print(f"{c.name:22} {c.group:7} {'quick ' if c.name in QUICK else '      '}{c.describe()}")
    print()
    for c in all_contenders():
        print(f"{c.key:20} {c.name}")
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    try:
        cases = select_cases(args.cases, quick=args.quick)
        contenders = select_contenders(args.contenders)
    except ValueError as exc:
        _err(str(exc))
        return EXIT_USAGE
    if args.rounds is not None and args.rounds < 1:
        _err(f"--rounds {args.rounds} must be at least 1")
        return EXIT_USAGE
    if args.front_doors == "all" and not _has_transformers():
        _err("--front-doors measures Hugging Face with transformers, which is not installed: pip install "
             "'te_cudnn[hf]', or pass --front-doors=no-hf")  # fmt: skip
        return EXIT_USAGE
    if not torch.cuda.is_available():
        _err("needs a CUDA GPU with cuDNN; torch.cuda.is_available() is False on this machine (--list works without one)")
        return EXIT_NO_GPU

    over: dict[str, Any] = {}
    if args.max_seconds is not None:
        over["deadline_s"] = args.max_seconds
    if args.mode_seconds is not None:
        over["mode_budget_s"] = args.mode_seconds
    if args.no_graphs:
        over["graphs"] = False
    if args.lead_ms is not None:
        over["lead_ms"] = args.lead_ms
    if args.pair_seconds is not None:
        over["pair_seconds"] = args.pair_seconds
    if args.plan_store is not None:
        over["plan_store"] = args.plan_store
    if args.no_host:
        over["host"] = False
    if args.every_case:
        over["every_case"] = True
    settings = Settings.for_run(args.quick, args.rounds, **over)
    results = run_benchmark(cases, contenders, settings, log=lambda line: print(line, flush=True))
    print()
    if args.out:  # the files hold everything; the console gets the short form (its tail is what is read)
        written = report.write_all(results, args.out)
        print(report.to_summary(results))
        print(f"\nwrote {', '.join(p for k, p in written.items() if k != 'chart')}")
        if "chart" in written:
            print(f"chart: {written['chart']}")
    else:
        print(report.to_markdown(results))
    if getattr(args, "json_path", None):
        os.makedirs(os.path.dirname(os.path.abspath(args.json_path)), exist_ok=True)
        with open(args.json_path, "w", encoding="utf-8") as f:
            f.write(report.to_json(results))
    if args.front_doors:
        print("\nfront doors:", flush=True)
        doors = front_doors.run(Path(args.out) if args.out else None, hf=args.front_doors == "all")
        if args.out:
            written = [str(p) for p in (Path(args.out) / f"front_doors.{x}" for x in ("json", "md", "png")) if p.exists()]
            print(f"\nwrote {', '.join(written)}")
        else:
            print(front_doors_report.markdown(doors))
    return 0


def _has_transformers() -> bool:
    return importlib.util.find_spec("transformers") is not None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(None if argv is None else list(argv))
    return run_from_args(args)
