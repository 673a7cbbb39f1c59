"""Why decode steps switched inside ``generate`` and decode steps in lockstep disagree.

The front-door benchmark times dynamic-cache decode steps two ways: in lockstep (two models,
each with its own cache, taking turns step by step outside ``generate``) and switched inside
``generate`` (one model whose attention implementation changes after every token). This probe
runs, on the benchmark's Llama (b and the prompt as given, 128 new tokens, greedy), designs that
separate the candidate causes of a disagreement:

* ``lockstep, two models``: the benchmark's lockstep;
* ``lockstep, one model, set_attn_implementation``: one model, its implementation switched
  before each step (untimed) by ``model.set_attn_implementation``, which walks every module;
  each contender with its own cache, outside ``generate``;
* ``lockstep, one model, config``: the same, switched by writing the one config every layer
  reads (``model.config._attn_implementation``), without the walk;
* ``generate, every step after a switch``: the benchmark's cycle inside ``generate`` (te_cudnn,
  ``"sdpa"``, te_cudnn, ``"sdpa"`` again), switched by the config;
* ``generate, half the steps after a switch``: the cycle te_cudnn, te_cudnn again, ``"sdpa"``,
  ``"sdpa"`` again, so that each implementation takes one step right after a switch and one
  after itself (does the switch cost the step after it?).

For each it prints te_cudnn's tokens/s over ``"sdpa"``'s, paired by turn (median and 95 %
interval), and the controls where the design has them, then the engine configurations of
te_cudnn's plans. ``--heuristic-decode`` keeps cuDNN's heuristic plan (split-KV, two kernels)
for the decode steps instead of te_cudnn's one-kernel plan without a workspace
(:func:`te_cudnn.plans.one_row.lean_one_row`); run it with ``TE_CUDNN_PLAN_STORE=off`` so that
no stored plan stands in.

    python tools/probe_switched_steps.py [--batch 4] [--prompt 512] [--rounds 4] [--calls 4] [--heuristic-decode]
"""

from __future__ import annotations

import argparse
import time

import torch

from te_cudnn.benchmark.front_doors import _transformers_quiet
from te_cudnn.benchmark.ratios import paired_ratio
from te_cudnn.benchmark.turns import SwitchingSteps, decode_in_lockstep, next_turn
from te_cudnn.plans.cache import plan_cache
from te_cudnn.plans.one_row import lean_one_row

from probe_decode_engines import _count  # tools/ (on sys.path when run as a script)
from probe_packed_decode import llama_models


def lockstep_one_model(model, switch: dict, ids: torch.Tensor, steps: int, rounds: int) -> dict[str, list[float]]:
    """Greedy decode steps of one model whose implementation ``switch[name]()`` selects before
    each of ``name``'s steps (untimed), each contender with its own dynamic cache, taking turns
    step by step (:func:`te_cudnn.benchmark.turns.next_turn`); one untimed round first.
    Seconds per step, paired by position."""
    seconds: dict[str, list[float]] = {name: [] for name in switch}
    for r in range(rounds + 1):
        caches, last = {}, {}
        for name, select in switch.items():
            select()
            out = model(ids, use_cache=True)
            caches[name], last[name] = out.past_key_values, out.logits[:, -1:].argmax(-1)
        turn = list(switch)
        for _ in range(steps):
            for name in turn:
                switch[name]()
                t0 = time.perf_counter()
                out = model(last[name], past_key_values=caches[name], use_cache=True)
                last[name] = out.logits[:, -1:].argmax(-1)
                bool((last[name] < 0).any())  # the token on the host: the step is done
                if r:
                    seconds[name].append(time.perf_counter() - t0)
            next_turn(turn)
    return seconds


def switched_in_generate(model, switch: dict, cycle: tuple, ids: torch.Tensor, new_tokens: int,
                         calls: int) -> dict[str, list[float]]:  # fmt: skip
    """Seconds per step (mean of a contender's steps in a turn) of ``generate`` calls whose
    steps follow ``cycle`` (:class:`te_cudnn.benchmark.turns.SwitchingSteps`); one untimed
    call first."""
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    steps = SwitchingSteps(switch, cycle)
    for call in range(calls + 1):
        model.generate(ids, streamer=steps if call else SwitchingSteps(switch, cycle), **kw)
    return steps.seconds


def _report(design: str, seconds: dict[str, list[float]], pairs: list[tuple[str, str]]) -> None:
    """tokens/s of ``a`` over ``b`` for each pair: ``b``'s seconds over ``a``'s, paired."""
    print(f"{design}:")
    for a, b in pairs:
        m, lo, hi = paired_ratio(seconds[b], seconds[a])
        print(f"  {a} / {b} tokens/s: {m:.4f} ({lo:.4f}-{hi:.4f}), {len(seconds[a])} samples")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=_count, default=4)
    p.add_argument("--prompt", type=_count, default=512)
    p.add_argument("--new-tokens", type=_count, default=128)
    p.add_argument("--rounds", type=_count, default=4, help="timed lockstep rounds")
    p.add_argument("--calls", type=_count, default=4, help="timed generate calls per switched design")
    p.add_argument("--heuristic-decode", action="store_true", help="cuDNN's heuristic plans for the decode steps")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_switched_steps: needs a CUDA device")
        return 2
    if a.heuristic_decode:
        lean_one_row(False)
    models = llama_models()
    model = models["sdpa"]
    ids = torch.randint(0, 32000, (a.batch, a.prompt), device="cuda")
    impl = {"te_cudnn": "te_cudnn", "te_cudnn, again": "te_cudnn", "sdpa": "sdpa", "sdpa, again": "sdpa"}
    walk = {name: (lambda i=impl[name]: model.set_attn_implementation(i)) for name in ("te_cudnn", "sdpa")}
    for i in walk:  # each implementation checked once by transformers; then the switch writes the config alone
        walk[i]()
    switch = {name: (lambda i=i: setattr(model.config, "_attn_implementation", i)) for name, i in impl.items()}
    with torch.no_grad(), _transformers_quiet():
        print(f"b={a.batch}, prompt {a.prompt}, {a.new_tokens} new tokens")
        seconds, _ = decode_in_lockstep(models, ids, a.new_tokens, a.rounds)
        _report("lockstep, two models", seconds, [("te_cudnn", "sdpa")])
        for design, by in (("set_attn_implementation", walk), ("config", switch)):
            seconds = lockstep_one_model(model, {n: by[n] for n in ("te_cudnn", "sdpa")}, ids, a.new_tokens, a.rounds)
            _report(f"lockstep, one model, {design}", seconds, [("te_cudnn", "sdpa")])
        seconds = switched_in_generate(model, {n: switch[n] for n in ("te_cudnn", "sdpa", "sdpa, again")},
                                       ("te_cudnn", "sdpa", "te_cudnn", "sdpa, again"), ids, a.new_tokens, a.calls)
        _report("generate, every step after a switch", seconds, [("te_cudnn", "sdpa"), ("sdpa, again", "sdpa")])
        seconds = switched_in_generate(model, switch, ("te_cudnn", "te_cudnn, again", "sdpa", "sdpa, again"), ids,
                                       a.new_tokens, a.calls)  # fmt: skip
        _report("generate, half the steps after a switch", seconds,
                [("te_cudnn", "sdpa"), ("te_cudnn, again", "sdpa, again"), ("te_cudnn, again", "te_cudnn"),
                 ("sdpa, again", "sdpa")])  # fmt: skip
        model.set_attn_implementation("sdpa")
    engines: dict[tuple[str, int], int] = {}
    for plan in plan_cache.plans():
        engines[plan.plan_name, plan.workspace_size] = engines.get((plan.plan_name, plan.workspace_size), 0) + 1
    print("te_cudnn's plans (engine configuration, workspace bytes: plans):",
          ", ".join(f"{n} {w}: {c}" for (n, w), c in sorted(engines.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
