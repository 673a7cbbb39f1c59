"""How ranks exchange tensors: torch.distributed (NCCL) for real groups, a lockstep simulation
of ``cp`` virtual ranks in one process for tests and single-GPU experiments.

The ring algorithms (:mod:`te_cudnn.parallel.ring`) are written once, as per-rank generators
that yield :class:`Post` (start sending these tensors to one neighbour and receiving those
from the other) and :class:`Wait` (the received tensors are needed now). A driver runs them:

* :func:`run_on_group` runs one rank's generator over a process group: ``Post`` becomes one
  ``torch.distributed.batch_isend_irecv`` (NCCL runs it on its own stream, overlapped with the
  attention the generator launches next), ``Wait`` makes the current stream wait for it (no
  host synchronisation);
* :func:`run_simulated` runs all ranks' generators in lockstep: at each ``Post`` the received
  tensors are copied from the sending virtual rank. The same code, schedule and buffers as on
  NCCL, testable on one GPU.

All-to-all (Ulysses) goes through :class:`AllToAll`, a differentiable ``all_to_all_single``.
All-gather context parallelism uses two plain collectives on flat buffers,
:func:`all_gather_flat` and :func:`reduce_scatter_flat`, and their single-process stand-ins
:func:`all_gather_simulated` and :func:`reduce_scatter_simulated`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Optional, Sequence

import torch
import torch.distributed as dist

__all__ = ["Post", "Wait", "run_on_group", "run_simulated", "run_loopback", "group_info", "AllToAll", "all_to_all",
           "LoopbackAllToAll",
           "all_gather_flat", "reduce_scatter_flat", "all_gather_simulated", "reduce_scatter_simulated"]


@dataclass
class Post:
    """Send ``sends`` to the next rank and receive ``recvs`` from the previous one
    (``forward=True``: to ``r + 1``, from ``r - 1``; ``False``: the other way round)."""

    sends: tuple[torch.Tensor, ...]
    recvs: tuple[torch.Tensor, ...]
    forward: bool


@dataclass
class Wait:
    handle: Any


RankProgram = Generator[Any, Any, Any]


def group_info(group: Any) -> tuple[int, int]:
    """(size, rank) of a torch.distributed process group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("cp_group needs an initialised torch.distributed process group "
                           "(torch.distributed.init_process_group('nccl'))")  # fmt: skip
    return dist.get_world_size(group), dist.get_rank(group)


def run_on_group(program: RankProgram, group: Any) -> Any:
    """Run one rank's program over ``group``; returns what the program returns."""
    size, rank = group_info(group)
    nxt = dist.get_global_rank(group, (rank + 1) % size)
    prev = dist.get_global_rank(group, (rank - 1) % size)
    reply = None
    while True:
        try:
            msg = program.send(reply)
        except StopIteration as done:
            return done.value
        if isinstance(msg, Post):
            reply = _post(msg, nxt, prev, group)
        else:
            for work in msg.handle:
                work.wait()  # NCCL: the current stream waits, the host does not
            reply = None


def _post(msg: Post, nxt: int, prev: int, group: Any) -> list:
    """One ``batch_isend_irecv``. No reference to the tensors outlives it here (the work keeps
    them until it completes), so a driver never holds a step's buffers into the next step."""
    to, frm = (nxt, prev) if msg.forward else (prev, nxt)
    ops = [dist.P2POp(dist.isend, t, to, group) for t in msg.sends]
    ops += [dist.P2POp(dist.irecv, t, frm, group) for t in msg.recvs]
    return dist.batch_isend_irecv(ops)


def _copy_into(recvs: Sequence[torch.Tensor], sends: Sequence[torch.Tensor]) -> None:
    """The received tensors copied from the sent ones (no loop variable keeps one alive)."""
    for recv, send in zip(recvs, sends):
        recv.copy_(send)


def run_simulated(programs: Sequence[RankProgram]) -> list[Any]:
    """Run the programs of virtual ranks ``0 .. cp-1`` in lockstep; returns their results."""
    cp = len(programs)
    replies: list[Any] = [None] * cp
    results: list[Any] = [None] * cp
    while True:
        msgs, finished = [], 0
        for r, program in enumerate(programs):
            try:
                msgs.append(program.send(replies[r]))
            except StopIteration as done:
                results[r] = done.value
                msgs.append(None)
                finished += 1
        if finished == cp:
            return results
        if finished or len({type(m) for m in msgs}) != 1:
            raise RuntimeError(f"simulated ring out of step: {[type(m).__name__ for m in msgs]}")
        if isinstance(msgs[0], Post):
            for r, msg in enumerate(msgs):
                src = msgs[(r - 1) % cp] if msg.forward else msgs[(r + 1) % cp]
                if len(src.sends) != len(msg.recvs):
                    raise RuntimeError("simulated ring: a rank receives a different number of tensors than its "
                                       "neighbour sends")  # fmt: skip
                _copy_into(msg.recvs, src.sends)
            msg = src = None
        msgs = None  # type: ignore[assignment]  # no step's buffers held into the next step
        replies = [None] * cp


def run_loopback(program: RankProgram) -> Any:
    """Run one rank's program alone: every received tensor is a copy of the one it sends. The
    rank allocates, computes and exchanges (as device copies) exactly what it would in a ring,
    so its memory and compute can be measured on one GPU; the values are not a real ring's."""
    reply = None
    while True:
        try:
            msg = program.send(reply)
        except StopIteration as done:
            return done.value
        if isinstance(msg, Post):
            _copy_into(msg.recvs, msg.sends)
        msg = reply = None


def all_to_all(x: torch.Tensor, group: Any) -> torch.Tensor:
    """``x`` is ``[cp, ...]``: slice ``i`` goes to rank ``i``; returns ``[cp, ...]`` whose slice
    ``i`` came from rank ``i``."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


class AllToAll(torch.autograd.Function):
    """Differentiable :func:`all_to_all` (its gradient is the all-to-all of the gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return all_to_all(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[Optional[torch.Tensor], None]:
        return all_to_all(grad, ctx.group), None


class LoopbackAllToAll(torch.autograd.Function):
    """:class:`AllToAll` of one rank alone: it allocates what :func:`all_to_all` does (a contiguous
    send, a receive buffer) and receives its own send back, both ways (for sizing on one GPU)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        return torch.empty_like(x).copy_(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        return torch.empty_like(grad).copy_(grad)


def all_gather_flat(x: torch.Tensor, group: Any) -> torch.Tensor:
    """``x`` ``[n]`` on every rank -> ``[cp, n]`` whose row ``i`` came from rank ``i``
    (``all_gather_into_tensor`` on NCCL; a list all-gather on other backends, e.g. gloo)."""
    cp, _ = group_info(group)
    x = x.contiguous()
    out = x.new_empty((cp, *x.shape))
    if dist.get_backend(group) == "nccl":
        dist.all_gather_into_tensor(out, x, group=group)
    else:
        dist.all_gather(list(out.unbind(0)), x, group=group)
    return out


def reduce_scatter_flat(x: torch.Tensor, group: Any) -> torch.Tensor:
    """``x`` ``[cp, n]`` on every rank (row ``i`` is meant for rank ``i``) -> ``[n]``: the sum over
    ranks of the rows meant for this one (``reduce_scatter_tensor`` on NCCL; an all-reduce and
    this rank's row on backends without reduce-scatter, e.g. gloo)."""
    _, rank = group_info(group)
    x = x.contiguous()
    if dist.get_backend(group) == "nccl":
        out = x.new_empty(x.shape[1:])
        dist.reduce_scatter_tensor(out, x, group=group)
        return out
    total = x.clone()
    dist.all_reduce(total, group=group)
    return total[rank]


def all_gather_simulated(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`all_gather_flat` among the virtual ranks ``0 .. cp-1`` of one process."""
    gathered = torch.stack(list(xs))
    return [gathered] * len(xs)


def reduce_scatter_simulated(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`reduce_scatter_flat` among the virtual ranks ``0 .. cp-1`` of one process."""
    return list(torch.stack(list(xs)).sum(0).unbind(0))
