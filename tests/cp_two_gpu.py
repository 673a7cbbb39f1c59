"""Context parallelism over NCCL: ``torchrun --nproc-per-node 2 tests/cp_two_gpu.py [--json PATH]``
(or ``--nproc-per-node 4``: the same cases at cp=4, plus a2a+p2p on a 2 x 2 grid).

Every rank builds the same seeded global batch (b=2, S=4096; THD: 4 sequences of random
lengths up to 4096, one empty), runs te_cudnn on the whole sequence (the single-GPU result)
and the fp32 reference, then its own shard through ``context_parallel_attention`` (p2p, a2a
and all_gather; MHA and GQA; causal, no_mask, THD padding_causal/padding for p2p and a2a,
sliding windows for p2p and all_gather, attention sinks for p2p), gathers the shards and checks:
no NaN, padded rows zero, error against the reference at most 1.2x the single-GPU error.
Deterministic mode must repeat bit for bit. With 4 ranks, hierarchical a2a+p2p runs on a
(a2a, p2p) = (2, 2) grid (``new_group`` blocks {0, 1}, {2, 3} for the all-to-all, rings {0, 2},
{1, 3}, TransformerEngine's layout): the five cases, deterministic mode, a learnable sink with a
window, and the module. Run by ``tests/test_cp_multi_gpu.py`` on a machine with two (and four)
GPUs; prints one line per case and exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cp_cases import check, check_sinks, error_words, make_case, reference, single_gpu  # noqa: E402

from te_cudnn import DotProductAttention  # noqa: E402
from te_cudnn.parallel import context_parallel_attention, shard, unshard  # noqa: E402
from te_cudnn.parallel.hierarchical import grid_groups  # noqa: E402

CASES = [  # (fmt, mask, h, hg, d)
    ("bshd", "causal", 12, 12, 128),
    ("sbhd", "causal", 32, 4, 128),
    ("bshd", "no_mask", 32, 4, 128),
    ("thd", "padding_causal", 32, 4, 128),
    ("thd", "padding", 12, 12, 128),
]
WINDOWS = [  # sliding windows for p2p and all_gather: (fmt, mask, h, hg, d, window)
    ("bshd", "causal", 32, 4, 128, (512, 0)),
    ("sbhd", "no_mask", 12, 12, 128, (256, 256)),
]


def _gather(x: torch.Tensor, cp: int, fmt: str, pad) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(cp)]
    dist.all_gather(parts, x.contiguous())
    return unshard(parts, fmt, pad)


def run_case(case, comm: str, cp: int, rank: int, group=None, **options) -> list[torch.Tensor]:
    pad = case.cu_padded
    local = [shard(x, cp, rank, case.fmt, pad).requires_grad_() for x in (case.q, case.k, case.v)]
    out = context_parallel_attention(*local, group or dist.group.WORLD, comm, **case.options(), **options)
    out.backward(shard(case.d_out, cp, rank, case.fmt, pad))
    return [_gather(t.detach(), cp, case.fmt, pad) for t in (out, *(x.grad for x in local))]


def _check_p2p_sinks(cp: int, rank: int, seq: int) -> None:
    """p2p with an attention sink (off_by_one; learnable with a window): output, gradients and the
    learnable sink's gradient (all-reduced over the group) equal te_cudnn's single-GPU result."""
    for softmax_type, window in (("off_by_one", None), ("learnable", (512, 0))):
        case = make_case("bshd", "causal", cp, 2, seq, 32, 4, 128, 128, seed=11)
        offset = torch.randn(1, 32, 1, 1, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
        offset = offset.requires_grad_() if softmax_type == "learnable" else None
        extra = dict(softmax_type=softmax_type, softmax_offset=offset)
        if window is not None:
            extra["window_size"] = window
        got = run_case(case, "p2p", cp, rank, **extra)
        grad_cp = None if offset is None else offset.grad.clone()
        errors = check_sinks(f"p2p sink {softmax_type} window={window}", case, got, grad_cp, offset, extra)
        if rank == 0:
            print(f"PASS p2p sink {softmax_type}{'' if window is None else f' window={window}'}: "
                  + error_words(errors), flush=True)  # fmt: skip


def _check_module(cp: int, rank: int, seq: int) -> None:
    """DotProductAttention(cp_group=...) on the shards equals the module without CP on the whole sequence."""
    kwargs = dict(num_gqa_groups=4, qkv_format="bshd", attn_mask_type="causal")
    case = make_case("bshd", "causal", cp, 2, seq, 32, 4, 128, 128, seed=9)
    full = DotProductAttention(32, 128, **kwargs)(case.q, case.k, case.v)
    local = [shard(x, cp, rank, "bshd") for x in (case.q, case.k, case.v)]
    for comm in ("p2p", "a2a", "all_gather"):
        out = DotProductAttention(32, 128, cp_group=dist.group.WORLD, cp_comm_type=comm, **kwargs)(*local)
        torch.testing.assert_close(out, shard(full, cp, rank, "bshd"), atol=2e-2, rtol=2e-2)
    if rank == 0:
        print("PASS module: DotProductAttention(cp_group=...) p2p, a2a and all_gather equal the module on the "
              "whole sequence", flush=True)  # fmt: skip


def _grid(cp: int, rank: int) -> list:
    """[a2a_group, p2p_group] of this rank on an (a2a, p2p) = (2, cp / 2) grid (every rank makes every group)."""
    blocks, rings = grid_groups(2, cp // 2)
    made = [dist.new_group(ranks) for ranks in blocks] + [dist.new_group(ranks) for _, ranks in rings]
    return [made[rank // 2], made[len(blocks) + rank % 2]]


def _check_a2a_p2p(cp: int, rank: int, seq: int, results: list) -> None:
    """a2a+p2p on the (2, cp / 2) grid: the five cases against the reference (error at most 1.2x
    the single GPU's), deterministic mode, a learnable sink with a window, the module."""
    groups = _grid(cp, rank)
    for i, (fmt, mask, h, hg, d) in enumerate(CASES):
        case = make_case(fmt, mask, cp, 2 if fmt != "thd" else 4, seq, h, hg, d, d, seed=2000 + i)
        label = f"a2a+p2p {fmt} {mask} h{h}/{hg}"
        errors = check(label, run_case(case, "a2a+p2p", cp, rank, groups), single_gpu(case), reference(case), case)
        results.append(dict(comm="a2a+p2p", fmt=fmt, mask=mask, h=h, hg=hg, d=d, cp=cp, layout=[2, cp // 2],
                            errors={n: {"cp": e, "single_gpu": o} for n, (e, o) in errors.items()}))  # fmt: skip
        if rank == 0:
            print(f"PASS a2a+p2p (2x{cp // 2}) {fmt:4} {mask:14} h={h:2} hg={hg:2}: "
                  + error_words(errors), flush=True)  # fmt: skip
    case = make_case("bshd", "causal", cp, 2, seq, 32, 4, 128, 128, seed=7)
    first = run_case(case, "a2a+p2p", cp, rank, groups, deterministic=True)
    second = run_case(case, "a2a+p2p", cp, rank, groups, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second)), "a2a+p2p: deterministic mode did not repeat"
    if rank == 0:
        print("PASS a2a+p2p deterministic: two runs bit-identical", flush=True)
    offset = torch.randn(1, 32, 1, 1, device="cuda", generator=torch.Generator("cuda").manual_seed(3)).requires_grad_()
    extra = dict(softmax_type="learnable", softmax_offset=offset, window_size=(512, 0))
    sink_case = make_case("bshd", "causal", cp, 2, seq, 32, 4, 128, 128, seed=11)
    got = run_case(sink_case, "a2a+p2p", cp, rank, groups, **extra)
    errors = check_sinks("a2a+p2p sink", sink_case, got, offset.grad.clone(), offset, extra)
    if rank == 0:
        print("PASS a2a+p2p sink learnable window=(512, 0): "
              + error_words(errors), flush=True)  # fmt: skip
    kwargs = dict(num_gqa_groups=4, qkv_format="bshd", attn_mask_type="causal")
    full = DotProductAttention(32, 128, **kwargs)(case.q, case.k, case.v)
    local = [shard(x, cp, rank, "bshd") for x in (case.q, case.k, case.v)]
    out = DotProductAttention(32, 128, cp_group=groups, cp_comm_type="a2a+p2p", **kwargs)(*local)
    torch.testing.assert_close(out, shard(full, cp, rank, "bshd"), atol=2e-2, rtol=2e-2)
    if rank == 0:
        print("PASS module: DotProductAttention(cp_group=[a2a_group, p2p_group], cp_comm_type='a2a+p2p') equals "
              "the module on the whole sequence", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the errors of every case here (rank 0)")
    parser.add_argument("--seq", type=int, default=4096, help="global sequence length S (default 4096)")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank, cp = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    results = []
    runs = [(comm, i, case, None) for comm in ("p2p", "a2a") for i, case in enumerate(CASES)]
    runs += [("all_gather", i, case, None) for i, case in enumerate(CASES) if case[0] != "thd"]  # THD declines
    runs += [(comm, 100 + i, case[:5], case[5]) for comm in ("p2p", "all_gather") for i, case in enumerate(WINDOWS)]
    for comm, i, (fmt, mask, h, hg, d), window in runs:
        case = make_case(fmt, mask, cp, 2 if fmt != "thd" else 4, args.seq, h, hg, d, d, seed=1000 + i)
        extra = {} if window is None else dict(window_size=window)
        ref = reference(case, torch.float32, window or (-1, -1))
        label = f"{comm} {fmt} {mask} h{h}/{hg}" + ("" if window is None else f" window {window}")
        errors = check(label, run_case(case, comm, cp, rank, **extra), single_gpu(case, **extra), ref, case)
        results.append(dict(comm=comm, fmt=fmt, mask=mask, h=h, hg=hg, d=d, cp=cp, window=window,
                            errors={n: {"cp": e, "single_gpu": o} for n, (e, o) in errors.items()}))  # fmt: skip
        if rank == 0:
            print(f"PASS {comm:10} {fmt:4} {mask:14} h={h:2} hg={hg:2}{'' if window is None else f' window={window}'}: "
                  + error_words(errors), flush=True)  # fmt: skip
        del case, ref
    for comm in ("p2p", "a2a", "all_gather"):
        case = make_case("bshd", "causal", cp, 2, args.seq, 32, 4, 128, 128, seed=7)
        first = run_case(case, comm, cp, rank, deterministic=True)
        second = run_case(case, comm, cp, rank, deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(first, second)), f"{comm}: deterministic mode did not repeat"
        if rank == 0:
            print(f"PASS {comm} deterministic: two runs bit-identical", flush=True)
    _check_p2p_sinks(cp, rank, args.seq)
    _check_module(cp, rank, args.seq)
    if cp == 4:
        _check_a2a_p2p(cp, rank, args.seq, results)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), cases=results), f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
