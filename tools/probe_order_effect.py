"""Does a contender's predecessor in each timing round change its time?

The benchmark interleaves contenders in rounds. With the order rotated from round to round, every
contender follows the same neighbour in all but one position of the cycle. If the GPU's clock
after a slow neighbour (or a hot one) differs, that neighbour biases the contender's median. This
probe runs the benchmark CLI with the round order chosen by ``--order``:

* ``rotate``: the benchmark's own order as it is;
* ``shuffle``: a fresh seeded permutation in every round (predecessors spread over all contenders);
* ``reverse``: the rotation of the reversed list (every contender follows its other neighbour).

    python tools/probe_order_effect.py --order shuffle -- --cases llama_h32_s8k --contenders te_cudnn,sdpa_cudnn --out DIR
"""

from __future__ import annotations

import argparse
import random
import sys

from te_cudnn.benchmark import cli, measure, runner


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--order", choices=("rotate", "shuffle", "reverse"), required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("bench", nargs=argparse.REMAINDER, help="the benchmark's arguments, after --")
    a = p.parse_args()
    rng = random.Random(a.seed)

    def shuffled(samplers, rounds):
        out = {name: [] for name in samplers}
        names = list(samplers)
        for _ in range(rounds):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                out[name].append(samplers[name]())
        return out

    def reversed_rotation(samplers, rounds):
        return measure.interleaved(dict(reversed(list(samplers.items()))), rounds)

    if a.order == "shuffle":
        runner.interleaved = shuffled
    elif a.order == "reverse":
        runner.interleaved = reversed_rotation
    args = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    print(f"round order: {a.order} (seed {a.seed})", flush=True)
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
