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
    stats = pstats.Stats(a.profile).stats  # {(file, line, fn): (cc, nc, tt, ct, callers)}
    keys = a.match.split(",")
    rows = [(f"{file.split('site-packages/')[-1]}:{line}:{fn}", nc, tt, ct)
            for (file, line, fn), (cc, nc, tt, ct, _) in stats.items()
            if nc >= a.min_calls and any(k in file for k in keys)]  # fmt: skip
    rows.sort(key=lambda r: -r[3])
    print(f"{'function':90s} {'calls':>8s} {'own us/call':>12s} {'cum us/call':>12s}")
    for name, nc, tt, ct in rows[: a.top]:
        print(f"{name[-90:]:90s} {nc:8d} {tt / nc * 1e6:12.2f} {ct / nc * 1e6:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
