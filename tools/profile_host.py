"""Host-side profile of a run (cProfile), filtered to te_cudnn and torch's op-dispatch layers.

    python tools/profile_host.py PROFILE.out [--match te_cudnn,_library,_ops.py] [--min-calls 100]

Prints, for functions whose file matches, calls, total and per-call own time and cumulative
time (µs), sorted by cumulative time: where a cached call's host time goes.
"""

from __future__ import annotations

import argparse
import pstats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile")
    p.add_argument("--match", default="te_cudnn,_library,torch/_ops.py")
    p.add_argument("--min-calls", type=int, default=100)
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args(argv)
    rows = profile_rows(pstats.Stats(a.profile), a.min_calls, a.match.split(","))
    print(f"{'function':90s} {'calls':>8s} {'own us/call':>12s} {'cum us/call':>12s}")
    for name, nc, tt, ct in rows[: a.top]:
        print(f"{name[-90:]:90s} {nc:8d} {tt / nc * 1e6:12.2f} {ct / nc * 1e6:12.2f}")
    return 0


def profile_rows(stats: pstats.Stats, min_calls: int, match: tuple = ("",)) -> list:
    """``(function, calls, own seconds, cumulative seconds)`` of the functions called at least
    ``min_calls`` times whose file contains one of ``match``, by cumulative time."""
    rows = [(f"{file.split('site-packages/')[-1]}:{line}:{fn}", nc, tt, ct)
            for (file, line, fn), (_cc, nc, tt, ct, _callers) in stats.stats.items()
            if nc >= min_calls and any(k in file for k in match)]  # fmt: skip
    return sorted(rows, key=lambda r: -r[3])


if __name__ == "__main__":
    raise SystemExit(main())
