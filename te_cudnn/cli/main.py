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
import os
import re
import sys
import warnings
from typing import Any, Callable, Optional

from ..benchmark.cli import register as register_bench
from ..demo import main as demo
from ..errors import UnsupportedConfigError
from ..plans.store import SUFFIX
from ..runtime import format_versions
from ..pipes import EXIT_BROKEN_PIPE, quiet_broken_pipe
from .common import DTYPE_NAMES, EXIT_FAILED, EXIT_USAGE, CliError, one_line
from .configs import cmd_tune, cmd_warm, warm_epilog
from .explain import cmd_explain
from .store import MAX_IMPORT_MEMBER_BYTES, cmd_clear, cmd_export, cmd_import, cmd_list, cmd_show, cmd_stats

__all__ = ["main", "demo_main", "build_parser", "quiet_broken_pipe", "EXIT_BROKEN_PIPE"]

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
             epilog=warm_epilog())  # fmt: skip
    wp.add_argument("configs", help="JSON (or .toml) file of configurations; keys below")
    wp.add_argument("--check", action="store_true", help="only validate the file and say which sub-backend would "
                    "serve each configuration (on this GPU, or the measured Hopper machine without one)")  # fmt: skip
    tp = add("tune", cmd_tune, "autotune the plans of configurations: build every engine cuDNN offers, time each on "
             "this GPU with the real shapes, store the fastest with every candidate's time (needs a GPU)",
             epilog=warm_epilog().replace("CONFIGS is", "CONFIGS (as for `plans warm`) is", 1)
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
    register_bench(sub, parents=[common])  # te-cudnn bench (te_cudnn/benchmark)
    return p


# ----------------------------------------------------------------------------- entry point
def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (a skipped plan file, a store it will not read) as one line each."""
    text = one_line(message).removeprefix("te_cudnn: ")
    print(f"te-cudnn: warning: {text}", file=sys.stderr)


def _unexpected(exc: BaseException) -> tuple[str, int]:
    """One line and an exit code for an exception no command turned into a ``CliError``."""
    if isinstance(exc, UnsupportedConfigError):
        return one_line(exc), EXIT_FAILED
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or one_line(exc)}", EXIT_FAILED
    if isinstance(exc, (ValueError, TypeError)):
        return one_line(exc), EXIT_USAGE
    return (f"unexpected {type(exc).__name__}: {one_line(exc)} (run with --debug or TE_CUDNN_DEBUG=1 for the "
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
    print(f"te-cudnn: {one_line(message)}", file=sys.stderr)
    return code


def main(argv: Optional[list[str]] = None) -> int:
    """``te-cudnn`` (and ``python -m te_cudnn``): the exit code."""
    return quiet_broken_pipe(lambda: _run(argv))


def demo_main(argv: Optional[list[str]] = None) -> int:
    """``te-cudnn-demo``: :func:`te_cudnn.demo.main`, quiet when its output is cut short (``| head``)."""

    return quiet_broken_pipe(lambda: demo(argv))

