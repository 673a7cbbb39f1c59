"""Helpers shared by the context-parallel CPU tests (the stand-in kernels of ``_cp_standin``):
dense cases, a simulated run with its gradients, the fp64 reference with windows and sinks, the
closeness rule, and CPU process groups (gloo) for the real transport."""

from __future__ import annotations

import socket
from typing import Callable

import pytest
import torch

from _cp_standin import from_bhsd, install, to_bhsd
from te_cudnn.parallel import shard, simulate_context_parallel, unshard
from te_cudnn.reference import attention_reference


def bf16(*shape) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.bfloat16)


def dense_case(cp: int, fmt: str, heads: tuple[int, int, int, int], c: int, b: int = 2,
               seed: int = 0) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """q, k, v, dO of a global bf16 batch of ``2 cp c`` tokens; ``heads = (h, hg, d_qk, d_v)``."""
    h, hg, d_qk, d_v = heads
    s = 2 * cp * c
    g = torch.Generator().manual_seed(seed)
    shape = lambda n, d: (b, s, n, d) if fmt == "bshd" else (s, b, n, d)  # noqa: E731
    q, k = (torch.randn(shape(n, d_qk), generator=g).bfloat16() for n in (h, hg))
    v = torch.randn(shape(hg, d_v), generator=g).bfloat16()
    return q, k, v, torch.randn(shape(h, d_v), generator=g).bfloat16()


def simulate(comm: str, cp: int, fmt: str, q, k, v, d_out, **options) -> list[torch.Tensor]:
    """The simulated context-parallel call over ``cp`` ranks and its backward: out, dq, dk, dv
    gathered into the global layout."""
    parts = [[shard(t, cp, r, fmt).requires_grad_() for r in range(cp)] for t in (q, k, v)]
    outs = simulate_context_parallel(*parts, comm, qkv_format=fmt, **options)
    torch.autograd.backward(outs, [shard(d_out, cp, r, fmt) for r in range(cp)])
    return [unshard(outs, fmt)] + [unshard([p.grad for p in ps], fmt) for ps in parts]


def reference(q, k, v, d_out, mask, fmt, window, softmax_type="vanilla", offset=None):
    """fp64 out, dq, dk, dv of the full attention, and the sink logits' gradient (or None)."""
    leaves = [to_bhsd(t, fmt).double().requires_grad_() for t in (q, k, v)]
    off = None if offset is None else offset.detach().double().requires_grad_()
    out = attention_reference(*leaves, attn_mask_type=mask, window_size=window, compute_dtype=torch.float64,
                              softmax_type=softmax_type, softmax_offset=off).out  # fmt: skip
    out.backward(to_bhsd(d_out, fmt).double())
    grads = [from_bhsd(out.detach(), fmt)] + [from_bhsd(t.grad, fmt) for t in leaves]
    return grads, (None if off is None else off.grad)


def close(got, ref, what: str) -> None:
    """bf16 results within 2e-2 (relative to the largest value, at least 1) of the reference."""
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, ref):
        assert x.dtype == torch.bfloat16 and x.shape == y.shape, f"{what} {name}"
        err = (x.double() - y).abs().max().item()
        assert err <= 2e-2 * max(1.0, y.abs().max().item()), f"{what} {name}: max error {err}"


def spawn_gloo(worker: Callable, tmp_path, world: int, *args) -> list[float]:
    """Run ``worker(rank, world, port, *args, report_path)`` in ``world`` CPU processes and
    return the floats rank 0 wrote to the report (its errors)."""
    import torch.multiprocessing as mp

    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    report = tmp_path / "errors.txt"
    mp.spawn(worker, args=(world, port, *args, str(report)), nprocs=world, join=True)
    return [float(x) for x in report.read_text().split()]


#: (h, hg, d_qk, d_v) of the parametrised CPU cases
HEADS = {"mha": (4, 4, 16, 16), "gqa": (4, 2, 16, 8)}


@pytest.fixture
def math_kernels(monkeypatch):
    """The stand-in kernels in every module of te_cudnn.parallel that launches attention."""
    import te_cudnn.parallel.all_gather as ag_mod
    import te_cudnn.parallel.ring as ring_mod

    install(monkeypatch, ring_mod, ag_mod)


def gather_results(out: torch.Tensor, local, world: int, fmt: str) -> list[torch.Tensor]:
    """On a process group: every rank's out and q, k, v gradients, gathered into the global layout."""
    import torch.distributed as dist

    gathered = []
    for t in (out.detach(), *(x.grad for x in local)):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        gathered.append(unshard(parts, fmt))
    return gathered


def declines_before(monkeypatch, collective: str, comm: str, kwargs: dict, q_shape: tuple, k_len: int, match: str):
    """A two-rank simulated call that must raise UnsupportedConfigError (matching ``match`` and
    naming ``comm``) before ``te_cudnn.parallel.api.<collective>`` is reached."""
    from te_cudnn import UnsupportedConfigError

    def refuse(*args):
        raise AssertionError("a declined call communicated")

    monkeypatch.setattr(f"te_cudnn.parallel.api.{collective}", refuse)
    q = bf16(*q_shape)
    k = bf16(q_shape[0], k_len, 2, q_shape[3])
    with pytest.raises(UnsupportedConfigError, match=match) as info:
        simulate_context_parallel([q, q], [k, k], [k, k], comm, **kwargs)
    assert f"cp_comm_type='{comm}'" in str(info.value)


def sink_checked_before(monkeypatch, collective: str, comm: str) -> None:
    """A learnable sink without logits, or with logits of the wrong dtype, raises ValueError
    before ``te_cudnn.parallel.api.<collective>`` is reached."""

    def refuse(*args):
        raise AssertionError("a malformed call communicated")

    monkeypatch.setattr(f"te_cudnn.parallel.api.{collective}", refuse)
    q = bf16(2, 8, 4, 16)
    with pytest.raises(ValueError, match="softmax_offset"):
        simulate_context_parallel([q, q], [q, q], [q, q], comm, softmax_type="learnable")
    with pytest.raises(ValueError, match="float32"):
        simulate_context_parallel([q, q], [q, q], [q, q], comm, softmax_type="learnable",
                                  softmax_offset=torch.zeros(4))  # fmt: skip
