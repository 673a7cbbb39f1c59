"""cuDNN handles: one per (device, thread), bound to the caller's current CUDA stream.

cuDNN handles must not be used by two threads at once; built plans are shared by all threads
(the plan cache). So each thread gets its own handle per device.

A thread's handles go back to a per-device pool when the thread ends (or when it calls
:func:`release_thread_handles`), and the next thread that needs a handle takes one from the
pool instead of creating one. A process therefore holds as many handles as the largest
number of threads that used te_cudnn at the same time, however many threads come and go
(thread pools, servers, data-loader workers), instead of one per thread that ever called.

Pooled handles are not destroyed (``cudnnDestroy``), for three reasons:

* ``cudnnDestroy`` synchronizes the device (cuDNN's documentation of cudnnDestroy). Run from
  a thread's end, it would stall every stream at a moment the program does not choose and,
  inside another thread's CUDA-graph capture (torch captures in "global" mode by default),
  invalidate that capture. The cuDNN frontend keeps its own default handles alive until exit
  for the same reason (``cudnn/_pygraph.py``: a GC-timed release inside someone else's
  capture "poisons every later launch").
* Plans in the shared cache were built, or deserialized, with the handle of the thread that
  built them, and they outlive that thread.
* Reuse is what matters for a long-running process: the pool is bounded by peak concurrency.

PyTorch keeps its cuDNN/cuBLAS handles the same way (a per-device pool; a thread's handles
return to it when the thread ends).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ..runtime import cudnn_module

__all__ = ["handle_for", "current_raw_stream", "release_thread_handles", "handle_stats"]

try:  # the raw current stream, without building a torch.cuda.Stream object
    current_raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - CPU-only torch builds
    def current_raw_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream


#: device -> handles no live thread holds. ``list.append`` / ``list.pop`` are single C calls,
#: atomic under the GIL, so the pool needs no lock: it is also filled from ``__del__``, which
#: may run during a garbage collection inside any code, including code that holds a lock.
_idle: dict[int, list] = {}
_created: dict[int, int] = {}  # device -> handles ever created (the pool's high-water mark)
_created_lock = threading.Lock()


class _ThreadHandles(dict):
    """``device -> handle`` of one thread. It lives only in that thread's ``threading.local``
    storage, so it dies with the thread, and its finalizer returns the handles to the pool."""

    __slots__ = ()

    def __del__(self, _idle: dict = _idle) -> None:  # the pool bound early: safe during interpreter teardown
        for device, handle in self.items():
            _idle.setdefault(device, []).append(handle)


_local = threading.local()


def _create(device: int) -> Any:
    cudnn = cudnn_module()
    with torch.cuda.device(device):
        return cudnn.create_handle()


def _take(device: int) -> Any:
    """A pooled handle for ``device`` (one a finished thread gave back), else a new one."""
    pool = _idle.get(device)
    while pool:
        try:
            handle = pool.pop()
        except IndexError:  # another thread took the last one between the test and the pop
            break
        if handle.backend_handle is not None:  # skip handles someone destroyed with cudnn.destroy_handle
            return handle
    handle = _create(device)
    with _created_lock:
        _created[device] = _created.get(device, 0) + 1
    return handle


def handle_for(device: int):
    """This thread's handle for ``device``, bound to the device's current torch stream."""
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = _ThreadHandles()
    handle = handles.get(device)
    if handle is None:
        handle = handles[device] = _take(device)
    stream = current_raw_stream(device)
    if handle.stream != stream:  # cudnn.set_stream skips unchanged streams too; this skips the call
        cudnn_module().set_stream(handle, stream)
    return handle


def release_thread_handles() -> int:
    """Give the calling thread's handles back to the pool now, instead of when the thread ends;
    returns how many. The thread's next :func:`handle_for` takes a handle from the pool again.

    Whoever keeps a reference to a handle it got from :func:`handle_for` (te_cudnn's launch
    path caches one per stream) must drop it too: after this call another thread may take
    that handle from the pool, and two threads must never use one handle at once."""
    handles = getattr(_local, "handles", None)
    if not handles:
        return 0
    released = len(handles)
    for device, handle in handles.items():
        _idle.setdefault(device, []).append(handle)
    handles.clear()  # its finalizer then gives back nothing twice
    return released


def handle_stats() -> dict[int, dict[str, int]]:
    """Per device: handles ``created`` so far and ``idle`` ones waiting in the pool (the rest
    are held by live threads)."""
    with _created_lock:
        created = dict(_created)
    return {device: {"created": n, "idle": len(_idle.get(device, ()))} for device, n in sorted(created.items())}
