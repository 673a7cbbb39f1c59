"""All-gather context parallelism (``cp_comm_type="all_gather"``) on the CPU.

cuDNN needs a GPU, so the two fused kernels ``te_cudnn.parallel.all_gather`` calls are replaced
by the fp64 stand-ins of ``tests/_cp_standin.py`` (masks, windows, bottom-right alignment,
sinks, GQA; the backward works from the *given* O and log-sum-exp). What is
checked is te_cudnn's orchestration: the key slice and shifted window of every chunk, the
gather into natural order, the reduce-scatter of dK/dV, the sink gradient summed over chunks
and ranks, against the fp64 reference on the full sequence for cp = 1..4 and 8. The real
kernels run in ``tests/test_cp_gpu.py`` and ``tests/cp_two_gpu.py``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import te_cudnn.parallel.all_gather as ag_mod
from _cp_cpu import bf16 as _bf16
from _cp_cpu import close as _close
from _cp_cpu import HEADS as CP_HEADS
from _cp_cpu import declines_before, dense_case, sink_checked_before, gather_results, math_kernels, simulate, spawn_gloo  # noqa: F401
from _cp_cpu import reference as _reference
from _cp_standin import CALLS, install_in_process
from te_cudnn.parallel import cp_decline_reasons, shard
from te_cudnn.parallel.all_gather import AgSpec, key_range, plan_tiles
from te_cudnn.parallel.api import _options


def _case(cp, fmt, heads, s_chunk=3, b=2, seed=0):
    return dense_case(cp, fmt, heads, s_chunk, b, seed)


def _run(cp, fmt, q, k, v, d_out, **options):
    return simulate("all_gather", cp, fmt, q, k, v, d_out, **options)


HEADS = {**CP_HEADS, "mqa": (4, 1, 8, 16)}
WINDOWS = {"causal": [None, (2, 0), (0, 0)], "no_mask": [None, (3, 1), (-1, 2), (4, -1), (0, 0)]}
_CASES = [(cp, fmt, mask, w, heads) for cp, fmt, mask, heads in itertools.product(
    (1, 2, 3, 4), ("bshd", "sbhd"), ("causal", "no_mask"), HEADS) for w in WINDOWS[mask]]  # fmt: skip


@pytest.mark.parametrize("cp,fmt,mask,window,heads", _CASES, ids=[f"cp{c}-{f}-{m}-{w}-{h}" for c, f, m, w, h in _CASES])
def test_all_gather_matches_full_attention(math_kernels, cp, fmt, mask, window, heads):
    q, k, v, d_out = _case(cp, fmt, HEADS[heads], seed=cp * 100 + len(heads))
    got = _run(cp, fmt, q, k, v, d_out, attn_mask_type=mask, window_size=window)
    full_window = (-1, 0 if mask == "causal" else -1) if window is None else window
    ref, _ = _reference(q, k, v, d_out, mask, fmt, full_window)
    _close(got, ref, f"cp={cp} {fmt} {mask} window={window}")


@pytest.mark.parametrize("fmt,mask,window", [("bshd", "causal", None), ("sbhd", "no_mask", (5, 2)),
                                             ("bshd", "causal", (7, 0))])  # fmt: skip
def test_all_gather_cp8(math_kernels, fmt, mask, window):
    q, k, v, d_out = _case(8, fmt, HEADS["gqa"], s_chunk=2, b=1, seed=8)
    got = _run(8, fmt, q, k, v, d_out, attn_mask_type=mask, window_size=window)
    ref, _ = _reference(q, k, v, d_out, mask, fmt, (-1, 0) if window is None else window)
    _close(got, ref, f"cp=8 {fmt} {mask} {window}")


@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
@pytest.mark.parametrize("cp,mask,window", [(1, "causal", None), (2, "causal", (3, 0)), (3, "no_mask", None),
                                            (4, "no_mask", (2, 2))])  # fmt: skip
def test_all_gather_sinks(math_kernels, softmax_type, cp, mask, window):
    """The sink enters each row once (one call per chunk); the learnable sink's gradient is the
    sum over both chunks of every rank."""
    q, k, v, d_out = _case(cp, "bshd", HEADS["gqa"], seed=40 + cp)
    offset = None
    if softmax_type == "learnable":
        offset = torch.randn(1, 4, 1, 1, generator=torch.Generator().manual_seed(cp)).requires_grad_()
    got = _run(cp, "bshd", q, k, v, d_out, attn_mask_type=mask, window_size=window, softmax_type=softmax_type,
               softmax_offset=offset)  # fmt: skip
    full_window = (-1, 0 if mask == "causal" else -1) if window is None else window
    ref, d_offset = _reference(q, k, v, d_out, mask, "bshd", full_window, softmax_type, offset)
    _close(got, ref, f"{softmax_type} cp={cp}")
    if offset is not None:
        torch.testing.assert_close(offset.grad.double(), d_offset, atol=2e-2, rtol=2e-2)


def test_all_gather_cross_attention_no_mask(math_kernels):
    """no_mask with fewer queries than keys per rank: one call per rank over all gathered keys."""
    cp, fmt = 3, "sbhd"
    q, _, _, d_out = _case(cp, fmt, HEADS["gqa"], s_chunk=2, seed=5)
    _, k, v, _ = _case(cp, fmt, HEADS["gqa"], s_chunk=4, seed=6)
    got = _run(cp, fmt, q, k, v, d_out, attn_mask_type="no_mask")
    ref, _ = _reference(q, k, v, d_out, "no_mask", fmt, (-1, -1))
    _close(got, ref, "cross")
    assert CALLS == [(4, 24, "no_mask", (-1, -1))] * cp


def test_each_chunk_computes_only_the_keys_it_reaches(math_kernels):
    """cp=4, chunks of 4 tokens: causal chunk j attends keys [0, 4(j+1)); with window (5, 0) at
    most 4 + 5 keys; no_mask without a window is one call per rank over all 32 keys."""
    q, k, v, d_out = _case(4, "bshd", HEADS["mha"], s_chunk=4, seed=1)
    _run(4, "bshd", q, k, v, d_out, attn_mask_type="causal")
    assert sorted(c[1] for c in CALLS) == [4 * (j + 1) for j in range(8)]
    assert all(c[0] == 4 and c[2] == "causal_bottom_right" for c in CALLS)
    CALLS.clear()
    _run(4, "bshd", q, k, v, d_out, attn_mask_type="causal", window_size=(5, 0))
    assert sorted(c[1] for c in CALLS) == [4, 8] + [9] * 6 and all(c[3][1] == 0 for c in CALLS)
    CALLS.clear()
    _run(4, "bshd", q, k, v, d_out, attn_mask_type="no_mask")
    assert CALLS == [(8, 32, "no_mask", (-1, -1))] * 4


def test_key_range_shifts_the_window_to_the_slice():
    # chunk 2 of 4-token chunks (queries 8..11), 24 keys
    assert key_range(2, 4, 24, (-1, 0)) == (0, 12, (-1, 0))  # causal: the prefix, bottom-right
    assert key_range(2, 4, 24, (3, 0)) == (5, 12, (3, 0))
    assert key_range(2, 4, 24, (3, 2)) == (5, 14, (5, 0))  # window left shifted by the right overhang
    assert key_range(5, 4, 24, (3, 2)) == (17, 24, (3, 2))  # clipped at the end: the right bound stays in the window
    assert key_range(0, 4, 24, (9, -1)) == (0, 24, (29, -1))
    spec = AgSpec(2, "bshd", True, (-1, 0))
    assert [(t.q_start, t.kv_start, t.kv_len) for t in plan_tiles(spec, 0, 8, 8)] == [(0, 0, 4), (4, 0, 16)]
    assert len(plan_tiles(AgSpec(2, "bshd", False, (-1, -1)), 1, 8, 8)) == 1


@pytest.mark.parametrize("kwargs,q_shape,k_len,match", [
    (dict(attn_bias_type="post_scale_bias"), (2, 8, 4, 16), 8, "attn_bias_type='post_scale_bias'"),
    (dict(dropout=0.1), (2, 8, 4, 16), 8, "dropout=0.1 with a causal mask"),
    (dict(attn_mask_type="no_mask", window_size=(2, 2), dropout=0.1), (2, 8, 4, 16), 8, "cuDNN takes no dropout"),
    (dict(attn_mask_type="no_mask", window_size=(2, 2)), (2, 8, 4, 16), 16, "as many queries as keys"),
    (dict(window_size=(2, 3)), (2, 8, 4, 16), 8, "right=3"),
    (dict(), (2, 2, 4, 16), 2, "one token per chunk"),
    (dict(attn_mask_type="causal_bottom_right"), (2, 8, 4, 16), 8, "bottom-right"),
    (dict(), (2, 7, 4, 16), 7, "two equal chunks"),
])  # fmt: skip
def test_declines_with_reasons_before_communication(monkeypatch, kwargs, q_shape, k_len, match):
    declines_before(monkeypatch, "all_gather_simulated", "all_gather", kwargs, q_shape, k_len, match)


def test_declines_thd_and_fp8_naming_the_alternative():
    q = _bf16(16, 4, 16)
    opts = _options("all_gather", "thd", "padding_causal", None, 0.0, False, None, None, None, "vanilla", None, True)
    why = " ".join(cp_decline_reasons(opts, 2, q, q, q))
    assert "qkv_format='thd'" in why and "'p2p'" in why and "'a2a'" in why
    opts = _options("all_gather", "bshd", "causal", None, 0.0, False, None, None, None, "vanilla", object(), True)
    dense = _bf16(2, 8, 4, 16)
    assert any("FP8" in r and "'a2a'" in r for r in cp_decline_reasons(opts, 2, dense, dense, dense))


def test_decline_reasons_empty_when_supported():
    q = _bf16(2, 8, 4, 16)
    for mask, window, dropout, sink in (("causal", None, 0.0, "vanilla"), ("causal", (4, 0), 0.0, "learnable"),
                                        ("no_mask", (2, 2), 0.0, "off_by_one"),
                                        ("no_mask", None, 0.1, "vanilla")):  # fmt: skip
        opts = _options("all_gather", "bshd", mask, None, dropout, False, window, None, None, sink, None, True)
        assert cp_decline_reasons(opts, 2, q, q, q) == [], (mask, window, dropout, sink)


def test_sink_arguments_checked_before_communication(monkeypatch):
    sink_checked_before(monkeypatch, "all_gather_simulated", "all_gather")


def test_module_accepts_all_gather_without_a_group():
    from te_cudnn import DotProductAttention

    module = DotProductAttention(4, 16, cp_comm_type="all_gather")
    assert module.cp_group is None and module.cp_comm_type == "all_gather"
    module.set_context_parallel_group(None, cp_comm_type="all_gather")
    assert module.cp_comm_type == "all_gather"


def _gloo_worker(rank: int, world: int, port: int, fmt: str, mask: str, window, report: str) -> None:
    """One rank of a CPU process group (gloo): the real collectives (all-gather, reduce-scatter,
    the sink gradient's all-reduce) of context_parallel_attention, with the stand-in kernels."""
    import os

    import torch.distributed as dist

    from te_cudnn import DotProductAttention
    from te_cudnn.parallel import context_parallel_attention

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    install_in_process(ag_mod)
    q, k, v, d_out = _case(world, fmt, HEADS["gqa"], s_chunk=3, seed=5)
    offset = torch.randn(1, 4, 1, 1, generator=torch.Generator().manual_seed(2)).requires_grad_()
    local = [shard(t, world, rank, fmt).requires_grad_() for t in (q, k, v)]
    out = context_parallel_attention(*local, dist.group.WORLD, "all_gather", qkv_format=fmt, attn_mask_type=mask,
                                     window_size=window, softmax_type="learnable", softmax_offset=offset)  # fmt: skip
    out.backward(shard(d_out, world, rank, fmt))
    module = DotProductAttention(4, (16, 8), num_gqa_groups=2, qkv_format=fmt, attn_mask_type=mask, window_size=window,
                                 cp_group=dist.group.WORLD, cp_comm_type="all_gather")  # fmt: skip
    plain = context_parallel_attention(*(x.detach() for x in local), dist.group.WORLD, "all_gather", qkv_format=fmt,
                                       attn_mask_type=mask, window_size=window)  # fmt: skip
    assert torch.equal(module(*(x.detach() for x in local)), plain.flatten(-2)), "the module runs the same attention"
    gathered = gather_results(out, local, world, fmt)
    if rank == 0:
        full_window = (-1, 0 if mask == "causal" else -1) if window is None else window
        ref, d_offset = _reference(q, k, v, d_out, mask, fmt, full_window, "learnable", offset)
        errs = [((x.double() - y).abs().max() / y.abs().max()).item() for x, y in zip(gathered, ref)]
        errs.append(((offset.grad.double() - d_offset).abs().max() / d_offset.abs().max()).item())
        with open(report, "w") as f:
            f.write(" ".join(f"{e:.6f}" for e in errs))
    dist.destroy_process_group()


@pytest.mark.parametrize("fmt,mask,window,world", [("bshd", "causal", None, 2), ("sbhd", "no_mask", (4, 1), 3),
                                                   ("bshd", "causal", (5, 0), 4)])  # fmt: skip
@pytest.mark.slow
def test_over_a_real_process_group_on_cpu(tmp_path, fmt, mask, window, world):
    """all_gather over torch.distributed (gloo on CPU processes): the collectives between real
    ranks, autograd, the learnable sink's gradient summed over the group, the module."""
    errs = spawn_gloo(_gloo_worker, tmp_path, world, fmt, mask, window)
    assert len(errs) == 5 and max(errs) < 2e-2, dict(zip(("out", "dq", "dk", "dv", "d_sink"), errs))
