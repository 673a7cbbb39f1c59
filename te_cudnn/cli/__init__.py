"""The ``te-cudnn`` command line (``python -m te_cudnn``, ``python -m te_cudnn.cli``).

:mod:`.main` parses the arguments and runs a command (usage: its docstring, or ``te-cudnn
--help``); each command group lives in its own module: :mod:`.store` (``plans list / show /
stats / clear / export / import``), :mod:`.configs` (``plans warm / tune``), :mod:`.explain`,
with what they share in :mod:`.common`. Every public name is importable from here.
"""

from .common import (CONFIG_KEYS, DTYPE_NAMES, EXIT_FAILED, EXIT_USAGE, EXPLAIN_FLAGS, CliError, as_typed,
                     parse_dtype)  # fmt: skip
from .configs import WARM_KEYS, cmd_tune, cmd_warm
from .explain import cmd_explain
from .main import EXIT_BROKEN_PIPE, build_parser, demo_main, main, quiet_broken_pipe
from .store import MAX_IMPORT_MEMBER_BYTES, cmd_clear, cmd_export, cmd_import, cmd_list, cmd_show, cmd_stats

__all__ = ["main", "demo_main", "build_parser", "CliError", "DTYPE_NAMES", "WARM_KEYS", "MAX_IMPORT_MEMBER_BYTES",
           "EXPLAIN_FLAGS", "CONFIG_KEYS", "as_typed",
           # the rest of the command line's public names, importable from here as well
           "EXIT_FAILED", "EXIT_USAGE", "EXIT_BROKEN_PIPE", "parse_dtype", "quiet_broken_pipe", "cmd_list", "cmd_show",
           "cmd_stats", "cmd_clear", "cmd_export", "cmd_import", "cmd_warm", "cmd_tune", "cmd_explain"]  # fmt: skip
