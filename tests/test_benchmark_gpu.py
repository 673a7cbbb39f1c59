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


@pytest.mark.parametrize("contender", ["te_cudnn", "hand_built", "hand_built_alloc", "sdpa_cudnn", "sdpa_flash",
                                       "sdpa_efficient"])
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


def test_allocating_hand_built_graph_agrees_with_te_cudnn() -> None:
    """The hand-built graph that allocates its results per call computes the same attention as
    te_cudnn (its O is checked against te_cudnn's, the case's reference) and is timed eagerly and
    in CUDA-graph replay like the others."""
    case = case_by_name("test_1")
    settings = Settings.for_run(quick=True, rounds=3, host=False, peaks=False)
    rows = run_case(case, select_contenders("te_cudnn,hand_built_alloc"), settings, time.monotonic() + 300,
                    lambda _: None)  # fmt: skip
    free_memory()
    row = next(r for r in rows if r["contender"] == "cuDNN graph (hand-built, allocating)")
    assert row["status"] == "ok", row
    assert row["rel_err"] is not None and row["rel_err"] < 1e-2, row["rel_err"]
    for mode in case.modes:
        assert row[f"{mode}_graph_ms"] > 0 and row[f"{mode}_eager_ms"] > 0, (mode, row)
    # te_cudnn against it from adjacent samples (the headline mode, both kinds): the same engine,
    # so the ratios sit near 1 (a loose bound: quick settings, a host-bound case)
    te = next(r for r in rows if r["contender"] == "te_cudnn")
    adjacent = te["fwd_bwd_adjacent"]["cuDNN graph (hand-built, allocating)"]
    assert sorted(adjacent) == ["eager", "graph"], adjacent
    for kind, ratios in adjacent.items():
        assert len(ratios) >= 4 and all(0.5 < r < 2.0 for r in ratios), (kind, ratios)
    assert "fwd_adjacent" not in te and "bwd_adjacent" not in te  # only the headline mode


def test_host_section_times_the_autotuned_plan_in_rounds_of_its_own() -> None:
    """The host section tunes the host problem's plan the way a user does (``autotuning(True)``
    around a call) and times te_cudnn against the yardstick again with the tuned plan."""
    from te_cudnn.benchmark.runner import host_section, plan_store_for_run
    from te_cudnn.plans import plan_cache

    settings = Settings.for_run(quick=True, host_rounds=2, host_calls=200)
    try:
        with plan_store_for_run("fresh"):
            host = host_section(settings, lambda _: None)
    finally:  # later tests build the heuristic plan of this key again
        plan_cache.retire(lambda p: p.key.config.b == 1 and p.key.config.h == 1 and p.key.config.sq == 64
                          and p.tuning is not None)  # fmt: skip
    assert host["te_cudnn_plan"] and host["te_cudnn_launch"] in ("raw", "ordered", "public", "dict"), host
    tuned = host["tuned"]
    assert "error" not in tuned, tuned
    assert tuned["plan"] and tuned["heuristic_plan"] == host["te_cudnn_plan"], tuned
    assert set(tuned["us"]) >= {"te_cudnn fused_attn_fwd", "bare graph.execute (hand-built graph)"}, tuned
    assert all(0 < u < 1000 for u in tuned["us"].values()), tuned["us"]
    assert tuned["te_minus_yardstick_us"] == pytest.approx(
        tuned["us"]["te_cudnn fused_attn_fwd"] - tuned["us"]["bare graph.execute (hand-built graph)"])
