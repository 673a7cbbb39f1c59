"""What every ``te-cudnn`` command shares: errors and exit codes, one-line messages in the
user's own option names, dtype names, and the output (text or ``--json``)."""

from __future__ import annotations

import json
import re
from typing import Any

import torch

__all__ = ["EXIT_FAILED", "EXIT_USAGE", "CliError", "one_line", "EXPLAIN_FLAGS", "CONFIG_KEYS", "as_typed",
           "DTYPE_NAMES", "parse_dtype", "emit"]  # fmt: skip

EXIT_FAILED, EXIT_USAGE = 1, 2


class CliError(Exception):
    """A failure the command reports as one line on stderr, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def one_line(text: Any) -> str:
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


# ----------------------------------------------------------------------------- output
def emit(args, payload: Any, text: str) -> None:
    """``payload`` as JSON under ``--json``, else ``text``."""
    print(json.dumps(payload, indent=1, sort_keys=True) if args.json else text)

