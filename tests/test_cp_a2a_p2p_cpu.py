"""Hierarchical ("a2a+p2p") context parallelism on the CPU, and the FP8 declines of the rings.

The ring's fused kernels are the fp64 stand-ins of ``tests/_cp_standin.py``. Checked: that the
a2a level hands each ring exactly the dual-chunk share of a ``P``-way split (dense and THD);
forward and every gradient against the fp64 reference on the full sequence for grids
(a2a, p2p) = 2x2, 2x1, 1x2, 2x4 (causal/no_mask, MHA/GQA, bshd/sbhd), with the windows and
sinks the ring serves (learnable sink's gradient summed over the grid); declines with reasons
before any exchange; a slow test over gloo process groups (``new_group`` for both levels). The
real kernels run in ``tests/test_cp_gpu.py`` and ``tests/cp_two_gpu.py`` (4 ranks).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import te_cudnn.parallel.ring as ring_mod
from _cp_cpu import bf16 as _bf16
from _cp_cpu import close as _close
from _cp_cpu import HEADS, dense_case, gather_results, math_kernels, simulate, spawn_gloo  # noqa: F401
from _cp_cpu import reference as _reference
from _cp_standin import install_in_process
from te_cudnn import UnsupportedConfigError
from te_cudnn.parallel import cp_decline_reasons, pad_cu_seqlens, shard, simulate_context_parallel
from te_cudnn.parallel.api import _options
from te_cudnn.parallel.hierarchical import grid_groups
from te_cudnn.parallel.ulysses import heads_to_sequence, simulated_exchange


def _case(cp, fmt, heads, c=3, b=2, seed=0):
    return dense_case(cp, fmt, HEADS[heads], c, b, seed)


def _run(layout, fmt, q, k, v, d_out, **options):
    return simulate("a2a+p2p", layout[0] * layout[1], fmt, q, k, v, d_out, cp_layout=layout, **options)


@pytest.mark.parametrize("a2a,p2p,fmt", [(2, 2, "bshd"), (2, 2, "sbhd"), (1, 3, "bshd"), (2, 3, "sbhd")])
def test_a2a_level_hands_the_ring_its_dual_chunk_share(a2a, p2p, fmt):
    """After the all-to-all inside a2a group p, every rank holds super-chunks p and 2P-1-p (the
    P-way dual-chunk share) of its h / A heads: what the ring over the p2p group expects."""
    cp, h = a2a * p2p, 4
    x = torch.arange(2 * 2 * cp * 2 * h, dtype=torch.float32).view(2, 2 * cp * 2, h, 1)
    x = x if fmt == "bshd" else x.transpose(0, 1).contiguous()
    blocks, rings = grid_groups(a2a, p2p)
    got = [None] * cp
    for idx in blocks:
        sends = [shard(x, cp, g, fmt) for g in idx]
        for g, y in zip(idx, heads_to_sequence(sends, a2a, fmt, None, simulated_exchange)):
            got[g] = y
    for a, idx in rings:
        heads = x.narrow(2, a * h // a2a, h // a2a)
        for p, g in enumerate(idx):
            assert torch.equal(got[g], shard(heads, p2p, p, fmt)), (a, p)


@pytest.mark.parametrize("a2a,p2p", [(2, 2), (2, 3), (1, 2)])
def test_a2a_level_composes_with_thd(a2a, p2p):
    """THD: with the group's padded offsets cu_seqlens_padded // P the a2a level gives the
    ring's THD share of a P-way split (every sequence padded to a multiple of 2 A P)."""
    cp, h = a2a * p2p, 4
    cu = torch.tensor([0, 5, 5, 17, 30], dtype=torch.int32)
    padded = pad_cu_seqlens(cu, cp)
    x = torch.randn(int(padded[-1]), h, 3)
    blocks, rings = grid_groups(a2a, p2p)
    got = [None] * cp
    for idx in blocks:
        sends = [shard(x, cp, g, "thd", padded) for g in idx]
        for g, y in zip(idx, heads_to_sequence(sends, a2a, "thd", padded // p2p, simulated_exchange)):
            got[g] = y
    for a, idx in rings:
        heads = x.narrow(1, a * h // a2a, h // a2a)
        for p, g in enumerate(idx):
            assert torch.equal(got[g], shard(heads, p2p, p, "thd", padded)), (a, p)


_CASES = [(layout, fmt, mask, heads) for layout, fmt, mask, heads in itertools.product(
    ((2, 2), (2, 1), (1, 2), (2, 4)), ("bshd", "sbhd"), ("causal", "no_mask"), HEADS)]  # fmt: skip


@pytest.mark.parametrize("layout,fmt,mask,heads", _CASES, ids=[f"{a}x{p}-{f}-{m}-{h}" for (a, p), f, m, h in _CASES])
def test_a2a_p2p_matches_full_attention(math_kernels, layout, fmt, mask, heads):
    q, k, v, d_out = _case(layout[0] * layout[1], fmt, heads, seed=10 * layout[0] + layout[1])
    got = _run(layout, fmt, q, k, v, d_out, attn_mask_type=mask)
    ref, _ = _reference(q, k, v, d_out, mask, fmt, (-1, 0 if mask == "causal" else -1))
    _close(got, ref, f"a2a+p2p {layout} {fmt} {mask} {heads}")


@pytest.mark.parametrize("layout,fmt,mask,window", [((2, 2), "bshd", "causal", (5, 0)),
                                                    ((2, 2), "sbhd", "no_mask", (4, 3)),
                                                    ((2, 3), "bshd", "causal", (8, 0))])  # fmt: skip
def test_a2a_p2p_windows(math_kernels, layout, fmt, mask, window):
    """The ring's sliding windows, over a ring of P ranks on chunks A times longer."""
    q, k, v, d_out = _case(layout[0] * layout[1], fmt, "gqa", seed=7)
    got = _run(layout, fmt, q, k, v, d_out, attn_mask_type=mask, window_size=window)
    ref, _ = _reference(q, k, v, d_out, mask, fmt, (window[0], 0 if mask == "causal" else window[1]))
    _close(got, ref, f"a2a+p2p {layout} window {window}")


@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
@pytest.mark.parametrize("layout,mask,window", [((2, 2), "causal", None), ((2, 1), "no_mask", None),
                                                ((2, 2), "causal", (5, 0))])  # fmt: skip
def test_a2a_p2p_sinks(math_kernels, softmax_type, layout, mask, window):
    """Each ring folds in its heads' sink logits; the learnable sink's gradient, summed over
    the grid, is the full one."""
    q, k, v, d_out = _case(layout[0] * layout[1], "bshd", "gqa", seed=3)
    offset = None
    if softmax_type == "learnable":
        offset = torch.randn(1, 4, 1, 1, generator=torch.Generator().manual_seed(1)).requires_grad_()
    got = _run(layout, "bshd", q, k, v, d_out, attn_mask_type=mask, window_size=window, softmax_type=softmax_type,
               softmax_offset=offset)  # fmt: skip
    full = (-1, 0 if mask == "causal" else -1) if window is None else window
    ref, d_offset = _reference(q, k, v, d_out, mask, "bshd", full, softmax_type, offset)
    _close(got, ref, f"a2a+p2p {softmax_type} {layout}")
    if offset is not None:
        torch.testing.assert_close(offset.grad.double(), d_offset, atol=2e-2, rtol=2e-2)


@pytest.fixture
def no_exchange(monkeypatch):
    def refuse(*args):
        raise AssertionError("a declined call communicated")

    for name in ("simulated_exchange", "run_simulated", "all_gather_simulated"):
        monkeypatch.setattr(f"te_cudnn.parallel.api.{name}", refuse)


@pytest.mark.parametrize("kwargs,h,hg,match", [
    (dict(), 3, 3, "h=3 and hg=3 must be divisible by its size 2"),
    (dict(), 4, 1, "hg=1 must be divisible"),
    (dict(attn_bias_type="post_scale_bias"), 4, 4, "attn_bias_type='post_scale_bias'"),
    (dict(fp8_meta=object()), 4, 4, "FP8"),
    (dict(window_size=(4, 0), dropout=0.1), 4, 4, "no dropout with a sliding window"),
    (dict(softmax_type="off_by_one", dropout=0.1), 4, 4, "attention sinks"),
    (dict(attn_mask_type="causal_bottom_right"), 4, 4, "bottom-right"),
    (dict(softmax_type="learnable"), 4, 4, "softmax_offset"),
])  # fmt: skip
def test_declines_with_reasons_before_communication(no_exchange, kwargs, h, hg, match):
    q, k = _bf16(2, 8, h, 16), _bf16(2, 8, hg, 16)
    with pytest.raises((UnsupportedConfigError, ValueError), match=match) as info:
        simulate_context_parallel([q] * 4, [k] * 4, [k] * 4, "a2a+p2p", cp_layout=(2, 2), **kwargs)
    if info.type is UnsupportedConfigError:
        assert "cp_comm_type='a2a+p2p'" in str(info.value) and "(a2a, p2p) = (2, 2)" in str(info.value)


def test_thd_windows_and_sinks_decline_as_on_the_ring(no_exchange):
    q = _bf16(16, 4, 16)
    cu = torch.tensor([0, 16], dtype=torch.int32)
    for extra, match in ((dict(window_size=(3, 0)), "sliding windows"), (dict(softmax_type="off_by_one"), "sinks")):
        with pytest.raises(UnsupportedConfigError, match=match) as info:
            simulate_context_parallel([q] * 4, [q] * 4, [q] * 4, "a2a+p2p", cp_layout=(2, 2), qkv_format="thd",
                                      cu_seqlens_q=cu, cu_seqlens_q_padded=cu, **extra)  # fmt: skip
        assert "inherits its limits" in str(info.value)


def test_layout_arguments():
    q = _bf16(2, 8, 4, 16)
    with pytest.raises(ValueError, match="cp_layout must be"):
        simulate_context_parallel([q] * 4, [q] * 4, [q] * 4, "a2a+p2p")
    with pytest.raises(ValueError, match=r"makes 6 ranks, but 4"):
        simulate_context_parallel([q] * 4, [q] * 4, [q] * 4, "a2a+p2p", cp_layout=(2, 3))
    with pytest.raises(ValueError, match="cp_layout is for cp_comm_type='a2a\\+p2p' only"):
        simulate_context_parallel([q] * 4, [q] * 4, [q] * 4, "p2p", cp_layout=(2, 2))


def test_decline_reasons_empty_when_supported():
    q = _bf16(2, 8, 4, 16)
    for mask, window, sink in (("causal", None, "vanilla"), ("causal", (4, 0), "learnable"),
                               ("no_mask", (2, 2), "off_by_one")):  # fmt: skip
        opts = _options("a2a+p2p", "bshd", mask, None, 0.0, False, window, None, None, sink, None, True)
        assert cp_decline_reasons(opts, 4, q, q, q, (2, 2)) == [], (mask, window, sink)


@pytest.mark.parametrize("comm", ["p2p", "a2a+p2p"])
def test_fp8_on_a_ring_declines_naming_a2a(no_exchange, comm):
    """FP8 under the ring needs per-step scales and amaxes (TransformerEngine's per-step
    quantizers); te_cudnn declines before any exchange and points to a2a."""
    q = _bf16(2, 8, 4, 16)
    layout = dict(cp_layout=(2, 1)) if comm == "a2a+p2p" else {}
    with pytest.raises(UnsupportedConfigError, match="per-step") as info:
        simulate_context_parallel([q, q], [q, q], [q, q], comm, fp8_meta=object(), **layout)
    assert "cp_comm_type='a2a'" in str(info.value)


def test_module_takes_two_groups_for_a2a_p2p():
    from te_cudnn import DotProductAttention

    module = DotProductAttention(4, 16, cp_comm_type="a2a+p2p")
    assert module.cp_group is None and module.cp_comm_type == "a2a+p2p"
    with pytest.raises(RuntimeError, match="process group"):
        module.set_context_parallel_group([object(), object()], cp_comm_type="a2a+p2p")


def test_context_parallel_attention_wants_two_groups():
    from te_cudnn.parallel import context_parallel_attention

    q = _bf16(2, 8, 4, 16)
    with pytest.raises(ValueError, match=r"cp_group=\[a2a_group, p2p_group\]"):
        context_parallel_attention(q, q, q, object(), "a2a+p2p")
    with pytest.raises(ValueError, match="only cp_comm_type='a2a\\+p2p' takes groups as a list"):
        context_parallel_attention(q, q, q, [object(), object()], "p2p")


def _gloo_worker(rank: int, world: int, port: int, a2a: int, fmt: str, mask: str, report: str) -> None:
    """One rank of a CPU process group (gloo) in an (a2a, world / a2a) grid: the real all-to-all
    inside the a2a group, the ring's batch_isend_irecv over the p2p group, the sink gradient's
    all-reduces, autograd, and the module."""
    import os

    import torch.distributed as dist

    from te_cudnn import DotProductAttention
    from te_cudnn.parallel import context_parallel_attention

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    install_in_process(ring_mod)
    p2p = world // a2a
    blocks, rings = grid_groups(a2a, p2p)
    groups = [dist.new_group(ranks) for ranks in blocks] + [dist.new_group(ranks) for _, ranks in rings]
    a2a_group, p2p_group = groups[rank // a2a], groups[p2p + rank % a2a]
    q, k, v, d_out = _case(world, fmt, "gqa", seed=5)
    offset = torch.randn(1, 4, 1, 1, generator=torch.Generator().manual_seed(2)).requires_grad_()
    local = [shard(t, world, rank, fmt).requires_grad_() for t in (q, k, v)]
    out = context_parallel_attention(*local, [a2a_group, p2p_group], "a2a+p2p", qkv_format=fmt, attn_mask_type=mask,
                                     softmax_type="learnable", softmax_offset=offset)  # fmt: skip
    out.backward(shard(d_out, world, rank, fmt))
    module = DotProductAttention(4, (16, 8), num_gqa_groups=2, qkv_format=fmt, attn_mask_type=mask,
                                 cp_group=[a2a_group, p2p_group], cp_comm_type="a2a+p2p")  # fmt: skip
    plain = context_parallel_attention(*(x.detach() for x in local), [a2a_group, p2p_group], "a2a+p2p",
                                       qkv_format=fmt, attn_mask_type=mask)  # fmt: skip
    assert torch.equal(module(*(x.detach() for x in local)), plain.flatten(-2)), "the module runs the same attention"
    gathered = gather_results(out, local, world, fmt)
    if rank == 0:
        ref, d_offset = _reference(q, k, v, d_out, mask, fmt, (-1, 0 if mask == "causal" else -1), "learnable", offset)
        errs = [((x.double() - y).abs().max() / y.abs().max()).item() for x, y in zip(gathered, ref)]
        errs.append(((offset.grad.double() - d_offset).abs().max() / d_offset.abs().max()).item())
        with open(report, "w") as f:
            f.write(" ".join(f"{e:.6f}" for e in errs))
    dist.destroy_process_group()


@pytest.mark.parametrize("world,a2a,fmt,mask", [(4, 2, "bshd", "causal"), (2, 1, "sbhd", "no_mask"),
                                                (2, 2, "bshd", "causal")])  # fmt: skip
@pytest.mark.slow
def test_over_real_process_groups_on_cpu(tmp_path, world, a2a, fmt, mask):
    """a2a+p2p over torch.distributed (gloo on CPU processes), the two levels made with new_group."""
    errs = spawn_gloo(_gloo_worker, tmp_path, world, a2a, fmt, mask)
    assert len(errs) == 5 and max(errs) < 2e-2, dict(zip(("out", "dq", "dk", "dv", "d_sink"), errs))
