"""GPU suite: te_cudnn's driver-API fills (``te_cudnn.driver``, ``launch.zeroed`` / ``neg_inf``)
write the same bits as torch's fills, on the current stream, eagerly and inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from te_cudnn import driver, launch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
def test_zeroed_and_neg_inf_match_torch(dtype):
    assert driver.capture_info() is not None and driver._memsets()[0] is not None
    t = torch.full((3, 5, 7), 1.5, device="cuda").to(dtype)
    assert launch.zeroed(t, 0) is t
    assert torch.equal(t.float(), torch.zeros(3, 5, 7, device="cuda"))
    s = torch.full((2, 4, 9, 1), float("nan"), device="cuda")
    launch.neg_inf(s, 0)
    assert torch.equal(s, torch.full_like(s, float("-inf")))


def test_fills_run_on_the_current_stream_and_in_a_graph():
    t = torch.ones(1 << 20, device="cuda")
    s = torch.ones(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(5_000_000)
        t.fill_(7.0)
        s.fill_(7.0)
        launch.zeroed(t, 0)  # on any other stream, these would land before the 7s and be overwritten
        launch.neg_inf(s, 0)
    side.synchronize()
    assert not t.any() and bool((s == float("-inf")).all())

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        u = launch.neg_inf(torch.empty(4096, device="cuda"), 0)
        z = launch.zeroed(torch.empty(4096, dtype=torch.bfloat16, device="cuda"), 0)
    u.fill_(0.5)
    z.fill_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert bool((u == float("-inf")).all()) and not z.any()
