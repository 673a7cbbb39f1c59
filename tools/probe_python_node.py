"""What does a training step pay for an attention implemented in Python?

The front-door benchmark's Llama (random weights, 16 layers, bf16), one model with its attention
implementation switched before each call: ``sdpa``, ``te_cudnn`` and ``sdpa`` plus one identity
autograd node per layer written in Python (the benchmark's control) and, where a C++ compiler and
ninja are at hand, ``sdpa`` plus one identity node compiled in C++ (``torch.utils.cpp_extension``):
what an attention whose autograd node is C++ would pay. For b=2 s=2048 it prints

* the step time at the host's pace, paired by turn against ``sdpa``;
* the step's GPU time with a spin queued in front of it, so that the host cannot pace the GPU,
  and the host ms it took to queue the step;
* the backward cost of identity Python nodes on a CUDA tensor (run on autograd's device thread)
  and on a CPU tensor (run on the calling thread), and of the C++ node on a CUDA tensor.

    python tools/probe_python_node.py [--turns 30] [--no-cpp]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Callable

import torch

from te_cudnn.benchmark.front_doors import _NODE, _PythonNode, _llama_config, _python_node_sdpa, _transformers
from te_cudnn.benchmark.ratios import paired_ratio
from te_cudnn.integrations import transformers as te_hf
from te_cudnn.timing import EventSpan, spin, spin_ended, spin_rate

_CPP_NODE = "sdpa + one C++ autograd node"
_CPP_SOURCE = r"""
#include <torch/extension.h>

// The identity as an autograd node compiled in C++: no kernel, only the node.
struct IdentityNode : public torch::autograd::Function<IdentityNode> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) { return x.view_as(x); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return grads;
  }
};

torch::Tensor identity(const torch::Tensor& x) { return IdentityNode::apply(x); }
"""


def _cpp_identity() -> Callable[[torch.Tensor], torch.Tensor]:
    """The C++ identity node's entry point, compiled on first use (torch.utils.cpp_extension)."""
    from torch.utils.cpp_extension import load_inline  # noqa: PLC0415 - needs a compiler: only this probe's option

    module = load_inline("te_cudnn_probe_identity_node", _CPP_SOURCE, functions=["identity"], verbose=False)
    return module.identity


def _cpp_node_sdpa(transformers, identity: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """Register transformers' sdpa attention with its output passed through the C++ identity node."""
    from transformers.masking_utils import sdpa_mask  # noqa: PLC0415 - optional dependency

    sdpa = transformers.integrations.sdpa_attention.sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        out, weights = sdpa(module, query, key, value, attention_mask, **kwargs)
        return identity(out), weights

    name = "sdpa_cpp_node"
    transformers.AttentionInterface.register(name, attention)
    transformers.AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _identity_backward_us(device: str, nodes: int, reps: int = 300, node: Callable = _PythonNode.apply) -> float:
    """Median µs of ``backward()`` through ``nodes`` identity nodes (``node``: Python by default)."""
    x = torch.randn(16, device=device, requires_grad=True)
    times = []
    for _ in range(reps):
        y = x
        for _ in range(nodes):
            y = node(y)
        loss = y.sum()
        t0 = time.perf_counter()
        loss.backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--spin-ms", type=float, default=150.0, help="the spin queued before a step")
    p.add_argument("--no-cpp", action="store_true", help="leave the C++ identity node out")
    p.add_argument("--no-spin", action="store_true", help="time the steps at the host's pace only")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("probe_python_node: needs a CUDA device")
        return 2
    transformers = _transformers()
    te_hf.register()
    impls = {"sdpa": "sdpa", "te_cudnn": "te_cudnn", _NODE: _python_node_sdpa(transformers)}
    identity = None
    if not a.no_cpp:
        try:
            identity = _cpp_identity()
        except Exception as e:  # noqa: BLE001 - no compiler or ninja: say so and go on without it
            print(f"C++ identity node not built ({type(e).__name__}: {str(e).splitlines()[0][:160]}); left out")
        else:
            impls[_CPP_NODE] = _cpp_node_sdpa(transformers, identity)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_llama_config(), attn_implementation="sdpa")
    model = model.to(device="cuda", dtype=torch.bfloat16).train()
    ids = torch.randint(0, 32000, (2, 2048), device="cuda")

    def step():
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    rate = spin_rate(0)
    paces = (False,) if a.no_spin else (False, True)
    samples = {(label, ahead): ([], []) for label in impls for ahead in paces}
    late = 0
    for impl in impls.values():
        model.set_attn_implementation(impl)
        step()
        step()
    keys, order = list(samples), random.Random(0)
    for _ in range(a.turns):
        order.shuffle(keys)
        for label, ahead in keys:
            model.set_attn_implementation(impls[label])
            torch.cuda.synchronize()
            spun = spin(a.spin_ms, rate) if ahead and rate else None
            span = EventSpan()
            span.begin()
            t0 = time.perf_counter()
            step()
            queued = time.perf_counter() - t0
            late += spin_ended(spun)
            span.end()
            torch.cuda.synchronize()
            samples[(label, ahead)][0].append(span.ms())
            samples[(label, ahead)][1].append(queued * 1e3)
    print(f"training step b=2 s=2048, {a.turns} turns ({late} spins ended before the host had queued the whole "
          "step: the launch queue holds only part of it)")
    for ahead in paces:
        print("  behind a spin (GPU time):" if ahead else "  at the host's pace (GPU events around the step):")
        base = samples[("sdpa", ahead)][0]
        for label in impls:
            ms, host = samples[(label, ahead)]
            ratio = paired_ratio(ms, base)
            print(f"    {label:34s} {statistics.median(ms):8.3f} ms  {ratio[0]:.4f} ({ratio[1]:.4f}-{ratio[2]:.4f})"
                  f"  host queue {statistics.median(host):.2f} ms")  # fmt: skip
    for device in ("cuda", "cpu"):
        one, many = _identity_backward_us(device, 1), _identity_backward_us(device, 33)
        print(f"identity Python node, backward on a {device} tensor: {(many - one) / 32:.1f} µs per node")
    if identity is not None:
        one, many = (_identity_backward_us("cuda", n, node=identity) for n in (1, 33))
        print(f"identity C++ node, backward on a cuda tensor: {(many - one) / 32:.1f} µs per node")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
