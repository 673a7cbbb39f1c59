"""How far whole ``generate`` calls spread on the host, and whether pinning the host thread to
one core narrows it.

The front-door benchmark's Llama (random weights, 16 layers, 32 heads over 8 KV heads, bf16),
two models from one state dict (``"sdpa"`` and ``"te_cudnn"``). Greedy ``generate`` at b=1,
a 512-token prompt, 128 new tokens, dynamic cache: ``"sdpa"``, ``"te_cudnn"`` and ``"sdpa"``
again (the control) take turns call by call, first with the thread free to move between
cores, then pinned to the core it started on. For each phase it prints every call's seconds
and median decode step, and the paired ratios (te_cudnn / sdpa, sdpa again / sdpa) with their
95 % intervals.

    python tools/probe_generate_spread.py [--turns 12]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from te_cudnn.benchmark.front_doors import _transformers_quiet
from te_cudnn.benchmark.ratios import paired_ratio
from te_cudnn.benchmark.turns import StepClock, alternating

from probe_decode_engines import _count  # tools/ (on sys.path when run as a script)
from probe_packed_decode import llama_models


def _phase(name: str, models: dict, ids: torch.Tensor, turns: int, new_tokens: int) -> None:
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    clocks = {label: StepClock() for label in ("sdpa", "te_cudnn", "sdpa again")}
    fns = {label: (lambda m=models[label.split()[0]], c=clocks[label]: m.generate(ids, streamer=c, **kw))
           for label in clocks}  # fmt: skip
    seconds: dict = {}
    alternating(fns, turns, seconds)
    print(f"{name}: affinity {sorted(os.sched_getaffinity(0))[:8]}{'...' if len(os.sched_getaffinity(0)) > 8 else ''}")
    for label in clocks:
        steps = clocks[label].medians[1:]
        print(f"  {label:10s} s/call " + " ".join(f"{s:5.2f}" for s in seconds[label]))
        print(f"  {'':10s} ms/step " + " ".join(f"{s * 1e3:5.1f}" for s in steps))
    for a in ("te_cudnn", "sdpa again"):
        m, lo, hi = paired_ratio(seconds["sdpa"], seconds[a])  # tokens/s ratio: sdpa's seconds over a's
        ms, los, his = paired_ratio(clocks["sdpa"].medians[1:], clocks[a].medians[1:])
        print(f"  {a} / sdpa tokens/s: whole calls {m:.3f} ({lo:.3f}-{hi:.3f}), median steps {ms:.3f} ({los:.3f}-{his:.3f}); "
              f"ratio of medians {statistics.median(seconds['sdpa']) / statistics.median(seconds[a]):.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=_count, default=12)
    p.add_argument("--new-tokens", type=_count, default=128)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_generate_spread: needs a CUDA device")
        return 2
    models = llama_models()
    ids = torch.randint(0, 32000, (1, 512), device="cuda")
    with torch.no_grad(), _transformers_quiet():
        _phase("free", models, ids, a.turns, a.new_tokens)
        core = os.sched_getaffinity(0)
        here = int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[36])  # the core it runs on now
        os.sched_setaffinity(0, {here})
        try:
            _phase(f"pinned to core {here}", models, ids, a.turns, a.new_tokens)
        finally:
            os.sched_setaffinity(0, core)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
