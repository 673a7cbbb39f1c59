"""How much of the compiled training step's te_cudnn-vs-SDPA gap is the cuDNN launch itself:
the example's compiled step (``examples/train_gpt.py``), run interleaved step by step for
te_cudnn, te_cudnn with the cuDNN launch skipped (everything else of the op path runs: the
dispatcher, the op bodies, the allocations; the results are garbage) and torch SDPA.

    python tools/probe_compiled_gap.py [--steps 200] [--batch 8] [--mode compile]

Prints the median step time (CUDA events) of each. In a host-bound step the difference between
"te_cudnn" and "te_cudnn, no launch" is what the launches cost inside the step; the difference
between "te_cudnn, no launch" and SDPA is te_cudnn's Python around them (SDPA still launches).
"te_cudnn, launch twice" repeats each launch at once: a launch that costs the same again is a
fixed cost; one that costs little the second time was paying for cold caches.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--mode", default="compile", choices=("eager", "compile"))
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import torch  # noqa: PLC0415
    import train_gpt  # noqa: PLC0415

    from te_cudnn import launch as te_launch, ops  # noqa: PLC0415

    args = train_gpt.parse_args(["--steps", str(a.steps), "--mode", a.mode, "--batch", str(a.batch)])
    data, _ = train_gpt.make_dataset(args)
    torch._dynamo.reset()
    real = ops._launch  # every pointer-array launch (plain paths and launch.execute) goes through it

    def no_launch(*_args, **_kwargs) -> None:
        return None

    def twice(*args, **kwargs) -> None:  # the same launch again: same inputs, same results
        real(*args, **kwargs)
        real(*args, **kwargs)

    runs = {"te_cudnn": (train_gpt.train("te_cudnn", a.mode, data, args), real),
            "te_cudnn, no launch": (train_gpt.train("te_cudnn", a.mode, data, args), no_launch),
            "te_cudnn, launch twice": (train_gpt.train("te_cudnn", a.mode, data, args), twice),
            "sdpa": (train_gpt.train("sdpa", a.mode, data, args), real)}
    results = {}
    while runs:
        for name, (gen, execute) in list(runs.items()):
            ops._launch = te_launch.launch = execute
            try:
                next(gen)
            except StopIteration as stop:
                results[name] = stop.value
                del runs[name]
            finally:
                ops._launch = te_launch.launch = real
    base = results["sdpa"]["median_step_ms"]
    print(f"{a.mode}, batch {a.batch}, {a.steps} steps, interleaved:")
    for name, r in results.items():
        print(f"  {name:22s} {r['median_step_ms']:8.2f} ms/step  ({r['median_step_ms'] / base:.3f}x sdpa)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
