"""What each cuDNN engine costs a dynamic-cache decode step, on the host and on the GPU.

A decode step of the front-door benchmark's Llama (32 query heads over 8 KV heads, d=64, bf16,
one query row, the keys and values of a ``DynamicCache``: ``[b, 8, L, 64]`` contiguous) is
host-bound: ``generate`` waits on the host, not on the GPU. This probe plans the attention
call's graph with every heuristic mode (as the autotuner does), builds every candidate, checks
each one's output against the heuristic plan's, and prints for each, at a few ``(b, L)``:

* host µs per launch through the backend's pointer-array execute (te_cudnn's launch path), and
  GPU µs per launch run back to back behind a spin;
* the same for te_cudnn's Hugging Face function on its remembered signature and for
  transformers' ``sdpa`` function.

Medians over interleaved rounds.

    python tools/probe_decode_engines.py [--rounds 7] [--calls 300]
"""

from __future__ import annotations

import argparse
import statistics
from array import array

import torch

from te_cudnn.backends import BY_ENUM
from te_cudnn.benchmark.front_doors import _transformers
from te_cudnn.integrations import transformers as te_hf
from te_cudnn.plans.cache import plan_cache
from te_cudnn.plans.handles import handle_for
from te_cudnn.plans.tune import make_operands, plan_candidates
from te_cudnn.timing import queued_ms, spin_rate


class _Module(torch.nn.Module):
    is_causal = True


def _probe(b: int, skv: int, rounds: int, calls: int, rate: float, h: int = 32, hg: int = 8, d: int = 64) -> None:
    sdpa = _transformers().integrations.sdpa_attention.sdpa_attention_forward
    module = _Module().eval()
    module.num_key_value_groups = h // hg
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, hg, skv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    plan_cache.clear()
    for _ in range(3):
        te_hf.attention_forward(module, q, k, v, None)
    plans = plan_cache.plans()
    assert len(plans) == 1, [p.key for p in plans]
    key = plans[0].key
    dev = key.config.device
    planned = plan_candidates(key, lambda: BY_ENUM[key.backend].build(key.config, key.direction, handle_for(dev)))
    g, uids = planned.graph, tuple(planned.spec.uids)
    ops = make_operands(g, uids, key.config, torch.device("cuda", dev))
    order = list(g._variant_pack_uids())
    ptrs = array("Q", [ops[u].data_ptr() for u in order])
    raw = g._lowered_graph._execute_with_raw_ptrs
    handle = handle_for(dev).backend_handle
    outputs = [t.uid for t in g.get_outputs()]
    ready = [c for c in planned.candidates if c.error is None]
    ws = torch.empty(max([c.workspace or 0 for c in ready] + [1]), dtype=torch.uint8, device="cuda")
    fns, notes, reference = {}, {}, None
    for c in sorted(ready, key=lambda c: c.index != planned.heuristic_index):  # the heuristic plan first
        cpp = g._materialize_backend_plan(c.index).cpp_index

        def launch(cpp=cpp):
            raw(ptrs.buffer_info()[0], len(order), ws.data_ptr(), handle, cpp)

        for u in outputs:
            ops[u].fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        got = ops[outputs[0]].float().clone()
        if reference is None:
            reference = got
        err = (got - reference).abs().max().item()
        mark = "*" if c.index == planned.heuristic_index else " "
        label = f"{mark}[{c.index}] {c.name}"
        notes[label] = f"ws {c.workspace or 0:>9d} B  max|diff| {err:.2e}"
        fns[label] = launch
    fns["te_cudnn HF function (remembered)"] = lambda: te_hf.attention_forward(module, q, k, v, None)
    fns["transformers sdpa function"] = lambda: sdpa(module, q, k, v, None, is_causal=False)
    samples = {name: ([], []) for name in fns}
    with torch.no_grad():
        for r in range(rounds):
            for name, fn in (fns.items() if r % 2 == 0 else reversed(list(fns.items()))):
                gpu_ms, host_us, _ = queued_ms(fn, calls, lead=10, ahead_ms=calls * 0.2, rate=rate)
                samples[name][0].append(host_us)
                samples[name][1].append(gpu_ms * 1e3)
    print(f"decode step b={b} h={h} hg={hg} L={skv} d={d} bf16 ({len(planned.candidates)} candidates, "
          f"{len(ready)} built; * = heuristic plan):")
    for name, (host, gpu) in samples.items():
        print(f"  {name[:72]:72s} host {statistics.median(host):6.1f} µs  GPU {statistics.median(gpu):6.1f} µs"
              f"  {notes.get(name, '')}")


def _count(text: str) -> int:
    """A whole number >= 1 (argparse's type for --rounds and --calls)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _shapes(text: str) -> list[tuple[int, int]]:
    """``"1x600,4x600"`` as ``[(1, 600), (4, 600)]``: batch and key length, each >= 1."""
    try:
        shapes = [tuple(int(x) for x in part.split("x")) for part in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"expected comma-separated BxL with B, L >= 1 (e.g. 1x600,4x600), got {text!r}")
    return shapes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=_count, default=7)
    p.add_argument("--calls", type=_count, default=300)
    p.add_argument("--shapes", type=_shapes, default="1x600,4x600,1x2048", help="comma-separated BxL")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_decode_engines: needs a CUDA device")
        return 2
    rate = spin_rate(0)
    for b, skv in a.shapes:
        _probe(b, skv, a.rounds, a.calls, rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
