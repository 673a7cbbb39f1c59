"""Memos of prepared calls: call signature -> what a repeated call needs, bounded and LRU.

A prepared call holds device tensors besides its Python fields: result templates (up to
:data:`TEMPLATE_BYTES` each, dense so that ``empty_like`` skips layout inference), constant
operands (query lengths, multipliers, zero sinks). Each memo is bounded both in entries and in
the device bytes its entries hold; when either bound is reached, the least recently used
entries are evicted (one at a time, never a wholesale flush: the hot signatures of a running
model stay). An evicted call is prepared again, and validated again, the next time it comes.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import fields, is_dataclass
from typing import Any, Hashable, Optional

import torch

__all__ = ["SigMemo", "held_bytes", "MAX_ENTRIES", "MAX_DEVICE_BYTES", "TEMPLATE_BYTES"]

#: Entries per memo (each a prepared call of a few hundred bytes of Python objects).
MAX_ENTRIES = 4096
#: Device bytes the entries of one memo may hold together (result templates, constants).
MAX_DEVICE_BYTES = 64 << 20
#: Result templates up to this size are real dense tensors (see te_cudnn.prepared._template).
TEMPLATE_BYTES = 16384

_NO_LAST: tuple = ((), None)  # () equals no signature (different length: one comparison)


def _tensor_bytes(t: torch.Tensor, seen: set) -> int:
    storage = t.untyped_storage()
    ptr = storage.data_ptr()
    if ptr in seen:  # views of one storage count once
        return 0
    seen.add(ptr)
    return storage.nbytes()


def held_bytes(obj: Any, _seen: Optional[set] = None) -> int:
    """Bytes of storage held by the tensors of ``obj``: a tensor, a list or tuple of them, or an
    object whose fields are (each storage counted once; objects nested one level deep).

    An object's fields are those its class names in ``held_fields`` (the fields that may hold
    tensors: a prepared call's templates and constants, not its configuration), else a
    dataclass's fields."""
    seen = set() if _seen is None else _seen
    if isinstance(obj, torch.Tensor):
        return _tensor_bytes(obj, seen)
    if isinstance(obj, (list, tuple)):
        return sum(held_bytes(x, seen) for x in obj if isinstance(x, (torch.Tensor, list, tuple)))
    total = 0
    for name in _fields_of(type(obj)):
        value = getattr(obj, name, None)
        if isinstance(value, (torch.Tensor, list, tuple)):
            total += held_bytes(value, seen)
        elif value is not None:
            for inner in _fields_of(type(value)):
                got = getattr(value, inner, None)
                if isinstance(got, (torch.Tensor, list, tuple)):
                    total += held_bytes(got, seen)
    return total


@functools.lru_cache(maxsize=None)
def _fields_of(cls: type) -> tuple[str, ...]:
    """The fields :func:`held_bytes` reads on instances of ``cls`` (none for other objects)."""
    declared = getattr(cls, "held_fields", None)
    if declared is not None:
        return tuple(declared)
    if is_dataclass(cls):
        return tuple(f.name for f in fields(cls))
    return ()


class SigMemo(OrderedDict):
    """Call signature -> prepared call, least recently used first, bounded by ``max_entries``
    and ``max_bytes`` (the device bytes the entries hold, :func:`held_bytes`).

    ``last`` is the (signature, prepared call) pair found last: repeated calls of one signature
    (every layer of a model) match it with one tuple comparison instead of hashing the
    ~30-field signature; other hits move their entry to the most recent end."""

    __slots__ = ("last", "device_bytes", "max_entries", "max_bytes", "_sizes", "_lock")

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_DEVICE_BYTES) -> None:
        super().__init__()
        self.last: tuple = _NO_LAST
        self.device_bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._sizes: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def find(self, sig: tuple) -> Any:
        """The prepared call of ``sig``, or None."""
        last = self.last
        if last[0] == sig:
            return last[1]
        prep = self.get(sig)
        if prep is not None:
            self.last = (sig, prep)
            try:
                self.move_to_end(sig)
            except KeyError:  # evicted by another thread meanwhile: still valid for this call
                pass
        return prep

    def remember(self, sig: Optional[Hashable], prep: Any, nbytes: Optional[int] = None) -> None:
        """Keep ``prep`` under ``sig`` (None: not kept), evicting least recently used entries
        until both bounds hold. An entry larger than ``max_bytes`` alone is not kept."""
        if sig is None:
            return
        size = held_bytes(prep) if nbytes is None else nbytes
        if size > self.max_bytes:
            return
        with self._lock:
            if sig in self:
                self.device_bytes -= self._sizes.pop(sig, 0)
                del self[sig]
            while self and (len(self) >= self.max_entries or self.device_bytes + size > self.max_bytes):
                old, _ = self.popitem(last=False)
                self.device_bytes -= self._sizes.pop(old, 0)
                if self.last[0] == old:
                    self.last = _NO_LAST
            self[sig] = prep
            self._sizes[sig] = size
            self.device_bytes += size

    def clear(self) -> None:
        with self._lock:
            self.last = _NO_LAST
            self.device_bytes = 0
            self._sizes.clear()
            super().clear()
