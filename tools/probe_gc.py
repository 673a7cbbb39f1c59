"""How much of a compiled training step of ``examples/train_gpt.py`` is Python's garbage collector,
te_cudnn against torch SDPA, run interleaved step by step as the example does.

    python tools/probe_gc.py [--steps 200] [--mode compile]

Prints, per attention: the median step time (CUDA events), the collections that ran during its
steps per generation and their total time per step; then the same with the collector off
(``gc.disable()`` after ``gc.freeze()``), to show what it costs each side.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def run(steps: int, mode: str, collector: bool) -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import train_gpt  # noqa: PLC0415

    args = train_gpt.parse_args(["--steps", str(steps), "--mode", mode])
    data, _ = train_gpt.make_dataset(args)
    torch._dynamo.reset()
    current = {"attn": None}
    spent: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        attn = current["attn"]
        if attn is None:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent.setdefault(attn, []).append(time.perf_counter() - started[0])
            counts.setdefault(attn, [0, 0, 0])[info["generation"]] += 1

    runs = {attn: train_gpt.train(attn, mode, data, args) for attn in ("te_cudnn", "sdpa")}
    done = {}
    gc.collect()
    if not collector:
        gc.freeze()
        gc.disable()
    gc.callbacks.append(callback)
    try:
        while runs:
            for attn, gen in list(runs.items()):
                current["attn"] = attn
                try:
                    next(gen)
                except StopIteration as stop:
                    done[attn] = stop.value
                    del runs[attn]
                current["attn"] = None
    finally:
        gc.callbacks.remove(callback)
        gc.enable()
        gc.unfreeze()
    label = "collector on " if collector else "collector off"
    for attn, r in done.items():
        ms = r["median_step_ms"]
        gc_ms = sum(spent.get(attn, [])) * 1e3 / steps
        print(f"{label} {mode} {attn:9s} median {ms:7.2f} ms/step; gc during its steps: "
              f"{counts.get(attn, [0, 0, 0])} collections (gen 0/1/2), {gc_ms:.3f} ms/step", flush=True)
    te, sd = done["te_cudnn"]["median_step_ms"], done["sdpa"]["median_step_ms"]
    print(f"{label} {mode} te_cudnn / sdpa = {te / sd:.3f}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--mode", default="compile", choices=("compile", "eager"))
    a = p.parse_args(argv)
    for collector in (True, False, True):
        run(a.steps, a.mode, collector)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
