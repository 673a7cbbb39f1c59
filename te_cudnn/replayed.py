"""Small per-call derivations replayed from CUDA graphs, to save their launches' host time.

A variable-length call derives its sequence lengths and ragged offsets from the caller's
``cu_seqlens*`` on every call (``te_cudnn.varlen``): two or three tiny kernels, whose launches
from Python cost more host time than the rest of a cached call. A CUDA graph of those kernels
reads the ``cu_seqlens*`` *memory* when it is replayed, so a replay derives from the values
the caller's tensors hold at that point of the stream, however they were written (a torch
operation, ``.data``, DLPack, a custom kernel, NCCL, another graph's replay): the same answer
as launching the kernels, for the host time of one graph launch (the driver's
``cuGraphLaunch`` on the caller's stream where torch exposes the instantiated graph, else
``CUDAGraph.replay``).

Rules that keep it right:

* **Keyed by everything the graph reads**: the address, length and stride of every input
  tensor, the call's description (its prepared call, held by the entry, with the constant
  tensors the derivation reads) and the stream. The call's own tensor lives at that address,
  so the graph reads the call's tensor.
* **Results that live one call**: the graph writes into buffers it owns and rewrites on every
  replay. A call binds them to the cuDNN launch it enqueues right after, on the same stream,
  and hands them to no one: te_cudnn's autograd functions pass the forward's lengths to the
  backward as a :class:`te_cudnn.BatchLengths`, derived by launching the kernels.
* **Per stream**: each stream has its graphs and one memory pool for them. Graphs of one
  stream may reuse each other's freed memory: they run one after the other, as the stream
  orders them.
* **Captured on the second sighting** of a key (a one-off call never pays for a capture), on
  te_cudnn's worker thread (never into a pool torch.compile's CUDA-graph trees route the
  caller's thread to) and a stream of te_cudnn's own, which no other code can be using
  (``torch.cuda.Stream()`` hands out a pool of 32 streams round-robin: a capture on one of
  them would record another thread's work on it). Never during a capture of the caller's:
  the caller's graph records the kernels themselves.

``TE_CUDNN_REPLAY_DERIVATIONS=0`` in the environment (read at import) or
:func:`replay_derivations` ``(False)`` turns replays off: every call launches the kernels.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import torch

from .driver import graph_launch, new_stream
from .launch import current_device, on_worker

__all__ = ["replayed", "replay_derivations", "replaying", "clear", "entries", "REPLAY_LIMIT"]

#: At most this many graphs are kept; beyond it they are all dropped (and captured again as
#: their keys come back).
REPLAY_LIMIT = 64

_on = [os.environ.get("TE_CUDNN_REPLAY_DERIVATIONS", "1") != "0"]
_graphs: dict[tuple, tuple] = {}  # key -> (graph, results, what the graph reads, exec handle, cuGraphLaunch)
_seen: dict[tuple, None] = {}  # keys derived once by launching the kernels
_pools: dict[tuple, Any] = {}  # (device index, stream) -> memory pool of that stream's graphs
_side: dict[int, torch.cuda.Stream] = {}  # device index -> the stream captures run on
# Held while graphs are captured or dropped, never while one is replayed: a pool must not lose
# its last graph (and with it torch's count of its users) while a capture into it is under way.
_lock = threading.Lock()
try:  # ``CUDAGraph.replay`` without its Python wrapper (which only calls this)
    _replay = torch._C._CUDAGraph.replay
except AttributeError:  # pragma: no cover - CPU-only torch builds
    _replay = torch.cuda.CUDAGraph.replay


def replay_derivations(enabled: bool = True) -> None:
    """Turn replaying of per-call derivations on (the default) or off, process-wide."""
    _on[0] = bool(enabled)
    if not enabled:
        clear()


def replaying() -> bool:
    return _on[0]


def clear() -> None:
    """Drop every graph (a later call captures again)."""
    with _lock:
        _drop()
    _seen.clear()


def _drop() -> None:
    _graphs.clear()
    _pools.clear()  # a pool whose graphs are all gone is gone too: later graphs start new ones


def entries() -> int:
    """How many graphs are kept."""
    return len(_graphs)


def replayed(key: tuple, index: int, stream: int, derive: Callable[[list], list[torch.Tensor]],
             keep: Any) -> list[torch.Tensor]:  # fmt: skip
    """``derive(reads)``'s tensors for ``key``, on device ``index``'s current stream (raw
    handle ``stream``): replayed from the key's graph, captured at its second sighting, else
    computed by launching the kernels. ``derive`` appends to ``reads`` every tensor it reads
    besides the key's inputs and ``keep`` (which the entry holds). Outside any capture only."""
    entry = _graphs.get(key)  # empty while replays are off
    if entry is not None:
        launch = entry[4]  # the driver's launch on the caller's stream; torch's replay where it is missing or fails
        if launch is None or index != current_device() or launch(entry[3], stream):
            _replay(entry[0])
        return entry[1]
    if not _on[0]:
        return derive([])
    if key not in _seen:
        if len(_seen) >= 4 * REPLAY_LIMIT:
            _seen.clear()
        _seen[key] = None
        return derive([])
    with _lock:  # threads that miss one key together capture it once
        entry = _graphs.get(key)
        if entry is None:
            if len(_graphs) >= REPLAY_LIMIT:
                _drop()
            graph, results, reads = on_worker(lambda: _capture(derive, index, stream), index)
            handle = _exec_handle(graph)
            entry = _graphs[key] = (graph, results, (keep, reads), handle, graph_launch() if handle else None)
    _replay(entry[0])
    return entry[1]


def _exec_handle(graph: Any) -> int:
    """The instantiated graph's ``cudaGraphExec_t`` as an int (0 where torch does not expose it)."""
    try:
        return int(graph.raw_cuda_graph_exec())
    except (AttributeError, RuntimeError, TypeError):
        return 0


def _capture(derive: Callable[[list], list[torch.Tensor]], index: int, stream: int) -> tuple:
    """Capture ``derive`` on te_cudnn's own stream (runs on te_cudnn's worker thread, which
    never takes the caller's stream); nothing runs until the graph is replayed."""
    side = _side.get(index)
    if side is None:
        side = _side[index] = torch.cuda.ExternalStream(new_stream(index), device=torch.device("cuda", index))
    pool = _pools.get((index, stream))
    if pool is None:
        pool = _pools[(index, stream)] = torch.cuda.graph_pool_handle()
    graph, reads = torch.cuda.CUDAGraph(), []
    with torch.cuda.stream(side):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            results = derive(reads)
        finally:
            graph.capture_end()
    return graph, results, reads
