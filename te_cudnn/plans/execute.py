"""Launching a built plan with as little host work as possible.

``graph.execute(buffers, workspace, handle=, tensor_uids=)`` (the frontend's ordered fast
path) re-derives, on every call, facts that never change for a built plan: which engine was
selected, the backend plan index, the binding schema, each operand's geometry.
:class:`PlanLauncher` derives them once and then calls the native entry points the frontend
itself calls: the pointer-array execute its own uid-map path ends in, or the ordered reader.
These are internals of cudnn-frontend 1.32 (:data:`PRIVATE_FRONTEND_NAMES`), so the launcher
checks they exist when the plan is built and otherwise (warned once), or when
``TE_CUDNN_PUBLIC_EXECUTE=1``, uses the public ``graph.execute``.
"""

from __future__ import annotations

import os
import warnings
from array import array
from operator import itemgetter
from typing import Any, Optional, Sequence

import torch

from ..runtime import cudnn_module, frontend_version

_data_ptr = torch.Tensor.data_ptr

__all__ = ["PRIVATE_FRONTEND_NAMES", "PlanLauncher", "missing_internals"]

_FORCE_PUBLIC = os.environ.get("TE_CUDNN_PUBLIC_EXECUTE", "0") == "1"

#: Every cudnn-frontend internal the direct launch uses, by where it lives in the ``cudnn``
#: package: the graph (``cudnn.pygraph``: methods, and attributes its ``__init__`` sets) and the
#: backend graph a built graph lowers to (``graph._lowered_graph``). A CPU test holds the
#: installed frontend to this list.
PRIVATE_FRONTEND_NAMES: dict[str, tuple[str, ...]] = {
    "pygraph": ("_prepare_ordered_binding_schema", "_materialize_backend_plan", "_finish_ordered", "_variant_pack_uids",
                "_plans", "_plan_index", "_lowered_graph", "_data_bindings"),
    "_pybind_module.backend_graph": ("_execute_ordered", "_execute_ordered_pack", "_execute_with_raw_ptrs"),
}

_warned_missing = False  # the fallback to the public execute is reported once per process


def missing_internals(graph: Any) -> list[str]:
    """The names of :data:`PRIVATE_FRONTEND_NAMES` that ``graph`` (a ``cudnn.pygraph``) or the
    backend graph it lowered to lacks (a graph not lowered yet has no backend graph to ask)."""
    missing = [n for n in PRIVATE_FRONTEND_NAMES["pygraph"] if not hasattr(graph, n)]
    lowered = getattr(graph, "_lowered_graph", None)
    if lowered is not None:
        missing += [n for n in PRIVATE_FRONTEND_NAMES["_pybind_module.backend_graph"] if not hasattr(lowered, n)]
    return missing


def _warn_public_fallback(graph: Any, missing: list[str]) -> None:
    """Once per process: a frontend graph lacks internals the direct launch uses (stand-ins in
    tests are not frontend graphs and take the public path silently)."""
    global _warned_missing
    if _warned_missing or not isinstance(graph, getattr(cudnn_module(), "pygraph", ())):
        return
    _warned_missing = True
    warnings.warn(f"te_cudnn: cudnn-frontend {frontend_version()} has no {', '.join(missing)}, internals of its graph "
                  "that te_cudnn's direct launch uses (written against frontend 1.32); plans launch through the "
                  "public graph.execute, at more host time per call", stacklevel=3)  # fmt: skip


class PlanLauncher:
    """``launch(buffers, workspace, handle)``. Modes, fastest first:

    * ``raw``: the backend's pointer-array execute (``_execute_with_raw_ptrs``), when every operand
      slot of the plan is one the caller binds. The operands' geometry is not re-read: te_cudnn's
      call signature already pins shapes, strides and dtypes to the ones the plan was built for;
    * ``ordered``: the frontend's native ordered reader (``_execute_ordered``), which also binds the
      graph's own by-value scalars;
    * ``public``: ``graph.execute(buffers, tensor_uids=...)``; ``dict``: ``graph.execute({uid: t})``
      for deserialized plans, which carry no operand layout.
    """

    __slots__ = ("graph", "uids", "mode", "by_dict", "_lowered", "_schema", "_cpp_index", "_raw", "_pick", "_n", "_identity",
                 "native")

    def __init__(self, graph: Any, uids: Sequence[int]):
        self.graph = graph
        self.uids = tuple(uids)
        self.mode = "public"
        #: mode ``raw`` with the operands bound in ``uids`` order: ``(execute, count, plan index)``;
        #: the hot path calls ``execute(address of a uint64 pointer array, count, workspace address,
        #: cudnnHandle_t, plan index)`` itself (see ``te_cudnn.launch.execute``). None otherwise.
        self.native: Optional[tuple] = None
        try:
            self.by_dict = graph._prepare_ordered_binding_schema() is None
        except Exception:
            self.by_dict = False
        if self.by_dict:
            self.mode = "dict"
        if _FORCE_PUBLIC or self.by_dict:
            return
        try:
            if graph.selected_engine is not None:  # a python (FROST) engine: keep the public path
                return
        except Exception:  # noqa: BLE001 - not a frontend graph: the public path is always right
            return
        missing = missing_internals(graph)
        if missing:  # another frontend version: the public path is always right
            _warn_public_fallback(graph, missing)
            return
        try:
            cfg = graph._materialize_backend_plan(graph._plan_index) if graph._plans else None
            cpp_index = None if cfg is None else cfg.cpp_index
            schema = graph._prepare_ordered_binding_schema()
            lowered = graph._lowered_graph
            needed = (lowered._execute_ordered, lowered._execute_ordered_pack, graph._finish_ordered, graph._data_bindings)
        except Exception:  # a graph the internals cannot launch: the public path is always right
            return
        if schema is None or any(n is None for n in needed):
            return
        self._lowered, self._schema = lowered, schema
        self._cpp_index = -1 if cpp_index is None else cpp_index
        self.mode = "ordered"
        try:
            order = list(graph._variant_pack_uids() or ())
            raw = lowered._execute_with_raw_ptrs
        except Exception:
            return
        if sorted(order) == order and sorted(order) == sorted(self.uids):
            positions = [self.uids.index(u) for u in order]
            self._identity = positions == list(range(len(order)))
            self._pick = (lambda b: b) if self._identity else itemgetter(*positions)
            self._raw, self._n = raw, len(order)
            self.mode = "raw"
            if self._identity:
                self.native = (raw, self._n, self._cpp_index)

    @property
    def direct(self) -> bool:
        return self.mode in ("raw", "ordered")

    def raw(self, ptrs: list, workspace_ptr: int, raw_handle: int) -> None:
        """Mode ``raw`` only: launch with the operands' data pointers (in ``uids`` order), the
        workspace address and the raw ``cudnnHandle_t``, all already read by the caller."""
        arr = array("Q", ptrs if self._identity else self._pick(ptrs))
        self._raw(arr.buffer_info()[0], self._n, workspace_ptr, raw_handle, self._cpp_index)

    def __call__(self, buffers: list, workspace: Any, handle: Any) -> None:
        mode = self.mode
        if mode == "raw":
            ptrs = array("Q", map(_data_ptr, self._pick(buffers)))
            self._raw(ptrs.buffer_info()[0], self._n, _data_ptr(workspace), handle.backend_handle or 0, self._cpp_index)
            return
        if mode == "ordered":
            g, raw_handle = self.graph, handle.backend_handle or 0
            result = self._lowered._execute_ordered(
                self._schema, buffers, self.uids, g._data_bindings, workspace, None, None, None, raw_handle, self._cpp_index
            )
            if result is not None:  # the native reader needs Python to describe some operands first
                pack = g._finish_ordered(self._schema, result, workspace, None)
                self._lowered._execute_ordered_pack(pack.native, pack.workspace, raw_handle, self._cpp_index)
            return
        if mode == "dict":
            self.graph.execute(dict(zip(self.uids, buffers)), workspace, handle=handle)
        else:
            self.graph.execute(buffers, workspace, handle=handle, tensor_uids=self.uids)
