"""Context-parallel attention benchmark: time, memory and error per rank.

Needs: torchrun and one CUDA GPU with cuDNN per rank (``--alone CP``: no torchrun, one GPU).

    torchrun --nproc-per-node 2 examples/context_parallel.py --seqlens 32768 65536 131072

Each rank holds its dual-chunk share of one causal bf16 sequence (b=1, h=32, hg=8, d=128 by
default) and runs ``te_cudnn.parallel.context_parallel_attention`` forward+backward for each
``--comm`` type; rank 0 also runs the whole sequence on its own GPU (``--single``, where it
fits). Prints per rank the median fwd+bwd time (CUDA events, after warm-up), the peak memory,
and the output's error against the single-GPU run; ``--fit`` estimates the longest sequence that
fits from the measured peak memory per token. ``--json FILE`` writes everything (rank 0); nothing
is written without it. ``--alone CP`` needs no torchrun: one GPU runs one rank of a CP-way ring
(its compute, memory and exchanges as device copies, no communication) beside the whole
sequence, to size a run. Without what it needs, it says so in one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

EXIT_MISSING = 2  # what the example needs (torchrun, a GPU) is not there
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what init_process_group reads


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Needs torchrun and a CUDA GPU per rank "
                                "(--alone CP: one GPU, no torchrun); --help needs neither.")  # fmt: skip
    p.add_argument("--seqlens", type=int, nargs="+", default=[32768, 65536, 131072], help="global sequence lengths S")
    p.add_argument("--comm", nargs="+", default=["p2p", "a2a"], choices=["p2p", "a2a", "all_gather", "a2a+p2p"],
                   help="cp_comm_type(s); a2a+p2p runs on a (2, cp / 2) grid: all-to-all over rank pairs, rings across them")
    p.add_argument("--head-groups", type=int, nargs="+", default=[1], metavar="G",
                   help="a2a and p2p run once per value: h / G heads at a time (less memory)")
    p.add_argument("--window", type=int, metavar="LEFT", help="causal sliding window of LEFT keys (window_size=(LEFT, 0)), "
                   "for every run including the single-GPU one")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=5, help="timed iterations (after 2 warm-up ones)")
    p.add_argument("--no-single", dest="single", action="store_false", help="skip the single-GPU comparison")
    p.add_argument("--fit", action="store_true", help="estimate the longest causal S that fits (from peak memory)")
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--alone", type=int, metavar="CP", help="no torchrun: one GPU runs one rank of a CP-way p2p ring "
                   "(te_cudnn.parallel.ring_rank_alone: its compute and memory, no communication) beside the "
                   "whole sequence")
    args = p.parse_args(argv)
    if args.alone is not None and args.alone < 2:
        p.error(f"--alone {args.alone}: a ring has at least 2 ranks")
    return args


def _missing(args) -> str | None:
    """What this run needs and does not have, in one line (None: all there)."""
    if args.alone is None:
        absent = [v for v in TORCHRUN_VARS if v not in os.environ]
        if absent:
            return (f"context_parallel.py needs torchrun ({', '.join(absent)} not set): run "
                    "`torchrun --nproc-per-node 2 examples/context_parallel.py`, or `--alone 2` on one GPU")
    import torch

    if not torch.cuda.is_available():
        how = f"--alone {args.alone} runs on one" if args.alone is not None else "each torchrun rank needs one"
        return f"context_parallel.py needs a CUDA GPU with cuDNN ({how}); torch.cuda.is_available() is False here"
    if args.alone is None and int(os.environ.get("LOCAL_RANK", 0)) >= torch.cuda.device_count():
        return (f"context_parallel.py needs one CUDA GPU per rank on a node: LOCAL_RANK={os.environ['LOCAL_RANK']} "
                f"but {torch.cuda.device_count()} GPU(s) here")
    return None


def _time(fn, iters: int) -> float:
    """Median ms of ``iters`` calls, each timed alone with CUDA events, after 2 warm-up calls."""
    from te_cudnn.timing import median_ms

    return median_ms(fn, rounds=iters, warmup=2)


def _peak(fn, inputs) -> int:
    """Bytes one fwd+bwd needs: its inputs (q, k, v, d_out) plus the most it allocates on top
    (cuDNN's workspace included: te_cudnn's cached workspaces are released first)."""
    import torch

    import te_cudnn

    torch.cuda.synchronize()
    te_cudnn.release_workspaces()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before + sum(x.numel() * x.element_size() for x in inputs)


def _inputs(args, s: int, device):
    import torch

    g = torch.Generator(device="cpu").manual_seed(s)
    mk = lambda n, d: torch.randn(args.batch, s, n, d, generator=g).to(device, torch.bfloat16)  # noqa: E731
    return mk(args.heads, args.dim), mk(args.kv_heads, args.dim), mk(args.kv_heads, args.dim), mk(args.heads, args.dim)


def _fwd_bwd(attn, q, k, v, d_out):
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = attn(*leaves)
    out.backward(d_out)
    return out.detach()


def alone(args) -> int:
    """One rank's share of a CP-way ring on this GPU beside the whole sequence on it."""
    import torch

    import te_cudnn
    from te_cudnn.parallel import ring_rank_alone, shard

    cp, rows, per_token = args.alone, [], {}
    window = {} if args.window is None else dict(window_size=(args.window, 0))
    single = lambda q, k, v: te_cudnn.fused_attention(q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal",  # noqa: E731
                                                      **window)
    rank = lambda q, k, v: ring_rank_alone(q, k, v, cp, 0, qkv_format="bshd", attn_mask_type="causal", **window)  # noqa: E731
    for s in args.seqlens:
        full = _inputs(args, s, torch.device("cuda"))
        local = [shard(x, cp, 0, "bshd") for x in full]
        for mode, fn, xs in (("single", single, full), (f"rank of {cp}", rank, local)):
            ms = _time(lambda: _fwd_bwd(fn, *xs[:3], xs[3]), args.iters)
            peak = _peak(lambda: _fwd_bwd(fn, *xs[:3], xs[3]), xs)
            rows.append(dict(S=s, mode=mode, rank=0, ms=ms, peak_gib=peak / 2**30))
            per_token.setdefault(mode, []).append((s, peak))
        del full, local
        torch.cuda.empty_cache()
    _report(args, rows, per_token, cp)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = _missing(args)
    if missing:
        print(missing, file=sys.stderr)
        return EXIT_MISSING
    if args.alone:
        return alone(args)
    import torch
    import torch.distributed as dist

    import te_cudnn
    from te_cudnn.parallel import context_parallel_attention, shard, unshard

    dist.init_process_group("nccl")
    rank, cp = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda")
    window = {} if args.window is None else dict(window_size=(args.window, 0))
    single = lambda q, k, v: te_cudnn.fused_attention(q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal",  # noqa: E731
                                                      **window)
    groups = {comm: _groups(comm, rank, cp) for comm in args.comm}
    rows, per_token = [], {}
    for s in args.seqlens:
        q, k, v, d_out = _inputs(args, s, device)
        local = [shard(x, cp, rank, "bshd") for x in (q, k, v, d_out)]
        ref = None
        if args.single and rank == 0:
            try:
                ms, peak = _time(lambda: _fwd_bwd(single, q, k, v, d_out), args.iters), _peak(lambda: _fwd_bwd(single, q, k, v, d_out), (q, k, v, d_out))
                ref = _fwd_bwd(single, q, k, v, d_out)
                rows.append(dict(S=s, mode="single", rank=0, ms=ms, peak_gib=peak / 2**30))
                per_token.setdefault("single", []).append((s, peak))
            except torch.OutOfMemoryError:
                rows.append(dict(S=s, mode="single", rank=0, ms=None, peak_gib=None, note="out of memory"))
            torch.cuda.empty_cache()
        for comm, mode, extra in _modes(args):
            attn = lambda q_, k_, v_: context_parallel_attention(q_, k_, v_, groups[comm], comm, **window, **extra)  # noqa: E731
            ms = _time(lambda: _fwd_bwd(attn, *local[:3], local[3]), args.iters)
            peak = _peak(lambda: _fwd_bwd(attn, *local[:3], local[3]), local)
            out = _fwd_bwd(attn, *local[:3], local[3])
            parts = [torch.empty_like(out) for _ in range(cp)]
            dist.all_gather(parts, out)
            err = None
            if ref is not None:
                full = unshard(parts, "bshd")
                err = float((full.double() - ref.double()).norm() / ref.double().norm())
            stats = [None] * cp
            dist.all_gather_object(stats, dict(ms=ms, peak=peak))
            for r, st in enumerate(stats):
                rows.append(dict(S=s, mode=mode, rank=r, ms=st["ms"], peak_gib=st["peak"] / 2**30,
                                 rel_err_vs_single=err if r == 0 else None))  # fmt: skip
            per_token.setdefault(mode, []).append((s, max(st["peak"] for st in stats)))
        del q, k, v, d_out, local, ref
        torch.cuda.empty_cache()
    if rank == 0:
        _report(args, rows, per_token, cp)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _modes(args):
    """(cp_comm_type, label, extra options) of every run: a2a and p2p once per ``--head-groups`` value."""
    for comm in args.comm:
        for g in (args.head_groups if comm in ("a2a", "p2p") else [1]):
            yield comm, comm if g == 1 else f"{comm}/{g}", {} if g == 1 else dict(head_groups=g)


def _groups(comm: str, rank: int, cp: int):
    """The ``cp_group`` of ``comm``: the world, or for a2a+p2p this rank's [a2a_group, p2p_group]
    on a (2, cp / 2) grid (TransformerEngine's rank order: a2a pairs {0, 1}, {2, 3}, ...)."""
    import torch.distributed as dist

    from te_cudnn.parallel.hierarchical import grid_groups

    if comm != "a2a+p2p":
        return dist.group.WORLD
    if cp % 2:
        raise SystemExit(f"--comm a2a+p2p needs an even number of ranks (a (2, cp / 2) grid), got {cp}")
    blocks, rings = grid_groups(2, cp // 2)
    made = [dist.new_group(ranks) for ranks in blocks] + [dist.new_group(ranks) for _, ranks in rings]
    return [made[rank // 2], made[len(blocks) + rank % 2]]


def _report(args, rows, per_token, cp) -> None:
    import torch

    single = {r["S"]: r["ms"] for r in rows if r["mode"] == "single" and r["ms"]}
    print(f"{torch.cuda.get_device_name()} x{cp}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print(f"{'S':>7} {'mode':>10} {'rank':>4} {'fwd+bwd ms':>11} {'peak GiB':>9} {'speed-up':>8} {'err vs 1 GPU':>12}")
    for r in rows:
        ms = "-" if r["ms"] is None else f"{r['ms']:.2f}"
        up = f"{single[r['S']] / r['ms']:.2f}x" if r["mode"] != "single" and r["S"] in single and r["ms"] else ""
        err = "" if r.get("rel_err_vs_single") is None else f"{r['rel_err_vs_single']:.2e}"
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        print(f"{r['S']:>7} {r['mode']:>10} {r['rank']:>4} {ms:>11} {peak:>9} {up:>8} {err:>12}")
    fits = {}
    if args.fit:
        total = torch.cuda.get_device_properties(0).total_memory
        for mode, points in per_token.items():
            if len(points) >= 2:
                (s0, p0), (s1, p1) = points[0], points[-1]
                slope = (p1 - p0) / (s1 - s0)
                fits[mode] = int((total - (p0 - slope * s0)) / slope)
                print(f"longest causal S that fits ({mode}, from peak memory {slope / 1024:.1f} KiB/token): ~{fits[mode]:,}")
        if "single" in fits:
            for mode in fits:
                if mode != "single":
                    print(f"  {mode}: {fits[mode] / fits['single']:.2f}x the single-GPU length")
    if args.json:
        with open(args.json, "w") as f:
            run = {k: v for k, v in vars(args).items() if k != "json"}
            json.dump(dict(gpu=torch.cuda.get_device_name(), cp=cp, torch=torch.__version__,
                           cudnn=torch.backends.cudnn.version(), rows=rows, fits=fits, args=run), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
