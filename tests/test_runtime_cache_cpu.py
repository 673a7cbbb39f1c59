"""The per-call runtime buffers of variable-length calls (sequence lengths, ragged offsets) are
computed once per cu_seqlens tensor and reused while the same tensor objects come back unchanged;
any in-place write, or a new tensor with the same values, recomputes them. Real torch kernels on
CPU tensors: ``te_cudnn.varlen.runtime_buffers`` is plain torch code."""

from __future__ import annotations

import pytest
import torch

from te_cudnn import ops
from te_cudnn import driver, launch, varlen
from te_cudnn.backends import BY_ENUM
from te_cudnn.config import describe_fwd
from te_cudnn.enums import FusedAttnBackend, QKVLayout


def _prep(layout: str, mask: str, q, k, v, cu):
    cfg = describe_fwd(is_training=True, max_seqlen_q=64, max_seqlen_kv=64, cu_seqlens_q=cu, cu_seqlens_kv=cu, q=q, k=k,
                       v=v, qkv_dtype=q.dtype, qkv_layout=QKVLayout.coerce(layout), attn_bias_type="no_bias",
                       attn_mask_type=mask, window_size=(-1, -1), attn_bias=None, attn_scale=None, dropout=0.0,
                       softmax_type="vanilla", bottom_right_diagonal=None)  # fmt: skip
    prep = ops._Prepared(cfg=cfg, backend=BY_ENUM[FusedAttnBackend.F16_arbitrary_seqlen], key=None, out_shape=(),
                         stats_shape=(), device=q.device, rng_increment=0, varlen=True,
                         **varlen.mult_fields(cfg, q.device))  # fmt: skip
    varlen.length_fields(prep)
    return prep


@pytest.fixture(autouse=True)
def _cpu_stream(monkeypatch):
    monkeypatch.setattr(varlen, "current_raw_stream", lambda device: 0)  # CPU tensors: one "stream"
    varlen.clear()
    yield
    varlen.clear()


CASES = {
    "bshd padding": ("bshd_bshd_bshd", "padding", lambda: [torch.randn(3, 64, 4, 32, dtype=torch.bfloat16) for _ in range(3)]),
    "thd padding_causal": ("thd_thd_thd", "padding_causal", lambda: [torch.randn(100, 4, 32, dtype=torch.bfloat16) for _ in range(3)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_reused_while_unchanged_recomputed_after_a_write(case: str) -> None:
    layout, mask, make = CASES[case]
    q, k, v = make()
    cu = torch.tensor([0, 30, 64, 100] if layout.startswith("thd") else [0, 30, 64, 90], dtype=torch.int32)
    prep = _prep(layout, mask, q, k, v, cu)
    first = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    fresh = varlen.runtime_buffers(prep, cu, cu, None, None)
    assert len(first) == len(fresh) > 0
    for a, b in zip(first, fresh):
        assert torch.equal(a, b)
    again = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert all(a is b for a, b in zip(first, again)), "same tensor, unchanged: the cached buffers"

    cu[1] = 20  # an in-place write (version bump): recomputed, and the values follow
    changed = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert not any(a is b for a, b in zip(first, changed))
    for a, b in zip(changed, varlen.runtime_buffers(prep, cu, cu, None, None)):
        assert torch.equal(a, b)
    if mask.startswith("padding"):
        assert changed[0].flatten()[0].item() == 20


def test_a_new_tensor_with_the_same_values_is_a_miss() -> None:
    layout, mask, make = CASES["bshd padding"]
    q, k, v = make()
    cu = torch.tensor([0, 30, 64, 90], dtype=torch.int32)
    prep = _prep(layout, mask, q, k, v, cu)
    first = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    other = cu.clone()
    second = varlen.cached_runtime_buffers(prep, other, other, None, None)
    assert not any(a is b for a, b in zip(first, second))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_the_cache_stays_bounded() -> None:
    layout, mask, make = CASES["bshd padding"]
    q, k, v = make()
    keep = []
    for i in range(3 * varlen.RUNTIME_CACHE_SIZE):
        cu = torch.tensor([0, 1 + i % 30, 64, 90], dtype=torch.int32)
        keep.append(cu)
        varlen.cached_runtime_buffers(_prep(layout, mask, q, k, v, cu), cu, cu, None, None)
        assert len(varlen.runtime_cache) <= varlen.RUNTIME_CACHE_SIZE


def test_inference_tensors_are_computed_every_call() -> None:
    layout, mask, make = CASES["bshd padding"]
    q, k, v = make()
    with torch.inference_mode():
        cu = torch.tensor([0, 30, 64, 90], dtype=torch.int32)
    prep = _prep(layout, mask, q, k, v, torch.tensor([0, 30, 64, 90], dtype=torch.int32))
    first = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    second = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert not varlen.runtime_cache and not any(a is b for a, b in zip(first, second))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_forget_prepared_clears_the_op_launchers() -> None:
    from te_cudnn import torch_ops

    torch_ops._fwd_launchers[("probe",)] = object()
    torch_ops._bwd_launchers[("probe",)] = object()
    ops.forget_prepared()
    assert not torch_ops._fwd_launchers and not torch_ops._bwd_launchers



@pytest.fixture
def capture(monkeypatch):
    """A stand-in for CUDA-graph capture: ``capture["id"]`` is what the driver would report
    (None: not capturing); the cache's bookkeeping is what is under test here, the driver
    query itself is checked on the GPU (tests/test_varlen_gpu.py)."""
    state = {"id": None, "queries": 0}

    def capture_id(index):
        state["queries"] += 1
        return state["id"]

    monkeypatch.setattr(varlen, "is_capturing", lambda: state["id"] is not None or state.get("unknown", False))
    monkeypatch.setattr(varlen, "capture_id", capture_id)
    monkeypatch.setattr(varlen, "current_raw_stream", lambda device: 7)  # a side stream: captures happen there
    return state


def test_the_default_stream_is_never_asked_whether_it_captures(monkeypatch) -> None:
    """CUDA cannot capture on the legacy default stream (raw handle 0): calls there skip the query."""
    layout, mask, make = CASES["bshd padding"]
    q, k, v = make()
    cu = torch.tensor([0, 30, 64, 90], dtype=torch.int32)
    prep = _prep(layout, mask, q, k, v, cu)
    asked = []
    monkeypatch.setattr(varlen, "is_capturing", lambda: asked.append(1) or False)
    varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert not asked
    monkeypatch.setattr(varlen, "current_raw_stream", lambda device: 7)
    varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert asked == [1]


def test_one_capture_computes_once_and_never_sees_eager_or_other_captures(capture) -> None:
    layout, mask, make = CASES["bshd padding"]
    q, k, v = make()
    cu = torch.tensor([0, 30, 64, 90], dtype=torch.int32)
    prep = _prep(layout, mask, q, k, v, cu)
    eager = varlen.cached_runtime_buffers(prep, cu, cu, None, None)

    capture["id"] = 7
    first = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert not any(a is b for a, b in zip(first, eager)), "a capture must compute its own buffers in its graph"
    later = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert all(a is b for a, b in zip(first, later)), "later calls of one capture read the first call's buffers"
    cu[2] = 50  # written inside the capture: recomputed
    written = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert not any(a is b for a, b in zip(first, written)) and written[0].flatten()[1].item() == 20

    captured = {key[2] for key in varlen.runtime_cache}
    assert captured == {None, 7}
    capture["id"] = 8  # the next capture, same tensor, same contents: capture 7's entries go
    other = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert not any(a is b for a, b in zip(written, other))
    assert {key[2] for key in varlen.runtime_cache} == {None, 8}

    capture["id"] = None  # eager again: the eager entry of the current contents, not a capture's
    back = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert not any(a is b for bufs in (first, written, other) for a, b in zip(bufs, back))
    assert {key[2] for key in varlen.runtime_cache} == {None}, "an eager call drops the capture's entries"
    assert all(torch.equal(a, b) for a, b in zip(back, varlen.runtime_buffers(prep, cu, cu, None, None)))


def test_a_capture_the_driver_cannot_name_computes_every_call(capture) -> None:
    layout, mask, make = CASES["bshd padding"]
    q, k, v = make()
    cu = torch.tensor([0, 30, 64, 90], dtype=torch.int32)
    prep = _prep(layout, mask, q, k, v, cu)
    capture["unknown"] = True  # capturing, but no capture id
    first = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    second = varlen.cached_runtime_buffers(prep, cu, cu, None, None)
    assert not any(a is b for a, b in zip(first, second)) and not varlen.runtime_cache
    assert capture["queries"] == 2


def test_capture_id_without_a_driver_is_none() -> None:
    if driver.capture_info() is not None:
        pytest.skip("this machine has a CUDA driver")
    assert launch.capture_id(0) is None


def test_fills_without_a_driver_fall_back_to_torch() -> None:
    """CPU tensors (and machines without the driver's memsets) fill through torch."""
    if driver._memsets() == (None, None):
        assert not driver.memset_d8(0, 0, 16, 0) and not driver.memset_d32(0, driver.NEG_INF_F32_BITS, 4, 0)
    assert torch.equal(launch.zeroed(torch.ones(3, 5, dtype=torch.bfloat16), 0), torch.zeros(3, 5, dtype=torch.bfloat16))
    assert torch.equal(launch.neg_inf(torch.zeros(7), 0), torch.full((7,), float("-inf")))
    assert launch.zeroed(torch.ones(0), 0).numel() == 0
