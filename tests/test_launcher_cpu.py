"""PlanLauncher's launch modes against a stand-in of the frontend's graph internals (no GPU):
the pointer order it binds, and when the hot path may call the native execute directly; the
installed frontend has every internal the launcher uses, and a frontend without one gets the
public ``graph.execute``, warned once."""

from __future__ import annotations

import ast
import functools
import warnings
from array import array
from pathlib import Path

import pytest

from te_cudnn.plans import execute
from te_cudnn.plans.execute import PlanLauncher
from te_cudnn.runtime import cudnn_module


class _Lowered:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def _execute_ordered(self, *a):  # pragma: no cover - not reached in raw mode
        raise AssertionError("ordered path")

    _execute_ordered_pack = _execute_ordered

    def _execute_with_raw_ptrs(self, address: int, n: int, ws: int, handle: int, index: int) -> None:
        # read the uint64 array at ``address`` back through a buffer of the same size
        import ctypes

        self.calls.append((list((ctypes.c_uint64 * n).from_address(address)), ws, handle, index))


class _Config:
    cpp_index = 7


class _Graph:
    """What PlanLauncher reads from a built cudnn-frontend 1.32 graph."""

    selected_engine = None
    _plans = [object()]
    _plan_index = 0
    _data_bindings = {}

    def __init__(self, plan_order: list[int], calls: list) -> None:
        self._order = plan_order
        self._lowered_graph = _Lowered(calls)

    def _prepare_ordered_binding_schema(self):
        return object()

    def _materialize_backend_plan(self, index):
        return _Config()

    def _finish_ordered(self, *a):  # pragma: no cover
        raise AssertionError("ordered path")

    def _variant_pack_uids(self):
        return self._order


@pytest.mark.parametrize("uids", [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 7, 8]])
def test_operands_in_the_plans_order_get_the_direct_launch(uids):
    calls: list = []
    launcher = PlanLauncher(_Graph(sorted(uids), calls), uids)
    assert launcher.mode == "raw" and launcher.native is not None
    execute, n, index = launcher.native
    ptrs = array("Q", [16 * (i + 1) for i in range(len(uids))])
    execute(ptrs.buffer_info()[0], n, 4096, 99, index)
    assert calls == [([16 * (i + 1) for i in range(len(uids))], 4096, 99, 7)]


def test_operands_in_another_order_are_reordered_and_never_launched_directly():
    calls: list = []
    uids = [2, 1, 3]  # the caller binds uid 2 first; the plan reads uid 1 first
    launcher = PlanLauncher(_Graph([1, 2, 3], calls), uids)
    assert launcher.mode == "raw" and launcher.native is None
    launcher.raw(array("Q", [200, 100, 300]), 0, 5)
    assert calls == [([100, 200, 300], 0, 5, 7)]


def test_operands_the_plan_does_not_read_keep_the_public_path():
    calls: list = []
    launcher = PlanLauncher(_Graph([1, 2, 3, 4], calls), [1, 2, 3])  # the plan needs an operand not bound
    assert launcher.mode == "ordered" and launcher.native is None


# ----------------------------------------------------------------------------- the real frontend's internals
def test_the_installed_frontend_has_every_internal_the_direct_launch_uses() -> None:
    """Against the installed cudnn-frontend itself: its graph class (and a graph made on the host,
    for the attributes ``__init__`` sets) and its backend graph class have every name in
    PRIVATE_FRONTEND_NAMES, the list the launcher checks."""
    cudnn = cudnn_module()
    missing = []
    for where, names in execute.PRIVATE_FRONTEND_NAMES.items():
        owner = functools.reduce(getattr, where.split("."), cudnn)
        made = owner() if where == "pygraph" else None  # the backend graph needs libcudnn to be made
        missing += [f"cudnn.{where}.{n}" for n in names if not (hasattr(owner, n) or hasattr(made, n))]
    assert not missing, f"cudnn-frontend {cudnn.__version__} lacks {missing}"


def test_the_list_names_every_internal_the_launcher_reads() -> None:
    """Every ``_name`` that execute.py reads of something other than the launcher itself is in
    PRIVATE_FRONTEND_NAMES, and every listed name is read there: the list cannot drift."""
    tree = ast.parse(Path(execute.__file__).read_text())
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
            and not n.attr.startswith("__") and not (isinstance(n.value, ast.Name) and n.value.id == "self")}  # fmt: skip
    listed = {n for names in execute.PRIVATE_FRONTEND_NAMES.values() for n in names}
    assert read == listed


class _LoweredWithoutRaw:
    """The backend graph of a frontend without the pointer-array execute."""

    def _execute_ordered(self, *a):  # pragma: no cover - never launched here
        raise AssertionError("ordered path")

    _execute_ordered_pack = _execute_ordered


def test_a_frontend_graph_without_the_internals_takes_the_public_path_warned_once(monkeypatch) -> None:
    """A real frontend graph, made to look built (a binding schema, a backend graph) by a frontend
    whose backend graph has no ``_execute_with_raw_ptrs``."""
    graph_class = cudnn_module().pygraph
    monkeypatch.setattr(graph_class, "_prepare_ordered_binding_schema", lambda self: object())
    monkeypatch.setattr(execute, "_warned_missing", False)

    def built():
        graph = graph_class()
        graph._lowered_graph = _LoweredWithoutRaw()
        return graph

    with pytest.warns(UserWarning, match=r"has no _execute_with_raw_ptrs, .* public graph\.execute"):
        launcher = PlanLauncher(built(), [1, 2, 3])
    assert launcher.mode == "public" and launcher.native is None and not launcher.direct
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert PlanLauncher(built(), [1, 2, 3]).mode == "public"
    calls: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a stand-in that is not a frontend graph: no warning
        assert PlanLauncher(_Graph([1, 2, 3], calls), [1, 2, 3]).mode == "raw"
        assert PlanLauncher(object(), [1, 2, 3]).mode == "public"


@pytest.mark.parametrize("shape, dtype, dense", [
    ((2, 16, 64, 1), "float32", True),  # 8 KiB: a real tensor
    ((1, 1, 4096, 1), "float32", True),  # exactly the limit
    ((1, 1, 4097, 1), "float32", False),  # one element more: expanded
    ((2, 64, 16, 64), "bfloat16", False),
    ((0, 8, 16, 1), "float32", True),  # zero-size results
], ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x))  # fmt: skip
def test_result_templates_give_contiguous_results(shape, dtype, dense) -> None:
    """ops._template: small templates are contiguous tensors (the cheaper empty_like), larger
    ones an expanded single element (no memory held); empty_like of either is a new contiguous
    tensor of the shape and dtype."""
    import torch

    from te_cudnn import ops

    dt = getattr(torch, dtype)
    t = ops._template(shape, dt, torch.device("cpu"))
    assert t.shape == shape and t.dtype == dt
    if dense:
        assert t.is_contiguous() and t.numel() * t.element_size() <= ops._DENSE_TEMPLATE_BYTES
    else:
        assert all(st == 0 for n, st in zip(shape, t.stride()) if n > 1)
        assert t.untyped_storage().nbytes() == t.element_size()
    r = torch.empty_like(t)
    assert r.shape == shape and r.dtype == dt and r.is_contiguous()
    assert r.numel() == 0 or r.data_ptr() != t.data_ptr()
