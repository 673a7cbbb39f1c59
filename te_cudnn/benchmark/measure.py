"""The benchmark's sampling on the device, on :mod:`te_cudnn.timing`'s timers (whose
:func:`~te_cudnn.timing.event_ms`, :func:`~te_cudnn.timing.capture` and
:func:`~te_cudnn.timing.host_medians` are re-exported here).

* GPU time: CUDA events around ``reps`` back-to-back eager calls that follow one untimed
  call (host gaps included: a host-bound call shows them), and around the replay of a CUDA
  graph holding ``reps`` captured calls (no host gaps). Before each sample the same contender
  runs untimed for a while (``lead``), so the GPU's clocks settle to its own load; contenders are
  timed in turn in every round, in a fresh random order each round (:func:`interleaved`), so
  clock and thermal drift and the neighbour each sample follows hit them alike; the median over
  rounds is reported, with the spread (interquartile range over median).
* Same-engine comparisons (te_cudnn against the hand-built graph): in the headline mode, also
  ratios of adjacent samples in a, b, b, a order (:func:`adjacent_ratios`), which cancel the
  fast clock swings of a GPU at its power cap that the ratio of medians over rounds keeps.
* Host time: ``perf_counter`` over many back-to-back cached calls on a tiny problem, where the
  host, not the GPU, is the bottleneck (:func:`~te_cudnn.timing.host_medians`).
* Peak memory: ``torch.cuda.max_memory_allocated`` around one call, reset before.
* Ceilings of this GPU, measured in the same run: a large bf16 (and FP8) matmul, and a large
  device-to-device copy (bytes read plus bytes written).
"""

from __future__ import annotations

import gc
import math
import statistics
from typing import Any, Callable, Optional

import torch

from ..ops import release_workspaces
from ..plans.order import ORDER_SEED, order_rng, round_order
from ..timing import capture, event_ms, host_medians, median_ms

__all__ = ["adjacent_ratios", "capture", "eager_sampler", "graph_sampler", "interleaved", "lead_count", "summarize", "host_medians",
           "EAGER_LEAD", "matmul_peak_tflops", "fp8_matmul_peak_tflops", "copy_bandwidth_gbps", "event_ms", "free_memory"]  # fmt: skip


#: untimed calls before each eager sample (see :func:`event_ms`)
EAGER_LEAD = 1


def lead_count(lead_ms: float, ms_per_unit: float, least: int = 0) -> int:
    """How many untimed units (calls, graph replays) of ``ms_per_unit`` each fill ``lead_ms``."""
    if lead_ms <= 0 or ms_per_unit <= 0:
        return least
    return max(least, math.ceil(lead_ms / ms_per_unit))


def eager_sampler(call: Callable[[], Any], reps: int, lead: int = EAGER_LEAD) -> Callable[[], float]:
    """Back-to-back eager calls: ``lead`` untimed calls (at least one), then ``reps`` timed ones.
    The host queues the timed calls while the GPU runs the lead ones, so the time is the calls'
    GPU time plus only the gaps a host that cannot keep up leaves (small, host-bound calls
    show them); a longer lead also lets the GPU's clocks settle to this call's own load."""
    lead = max(EAGER_LEAD, lead)
    return lambda: event_ms(call, reps, lead=lead)


def graph_sampler(graph, reps: int, lead: int = 0) -> Callable[[], float]:
    """One timed replay of a graph of ``reps`` calls, after ``lead`` untimed replays."""
    return lambda: event_ms(graph.replay, lead=lead) / reps


def interleaved(samplers: dict[str, Callable[[], float]], rounds: int, seed: int = ORDER_SEED) -> dict[str, list[float]]:
    """``rounds`` samples of each sampler, taking them in turn in every round, in a fresh order
    each round (:func:`te_cudnn.plans.order.round_order`, from ``seed``: the same orders in every
    run). Why not a fixed or rotated order: :mod:`te_cudnn.plans.order`."""
    rng = order_rng(seed)
    out: dict[str, list[float]] = {name: [] for name in samplers}
    for name in (n for _ in range(rounds) for n in round_order(list(samplers), rng)):
        out[name].append(samplers[name]())
    return out


def adjacent_ratios(a: Callable[[], float], b: Callable[[], float], quads: int) -> list[float]:
    """``quads`` ratios of sampler ``a``'s time to sampler ``b``'s, each from four samples taken
    one right after the other in the order a, b, b, a: ``(a1 + a2) / (b1 + b2)``. A GPU at its
    power cap moves its clock within tens of milliseconds, faster than a round of every contender
    lasts (see :func:`interleaved`); a clock that drifts linearly over the four samples slows
    both sides alike and cancels, and each side takes the same places (one sample right after
    its own work, one right after the other's)."""
    out = []
    for _ in range(quads):
        a1 = a()
        b1 = b()
        b2 = b()
        a2 = a()
        out.append((a1 + a2) / (b1 + b2))
    return out


def summarize(samples: list[float]) -> tuple[float, float]:
    """Median and spread (interquartile range over median, in %)."""
    med = statistics.median(samples)
    if len(samples) < 4 or med <= 0:
        return med, 0.0
    q = statistics.quantiles(samples, n=4)
    return med, (q[2] - q[0]) / med * 100.0


def free_memory() -> None:
    """Drop what the last case left: Python garbage, te_cudnn's kept workspaces, the
    allocator's cached blocks."""
    gc.collect()
    try:
        release_workspaces()
    except Exception:  # noqa: BLE001 - best effort
        pass
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- ceilings
def matmul_peak_tflops(n: int = 8192, dtype: torch.dtype = torch.bfloat16) -> float:
    """Dense matmul TFLOP/s of this GPU: ``n x n x n`` with torch.matmul (cuBLAS), random data."""
    a = torch.randn(n, n, device="cuda").to(dtype)
    b = torch.randn(n, n, device="cuda").to(dtype)
    c = torch.empty(n, n, device="cuda", dtype=dtype)
    ms = median_ms(lambda: torch.matmul(a, b, out=c), reps=10)
    del a, b, c
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def fp8_matmul_peak_tflops(n: int = 8192) -> Optional[float]:
    """The same for E4M3 x E4M3 -> bf16 through ``torch._scaled_mm``; None where it is absent."""
    if not hasattr(torch, "_scaled_mm") or torch.cuda.get_device_capability()[0] < 9:
        return None
    try:
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        one = torch.ones((), device="cuda")
        fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        ms = median_ms(fn, reps=10)
        return 2.0 * n**3 / (ms * 1e-3) / 1e12
    except Exception:  # noqa: BLE001 - an optional ceiling
        return None


def copy_bandwidth_gbps(nbytes: int = 2 << 30) -> float:
    """Device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=5)
    del src, dst
    return 2.0 * nbytes / (ms * 1e-3) / 1e9
