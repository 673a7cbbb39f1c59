"""How the run records a failure and goes on: an exception as one line, a note added to a row's
notes, a synchronize that cannot raise."""

from __future__ import annotations

from typing import Optional

import torch


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


def _add(notes: Optional[str], note: str) -> str:
    return f"{notes}; {note}" if notes else note


def _sync_quietly() -> None:
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass
