"""The reach of a ``te_cudnn.backend_policy`` context: nesting merges and restores, an exception
restores, equal policies share one token (a C-level read on the hot path), and other threads and
asyncio tasks never see it; CPU only."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import te_cudnn
from te_cudnn import FusedAttnBackend, ops, policy

from _policy_cpu import ARB, BOTH, FP8, M512, chosen
from _policy_cpu import clean_policy  # noqa: F401 - autouse: no policy variable set, no context leaked


# ----------------------------------------------------------------------------- nesting, threads, tasks
def test_nesting_merges_and_restores() -> None:
    with te_cudnn.backend_policy(force=M512, forbid=[FP8]) as outer:
        assert outer.force is M512 and set(outer.forbid) == {FP8}
        outer_token = policy.token()
        with te_cudnn.backend_policy(forbid=["F16_arbitrary_seqlen"]) as inner:
            assert inner.force is M512  # force=None keeps the enclosing force
            assert set(inner.forbid) == {FP8, ARB}  # forbid sets add up
            with te_cudnn.backend_policy(force=2) as innermost:
                assert innermost.force is FP8 and set(innermost.forbid) == {FP8, ARB}
            assert policy.current() == inner
        assert policy.token() == outer_token and policy.current() == outer
    assert policy.token() is policy.NO_CONTEXT
    assert policy.current() == policy.Policy()


def test_context_restores_after_an_exception() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with te_cudnn.backend_policy(force=M512):
            with te_cudnn.backend_policy(forbid=[ARB]):
                raise RuntimeError("boom")
    assert policy.token() is policy.NO_CONTEXT and chosen(**BOTH) is ARB


def test_equal_policies_share_one_token() -> None:
    """Prepared calls are keyed on the token: re-entering the same policy must hit them again."""
    with te_cudnn.backend_policy(force="F16_max512_seqlen", forbid=["FP8"]):
        first = policy.token()
    with te_cudnn.backend_policy(force=M512, forbid=(2,)):
        second = policy.token()
    assert first == second and hash(first) == hash(second) and first is not policy.NO_CONTEXT
    with te_cudnn.backend_policy():  # nothing forced or forbidden: the default token
        assert policy.token() is policy.NO_CONTEXT


def test_token_is_a_c_call_on_the_hot_path() -> None:
    """fused_attn_fwd / fused_attn_bwd add ``_policy_token()`` to their signature tuples: it must
    stay a C-level ContextVar read (measured ~20 ns), never a Python function."""
    assert ops._policy_token is policy.token
    assert type(policy.token).__name__ == "builtin_function_or_method"


def test_context_does_not_leak_into_other_threads() -> None:
    inside, release = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def worker() -> None:
        with te_cudnn.backend_policy(force=M512, forbid=[FP8]):
            seen["worker"] = policy.current()
            inside.set()
            release.wait(10)
        seen["worker_after"] = policy.token()

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    try:  # while the worker is inside its context, this thread sees none
        assert policy.token() is policy.NO_CONTEXT and chosen(**BOTH) is ARB
    finally:
        release.set()
        t.join(10)
    assert seen["worker"].force is M512 and seen["worker_after"] is policy.NO_CONTEXT

    def observer() -> None:
        seen["observer"] = (policy.token(), chosen(**BOTH))

    with te_cudnn.backend_policy(force=M512):  # nor does this thread's context reach a new thread
        t = threading.Thread(target=observer)
        t.start()
        t.join(10)
    assert seen["observer"] == (policy.NO_CONTEXT, ARB)


def test_asyncio_tasks_are_isolated() -> None:
    async def task(force: FusedAttnBackend) -> list[FusedAttnBackend]:
        out = []
        with te_cudnn.backend_policy(force=force):
            for _ in range(3):
                await asyncio.sleep(0)  # interleave with the other task
                out.append(policy.current().force)
        return out

    async def main() -> tuple:
        return await asyncio.gather(task(M512), task(ARB))

    a, b = asyncio.run(main())
    assert a == [M512] * 3 and b == [ARB] * 3
