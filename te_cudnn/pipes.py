"""Command-line output into a pipe whose reader went away (``te-cudnn plans list | head``).

Shared by the ``te-cudnn`` command and the demo, below both.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

__all__ = ["EXIT_BROKEN_PIPE", "quiet_broken_pipe"]

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
