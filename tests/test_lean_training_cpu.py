"""The front doors' remembered training call (``te_cudnn.autograd.lean_attention``) on the CPU.

cuDNN needs a GPU, so the two launches the lean autograd node makes (``plain_fwd`` /
``plain_bwd``) and the full backward of its first call per output-gradient layout
(``fused_attn_bwd``) are replaced by an fp32 implementation of the same contract. What is
checked is te_cudnn's wiring: what the node saves, which backward each output-gradient layout
takes (the full path once, then the remembered plain one), when a backward is not remembered,
gradients in the inputs' strides, and the error for a second derivative. The real launches run
in ``tests/test_front_doors_gpu.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from te_cudnn import autograd
from te_cudnn.autograd import AttnOptions, lean_attention
from te_cudnn.lean import LeanTraining

B, H, S, D = 2, 3, 8, 4


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp32 causal attention over [b, h, s, d] tensors."""
    scores = (q.float() @ k.float().transpose(-1, -2)) / D**0.5
    scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v.float()


def _grads(q, k, v, d_o):
    with torch.enable_grad():  # also inside a backward
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        return torch.autograd.grad(_attention(*leaves), leaves, d_o.float())


class _Kernels:
    """Stand-ins for the launches, counting calls; ``learnable``: whether the full backward's
    prepared call may be remembered (a plain one allocating gradients like the inputs)."""

    def __init__(self, learnable: bool = True) -> None:
        self.calls = {"plain_fwd": 0, "plain_bwd": 0, "full_bwd": 0}
        self.learnable = learnable

    def plain_fwd(self, prep, q, k, v, out):
        self.calls["plain_fwd"] += 1
        out.copy_(_attention(q, k, v))
        return out, [torch.zeros(B, H, S, 1), prep.zero_rng]

    def plain_bwd(self, prep, q, k, v, o, d_o, stats, rng_state):
        self.calls["plain_bwd"] += 1
        grads = [torch.empty_like(t).copy_(g) for t, g in zip((q, k, v), _grads(q, k, v, d_o))]
        return [*grads, None, None]

    def fused_attn_bwd(self, sq, skv, cu_q, cu_kv, q, k, v, o, d_o, dtype, aux, backend, _prepared, **options):
        """The full backward on the bshd views the lean entry's ``view`` gives."""
        self.calls["full_bwd"] += 1
        assert (sq, skv) == (S, S) and options["qkv_layout"] == "bshd_bshd_bshd" and options["attn_mask_type"] == "causal"
        bhsd = [t.transpose(1, 2) for t in (q, k, v, d_o)]
        grads = [torch.empty_like(t).copy_(g.transpose(1, 2)) for t, g in zip((q, k, v), _grads(*bhsd))]
        _prepared.append(SimpleNamespace(plain=self.learnable, grads_like_inputs=self.learnable))
        return [*grads, None, None]


@pytest.fixture
def kernels(monkeypatch):
    def install(learnable: bool = True) -> _Kernels:
        k = _Kernels(learnable)
        monkeypatch.setattr(autograd, "plain_fwd", k.plain_fwd)
        monkeypatch.setattr(autograd, "plain_bwd", k.plain_bwd)
        monkeypatch.setattr(autograd, "fused_attn_bwd", k.fused_attn_bwd)
        return k

    return install


def _transposed(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)


def _entry() -> LeanTraining:
    """The drop-in's entry: [b, h, s, d] tensors, a bshd causal graph, O in [b, s, h, d] memory."""
    prep = SimpleNamespace(zero_rng=torch.zeros(2, dtype=torch.int64))
    template = torch.empty(B, S, H, D).transpose(1, 2)
    return LeanTraining(prep, template, AttnOptions(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal"), (S, S),
                        _transposed, _transposed)  # fmt: skip


def _leaves(bshd_memory: bool = False):
    if bshd_memory:
        return [torch.randn(B, S, H, D).transpose(1, 2).requires_grad_() for _ in range(3)]
    return [torch.randn(B, H, S, D, requires_grad=True) for _ in range(3)]


def _step(entry, grad_kind: str, bshd_memory: bool = False):
    q, k, v = _leaves(bshd_memory)
    out = lean_attention(entry, q, k, v)
    if grad_kind == "dense":
        d_o = torch.randn(B, H, S, D)
    elif grad_kind == "bshd":
        d_o = torch.randn(B, S, H, D).transpose(1, 2)
    else:  # an expanded gradient, as sum() hands over: not readable by cuDNN, made contiguous
        d_o = torch.ones(()).expand(B, H, S, D)
    out.backward(d_o)
    ref_out = _attention(q, k, v)
    ref = _grads(q, k, v, d_o)
    assert out.grad_fn is not None and "LeanAttnFunc" in out.grad_fn.name()
    assert torch.allclose(out, ref_out, atol=1e-5)
    for t, g in zip((q, k, v), ref):
        assert t.grad.stride() == t.stride()
        assert torch.allclose(t.grad, g, atol=1e-5)


@pytest.mark.parametrize("bshd_memory", [False, True])
def test_each_gradient_layout_takes_the_full_backward_once_then_the_remembered_one(kernels, bshd_memory):
    k = kernels()
    entry = _entry()
    for kind in ("dense", "dense", "bshd", "expanded", "bshd", "expanded", "dense"):
        _step(entry, kind, bshd_memory)
    assert k.calls == {"plain_fwd": 7, "full_bwd": 2, "plain_bwd": 5}
    assert len(entry.backwards) == 2  # the expanded gradient is made contiguous: the dense layout's entry


def test_a_backward_that_is_not_plain_is_never_remembered(kernels):
    k = kernels(learnable=False)
    entry = _entry()
    for _ in range(3):
        _step(entry, "dense")
    assert k.calls == {"plain_fwd": 3, "full_bwd": 3, "plain_bwd": 0}
    assert not entry.backwards


def test_gradients_of_the_gradients_raise(kernels):
    kernels()
    entry = _entry()
    q, k, v = _leaves()
    out = lean_attention(entry, q, k, v)
    (dq,) = torch.autograd.grad((out * out).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.sum().backward()
