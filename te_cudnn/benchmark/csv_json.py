"""results.csv (the flat rows, and reading them back) and results.json (the results dict)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from .rows import CSV_FIELDS, flat_rows

_INT_FIELDS = {"rounds", "plans_built", "plans_loaded", "plans_tuned"}
_TEXT_FIELDS = {"case", "group", "description", "contender", "status", "precision", "backend", "plans", "notes",
                "errors", "reason"}  # fmt: skip


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def to_csv(results: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for row in flat_rows(results):
        w.writerow({k: _cell(row[k]) for k in CSV_FIELDS})
    return buf.getvalue()


def read_csv(text: str) -> list[dict[str, Any]]:
    """The rows of :func:`to_csv`, numbers parsed back (``read_csv(to_csv(r)) == flat_rows(r)``)."""
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row: dict[str, Any] = {}
        for k in CSV_FIELDS:
            v = raw.get(k, "")
            if v == "":
                row[k] = None
            elif k in _TEXT_FIELDS:
                row[k] = v
            elif k in _INT_FIELDS:
                row[k] = int(float(v))
            else:
                row[k] = float(v)
        rows.append(row)
    return rows


def to_json(results: dict) -> str:
    return json.dumps(results, indent=1, default=str)
