"""The CUDA driver-API calls te_cudnn makes through ``ctypes``: where torch has no call for
what is needed (a capture's id, a stream no other code can be handed) or where torch's call
costs several times the host time of the driver's (filling a new tensor: a dispatched fill
launches a kernel; a driver memset is one call; launching an instantiated graph).

Every function reports failure to its caller (None or False) instead of raising where the
driver library or a symbol is missing, so callers keep a torch path for that case. The
driver's entry points are resolved once, with their argument types declared (``ctypes``
would otherwise pass 64-bit pointers and sizes as C ints).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any, Callable, Optional

__all__ = ["capture_info", "graph_launch", "memset_d8", "memset_d32", "new_stream", "NEG_INF_F32_BITS"]

#: The bits of float32 -inf, for :func:`memset_d32`.
NEG_INF_F32_BITS = 0xFF800000

_c_ptr, _c_size, _c_uint, _c_int = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int


@functools.lru_cache(maxsize=None)
def _library() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
    except OSError:
        return None


def _entry(name: str, argtypes: list) -> Optional[Callable[..., int]]:
    lib = _library()
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is not None:
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


@functools.lru_cache(maxsize=None)
def capture_info() -> Optional[Callable[..., int]]:
    """``cuStreamGetCaptureInfo`` (its first, three-argument form, which every driver since
    CUDA 10.1 exports under that name: stream, status, id), or None. The runtime's form is not
    used: its signature changed in CUDA 13."""
    return _entry("cuStreamGetCaptureInfo", [ctypes.c_void_p, ctypes.POINTER(_c_int), ctypes.POINTER(ctypes.c_uint64)])


@functools.lru_cache(maxsize=None)
def _memsets() -> tuple[Any, Any]:
    return (_entry("cuMemsetD8Async", [_c_ptr, ctypes.c_ubyte, _c_size, ctypes.c_void_p]),
            _entry("cuMemsetD32Async", [_c_ptr, _c_uint, _c_size, ctypes.c_void_p]))  # fmt: skip


def memset_d8(ptr: int, value: int, count: int, stream: int) -> bool:
    """Set ``count`` bytes at device address ``ptr`` to ``value``, enqueued on raw stream
    ``stream`` (captured like any other work when the stream is capturing). False where the
    driver call is missing or fails (no context current on this thread, for one)."""
    fn = _memsets()[0]
    return fn is not None and fn(ptr, value, count, stream) == 0


def memset_d32(ptr: int, bits: int, count: int, stream: int) -> bool:
    """Set ``count`` 32-bit words at ``ptr`` (4-byte aligned) to ``bits``, as :func:`memset_d8`."""
    fn = _memsets()[1]
    return fn is not None and fn(ptr, bits, count, stream) == 0


@functools.lru_cache(maxsize=None)
def graph_launch() -> Optional[Callable[[int, int], int]]:
    """``cuGraphLaunch(exec, stream) -> CUresult``, or None: an instantiated graph's launch
    without the wrapper of ``torch.cuda.CUDAGraph.replay`` (a device guard, a driver-version
    query and a release of the GIL), for graphs that draw no random numbers."""
    return _entry("cuGraphLaunch", [ctypes.c_void_p, ctypes.c_void_p])


def new_stream(index: int) -> int:
    """A new non-blocking CUDA stream in device ``index``'s primary context (the one torch
    uses), as a raw handle kept for the process. Raises RuntimeError naming the failing call."""
    lib = _library()
    if lib is None:
        raise RuntimeError("te_cudnn: the CUDA driver library (libcuda) could not be loaded")
    ref = ctypes.byref
    dev, ctx, handle, popped = ctypes.c_int(0), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()

    def check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"te_cudnn: {what} failed (CUresult {status}) on cuda:{index}")

    check(lib.cuDeviceGet(ref(dev), ctypes.c_int(index)), "cuDeviceGet")
    check(lib.cuDevicePrimaryCtxRetain(ref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
    try:
        check(lib.cuStreamCreate(ref(handle), ctypes.c_uint(1)), "cuStreamCreate")  # CU_STREAM_NON_BLOCKING
    finally:
        lib.cuCtxPopCurrent_v2(ref(popped))
    return handle.value
