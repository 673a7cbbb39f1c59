"""Launching a built plan with as little host work as possible.

``graph.execute(buffers, workspace, handle=, tensor_uids=)`` (the frontend's ordered fast
path) re-derives, on every call, facts that never change for a built plan: which engine was
selected, the backend plan index, the binding schema. :class:`PlanLauncher` derives them once
and then calls the same native entry points the frontend itself calls, in the same order
(``_execute_ordered``, then ``_finish_ordered`` + ``_execute_ordered_pack`` when the native
reader asks for completion). These are internals of cudnn-frontend 1.32, so the launcher
checks they exist when the plan is built and otherwise, or when
``TE_CUDNN_PUBLIC_EXECUTE=1``, uses the public ``graph.execute``.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

__all__ = ["PlanLauncher"]

_FORCE_PUBLIC = os.environ.get("TE_CUDNN_PUBLIC_EXECUTE", "0") == "1"


class PlanLauncher:
    """``launch(buffers, workspace, handle)``: the direct native path when the frontend's
    internals are there, else the public ordered execute, else (a deserialized plan carries no
    operand layout) the public uid -> tensor form."""

    __slots__ = ("graph", "uids", "direct", "by_dict", "_lowered", "_schema", "_cpp_index")

    def __init__(self, graph: Any, uids: Sequence[int]):
        self.graph = graph
        self.uids = tuple(uids)
        self.direct = False
        try:
            self.by_dict = graph._prepare_ordered_binding_schema() is None
        except Exception:
            self.by_dict = False
        if _FORCE_PUBLIC or self.by_dict:
            return
        try:
            if graph.selected_engine is not None:  # a python (FROST) engine: keep the public path
                return
            cfg = graph._materialize_backend_plan(graph._plan_index) if graph._plans else None
            cpp_index = None if cfg is None else cfg.cpp_index
            schema = graph._prepare_ordered_binding_schema()
            lowered = graph._lowered_graph
            needed = (lowered._execute_ordered, lowered._execute_ordered_pack, graph._finish_ordered, graph._data_bindings)
        except Exception:  # another frontend version: the public path is always right
            return
        if schema is None or any(n is None for n in needed):
            return
        self._lowered, self._schema = lowered, schema
        self._cpp_index = -1 if cpp_index is None else cpp_index
        self.direct = True

    def __call__(self, buffers: list, workspace: Any, handle: Any) -> None:
        if not self.direct:
            if self.by_dict:
                self.graph.execute(dict(zip(self.uids, buffers)), workspace, handle=handle)
            else:
                self.graph.execute(buffers, workspace, handle=handle, tensor_uids=self.uids)
            return
        g, raw_handle = self.graph, handle.backend_handle or 0
        result = self._lowered._execute_ordered(
            self._schema, buffers, self.uids, g._data_bindings, workspace, None, None, None, raw_handle, self._cpp_index
        )
        if result is not None:  # the native reader needs Python to describe some operands first
            pack = g._finish_ordered(self._schema, result, workspace, None)
            self._lowered._execute_ordered_pack(pack.native, pack.workspace, raw_handle, self._cpp_index)
