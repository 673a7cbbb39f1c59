"""The front doors' cached inference forward.

The module, the SDPA drop-in, ``fused_attention`` and the Hugging Face attention function
validate, translate and select on the first call of a signature (their inputs' shapes, strides, dtypes and devices and
the options that change the plan). A later call of that signature that wants no gradient and
runs no dropout needs none of it again: it allocates the output in the door's own geometry
(the drop-in's ``[b, h, s, d]`` view of ``[b, s, h, d]`` memory, the module's flattened heads)
and launches the prepared plain forward, reading the inputs' pointers where they are. Every
check that guards the answer stays: the signature equals a validated one, and the launch
checks the pointers' 16-byte alignment (:func:`run_inference`).
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Hashable, Optional

import torch

from .launch import is_capturing
from .launch import launch as _launch
from .launch import misaligned as _misaligned
from .memo import TEMPLATE_BYTES, SigMemo
from .plans.cache import next_tick
from .prepared import _dependent_caches, shared_template
from .launchers import plain_fwd
from .policy import token as policy_token

__all__ = ["LeanDoor", "LeanTraining", "as_is", "new_output", "run_inference", "wants_grad", "policy_token"]

_empty_like = torch.empty_like
_empty_strided = torch.empty_strided
_grad_enabled = torch.is_grad_enabled


def wants_grad(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether autograd would record this call: grad mode is on and an input requires grad
    (False for arguments that are not tensors: the validation that follows names them)."""
    if not _grad_enabled():
        return False
    try:
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    except AttributeError:
        return False
    return False


class LeanTraining:
    """A remembered call that autograd records (te_cudnn.autograd's lean function runs it): the
    prepared plain forward, the output template, and what the backward needs. ``backwards``
    maps the output gradient's strides to the prepared plain backward that takes them (learned
    on the first backward with those strides); ``options``, ``seqlens``, ``view`` (the door's
    q, k, v -> the graph layout's views, its own inverse) and ``out_view`` (the door's output ->
    the graph's) let that first backward run the full path."""

    __slots__ = ("prep", "template", "options", "seqlens", "view", "out_view", "backwards")

    def __init__(self, prep: Any, template: Any, options: Any, seqlens: tuple[int, int], view: Any,
                 out_view: Any) -> None:  # fmt: skip
        self.prep, self.template, self.options, self.seqlens = prep, template, options, seqlens
        self.view, self.out_view = view, out_view
        self.backwards: dict[tuple[int, ...], Any] = {}


def as_is(t: torch.Tensor) -> torch.Tensor:
    """A :class:`LeanTraining` view for tensors the graph takes as the door has them."""
    return t


def new_output(template: Any) -> torch.Tensor:
    """A new tensor of a remembered output's shape and strides (see :meth:`LeanDoor.learn`)."""
    if template.__class__ is tuple:
        shape, stride, dtype, device = template
        return _empty_strided(shape, stride, dtype=dtype, device=device)
    return _empty_like(template)


class LeanDoor:
    """One front door's signatures -> (prepared plain forward, output template), or a
    :class:`LeanTraining` for calls autograd records; bounded and least recently used like
    te_cudnn's own memos, and forgotten with them."""

    __slots__ = ("memo",)

    def __init__(self) -> None:
        self.memo = SigMemo()
        _dependent_caches.append(self.memo)

    def find(self, sig: Hashable) -> Any:
        """The entry of ``sig`` (pass it to :func:`run_inference`), or None."""
        return self.memo.find(sig)

    def learn(self, sig: Optional[Hashable], prepared: list, out: torch.Tensor, training: Optional[tuple] = None) -> None:
        """Remember the call that just ran under ``sig``: its prepared forward (the one entry of
        ``prepared``, te_cudnn.ops' ``_prepared`` list) and ``out``, the tensor the door returned,
        whose shape and strides later calls get. Only plain forwards without dropout are kept
        (those need nothing per call but the pointers). ``training``: ``(options, seqlens, view,
        out_view)`` of a call autograd recorded (see :class:`LeanTraining`)."""
        if sig is None or len(prepared) != 1:
            return
        prep = prepared[0]
        if not prep.plain or prep.rng_increment or is_capturing():
            return
        if math.prod(out.shape) * out.element_size() <= TEMPLATE_BYTES:  # a small real tensor: empty_like is cheapest
            like = _empty_like(out, device="meta")  # empty_like's geometry, without memory
            template: Any = shared_template(tuple(like.shape), tuple(like.stride()), out.dtype, out.device)
        else:
            template = (tuple(out.shape), tuple(out.stride()), out.dtype, out.device)
        self.memo.remember(sig, LeanTraining(prep, template, *training) if training else (prep, template))


def run_inference(entry: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A remembered inference forward (an entry of :meth:`LeanDoor.find`) on new tensors of its signature.
    The usual case (a graph without stats launched from pointers, its plan cached) is
    specialised into this frame: allocate, check the 16-byte alignment, keep the plan's use
    count and recency, launch. Anything else (an evicted plan, stats, a plan the frontend
    executes) goes through :func:`te_cudnn.launchers.plain_fwd`."""
    prep, template = entry
    out = _empty_like(template) if template.__class__ is not tuple else new_output(template)
    plan = prep.plan
    if plan is None or plan.evicted or prep.stats_template is not None or plan.launch.mode != "raw":
        plain_fwd(prep, q, k, v, out)
        return out
    pq, pk, pv, po = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    if (pq | pk | pv | po) & 15:
        _misaligned(q=q, k=k, v=v, out=out)
    plan.hits += 1  # as plain_fwd keeps them (plan_cache.hit, inline)
    plan.last_used = next_tick()
    _launch(plan, array("Q", (pq, pk, pv, po)), prep.index)  # the builder's uid order: q, k, v, o
    return out
