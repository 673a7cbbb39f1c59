"""Where a training call's backward host time goes: te_cudnn's Hugging Face attention node
against transformers' ``sdpa`` node, taken apart.

At the Llama layer's training shape (b=2, s=2048, 32 query heads over 8 KV heads, d=64, bf16,
causal; ``[b, h, s, d]`` views of ``[b, s, h, d]`` leaves), behind a spin so that only host
time counts, host µs per call of

* ``backward``: ``out.backward(grad, retain_graph=True)``, autograd's engine with its hand-off
  to the device thread (the graph's forward is run once, outside the timing);
* ``node``: the attention node alone, called on the main thread with gradients off, as the
  engine runs it (te_cudnn: its Python ``backward``; ``sdpa``: torch's C++ node);
* te_cudnn's pieces: unpacking the five saved tensors, ``plain_bwd`` (allocating dQ, dK, dV and launching), and cuDNN's launch
  of the backward plan alone on gradients allocated once;
* torch's allocation of three gradients like q, k, v (``empty_like``), for scale;
* ``sdpa in a Python node``: torch's own cuDNN attention ops (the kernels ``sdpa`` runs) in a
  ``torch.autograd.Function`` written in Python, through the engine and as a node alone: what a
  Python node costs when its backward does the same work as torch's C++ node.

    python tools/probe_train_backward.py [--rounds 15] [--calls 20]
"""

from __future__ import annotations

import argparse
from array import array

import torch

from te_cudnn.launch import launch
from te_cudnn.launchers import plain_bwd

from probe_decode_engines import _count  # tools/ (on sys.path when run as a script)
from probe_train_call import _behind_spin_us, _calls, _tensors, attention_functions


class _SdpaInPython(torch.autograd.Function):
    """torch's cuDNN attention forward and backward ops (causal, GQA) in a Python node."""

    @staticmethod
    def forward(ctx, q, k, v):
        out, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, True, False)
        ctx.save_for_backward(q, k, v, out, lse, seed, offset)
        ctx.rest = (cq, ck, mq, mk)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, seed, offset = ctx.saved_tensors
        cq, ck, mq, mk = ctx.rest
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            d_out, q, k, v, out, lse, seed, offset, None, cq, ck, mq, mk, 0.0, True)


def _node_args(node, grad: torch.Tensor) -> tuple:
    """``grad`` followed by None for the node's other outputs (torch's attention ops return
    the logsumexp and more beside the output): as many as the node takes."""
    for extra in range(12):
        args = (grad, *([None] * extra))
        try:
            node(*args)
        except (TypeError, RuntimeError):
            continue
        return args
    raise RuntimeError(f"cannot call {type(node).__name__} with one output gradient")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=_count, default=15)
    p.add_argument("--calls", type=_count, default=20)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_train_backward: needs a CUDA device")
        return 2
    impls = attention_functions()
    fns: dict = {}
    for name, fn in impls.items():
        fwd, fwd_bwd = _calls(fn, 2, 2048)
        for _ in range(3):
            fwd_bwd()  # the te_cudnn node learns its backward
        out = fwd()
        grad = torch.randn_like(out)
        node = _attention_node(out)
        print(f"{name}: output {tuple(out.shape)} strides {out.stride()}, node {type(node).__name__}")
        fns[f"{name} backward"] = lambda out=out, grad=grad: out.backward(grad, retain_graph=True)
        if name == "te_cudnn":
            node_grad = grad
            fns[f"{name} node"] = lambda node=node, g=node_grad: node.apply(g)
            fns[f"{name} node.saved_tensors"] = lambda node=node: node.saved_tensors
            q, k, v, o, stats = node.saved_tensors
            entry = node.entry
            prep = entry.backwards[grad.stride()]
            rng = node.rng_state
            fns[f"{name} plain_bwd"] = lambda a=(prep, q, k, v, o, grad, stats, rng): plain_bwd(*a)
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            ptrs = array("Q", [t.data_ptr() for t in (q, k, v, o, stats, grad, dq, dk, dv)])
            plan = prep.get_plan()
            fns[f"{name} launch only"] = lambda plan=plan, ptrs=ptrs: launch(plan, ptrs, 0)
            fns["torch empty_like x3"] = lambda ts=(q, k, v): [torch.empty_like(t) for t in ts]
        else:
            args = _node_args(node, grad.transpose(1, 2))  # the node's output is [b, h, s, d]
            fns[f"{name} node"] = lambda node=node, args=args: node(*args)
    _, views, grad = _tensors(2, 2048)
    out, grad = _SdpaInPython.apply(*views), grad.transpose(1, 2)
    fns["sdpa in a Python node, backward"] = lambda out=out, g=grad: out.backward(g, retain_graph=True)
    fns["sdpa in a Python node, node"] = lambda node=out.grad_fn, g=grad: node.apply(g)
    with torch.no_grad():  # as autograd's engine runs nodes (without create_graph)
        res = _behind_spin_us(fns, a.rounds, a.calls)
    print(f"host µs per call, b=2 s=2048, behind a spin (median of {a.rounds} rounds in turns, {a.calls} calls each):")
    for name, us in res.items():
        print(f"  {name:34s} {us:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
