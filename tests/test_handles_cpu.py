"""The per-thread cuDNN handle bookkeeping (te_cudnn.plans.handles); CPU only.

Handle creation is replaced by a stand-in object, so these tests check the pool's own
bookkeeping (which thread holds what, what comes back when a thread ends), not cuDNN; the
real handles are exercised by tests/test_concurrency_gpu.py. Each test uses its own fake
device number, so the real pool entries of device 0.. are never touched.
"""

from __future__ import annotations

import itertools
import threading
from types import SimpleNamespace

import pytest

from te_cudnn.plans import handles

_devices = itertools.count(9000)


@pytest.fixture
def fake(monkeypatch):
    """A fresh fake device whose handles are SimpleNamespace stand-ins bound to stream 0."""
    device = next(_devices)
    made = []

    def create(dev):
        assert dev == device, f"handle created for device {dev}, expected {device}"
        h = SimpleNamespace(backend_handle=1000 + len(made), stream=0, device=dev)
        made.append(h)
        return h

    monkeypatch.setattr(handles, "_create", create)
    monkeypatch.setattr(handles, "current_raw_stream", lambda dev: 0)  # the handle's stream: no set_stream call
    return SimpleNamespace(device=device, made=made)


def _in_thread(fn):
    """Run ``fn`` in a new thread that ends before this returns; its result or exception."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_thread_keeps_one_handle_per_device(fake):
    def work():
        return handles.handle_for(fake.device), handles.handle_for(fake.device)

    first, second = _in_thread(work)
    assert first is second and len(fake.made) == 1


def test_a_finished_threads_handle_goes_back_to_the_pool_and_is_reused(fake):
    h1 = _in_thread(lambda: handles.handle_for(fake.device))
    stats = handles.handle_stats()[fake.device]
    assert stats == {"created": 1, "idle": 1}, "the thread ended: its handle must be back in the pool"
    h2 = _in_thread(lambda: handles.handle_for(fake.device))
    assert h2 is h1, "a new thread must take the pooled handle instead of creating one"
    assert len(fake.made) == 1 and handles.handle_stats()[fake.device] == {"created": 1, "idle": 1}


def test_concurrent_threads_get_distinct_handles_and_churn_creates_no_more(fake):
    n = 4
    barrier = threading.Barrier(n)
    got, errors = [None] * n, []

    def work(i):
        try:
            got[i] = handles.handle_for(fake.device)
            barrier.wait(timeout=30)  # all four hold their handle at the same time
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len({id(h) for h in got}) == n, "threads alive at the same time must never share a handle"
    assert handles.handle_stats()[fake.device] == {"created": n, "idle": n}
    for _ in range(20):  # thread churn: one short-lived thread after another
        _in_thread(lambda: handles.handle_for(fake.device))
    assert handles.handle_stats()[fake.device] == {"created": n, "idle": n}, "churn must reuse pooled handles"


def test_release_thread_handles_gives_them_back_now(fake):
    def work():
        h = handles.handle_for(fake.device)
        during = handles.handle_stats()[fake.device]
        released = handles.release_thread_handles()
        after = handles.handle_stats()[fake.device]
        again = handles.handle_for(fake.device)
        return h, during, released, after, again, handles.release_thread_handles(), handles.release_thread_handles()

    h, during, released, after, again, released_again, released_none = _in_thread(work)
    assert during == {"created": 1, "idle": 0}
    assert released == 1 and after == {"created": 1, "idle": 1}
    assert again is h, "the thread's next call takes the released handle back from the pool"
    assert released_again == 1 and released_none == 0
    # released explicitly and then the thread ended: the handle is in the pool once, not twice
    assert handles.handle_stats()[fake.device] == {"created": 1, "idle": 1}


def test_a_destroyed_pooled_handle_is_not_handed_out(fake):
    h1 = _in_thread(lambda: handles.handle_for(fake.device))
    h1.backend_handle = None  # what cudnn.destroy_handle leaves behind
    h2 = _in_thread(lambda: handles.handle_for(fake.device))
    assert h2 is not h1 and h2.backend_handle is not None
    assert handles.handle_stats()[fake.device]["created"] == 2
