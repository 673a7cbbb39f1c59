"""Launching a compiled plan on the caller's stream: workspaces, launch contexts, pointers.

The layer between the plan cache and the public functions. ``launch`` takes a plan whose
operands are a pointer array in the plan's uid order and runs it on the current stream of a
device: a stream read, one dict lookup and the frontend's native call. ``execute`` takes
tensors instead (and the frontend's own execute for plans that cannot launch from
pointers). Everything slower lives in ``_context``: the first use of a stream, a larger
workspace, CUDA-graph capture.

Workspaces: one buffer per (device, stream), grown when needed, shared by every plan on that
stream (work on one stream runs in order); during capture a fresh buffer from the graph's
pool. ``release_workspaces`` gives them back.

CUDA graphs: ``is_capturing`` (torch's C entry point) and ``capture_id``, the driver's id of
the capture the current stream is in, which scopes te_cudnn's runtime-buffer cache to one
captured graph (``te_cudnn.varlen``). Work on the legacy default stream (raw handle 0, torch's
default stream) is never captured: CUDA refuses to begin a capture there, and torch's
``CUDAGraph`` requires a non-default stream. So a launch there skips the capture query, which
every launch of a plan with workspace on another stream pays.

Operand check (a debug mode, off by default): with ``TE_CUDNN_CHECK_OPERANDS=1`` in the
environment (read once, at import) or after ``check_operands(True)``, ``execute`` compares
every operand it binds with the tensor the plan's graph declares for that uid (dims, strides,
dtype, device, alignment) and ``launch`` what its pointers allow (their count, null pointers,
alignment); a mismatch raises ``ValueError`` naming the operand, what the graph declares and
what was bound, before anything runs. Off, each costs one test of a module flag.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import os
import sys
import threading
import weakref
from array import array
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from .backends import BY_ENUM, OPERANDS_BY_UID
from .backends.base import Uid
from .backends.operands import DeclaredOperand, alignment
from .driver import NEG_INF_F32_BITS, capture_info, memset_d8, memset_d32
from .errors import MisalignedError
from .plans.handles import current_raw_stream, handle_for, release_thread_handles
from .runtime import torch_dtype_to_cudnn

if TYPE_CHECKING:
    from .plans import CompiledPlan

__all__ = [
    "launch", "execute", "is_capturing", "capture_id", "release_workspaces", "misaligned", "check_aligned",
    "seed_offset", "current_raw_stream", "current_device", "data_ptr", "FWD_NAMES", "BWD_NAMES",
    "check_operands", "checking_operands", "DeclaredOperand", "declared_operands", "declared_in_graph",
    "operand_mismatches", "check_bound", "check_pointers", "operand_checks", "kept", "on_worker",
]  # fmt: skip

#: The names of the leading operands whose 16-byte alignment a launch checks (error messages).
FWD_NAMES = ("q", "k", "v", "out", "softmax_lse")
BWD_NAMES = ("q", "k", "v", "o", "aux_ctx_tensors[0]", "d_o")

#: Whether :func:`execute` and :func:`launch` check their operands: the debug mode of
#: ``TE_CUDNN_CHECK_OPERANDS=1`` (read here, once) and :func:`check_operands`.
_check = os.environ.get("TE_CUDNN_CHECK_OPERANDS", "0") == "1"

data_ptr = torch.Tensor.data_ptr
try:  # the C entry point behind torch.cuda.current_device (the device guard's one integer compare)
    current_device = torch._C._cuda_getDevice
except AttributeError:  # pragma: no cover - CPU-only torch builds
    current_device = torch.cuda.current_device


def misaligned(**tensors: Optional[torch.Tensor]) -> None:
    """Raise the ValueError for operands cuDNN cannot read (not 16-byte aligned), naming them."""
    bad = [f"{n} (data_ptr % 16 = {t.data_ptr() % 16})" for n, t in tensors.items() if t is not None and t.data_ptr() % 16]
    raise MisalignedError(f"cuDNN needs 16-byte aligned tensors; misaligned: {', '.join(bad)}. Pass tensors that start on "
                          "a 16-byte boundary")  # fmt: skip


def check_aligned(names: tuple, buffers: list) -> None:
    if any(data_ptr(t) & 15 for t in buffers[: len(names)]):
        misaligned(**dict(zip(names, buffers)))


def zeroed(t: torch.Tensor, index: int) -> torch.Tensor:
    """``t`` (new and dense) set to zero; on cuda:``index``, by one driver memset on the current
    stream, a fraction of the host time of ``t.zero_()`` (its fallback, and the CPU path)."""
    n = t.numel() * t.element_size()
    if n and not (t.is_cuda and memset_d8(data_ptr(t), 0, n, current_raw_stream(index))):
        t.zero_()
    return t


def neg_inf(t: torch.Tensor, index: int) -> torch.Tensor:
    """``t`` (new and dense float32) filled with -inf, as :func:`zeroed`."""
    n = t.numel()
    if n and not (t.is_cuda and memset_d32(data_ptr(t), NEG_INF_F32_BITS, n, current_raw_stream(index))):
        t.fill_(float("-inf"))
    return t


def seed_offset(rng_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, 1, 1, 1] views of rng_state[0] (seed) and rng_state[1] (offset), as the graph declares."""
    return rng_state.as_strided((1, 1, 1, 1), (1, 1, 1, 1), 0), rng_state.as_strided((1, 1, 1, 1), (1, 1, 1, 1), 1)


# ------------------------------------------------------------------------ CUDA-graph capture


def _never_capturing() -> bool:
    return False


try:  # the C entry point behind torch.cuda.is_current_stream_capturing (skips its Python wrapper)
    is_capturing = torch._C._cuda_isCurrentStreamCapturing
except AttributeError:  # pragma: no cover - CPU-only torch builds
    is_capturing = torch.cuda.is_current_stream_capturing
if not torch.cuda.is_available():  # CPU-only builds define it as a stub that raises; no CUDA, no capture
    is_capturing = _never_capturing

_CAPTURE_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE


def capture_id(index: int) -> Optional[int]:
    """The id of the CUDA-graph capture that the current stream of device ``index`` is in
    (unique within the process: a later capture never reuses it), or None when the stream is
    not capturing or the driver cannot say. A driver call: call it only while
    :func:`is_capturing` says True (once per captured call, never on replays)."""
    fn = capture_info()
    if fn is None:
        return None
    status, ident = ctypes.c_int(0), ctypes.c_uint64(0)
    if fn(current_raw_stream(index), ctypes.byref(status), ctypes.byref(ident)) != 0 or status.value != _CAPTURE_ACTIVE:
        return None
    return ident.value


# ------------------------------------------------------------------------ kept allocations

_keeper: list = []  # the one worker thread that makes kept tensors (started on first use)
_keeper_lock = threading.Lock()


def _keeper_pool() -> concurrent.futures.ThreadPoolExecutor:
    with _keeper_lock:
        if not _keeper:
            _keeper.append(concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="te_cudnn-kept"))
        return _keeper[0]


def _make_on(make: Callable[[], Any], index: int, stream: Optional[torch.cuda.Stream]) -> Any:
    if stream is None:
        return make()
    with torch.cuda.device(index), torch.cuda.stream(stream):
        return make()


def _on_device(fn: Callable[[], Any], index: int) -> Any:
    with torch.cuda.device(index):
        return fn()


def on_worker(fn: Callable[[], Any], index: int) -> Any:
    """``fn()`` on te_cudnn's worker thread (the one :func:`kept` uses), with device ``index``
    current and that thread's own current stream (not the caller's): for work that must not
    touch the caller's streams or allocate from a pool the caller's thread is routed to."""
    if threading.current_thread().name.startswith("te_cudnn-kept"):
        return _on_device(fn, index)
    return _keeper_pool().submit(_on_device, fn, index).result()


def kept(make: Callable[[], Any], device: Optional[torch.device] = None) -> Any:
    """``make()``, for device tensors te_cudnn keeps across calls (workspaces, result templates,
    constant operands), made so that they never come from a CUDA-graph memory pool.

    torch.compile's CUDA-graph trees (``mode="reduce-overhead"``) warm a compiled region up by
    routing every allocation of the calling thread to the graph's private pool, then report any
    block of that pool that outlives the call without being one of its outputs. A tensor
    te_cudnn keeps would be such a block. Routing is per thread, so ``make`` runs on one worker
    thread of te_cudnn's, on the caller's device and current stream (its kernels stay ordered
    with the caller's work, and the allocator ties the memory to that stream, as if the caller
    had allocated it). During a capture it runs in the caller's thread: CUDA forbids another
    thread to allocate while a global-mode capture is under way (these calls are then part of
    that capture, which is te_cudnn's rule for captures anyway). Costs a thread hand-off, once
    per kept tensor."""
    index = -1 if device is None or device.type != "cuda" else (device.index if device.index is not None
                                                                 else torch.cuda.current_device())  # fmt: skip
    if index < 0 or threading.current_thread().name.startswith("te_cudnn-kept") or (
            current_raw_stream(index) and is_capturing()):  # fmt: skip
        return make()
    stream = torch.cuda.current_stream(index)
    return _keeper_pool().submit(_make_on, make, index, stream).result()


# ------------------------------------------------------------------------------ workspaces

_workspaces: dict[tuple[int, int], torch.Tensor] = {}
_no_workspace: dict[int, torch.Tensor] = {}


def workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """Scratch memory for one execute. Outside CUDA-graph capture, one buffer per (device,
    stream) is reused (grown when needed): work on one stream runs in order, so it is never
    shared by two kernels at once. During capture a fresh buffer from the graph's pool is
    used, so captured graphs never point at a buffer that is later replaced. Plans that need
    none (most forwards) get a 16-byte placeholder that lives as long as the process."""
    if nbytes == 0:
        ws = _no_workspace.get(device.index)
        if ws is None:
            ws = _no_workspace[device.index] = kept(lambda: torch.empty(16, dtype=torch.uint8, device=device), device)
        return ws
    stream = current_raw_stream(device.index)
    if stream and is_capturing():
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    slot = (device.index, stream)
    ws = _workspaces.get(slot)
    if ws is None or ws.numel() < nbytes:
        # free the smaller buffer first (work queued on this stream keeps its order): the peak is
        # the larger buffer, not both (calls alternating between plans of growing workspace)
        ws = _workspaces.pop(slot, None)
        ws = None
        ws = _workspaces[slot] = kept(lambda: torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device), device)
    return ws


class _LaunchContexts(dict):
    """(device, stream) -> [handle, raw cudnnHandle_t, reusable workspace, its bytes, its address]
    for one thread (a dict that can be weakly referenced, so release_workspaces() reaches it)."""

    __slots__ = ("__weakref__",)


_all_contexts: dict[int, "weakref.ref[_LaunchContexts]"] = {}  # every live thread's contexts
_contexts_lock = threading.Lock()


class _LaunchLocal(threading.local):
    def __init__(self) -> None:
        self.ctx = ctx = _LaunchContexts()
        key = id(ctx)
        with _contexts_lock:  # the entry leaves with its thread
            _all_contexts[key] = weakref.ref(ctx, lambda _, key=key: _all_contexts.pop(key, None))


_launch_local = _LaunchLocal()


def release_workspaces() -> int:
    """Drop the cuDNN workspaces te_cudnn keeps for reuse (every thread, device and stream);
    returns their bytes. The memory goes back to PyTorch's caching allocator (follow with
    ``torch.cuda.empty_cache()`` to return it to the driver); the next call allocates what its
    plan needs. Safe at any time: a launch in flight keeps its buffer until it is done.
    Also releases the calling thread's cuDNN handles (other threads' go when they exit)."""
    with _contexts_lock:
        contexts = [c for c in (ref() for ref in list(_all_contexts.values())) if c is not None]
    buffers = {id(ws): ws for ws in _workspaces.values()}
    _workspaces.clear()
    for ctx in contexts:
        for entry in list(ctx.values()):
            if entry[3]:  # the shared 16-byte placeholder of workspace-free plans stays
                buffers[id(entry[2])] = entry[2]
        ctx.clear()
    release_thread_handles()
    return sum(ws.numel() for ws in buffers.values())


# ---------------------------------------------------------------------------------- launch


def _context(index: int, stream: int, nbytes: int) -> list:
    """This thread's launch context for ``stream`` of device ``index`` with at least ``nbytes``
    of workspace: ``[handle, raw cudnnHandle_t, workspace, its bytes, its address]`` (the slow
    half of :func:`launch`: first use of a stream, a larger workspace, CUDA-graph capture, or
    a handle another caller re-bound to another stream). During capture a plan that needs
    workspace gets a fresh buffer from the graph's pool (returned in a one-off context)."""
    ctx = _launch_local.ctx
    slot = (index, stream)
    entry = ctx.get(slot)
    if entry is None:
        handle = handle_for(index)
        ws = workspace(0, _device_of(index))
        entry = ctx[slot] = [handle, handle.backend_handle or 0, ws, 0, data_ptr(ws)]
    handle = entry[0]
    if handle.stream != stream:  # another caller re-bound this thread's handle to another stream
        handle = handle_for(index)
        if handle is not entry[0]:  # the thread's handle was released and replaced meanwhile
            entry[0], entry[1] = handle, handle.backend_handle or 0
    if nbytes <= entry[3] and (nbytes == 0 or not stream or not is_capturing()):  # workspace-free plans never touch it
        return entry
    capturing = stream != 0 and is_capturing()
    if nbytes > entry[3] and not capturing:  # growing: let go of the smaller buffer first
        entry[2], entry[3] = None, -1
    ws = workspace(nbytes, _device_of(index))  # during capture: a fresh buffer from the graph's pool
    if capturing:
        return [entry[0], entry[1], ws, nbytes, data_ptr(ws)]
    entry[2], entry[3], entry[4] = ws, ws.numel(), data_ptr(ws)
    return entry


_devices: dict[int, torch.device] = {}


def _device_of(index: int) -> torch.device:
    dev = _devices.get(index)
    if dev is None:
        dev = _devices[index] = torch.device("cuda", index)
    return dev


def launch(plan: CompiledPlan, ptrs: array, index: int) -> None:
    """Launch ``plan`` (mode ``raw``) on the caller's current stream of device ``index`` with
    ``ptrs``: the operands' data pointers in the plan's uid order. The fast half is a stream
    read, one dict lookup and the native call; everything else is :func:`_context`. When the
    device is not the current one (model parallel in one process, Hugging Face ``device_map``),
    the launch runs under a guard that makes it current."""
    if _check:  # the operand-check debug mode (off: this one test)
        check_pointers(plan, ptrs)
    if index != current_device():
        with torch.cuda.device(index):
            return launch(plan, ptrs, index)
    stream = current_raw_stream(index)
    entry = _launch_local.ctx.get((index, stream))
    nbytes = plan.workspace_size
    if entry is None or entry[0].stream != stream or not (nbytes <= entry[3] and (nbytes == 0 or not stream
                                                                                  or not is_capturing())):
        entry = _context(index, stream, nbytes)
    native = plan.launch.native
    if native is not None:  # operands in the plan's order: launch from here (no wrapper frame)
        native[0](ptrs.buffer_info()[0], native[1], entry[4], entry[1], native[2])
    else:
        plan.launch.raw(ptrs.tolist(), entry[4], entry[1])


def execute(plan: CompiledPlan, buffers: list[torch.Tensor], device: torch.device, checked: tuple = (),
            rng_state: Optional[torch.Tensor] = None) -> None:
    """Launch ``plan`` with ``buffers`` (tensors in the plan's uid order) on the caller's
    current stream: through :func:`launch` when the plan launches from pointers, else through
    the frontend's own execute. ``checked``: the names of the leading ``buffers`` whose 16-byte
    alignment is checked from the same pointers the launch reads (``FWD_NAMES`` /
    ``BWD_NAMES``). ``rng_state``: dropout's [seed, offset] tensor, bound after ``buffers``
    as the graph's seed and offset operands (by address: no views on the raw path)."""
    if _check:  # the operand-check debug mode (off: this one test)
        check_bound(plan, buffers if rng_state is None else [*buffers, *seed_offset(rng_state)], device)
    launcher = plan.launch
    if launcher.mode == "raw":
        ptrs = array("Q", map(data_ptr, buffers))  # the pointer array the raw launch reads
        # checked: 4 names (a forward without stats) to 6 (the backward's q, k, v, o, stats, d_o)
        if checked and (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[len(checked) - 2] | ptrs[len(checked) - 1]) & 15:
            misaligned(**dict(zip(checked, buffers)))
        if rng_state is not None:
            seed = data_ptr(rng_state)
            ptrs.append(seed)
            ptrs.append(seed + 8)
        return launch(plan, ptrs, device.index)
    if checked:
        check_aligned(checked, buffers)
    if rng_state is not None:
        buffers = [*buffers, *seed_offset(rng_state)]
    index = device.index
    if index != current_device():
        with torch.cuda.device(index):
            return execute(plan, buffers, device)
    entry = _context(index, current_raw_stream(index), plan.workspace_size)
    launcher(buffers, entry[2], entry[0])


# ------------------------------------------------------------------- operand check (debug mode)

#: How many bindings the debug mode compared: ``tensors`` (:func:`check_bound`, every operand's
#: geometry) and ``pointers`` (:func:`check_pointers`, what a pointer array allows).
operand_checks: dict[str, int] = {"tensors": 0, "pointers": 0}


def check_operands(enabled: bool) -> None:
    """Turn the operand check on or off (``TE_CUDNN_CHECK_OPERANDS=1`` turns it on at import).

    Prepared calls are forgotten, so that the next calls prepare again under the new mode."""
    global _check
    if not isinstance(enabled, bool):
        raise TypeError(f"check_operands takes a bool, got {type(enabled).__name__}")
    _check = enabled
    prepared = sys.modules.get(f"{__package__}.prepared")
    if prepared is not None:
        prepared.forget_prepared()


def checking_operands() -> bool:
    """Whether the operand check is on."""
    return _check


_declared: "weakref.WeakKeyDictionary[Any, tuple[DeclaredOperand, ...]]" = weakref.WeakKeyDictionary()
_declared_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _torch_dtypes() -> dict:
    """cuDNN data type -> torch dtype, for the types te_cudnn binds."""

    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64]
    dtypes += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
    return {torch_dtype_to_cudnn(dt): dt for dt in dtypes}


def declared_in_graph(graph: Any, uids: Sequence[int], operands: Any = None) -> Optional[tuple[DeclaredOperand, ...]]:
    """The operands ``graph`` declares for ``uids`` (in that order), read from the frontend's
    tensor descriptions; None when the graph holds none for some uid (a plan deserialized from
    the plan store carries no descriptions) or leaves one without dims. What the caller passes
    for each uid and its alignment rule come from the sub-backend's declarations, ``operands``
    (``SubBackend.operands(direction)``; default: each uid's first declaration)."""
    declarations = OPERANDS_BY_UID if operands is None else operands
    out = []
    for uid in uids:
        try:
            t = graph.find_tensor(uid)
        except Exception:  # another frontend: no descriptions to read
            return None
        if t is None or not t.dim or not t.stride:
            return None
        dtype = _torch_dtypes().get(t.data_type) if t.data_type is not None else None
        dims, strides = tuple(int(n) for n in t.dim), tuple(int(s) for s in t.stride)
        op = declarations.get(uid)
        role = Uid.NAMES.get(uid, f"uid {uid}") if op is None else op.role
        out.append(DeclaredOperand(uid, role, dims, strides, dtype, t.ragged_offset is not None,
                                   alignment(op is not None and op.align16, dims, dtype)))  # fmt: skip
    return tuple(out)


def declared_operands(plan: CompiledPlan) -> tuple[DeclaredOperand, ...]:
    """The operands ``plan`` binds, in its uid order, as its graph declares them (read once per
    plan). A plan loaded from the plan store carries no tensor descriptions: its sub-backend's
    builder makes the graph of its key again, on the host (no device, no cuDNN planning)."""
    found = _declared.get(plan)
    if found is not None:
        return found
    key = plan.key
    backend = BY_ENUM[key.backend]
    declarations = backend.operands(key.direction)
    found = declared_in_graph(plan.graph, plan.uids, declarations)
    if found is None:
        spec = backend.build(key.config, key.direction)
        try:
            spec.graph.validate()  # infers the data types of outputs the builder leaves to the graph
        except Exception:  # noqa: BLE001 - dims and strides are declared either way
            pass
        found = declared_in_graph(spec.graph, plan.uids, declarations)
        if found is None:
            raise RuntimeError(f"the graph of {key} declares no tensor for some of its operands {plan.uids}")
    with _declared_lock:
        _declared[plan] = found
    return found


def _pairs(dims: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    """(size, stride) of every dim longer than 1, sorted: the elements a geometry addresses,
    whatever order its dims are listed in (the graph's BHSD against the caller's format)."""
    return sorted((int(n), int(s)) for n, s in zip(dims, strides) if n != 1)


def _geometry_matches(d: DeclaredOperand, t: torch.Tensor) -> bool:
    if d.ragged:  # bound [t, h, d]: the head and feature dims and the token stride are declared
        if t.dim() != 3 or len(d.dims) != 4:
            return False
        if _pairs(t.shape[1:], t.stride()[1:]) != _pairs((d.dims[1], d.dims[3]), (d.strides[1], d.strides[3])):
            return False
        return t.shape[0] <= 1 or t.stride(0) == d.strides[2]
    return _pairs(t.shape, t.stride()) == _pairs(d.dims, d.strides)


def _bound(t: Any) -> str:
    if not isinstance(t, torch.Tensor):
        return f"a {type(t).__name__}, not a tensor"
    return (f"shape {list(t.shape)} strides {list(t.stride())} {str(t.dtype).removeprefix('torch.')} on {t.device}, "
            f"data_ptr % 16 = {t.data_ptr() % 16}")  # fmt: skip


def operand_mismatches(declared: Sequence[DeclaredOperand], buffers: Sequence[Any],
                       device: Optional[torch.device] = None) -> list[str]:  # fmt: skip
    """What differs between the operands a graph declares and the tensors bound to them, one
    line per operand (empty: they agree): the count, then per operand that it is a tensor, its
    geometry (dims with their strides, in any order: the graph's BHSD against the caller's
    format; THD tensors by their head and feature dims and token stride), dtype, device (when
    ``device`` is given) and alignment."""
    problems = []
    if len(buffers) != len(declared):
        problems.append(f"{len(buffers)} operands bound but the graph declares {len(declared)}: "
                        f"{', '.join(d.role for d in declared)}")  # fmt: skip
    for d, t in zip(declared, buffers):
        why = []
        if not isinstance(t, torch.Tensor):
            why.append("not a tensor")
        else:
            if not _geometry_matches(d, t):
                why.append("geometry differs")
            if d.dtype is not None and t.dtype != d.dtype:
                why.append("dtype differs")
            if device is not None and t.device != device:
                why.append(f"not on {device}")
            if t.data_ptr() % d.align:
                why.append(f"not {d.align}-byte aligned")
        if why:
            problems.append(f"{d.role} (uid {d.uid}): {' and '.join(why)}: the graph declares {d.describe()}; "
                            f"bound {_bound(t)}")  # fmt: skip
    return problems


def check_bound(plan: CompiledPlan, buffers: Sequence[Any], device: Optional[torch.device] = None) -> None:
    """Raise ``ValueError`` when ``buffers`` (in ``plan``'s uid order) are not the tensors its
    graph declares (:func:`operand_mismatches`)."""
    operand_checks["tensors"] += 1
    problems = operand_mismatches(declared_operands(plan), buffers, device)
    if problems:
        raise ValueError(f"operands bound to the plan for {plan.key} differ from its graph's: " + "; ".join(problems))


def check_pointers(plan: CompiledPlan, ptrs: Sequence[int]) -> None:
    """Raise ``ValueError`` when a pointer array cannot be ``plan``'s operands: another count
    than its uids, a null pointer, a start its operand's alignment forbids. (Pointers carry no
    geometry: :func:`execute` checks the tensors they come from.)"""
    operand_checks["pointers"] += 1
    declared = declared_operands(plan)
    problems = []
    if len(ptrs) != len(declared):
        problems.append(f"{len(ptrs)} pointers for the {len(declared)} operands {', '.join(d.role for d in declared)}")
    for d, p in zip(declared, ptrs):
        if p == 0 or p % d.align:
            problems.append(f"{d.role} (uid {d.uid}): pointer {p:#x} " + ("is null" if p == 0 else
                            f"is not {d.align}-byte aligned") + f"; the graph declares {d.describe()}")  # fmt: skip
    if problems:
        raise ValueError(f"pointers bound to the plan for {plan.key} cannot be its operands: " + "; ".join(problems))
