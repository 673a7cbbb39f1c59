"""The ``te-cudnn`` console tool run as a process: ``python -m te_cudnn.cli`` and ``python -m
te_cudnn``, a closed pipe, and one-line errors without a traceback; CPU only (slow: each case
starts a process)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from te_cudnn.cli import main

from _cli import EXPLAIN, root  # noqa: F401 - root: the fixture


def _cli_process(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "te_cudnn.cli", *argv], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ, **env})  # fmt: skip


@pytest.mark.slow
def test_module_entry_point() -> None:
    proc = _cli_process("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: te-cudnn") and "plans" in proc.stdout and "explain" in proc.stdout
    if importlib.util.find_spec("numpy"):  # numpy is a dependency; without it torch warns at import
        assert proc.stderr == ""


@pytest.mark.slow
def test_python_dash_m_te_cudnn() -> None:
    """``python -m te_cudnn`` is the command line."""
    proc = subprocess.run([sys.executable, "-m", "te_cudnn", "--bogus"], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == "te-cudnn: unrecognized arguments: --bogus (see `te-cudnn --help`)"
    proc = subprocess.run([sys.executable, "-m", "te_cudnn", *EXPLAIN], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "-> F16_arbitrary_seqlen" in proc.stdout


BROKEN_PIPE = [
    ("plans-list", ["-m", "te_cudnn", "plans", "list"]),
    ("bench-list", ["-m", "te_cudnn", "bench", "--list"]),
    ("explain", ["-m", "te_cudnn", *EXPLAIN]),
    ("demo", ["-c", "import sys; from te_cudnn.cli import demo_main; sys.exit(demo_main(['--configs', 'test_0']))"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv", [a for _, a in BROKEN_PIPE], ids=[n for n, _ in BROKEN_PIPE])
def test_closed_pipe_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    """``te-cudnn plans list | head``: the reader is gone before the output is written; the
    command stops without a traceback (exit 141, as a shell reports SIGPIPE, or 0)."""
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[1],
                            env={**os.environ, "TE_CUDNN_PLAN_STORE": str(tmp_path / "store")})  # fmt: skip
    proc.stdout.close()  # before the process writes anything (importing torch takes far longer)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141), err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


@pytest.mark.slow
def test_process_errors_are_one_line_without_traceback(root: Path, tmp_path: Path) -> None:
    """As a user runs it: the plausible mistakes give one line on stderr and a non-zero exit."""
    archive = tmp_path / "plans.tar.gz"
    assert main(["plans", "export", str(archive), "--store", str(root)]) == 0
    cases = [  # a few, each a process start; test_list_dump_wrong_files and others cover the rest in-process
        (("plans", "list", "--dump", str(archive)), 1),
        (("plans", "export", str(tmp_path / "missing" / "x.tar.gz"), "--store", str(root)), 2),
    ]
    for argv, code in cases:
        proc = _cli_process(*argv)
        assert proc.returncode == code, (argv, proc.stderr)
        assert proc.stdout == "", argv
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("te-cudnn"), proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
