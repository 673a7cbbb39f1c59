"""The side-by-side benchmark now lives in the package: ``te-cudnn bench`` or
``python -m te_cudnn.benchmark`` (see ``--help``). This script keeps its old options working:

    python tools/bench.py [--only dense|host|varlen|fp8|max512] [--configs test_0,test_1,test_3]
                          [--full] [--iters N] [--json out.json]

``--only dense`` runs the TransformerEngine cases (``--configs``), ``host`` the host-time section
only, ``varlen`` the THD cases, ``fp8`` the FP8 cases, ``max512`` the max512 cases (te_cudnn's
two sub-backends and the hand-built graph); with none of these it runs ``--quick`` (about a
minute, as ``tools/run_gpu_suite.sh`` calls it), and ``--full`` every default case. ``--iters``
is ``--rounds``. Any other option goes to the package's command line as it is
(``--out DIR``, ``--quick``, ``--contenders ...``). ``host_medians`` (``te_cudnn.timing``'s) stays
importable from here under its old name.
"""

from __future__ import annotations

import argparse
import sys

from te_cudnn.benchmark.cli import main as bench_main
from te_cudnn.timing import host_medians  # noqa: F401  (importable from here, as before)

SECTIONS = {"dense": "te", "varlen": "thd", "fp8": "fp8", "max512": "max512"}


def translate(argv: list[str]) -> list[str]:
    """The package's arguments for this script's (old) ones."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--only", choices=("dense", "host", "varlen", "fp8", "max512"), default=None)
    p.add_argument("--configs", default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--full", action="store_true")
    old, rest = p.parse_known_args(argv)
    out: list[str] = []
    if old.only is None and not old.configs and not old.full and "--cases" not in rest and "--quick" not in rest:
        out.append("--quick")  # the GPU suite's run (tools/run_gpu_suite.sh): about a minute
    if old.only == "host":
        out += ["--cases", "none"]  # no case: the ceilings and the host section
    elif old.only == "dense":
        out += ["--cases", old.configs or "test_0,test_1,test_3"]
    elif old.only is not None:
        out += ["--cases", SECTIONS[old.only]]
        if old.only == "max512":
            out += ["--contenders", "te_cudnn,te_cudnn_max512,hand_built"]
    elif old.configs:
        out += ["--cases", old.configs]
    if old.iters is not None:
        out += ["--rounds", str(old.iters)]
    if old.json:
        out += ["--json", old.json]
    return out + rest


def main(argv: list[str] | None = None) -> int:
    return bench_main(translate(sys.argv[1:] if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())
