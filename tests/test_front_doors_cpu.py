"""The front-door benchmark's bookkeeping on the CPU: the alternating measure and the report.
(The measurements themselves need a GPU: ``python -m te_cudnn.benchmark.front_doors``.)"""

from __future__ import annotations

import pytest

from te_cudnn.benchmark import front_doors


@pytest.fixture
def no_sync(monkeypatch):
    monkeypatch.setattr(front_doors.torch.cuda, "synchronize", lambda: None)


def test_alternating_takes_turns_first_alternating_and_pairs_the_samples(no_sync, monkeypatch):
    calls, clock = [], iter(range(1000))
    monkeypatch.setattr(front_doors.time, "perf_counter", lambda: float(next(clock)))
    fns = {"sdpa": lambda: calls.append("sdpa"), "te_cudnn": lambda: calls.append("te_cudnn")}
    paired: dict = {}
    medians = front_doors._alternating(fns, 3, paired)
    assert calls == ["sdpa", "te_cudnn"] + ["sdpa", "te_cudnn", "te_cudnn", "sdpa", "sdpa", "te_cudnn"]
    assert paired == {"sdpa": [1.0] * 3, "te_cudnn": [1.0] * 3}  # one clock tick per timed call
    assert medians == {"sdpa": 1.0, "te_cudnn": 1.0}


def test_report_gives_the_paired_ratios_with_their_intervals():
    res = {
        "device": "a GPU",
        "host": {"torch SDPA (default backend)": 10.0, "te_cudnn.fused_attn_fwd": 11.0},
        "fwd_bwd": [{"shape": "b=1", "inputs": "BHSD leaves", "te_cudnn_ms": 1.0, "torch_cudnn_ms": 1.0, "ratio": 0.99,
                     "ratio_low": 0.97, "ratio_high": 1.01}],  # fmt: skip
        "hf": {"model": "m", "sdpa": {"prefill ms": 20.0, "generate error": "x"}, "te_cudnn": {"prefill ms": 19.0},
               "te_cudnn vs sdpa, paired by turn (median, 95 % interval)": {"prefill ms": [0.95, 0.9, 0.99]}},
    }  # fmt: skip
    md = front_doors._markdown(res)
    assert "| te_cudnn.fused_attn_fwd | 11.0 | 1.10× |" in md
    assert "| b=1 | BHSD leaves | 1.000 | 1.000 | 0.990 | 0.970–1.010 |" in md
    assert "| prefill ms | 20.0 | 19.0 | 0.950 | 0.950 (0.900–0.990) |" in md
    assert "| generate error | x | None | | |" in md
