"""Rendering results: pure functions from the results dict to a markdown table, CSV, JSON and a
PNG chart (matplotlib, the optional ``bench`` extra; without it the chart is skipped, saying so).

The results dict (written by :func:`.runner.run_benchmark`, read back from results.json):
``env`` (versions, GPU, driver), ``settings``, ``peaks`` (``matmul_bf16_tflops``,
``matmul_fp8_tflops``, ``copy_gbps``), ``host`` (``us`` per contender, ``yardstick``,
``te_cudnn``, ``target_us``), ``cases`` (each case's fields with ``flops_fwd``, ``flops_bwd``,
``kv_bytes``, ``modes``) and ``results``: one row per (case, contender) with ``status``
(``ok`` / ``skipped`` / ``error``), ``reason`` and, when it ran, ``{mode}_ms`` (GPU time:
CUDA-graph replay, or eager where no graph was captured), ``{mode}_eager_ms``,
``{mode}_graph_ms``, ``first_call_ms``, ``build_ms``, ``load_ms``, ``peak_mib``, ``mem_ratio``.
Derived (:mod:`.rows`): TFLOP/s and % of the measured matmul peak, KV-cache GB/s and % of the copy
bandwidth, and each time relative to torch SDPA (cuDNN) on the same case.

One concern per module, all re-exported here: :mod:`.rows` (the flat rows and the derived
values), :mod:`.ratios` (ratios paired by round and their intervals), :mod:`.csv_json` (CSV and
JSON), :mod:`.markdown` (table.md and the summary), :mod:`.targets` (the target checks),
:mod:`.formatting` (numbers and tables as text), :mod:`.chart` (the PNG); :func:`write_all`
(every file) lives here.
"""

from __future__ import annotations

import os

from .chart import write_chart
from .csv_json import read_csv, to_csv, to_json
from .markdown import to_markdown, to_summary
from .ratios import median_interval, paired_ratio
from .rows import CSV_FIELDS, REFERENCE, flat_rows
from .targets import DECODE_TARGET_PCT, MEM_TARGET

__all__ = ["flat_rows", "to_csv", "read_csv", "to_json", "to_markdown", "to_summary", "write_chart", "write_all",
           "CSV_FIELDS", "paired_ratio", "median_interval",
           "REFERENCE", "MEM_TARGET", "DECODE_TARGET_PCT"]  # fmt: skip


def write_all(results: dict, out_dir: str) -> dict[str, str]:
    """results.json, results.csv, table.md and chart.png in ``out_dir``; returns what was
    written (name -> path) and, under ``"chart"``, why no chart was written if it was not."""
    os.makedirs(out_dir, exist_ok=True)
    written: dict[str, str] = {}
    for name, text in (("results.json", to_json(results)), ("results.csv", to_csv(results)),
                       ("table.md", to_markdown(results))):  # fmt: skip
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        written[name] = path
    png = os.path.join(out_dir, "chart.png")
    why = write_chart(results, png)
    if why is None:
        written["chart.png"] = png
    else:
        written["chart"] = why
    return written
