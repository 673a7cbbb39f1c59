"""Does a contender's predecessor in each timing round change its time?

The benchmark interleaves contenders in rounds. With the order rotated from round to round, every
contender follows the same neighbour in all but one position of the cycle. If the GPU's clock
after a slow neighbour (or a hot one) differs, that neighbour biases the contender's median. This
probe runs the benchmark CLI with the round order chosen by ``--order``:

* ``rotate``: the order the benchmark used until 2026-11-26, rotated by one each round;
* ``reverse``: the same rotation of the reversed list (every contender follows its other neighbour);
* ``shuffle``: the benchmark's order now, a fresh seeded permutation in every round.

The benchmark's other options pass through (``--lead-ms`` among them).

    python tools/probe_order_effect.py --order rotate -- --cases llama_h32_s8k --contenders te_cudnn,sdpa_cudnn --out DIR
"""

from __future__ import annotations

import argparse
import sys

from te_cudnn.benchmark import cli, measure, runner


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--order", choices=("rotate", "shuffle", "reverse"), required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("bench", nargs=argparse.REMAINDER, help="the benchmark's arguments, after --")
    a = p.parse_args()

    def rotated(samplers, rounds, seed=0):
        out = {name: [] for name in samplers}
        names = list(samplers)
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                out[name].append(samplers[name]())
        return out

    if a.order == "rotate":
        runner.interleaved = rotated
    elif a.order == "reverse":
        runner.interleaved = lambda samplers, rounds, seed=0: rotated(dict(reversed(list(samplers.items()))), rounds)
    else:
        runner.interleaved = lambda samplers, rounds, seed=0: measure.interleaved(samplers, rounds, a.seed)
    args = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    print(f"round order: {a.order} (seed {a.seed})", flush=True)
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
