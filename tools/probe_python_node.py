"""What does a training step pay for an attention implemented in Python?

The front-door benchmark's Llama (random weights, 16 layers, bf16), one model with its attention
implementation switched before each call: ``sdpa``, ``te_cudnn`` and ``sdpa`` plus one identity
autograd node per layer written in Python (the benchmark's control). For b=2 s=2048 it prints

* the step time at the host's pace, paired by turn against ``sdpa``;
* the step's GPU time with a spin queued in front of it, so that the host cannot pace the GPU,
  and the host ms it took to queue the step;
* the backward cost of identity Python nodes on a CUDA tensor (run on autograd's device thread)
  and on a CPU tensor (run on the calling thread).

    python tools/probe_python_node.py [--turns 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from te_cudnn.benchmark.front_doors import _NODE, _PythonNode, _llama_config, _python_node_sdpa, _transformers
from te_cudnn.benchmark.ratios import paired_ratio
from te_cudnn.integrations import transformers as te_hf
from te_cudnn.timing import EventSpan, spin, spin_ended, spin_rate


def _identity_backward_us(device: str, nodes: int, reps: int = 300) -> float:
    """Median µs of ``backward()`` through ``nodes`` identity Python nodes."""
    x = torch.randn(16, device=device, requires_grad=True)
    times = []
    for _ in range(reps):
        y = x
        for _ in range(nodes):
            y = _PythonNode.apply(y)
        loss = y.sum()
        t0 = time.perf_counter()
        loss.backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--spin-ms", type=float, default=150.0, help="the spin queued before a step")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("probe_python_node: needs a CUDA device")
        return 2
    transformers = _transformers()
    te_hf.register()
    impls = {"sdpa": "sdpa", "te_cudnn": "te_cudnn", _NODE: _python_node_sdpa(transformers)}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_llama_config(), attn_implementation="sdpa")
    model = model.to(device="cuda", dtype=torch.bfloat16).train()
    ids = torch.randint(0, 32000, (2, 2048), device="cuda")

    def step():
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    rate = spin_rate(0)
    samples = {(label, ahead): ([], []) for label in impls for ahead in (False, True)}
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
    for ahead in (False, True):
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
