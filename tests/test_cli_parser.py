"""The ``te-cudnn`` command line itself: help for every command, the common options, unknown
options and missing arguments named in one line, ``--version``, and unexpected errors and store
warnings as one line, run in-process; CPU only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from te_cudnn.cli import build_parser, main
from te_cudnn.plans.store import PlanStore

from _cli import EXPLAIN, root, run  # noqa: F401 - root: the fixture


# ----------------------------------------------------------------------------- parser / help / errors
HELPS = [[], ["plans"], ["explain"]] + [["plans", c] for c in ("list", "show", "stats", "clear", "export", "import", "warm")]


@pytest.mark.parametrize("prefix", HELPS, ids=lambda p: "-".join(p) or "top")
def test_help_exits_zero(capsys, prefix: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*prefix, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: te-cudnn")


def test_missing_subcommand_exits_two(capsys) -> None:
    for argv in ([], ["plans"], ["plans", "frobnicate"], ["plans", "show"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("te-cudnn") and err.count("\n") == 1, err  # one line, no usage block


def test_every_subcommand_has_common_options() -> None:
    parser = build_parser()
    for argv in (["plans", "list"], ["plans", "stats"], ["plans", "clear"], ["plans", "show", "x"],
                 ["plans", "export", "f"], ["plans", "import", "f"], ["plans", "warm", "c.json"],
                 ["plans", "tune", "c.json"]):  # fmt: skip
        args = parser.parse_args([*argv, "--store", "/somewhere", "--json", "--debug"])
        assert args.store == "/somewhere" and args.json is True and args.debug is True and callable(args.func)
    for argv in (EXPLAIN, ["bench"]):
        args = parser.parse_args([*argv, "--json", "--debug"])
        assert args.json is True and args.debug is True and callable(args.func)


@pytest.mark.parametrize("argv", [EXPLAIN, ["bench", "--list"]], ids=["explain", "bench"])
def test_store_only_where_it_is_used(capsys, argv: list[str]) -> None:
    """explain and bench read no plan store: --store is an unknown option there, not one ignored."""
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--store", "/somewhere"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --store /somewhere" in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("argv", "prog"),
    [(["--bogus"], "te-cudnn"), (["--bogus=1"], "te-cudnn"), (["plans", "--bogus"], "te-cudnn plans"),
     (["explain", "--bogus"], "te-cudnn explain"), (["explain", "--sq", "128", "--bogus"], "te-cudnn explain"),
     (["plans", "list", "--bogus"], "te-cudnn"), (["explain", *EXPLAIN[1:], "--bogus"], "te-cudnn")],
)  # fmt: skip
def test_unknown_option_is_named(capsys, argv: list[str], prog: str) -> None:
    """An option nobody defines is named, even where an argument is also missing."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    bogus = next(a for a in argv if a.startswith("--bogus"))
    assert capsys.readouterr().err == f"{prog}: unrecognized arguments: {bogus} (see `{prog} --help`)\n"


def test_missing_arguments_still_say_so(capsys) -> None:
    """Abbreviations and negative numbers are not unknown options: the missing argument is reported."""
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--hea", "16", "--window", "-1", "-1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("te-cudnn explain: the following arguments are required: --sq, --d (see "
                                       "`te-cudnn explain --help`)\n")  # fmt: skip


def test_version(capsys) -> None:
    from te_cudnn.runtime import format_versions

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out == format_versions() + "\n"
    assert out.startswith("te_cudnn ") and "torch " in out and "CUDA " in out and "cuDNN " in out and "frontend " in out


def test_unexpected_errors_are_one_line(capsys, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a command raises comes out as one line with an exit code; --debug or
    TE_CUDNN_DEBUG=1 lets the traceback through."""
    from te_cudnn.cli import store as cli

    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(cli, "_rows", boom)
    rc, out, err = run(capsys, "plans", "stats", "--store", str(root))
    assert rc == 1 and out == ""
    assert err == ("te-cudnn: unexpected RuntimeError: first line; second line (run with --debug or TE_CUDNN_DEBUG=1 "
                   "for the traceback)\n")  # fmt: skip
    with pytest.raises(RuntimeError, match="first line"):
        main(["plans", "stats", "--store", str(root), "--debug"])
    monkeypatch.setenv("TE_CUDNN_DEBUG", "1")
    with pytest.raises(RuntimeError, match="first line"):
        main(["plans", "stats", "--store", str(root)])
    monkeypatch.delenv("TE_CUDNN_DEBUG")

    def denied(*_: Any, **__: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(root / "x"))

    monkeypatch.setattr(cli, "_rows", denied)
    rc, _, err = run(capsys, "plans", "list", "--store", str(root))
    assert rc == 1 and err == f"te-cudnn: {root / 'x'}: Permission denied\n"

    def bad_value(*_: Any, **__: Any) -> Any:
        raise ValueError("x=3 is wrong")

    monkeypatch.setattr(cli, "_rows", bad_value)
    rc, _, err = run(capsys, "plans", "list", "--store", str(root))
    assert rc == 2 and err == "te-cudnn: x=3 is wrong\n"


def test_store_warnings_are_one_line(capsys, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    from te_cudnn.cli import store as cli

    real_rows = cli._rows

    def warn_then_list(store: PlanStore) -> Any:
        warnings.warn("te_cudnn: not using the plan store X: it is\nwritable by others")
        return real_rows(store)

    monkeypatch.setattr(cli, "_rows", warn_then_list)
    rc, _, err = run(capsys, "plans", "stats", "--store", str(root))
    assert rc == 0 and err == "te-cudnn: warning: not using the plan store X: it is; writable by others\n"
