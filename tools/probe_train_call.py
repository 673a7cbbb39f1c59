"""Where a training call's host time goes: te_cudnn's Hugging Face attention function against
transformers' ``sdpa`` function, forward and backward.

Both take the Llama layer's tensors (``[b, h, s, d]`` views of ``[b, s, h, d]`` leaves that
require grad, 32 query heads over 8 KV heads, d=64, bf16, causal). For each it prints

* host µs per forward and per forward + backward (``out.backward``) at a small shape
  (b=1, s=128), where the host paces the GPU, and at the training shape behind a spin (only
  host time counts), medians over rounds taken in turns;
* under ``torch.profiler`` at the training shape (b=2, s=2048): per call, the CPU ops of the
  forward and of the backward node (the backward runs on autograd's device thread, which
  ``cProfile`` does not see), the CUDA API calls and the kernels.

    python tools/probe_train_call.py [--iters 50] [--rounds 15]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

from te_cudnn.benchmark.front_doors import _Stub, _transformers
from te_cudnn.integrations import transformers as te_hf
from te_cudnn.timing import host_medians, spin, spin_ended, spin_rate

from probe_host_api_calls import profile_calls  # tools/ (on sys.path when run as a script)

def _tensors(b: int, s: int, h: int = 32, hg: int = 8, d: int = 64):
    def leaf(heads):
        return torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = leaf(h), leaf(hg), leaf(hg)
    grad = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    return (q, k, v), tuple(t.transpose(1, 2) for t in (q, k, v)), grad


def attention_functions() -> dict:
    """transformers' ``sdpa`` attention function and te_cudnn's, by name."""
    return {"sdpa": _transformers().integrations.sdpa_attention.sdpa_attention_forward,
            "te_cudnn": te_hf.attention_forward}  # fmt: skip


def _calls(fn, b: int, s: int):
    stub = _Stub().train()
    stub.is_causal, stub.num_key_value_groups = True, 4
    leaves, (q, k, v), grad = _tensors(b, s)

    def fwd():
        return fn(stub, q, k, v, None, dropout=0.0, scaling=None, is_causal=True)[0]

    def fwd_bwd():
        fwd().backward(grad)
        for t in leaves:
            t.grad = None

    return fwd, fwd_bwd


def _behind_spin_us(fns: dict, rounds: int, calls: int = 20) -> dict:
    """Host µs per call while a spin keeps the GPU busy, so that the host never waits on it
    (rounds in turns; a round whose spin ended before its calls were queued is left out)."""
    rate = spin_rate(0)
    times: dict = collections.defaultdict(list)
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            spun = spin(100.0, rate)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            elapsed = time.perf_counter() - t0
            if not spin_ended(spun):
                times[name].append(elapsed / calls * 1e6)
    torch.cuda.synchronize()
    return {n: statistics.median(t) for n, t in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("probe_train_call: needs a CUDA device")
        return 2
    impls = attention_functions()
    small = {name: _calls(fn, 1, 128) for name, fn in impls.items()}
    host = host_medians({f"{n} {kind}": c[i] for n, c in small.items() for i, kind in enumerate(("fwd", "fwd+bwd"))},
                        a.rounds, 200, warmup=20)  # fmt: skip
    print("host µs per call, b=1 s=128 (median of rounds in turns):")
    for name, us in host.items():
        print(f"  {name:22s} {us:8.1f}")
    large = {name: _calls(fn, 2, 2048) for name, fn in impls.items()}
    busy = _behind_spin_us({f"{n} {kind}": c[i] for n, c in large.items() for i, kind in enumerate(("fwd", "fwd+bwd"))},
                           a.rounds)  # fmt: skip
    print("host µs per call, b=2 s=2048, behind a spin (median of rounds in turns):")
    for name, us in busy.items():
        print(f"  {name:22s} {us:8.1f}")
    for name in impls:
        res = profile_calls(large[name][1], a.iters)
        print(f"\n{name}, b=2 s=2048 fwd+bwd under torch.profiler: per call, mean µs (host for ops and API calls)")
        for kind in ("ops", "api", "kernels"):
            for ev, (count, us) in sorted(res[kind].items(), key=lambda kv: -kv[1][0] * kv[1][1]):
                if count >= 0.5:
                    print(f"  {kind:7s} {count:5.2f} x {us:9.2f}  {ev[:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
