"""The benchmark on the GPU: every contender's modes are timed as CUDA-graph replay where they
should be, and a case gives its memory back.

A captured ``bwd`` of torch's SDPA through autograd used to fail (the driver refused a wait of
the legacy default stream on the capture), the row fell back to eager timing, and torch 2.11
kept the failed capture's memory for the rest of the process: reserved memory grew to 80 GiB
over a full run and late FP8 captures ran out of memory.
"""

from __future__ import annotations

import time

import pytest
import torch

from te_cudnn.benchmark.cases import case_by_name
from te_cudnn.benchmark.contenders import select_contenders
from te_cudnn.benchmark.measure import free_memory
from te_cudnn.benchmark.runner import Settings, run_case

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("contender", ["te_cudnn", "hand_built", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient"])
def test_every_training_mode_is_graph_timed_and_memory_comes_back(contender: str) -> None:
    case = case_by_name("test_0")
    free_memory()
    reserved_before = torch.cuda.memory_reserved()
    settings = Settings.for_run(quick=True, rounds=3, host=False, peaks=False)
    rows = run_case(case, select_contenders(contender), settings, time.monotonic() + 300, lambda _: None)
    free_memory()
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["status"] == "ok", row
    assert "capture failed" not in (row.get("notes") or ""), row["notes"]
    for mode in case.modes:
        assert row[f"{mode}_graph_ms"] > 0, (mode, row)
    grown = (torch.cuda.memory_reserved() - reserved_before) / 2**20
    assert grown <= 64, f"{contender}: {grown:.0f} MiB stayed reserved after the case and free_memory()"
