"""Timing GPU work with CUDA events, and host work with the host clock.

Every timing loop of te_cudnn (the autotuner, the benchmark, the demo, the examples and the
tools) takes its measurements through this module, so that each way of timing is written once:

* :func:`event_ms`: back-to-back calls between two CUDA events; :func:`median_ms`: its median
  over rounds, after warm-up; :class:`EventSpan`: an event pair around work queued now and read
  later (a loop queues many spans and synchronizes once).
* :func:`capture`: a CUDA graph of calls, to time their replay without host gaps.
* :func:`host_medians`: host microseconds per call, where the host, not the GPU, is the limit.
* :func:`queued_ms`: GPU time and host time of the same back-to-back calls, optionally queued
  behind a spin (the GPU time without host gaps beside the host's own cost).
* :func:`spin_ahead_samples` and :func:`interleaved_samples`: GPU time of launches whose host
  cost would otherwise be timed: the stream spins (``torch.cuda._sleep``) while the host queues
  them, so the samples hold the GPU's back-to-back execution only.

A bottom layer: it imports only torch and the standard library; policy (how long a sample
lasts, how many rounds, in which order) belongs to the callers.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import torch

__all__ = ["EventSpan", "event_ms", "queued_ms", "median_ms", "capture", "host_medians", "spin_rate", "spin",
           "spin_ended", "warm", "spin_ahead_samples", "interleaved_samples", "SPIN_CALIBRATION_CYCLES", "MAX_SPIN_MS",
           "SPIN_RETRIES"]  # fmt: skip


class EventSpan:
    """Two CUDA timing events around work queued on the current stream. :meth:`ms` reads the
    time between them once the end event has completed (after :meth:`wait` or a synchronize),
    so a loop can queue many spans and read them all after one synchronize."""

    __slots__ = ("_end", "_start")

    def __init__(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def begin(self) -> None:
        self._start.record()

    def end(self) -> None:
        self._end.record()

    def wait(self) -> None:
        """Block the host until the work before :meth:`end` is done."""
        self._end.synchronize()

    def ms(self) -> float:
        """Milliseconds between :meth:`begin` and :meth:`end` on the GPU."""
        return self._start.elapsed_time(self._end)


def event_ms(fn: Callable[[], Any], reps: int = 1, lead: int = 0) -> float:
    """Milliseconds per call of ``reps`` back-to-back calls, CUDA events around them (the GPU
    time of :func:`queued_ms`). ``lead`` untimed calls go first: while the GPU runs them the
    host queues the start event and the timed calls, so the first timed call does not wait for
    its own launch (without a lead, the time of a lone call includes its host latency from an
    idle GPU)."""
    return queued_ms(fn, reps, lead)[0]


def queued_ms(fn: Callable[[], Any], reps: int, lead: int = 0, ahead_ms: float = 0.0,
              rate: Optional[float] = None) -> tuple[float, float, bool]:
    """``(GPU ms per call, host µs per call, late)`` of ``reps`` back-to-back calls of ``fn``
    after ``lead`` untimed ones: the GPU time between CUDA events, and the host time the loop
    took to queue the calls (``perf_counter``). With ``ahead_ms`` and a :func:`spin_rate`
    ``rate``, the stream first spins for about that long, so the GPU runs the calls back to back
    whatever the host's pace: the GPU time then holds no host gaps. ``late``: the spin was over
    before the host had queued every call (the GPU time may include host gaps: spin longer)."""
    for _ in range(lead):
        fn()
    spun = spin(ahead_ms, rate) if ahead_ms > 0 and rate else None
    span = EventSpan()
    span.begin()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host_us = (time.perf_counter() - t0) / reps * 1e6
    span.end()
    late = spin_ended(spun)
    span.wait()
    return span.ms() / reps, host_us, late


def median_ms(fn: Callable[[], Any], reps: int = 1, rounds: int = 7, warmup: int = 3) -> float:
    """The median over ``rounds`` of :func:`event_ms` (``reps`` calls each), after ``warmup``
    untimed calls and a synchronize (lazy initialisation and allocator growth stay out)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(event_ms(fn, reps) for _ in range(rounds))


def capture(fn: Callable[[Any], Callable[[], Any]], reps: int, setup: Optional[Callable[[], Any]] = None,
            warmup: int = 2) -> tuple[Any, Any]:  # fmt: skip
    """A CUDA graph of ``reps`` calls of ``fn(state)`` where ``state = setup()`` (run on the
    capture stream, so that autograd's backward, which runs on its forward's stream, is
    captured too). Warm-up calls run on the side stream first (allocator pools, lazy init).
    Returns ``(graph, state)``; keep ``state`` alive as long as the graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        state = setup() if setup is not None else None
        call = fn(state)
        for _ in range(warmup):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for _ in range(reps):
            call()
    torch.cuda.synchronize()
    return graph, state


def host_medians(fns: dict, rounds: int, calls: int, warmup: int = 500) -> dict:
    """Median host microseconds per call of each function: ``calls`` back-to-back calls timed
    with the host clock, then one synchronize; interleaved rounds, so machine noise hits every
    contender alike."""
    reps: dict = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            reps[name].append((t1 - t0) / calls * 1e6)
    return {name: statistics.median(r) for name, r in reps.items()}


# ----------------------------------------------------------------------------- spinning ahead of the samples
#: The length of the spins that measure ``torch.cuda._sleep``'s rate (0.5 ms at 2 GHz).
SPIN_CALIBRATION_CYCLES = 1_000_000
#: The longest spin queued before a sample.
MAX_SPIN_MS = 200.0
#: A sample whose spin ended before the host had queued it is taken again with twice the spin, at
#: most this many times per run (then it counts as it is).
SPIN_RETRIES = 4

_cycles_per_ms: dict[int, Optional[float]] = {}


def spin_rate(device: int) -> Optional[float]:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep``, measured once per device: the
    fastest of three spins in a row (None where ``_sleep`` is missing or fails). ``_sleep``
    counts clock cycles, and a GPU that was idle runs the first spin at a low clock; a rate
    read there would make every later spin, at the clock under load, a fraction as long as
    meant. The highest rate gives spins at least as long as meant; a spin that still ends too
    soon is caught where it is used (:func:`spin_ended`)."""
    if device in _cycles_per_ms:
        return _cycles_per_ms[device]
    rate = None
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        try:
            rates = []
            for _ in range(3):
                ms = event_ms(lambda: sleep(SPIN_CALIBRATION_CYCLES))
                if ms > 0:
                    rates.append(SPIN_CALIBRATION_CYCLES / ms)
            rate = max(rates) if rates else None
        except Exception:  # noqa: BLE001 - spinning is an optimisation of the measurement
            rate = None
    _cycles_per_ms[device] = rate
    return rate


def spin(ms: float, rate: float) -> Any:
    """Spin the current stream for about ``ms`` and return an event recorded right after it."""
    torch.cuda._sleep(int(ms * rate))
    spun = torch.cuda.Event()
    spun.record()
    return spun


def spin_ended(spun: Any) -> bool:
    """True when the spin before a sample was over by the time the host had queued the sample's
    launches: the GPU may have waited for the host, so the sample may include host time."""
    return spun is not None and bool(spun.query())


def warm(run: Callable[[], None], warmup: int) -> tuple[float, float]:
    """``warmup`` launches of ``run`` (at least one), then one more between CUDA events:
    ``(median host ms per launch, device ms of one launch)`` (the latter at least 1 µs)."""
    host = []
    for _ in range(max(warmup, 1)):
        t0 = time.perf_counter()
        run()
        host.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(host) * 1e3, max(event_ms(run), 1e-3)


def spin_ahead_samples(run: Callable[[], None], *, warmup: int, reps: int, sample_ms: float,
                       max_inner: int) -> list[float]:  # fmt: skip
    """Milliseconds per launch of ``run`` on the current stream, one value per sample.

    ``warmup`` launches (:func:`warm`), then ``reps`` samples between CUDA events, each of
    enough launches to last about ``sample_ms`` (at most ``max_inner``). Where the host needs
    longer to launch ``run`` than the GPU to run it, the stream first spins for as long as the
    host needs to queue every sample, so the samples measure the GPU's back-to-back execution,
    not the host; when the spin was over before the host had queued them, all samples are taken
    again with twice the spin (at most :data:`SPIN_RETRIES` times)."""
    host_ms, estimate = warm(run, warmup)
    inner = int(min(max(1, math.ceil(sample_ms / estimate)), max_inner))
    spans = [EventSpan() for _ in range(max(reps, 1))]
    rate = spin_rate(torch.cuda.current_device())
    ahead = min(host_ms * inner * len(spans) * 1.25 + 0.5, MAX_SPIN_MS)
    spinning = bool(rate) and host_ms > estimate * 0.5  # launches would starve the GPU: queue them behind a spin
    for _ in range(SPIN_RETRIES + 1):
        spun = spin(ahead, rate) if spinning else None
        for span in spans:
            span.begin()
            for _ in range(inner):
                run()
            span.end()
        late = spin_ended(spun)
        torch.cuda.synchronize()
        if not late or ahead >= MAX_SPIN_MS:
            break
        ahead = min(ahead * 2, MAX_SPIN_MS)  # the spin ended before the host was done: longer, again
    return [span.ms() / inner for span in spans]


def interleaved_samples(runs: Sequence[Callable[[], None]], *, warmup: int, reps: int,
                        order: Callable[[list[int]], Sequence[int]], sample_ms: float, max_inner: int,
                        settle_ms: float, max_settle_launches: int) -> list[Any]:  # fmt: skip
    """Milliseconds per launch of each of ``runs``, timed side by side, so that a drift of the
    GPU's clocks hits them alike: ``reps`` rounds, each visiting every run once in the order
    ``order(run positions)`` gives, one sample per run per round of enough back-to-back launches
    to last about ``sample_ms`` (at most ``max_inner``). Before the rounds the GPU runs the first
    run for about ``settle_ms`` (at most ``max_settle_launches`` launches), so the samples see
    the clock its power limit holds under sustained load. Returns one list of samples per run,
    or the exception a run raised (that run is left out of later rounds).

    A host-bound run's launches are queued behind a spin of the stream so that host time is not
    timed; a sample whose spin was over before the host had queued it is taken again in a later
    round with twice the spin (at most :data:`SPIN_RETRIES` times per run)."""
    n = len(runs)
    results: list[Any] = [None] * n
    inner, ahead = [1] * n, [0.0] * n
    rate = spin_rate(torch.cuda.current_device())
    for i, run in enumerate(runs):
        try:
            host_ms, estimate = warm(run, warmup)
        except Exception as exc:  # noqa: BLE001 - this run's result is its failure
            results[i] = exc
            continue
        inner[i] = int(min(max(1, math.ceil(sample_ms / estimate)), max_inner))
        if rate and host_ms > estimate * 0.5:  # launches would starve the GPU: queue them behind a spin
            ahead[i] = min(host_ms * inner[i] * 1.25 + 0.05, MAX_SPIN_MS)
        results[i] = []
    live = [i for i in range(n) if results[i] == []]
    if live:  # settle: bring the GPU to the clock it holds under load
        first = live[0]
        estimate_ms = sample_ms / inner[first]
        for _ in range(int(min(max(1, settle_ms / max(estimate_ms, 1e-3)), max_settle_launches))):
            runs[first]()
    late_samples = [0] * n
    for _ in range(max(reps, 1) + SPIN_RETRIES):
        pending = [i for i in live if len(results[i]) < max(reps, 1)]
        if not pending:
            break
        queued = []
        for i in order(pending):
            spun = spin(ahead[i], rate) if ahead[i] else None
            span = EventSpan()
            try:
                span.begin()
                for _ in range(inner[i]):
                    runs[i]()
                span.end()
            except Exception as exc:  # noqa: BLE001
                results[i] = exc
                continue
            queued.append((i, span, spin_ended(spun)))
        torch.cuda.synchronize()
        for i, span, late in queued:
            if not isinstance(results[i], list):
                continue
            if late and ahead[i] < MAX_SPIN_MS and late_samples[i] < SPIN_RETRIES:
                # the spin ended before the host had queued the sample (a GPU clock above the one
                # the spin rate was read at): the sample may hold host time; spin longer, time again
                late_samples[i] += 1
                ahead[i] = min(ahead[i] * 2, MAX_SPIN_MS)
                continue
            results[i].append(span.ms() / inner[i])
        live = [i for i in live if isinstance(results[i], list)]
    return results
