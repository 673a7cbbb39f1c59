"""Numbers and tables as markdown text, for the report and its target lines."""

from __future__ import annotations

from typing import Optional


def _num(x: Optional[float], digits: int = 4) -> str:
    if x is None:
        return ""
    if abs(x) >= 10 ** digits:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return lines
