"""Context parallelism on the CPU: the ring's schedule, merge and gradient travel, the Ulysses
all-to-all, and argument validation.

cuDNN needs a GPU, so the ring tests here replace the two fused kernels the ring calls with the
fp64 stand-ins of ``tests/_cp_standin.py`` (output and log-sum-exp forward; a backward from the
*given* global O and log-sum-exp). What they check is te_cudnn's orchestration: the
sections each step computes, the log-sum-exp merge, the key/value gradients that travel the
ring, for cp = 1..8 against the fp32 reference on the full sequence. The real kernels run in
``tests/test_cp_gpu.py`` (simulated ring on one GPU) and ``tests/cp_two_gpu.py`` (NCCL).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import te_cudnn.parallel.ring as ring_mod
import te_cudnn.parallel.ring_attn as ring_attn_mod
from _cp_cpu import gather_results, spawn_gloo
from _cp_standin import CALLS, from_bhsd, install, install_in_process, installed, math_fwd, to_bhsd
from te_cudnn import UnsupportedConfigError
from te_cudnn.parallel import cp_decline_reasons, shard, simulate_context_parallel, unshard
from te_cudnn.parallel.api import _options
from te_cudnn.parallel.schedule import Section, bwd_origin, fwd_origin, fwd_step_of, section
from te_cudnn.reference import attention_reference


@pytest.fixture
def math_kernels(monkeypatch):
    install(monkeypatch, ring_mod)


def _full_reference(q, k, v, d_out, mask, fmt, window=(-1, -1)):
    leaves = [to_bhsd(t, f"{fmt}_").double().requires_grad_() for t in (q, k, v)]
    out = attention_reference(*leaves, attn_mask_type=mask, compute_dtype=torch.float64, window_size=window).out
    out.backward(to_bhsd(d_out, f"{fmt}_").double())
    back = lambda t: from_bhsd(t, f"{fmt}_")  # noqa: E731
    return back(out.detach()), *(back(t.grad) for t in leaves)


@pytest.mark.parametrize("cp,fmt,mask,heads", [
    (cp, fmt, mask, heads) for cp, fmt, mask, heads in itertools.product(
        (1, 2, 3, 4, 8), ("bshd", "sbhd"), ("causal", "no_mask"), ((4, 4, 16, 16), (4, 2, 16, 8), (4, 1, 8, 16)))
])  # fmt: skip
def test_ring_matches_full_attention(math_kernels, cp, fmt, mask, heads):
    h, hg, d_qk, d_v = heads
    b, s = 2, 4 * cp
    g = torch.Generator().manual_seed(cp * 100 + h + hg)
    shape = lambda n, d: (b, s, n, d) if fmt == "bshd" else (s, b, n, d)  # noqa: E731
    q, k = (torch.randn(shape(n, d_qk), generator=g).bfloat16() for n in (h, hg))
    v = torch.randn(shape(hg, d_v), generator=g).bfloat16()
    d_out = torch.randn(shape(h, d_v), generator=g).bfloat16()
    parts = [[shard(t, cp, r, fmt).requires_grad_() for r in range(cp)] for t in (q, k, v)]
    outs = simulate_context_parallel(*parts, "p2p", qkv_format=fmt, attn_mask_type=mask)
    torch.autograd.backward(outs, [shard(d_out, cp, r, fmt) for r in range(cp)])
    ref = _full_reference(q, k, v, d_out, mask, fmt)
    got = [unshard(outs, fmt)] + [unshard([p.grad for p in ps], fmt) for ps in parts]
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, ref):
        assert x.dtype == torch.bfloat16 and x.shape == y.shape, name
        err = (x.double() - y).abs().max().item()
        assert err <= 2e-2 * max(1.0, y.abs().max().item()), f"{name}: max error {err}"


def _pair_off(monkeypatch, backward: bool = True, forward: bool = True) -> None:
    """Run the ring's programs at cp = 2 instead of te_cudnn.parallel.ring_pair's."""
    if backward:
        monkeypatch.setattr(ring_attn_mod, "pair_applies", lambda *a: False)
    if forward:
        monkeypatch.setattr(ring_attn_mod, "pair_forward_applies", lambda *a: False)


def _two_ranks(fmt, mask, heads, softmax_type, seed):
    h, hg, d_qk, d_v = heads
    b, s = 2, 16
    g = torch.Generator().manual_seed(seed)
    shape = lambda n, d: (b, s, n, d) if fmt == "bshd" else (s, b, n, d)  # noqa: E731
    q, k = (torch.randn(shape(n, d_qk), generator=g).bfloat16() for n in (h, hg))
    v = torch.randn(shape(hg, d_v), generator=g).bfloat16()
    d_out = torch.randn(shape(h, d_v), generator=g).bfloat16()
    offset = torch.randn(1, h, 1, 1, generator=g) if softmax_type == "learnable" else None

    def run():
        parts = [[shard(t, 2, r, fmt).requires_grad_() for r in range(2)] for t in (q, k, v)]
        outs = simulate_context_parallel(*parts, "p2p", qkv_format=fmt, attn_mask_type=mask, softmax_type=softmax_type,
                                         softmax_offset=offset)  # fmt: skip
        torch.autograd.backward(outs, [shard(d_out, 2, r, fmt) for r in range(2)])
        return [unshard([o.detach() for o in outs], fmt)] + [unshard([p.grad for p in ps], fmt) for ps in parts]

    return run, (q, k, v, d_out)


_PAIR_CASES = [("bshd", "causal", (4, 2, 16, 8), "vanilla"), ("sbhd", "causal", (4, 4, 16, 16), "learnable"),
               ("bshd", "no_mask", (4, 1, 8, 16), "off_by_one"), ("sbhd", "no_mask", (4, 2, 16, 16), "vanilla")]  # fmt: skip


@pytest.mark.parametrize("fmt,mask,heads,softmax_type", _PAIR_CASES)
def test_two_rank_backward_equals_the_fp32_accumulators_bit_for_bit(math_kernels, monkeypatch, fmt, mask, heads,
                                                                      softmax_type):  # fmt: skip
    """cp = 2 (ring_pair.pair_applies): every gradient row sums two kernel results, added in place
    in bf16 (fp32 arithmetic, one rounding), and the neighbour's dK/dV travels in bf16: the same
    gradients as the fp32 accumulators, bit for bit (both from the ring's forward)."""
    run, _ = _two_ranks(fmt, mask, heads, softmax_type, heads[0] * 10 + heads[1])
    _pair_off(monkeypatch, backward=False)
    paired = run()
    _pair_off(monkeypatch)
    ringed = run()
    for name, x, y in zip(("out", "dq", "dk", "dv"), paired, ringed):
        assert x.dtype == torch.bfloat16 and torch.equal(x, y), name


@pytest.mark.parametrize("fmt,mask,heads,softmax_type", _PAIR_CASES)
def test_two_rank_forward_joins_the_blocks(math_kernels, monkeypatch, fmt, mask, heads, softmax_type):
    """cp = 2 without sink or dropout: each query row is one call against the keys it reaches
    (the neighbour's block joined to the own, bottom-right causal), no merge; with a sink the
    ring's forward runs. Output and gradients match the full sequence's, and the ring's."""
    run, (q, k, v, d_out) = _two_ranks(fmt, mask, heads, softmax_type, heads[0] * 10 + heads[1] + 1)
    CALLS.clear()  # the stand-in records forward calls: (sq, skv, mask, window)
    paired = run()
    fwd_calls = sorted(x[:3] for x in CALLS)
    _pair_off(monkeypatch)
    ringed = run()
    c = q.shape[1 if fmt == "bshd" else 0] // 4  # tokens per chunk
    if softmax_type != "vanilla":
        assert "causal_bottom_right" not in {x[2] for x in fwd_calls}
    elif mask == "causal":  # rank 0: chunk 0 alone, chunk 3 against all four; rank 1: both chunks against three
        assert fwd_calls == [(c, c, "causal"), (c, 4 * c, "causal_bottom_right"), (2 * c, 3 * c, "causal_bottom_right")]
    else:
        assert fwd_calls == [(2 * c, 4 * c, "no_mask")] * 2
    ref = _full_reference(q, k, v, d_out, mask, fmt) if softmax_type == "vanilla" else ringed
    for name, x, y, z in zip(("out", "dq", "dk", "dv"), paired, ringed, ref):
        assert x.dtype == torch.bfloat16, name
        tol = 2e-2 * max(1.0, y.abs().max().item())
        assert (x.double() - y.double()).abs().max().item() <= tol, name
        assert (x.double() - z.double()).abs().max().item() <= tol, name
        if softmax_type != "vanilla":  # the ring's forward: the same program both times
            assert torch.equal(x, y), name


def test_schedule_covers_every_block_once():
    for cp in (1, 2, 3, 5, 8):
        for r in range(cp):
            fwd = [fwd_origin(cp, r, i) for i in range(cp)]
            bwd = [bwd_origin(cp, r, i) for i in range(cp)]
            assert sorted(fwd) == sorted(bwd) == list(range(cp))
            assert fwd[0] == r and bwd[-1] == r  # own block first forward, last backward (its gradient completes)
            assert bwd[0] == fwd[-1]  # the backward starts with the block the forward ended with
            assert all(fwd[fwd_step_of(cp, r, j)] == j for j in range(cp))


def test_sections():
    assert section(2, 2, True) is Section.DIAGONAL
    assert section(2, 0, True) is Section.LOWER and Section.LOWER.kv_half and not Section.LOWER.q_half
    assert section(0, 3, True) is Section.UPPER and Section.UPPER.q_half and not Section.UPPER.kv_half
    assert section(0, 3, False) is Section.FULL


def test_ring_merge_never_nan():
    acc_o, acc_lse = torch.zeros(1, 2, 1, 4), torch.full((1, 1, 2, 1), float("-inf"))
    o_i, lse_i = torch.ones(1, 2, 1, 4), torch.tensor([[[[float("-inf")], [0.5]]]])
    ring_mod._merge(acc_o, acc_lse, o_i, lse_i, "bshd")
    assert not acc_o.isnan().any() and acc_o[0, 0].eq(0).all() and acc_o[0, 1].eq(1).all()
    assert acc_lse[0, 0, 0, 0] == float("-inf") and acc_lse[0, 0, 1, 0] == 0.5
    ring_mod._merge(acc_o, acc_lse, torch.full((1, 2, 1, 4), 3.0), torch.tensor([[[[0.0], [0.5]]]]), "bshd")
    assert acc_o[0, 0].eq(3).all() and torch.allclose(acc_o[0, 1], torch.full((4,), 2.0))
    assert math.isclose(acc_lse[0, 0, 1, 0].item(), 0.5 + math.log(2), rel_tol=1e-6)


def _bf16(*shape):
    return torch.zeros(shape, dtype=torch.bfloat16)


@pytest.mark.parametrize("comm,kwargs,q_shape,hg,match", [
    ("p2p", dict(attn_bias_type="post_scale_bias"), (2, 8, 4, 16), 4, "attn_bias_type='post_scale_bias'"),
    ("p2p", dict(window_size=(4, 0), dropout=0.1), (2, 8, 4, 16), 4, "no dropout with a sliding window"),
    ("p2p", dict(window_size=(5, 0)), (2, 8, 4, 16), 4, "sq = skv = 1"),
    ("p2p", dict(softmax_type="off_by_one", dropout=0.1), (2, 8, 4, 16), 4, "attention sinks"),
    ("p2p", dict(attn_mask_type="causal_bottom_right"), (2, 8, 4, 16), 4, "bottom-right"),
    ("a2a", dict(), (2, 8, 3, 16), 3, "h=3 and hg=3 must be divisible by cp=2"),
    ("p2p", dict(), (2, 7, 4, 16), 4, "two equal chunks"),
])  # fmt: skip
def test_declines_with_reasons_before_communication(comm, kwargs, q_shape, hg, match):
    q = _bf16(*q_shape)
    k = _bf16(*q_shape[:2], hg, q_shape[3])
    with pytest.raises(UnsupportedConfigError, match=match) as info:
        simulate_context_parallel([q, q], [k, k], [k, k], comm, **kwargs)
    assert f"cp_comm_type={comm!r}" in str(info.value)


def test_decline_reasons_empty_when_supported():
    q = _bf16(2, 8, 4, 16)
    for comm in ("p2p", "a2a"):
        opts = _options(comm, "bshd", "causal", None, 0.0, False, None, None, None, "vanilla", None, True)
        assert cp_decline_reasons(opts, 2, q, q, q) == []


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(qkv_format="bhsd"), ValueError, "qkv_format='bhsd'"),
    (dict(dropout=1.5), ValueError, "dropout"),
    (dict(attn_mask_type=3), TypeError, "attn_mask_type"),
    (dict(not_an_option=1), TypeError, "not_an_option"),
])  # fmt: skip
def test_argument_errors(kwargs, error, match):
    q = _bf16(2, 8, 4, 16)
    with pytest.raises(error, match=match):
        simulate_context_parallel([q, q], [q, q], [q, q], "p2p", **kwargs)
    with pytest.raises(ValueError, match="cp_comm_type='ring'"):
        simulate_context_parallel([q, q], [q, q], [q, q], "ring")


def test_thd_needs_padded_offsets():
    q = _bf16(16, 4, 16)
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    with pytest.raises(UnsupportedConfigError, match="cu_seqlens_q_padded"):
        simulate_context_parallel([q, q], [q, q], [q, q], "p2p", qkv_format="thd", cu_seqlens_q=cu)


def test_context_parallel_attention_needs_a_process_group():
    from te_cudnn.parallel import context_parallel_attention

    q = _bf16(2, 8, 4, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        context_parallel_attention(q, q, q, None)


def test_example_help_without_a_process_group():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "context_parallel.py"
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--seqlens" in proc.stdout and "torchrun" in proc.stdout


def test_module_without_process_group_refuses_cp_group():
    from te_cudnn import DotProductAttention

    with pytest.raises(RuntimeError, match="init_process_group|process group"):
        DotProductAttention(4, 16, cp_group=object())
    with pytest.raises(ValueError, match="cp_comm_type='ring'"):
        DotProductAttention(4, 16, cp_comm_type="ring")
    with pytest.raises(ValueError, match="cp_head_groups must be a positive int"):
        DotProductAttention(4, 16, cp_head_groups=0)
    assert DotProductAttention(4, 16).cp_group is None


def _gloo_worker(rank: int, world: int, port: int, comm: str, fmt: str, mask: str, report: str) -> None:
    """One rank of a CPU process group (gloo): the real transport (batch_isend_irecv, all-to-all)
    and autograd functions of context_parallel_attention, with the fp32 stand-in kernels."""
    import os

    import torch.distributed as dist

    from te_cudnn.parallel import context_parallel_attention

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    install_in_process(ring_mod)
    g = torch.Generator().manual_seed(5)
    b, s, h, hg, d = 2, 8 * world, 4, 2, 16
    shape = lambda n: (b, s, n, d) if fmt == "bshd" else (s, b, n, d)  # noqa: E731
    q, k, v, d_out = (torch.randn(shape(n), generator=g).bfloat16() for n in (h, hg, hg, h))
    local = [shard(t, world, rank, fmt).requires_grad_() for t in (q, k, v)]
    out = context_parallel_attention(*local, dist.group.WORLD, comm, qkv_format=fmt, attn_mask_type=mask)
    out.backward(shard(d_out, world, rank, fmt))
    from te_cudnn import DotProductAttention

    module = DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type=mask, cp_group=dist.group.WORLD,
                                 cp_comm_type=comm)  # fmt: skip
    flat = module(*(x.detach() for x in local))  # heads flattened, as TE's module returns it
    assert torch.equal(flat, out.detach().flatten(-2)), "the module with cp_group runs the same attention"
    if comm == "p2p":  # head groups: the same attention, bit for bit
        grouped = DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type=mask,
                                      cp_group=dist.group.WORLD, cp_comm_type=comm, cp_head_groups=2)  # fmt: skip
        assert torch.equal(grouped(*(x.detach() for x in local)), flat), "cp_head_groups=2 runs the same attention"
    gathered = gather_results(out, local, world, fmt)
    if rank == 0:
        ref = _full_reference(q, k, v, d_out, mask, fmt)
        errs = [((x.double() - y).abs().max() / y.abs().max()).item() for x, y in zip(gathered, ref)]
        with open(report, "w") as f:
            f.write(" ".join(f"{e:.6f}" for e in errs))
    dist.destroy_process_group()


@pytest.mark.parametrize("comm,fmt,mask,world", [("p2p", "bshd", "causal", 2), ("p2p", "sbhd", "no_mask", 3),
                                                 ("p2p", "bshd", "causal", 4), ("a2a", "bshd", "causal", 2)])  # fmt: skip
@pytest.mark.slow
def test_over_a_real_process_group_on_cpu(tmp_path, comm, fmt, mask, world):
    """context_parallel_attention over torch.distributed (gloo on CPU processes): the ring's
    batched isend/irecv between real ranks, the all-to-all, autograd, the results gathered."""
    errs = spawn_gloo(_gloo_worker, tmp_path, world, comm, fmt, mask)
    assert len(errs) == 4 and max(errs) < 2e-2, dict(zip(("out", "dq", "dk", "dv"), errs))


def test_ring_rank_alone_allocates_and_computes_one_ranks_share(math_kernels):
    """One rank of a 4-way ring without a process group: the local shapes and gradients of a
    rank; with every block a copy of its own, the result equals the ring over four identical shards."""
    from te_cudnn.parallel import ring_rank_alone

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 8, 4, 16, generator=g).bfloat16().requires_grad_() for _ in range(3))
    out = ring_rank_alone(q, k, v, 4, 1, qkv_format="bshd", attn_mask_type="causal")
    out.sum().backward()
    assert out.shape == q.shape and q.grad.shape == q.shape and k.grad.shape == k.shape
    same = [[t.detach().clone().requires_grad_() for _ in range(4)] for t in (q, k, v)]
    ring = simulate_context_parallel(*same, "p2p", qkv_format="bshd", attn_mask_type="causal")
    assert torch.equal(ring[1], out.detach())


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(cp=st.integers(1, 4), comm=st.sampled_from(["p2p", "a2a"]), fmt=st.sampled_from(["bshd", "sbhd"]),
       mask=st.sampled_from(["causal", "no_mask"] * 3 + ["padding", "causal_bottom_right"]),
       s_local=st.sampled_from([2, 4, 6, 2, 4, 1, 3]),
       h=st.sampled_from([1, 2, 3, 4]), group=st.sampled_from([1, 2]), d=st.sampled_from([8, 16]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16] * 2 + [torch.float32]),
       window=st.sampled_from([None, None, (-1, -1), (-1, 0), (4, 0)]))  # fmt: skip
def test_every_call_runs_or_declines_with_a_reason(cp, comm, fmt, mask, s_local, h, group, d, dtype, window):
    """Random context-parallel calls (fp32 stand-in kernels): each one either raises
    UnsupportedConfigError / ValueError / TypeError with a message before any exchange, or runs
    and gives the full attention's output (p2p) or finite outputs of the right shape (a2a)."""
    hg = h // group if h % group == 0 else h
    seq = s_local * cp
    full_shape = lambda n: (2, seq, n, d) if fmt == "bshd" else (seq, 2, n, d)  # noqa: E731
    full = [torch.randn(full_shape(n)).to(dtype) for n in (h, hg, hg)]
    dim = 1 if fmt == "bshd" else 0
    if s_local % 2 == 0:
        parts = [[shard(x, cp, r, fmt) for r in range(cp)] for x in full]
    else:  # not a dual-chunk split (the call declines): plain pieces of the right local shape
        parts = [list(x.chunk(cp, dim)) for x in full]
    try:
        with installed(ring_mod):
            outs = simulate_context_parallel(*parts, comm, qkv_format=fmt, attn_mask_type=mask, window_size=window)
    except (UnsupportedConfigError, ValueError, TypeError) as exc:
        assert str(exc)  # a reason, never an empty message
        assert "executes on CUDA devices" not in str(exc), "a kernel call escaped the stand-ins"
        return
    assert mask in ("causal", "no_mask") and dtype != torch.float32 and s_local % 2 == 0
    assert len(outs) == cp and all(o.shape == parts[0][0].shape and o.dtype == dtype for o in outs)
    assert all(torch.isfinite(o.float()).all() for o in outs)
    if comm in ("p2p", "a2a"):
        full_window = (-1, -1) if window is None else (window[0], 0 if mask == "causal" else window[1])
        want = _full_reference(*full, torch.zeros_like(full[0]), mask, fmt, full_window)[0]
        err = (unshard(outs, fmt).double() - want).abs().max().item()
        assert err <= 2e-2 * max(1.0, want.abs().max().item()), err


def test_a2a_hands_each_rank_an_aligned_copy_of_its_sink_logits(monkeypatch):
    """h / cp = 2 logits per rank: the head slice of every odd rank starts 8 bytes into the
    [1, h, 1, 1] fp32 tensor, which cuDNN cannot read (16-byte rule); each rank gets a copy,
    and the gradients of the copies reach the shared logits."""
    import te_cudnn.parallel.ulysses_groups as groups_mod

    install(monkeypatch, ring_mod)
    seen = []

    def fwd(*args, softmax_offset=None, **kwargs):
        seen.append(softmax_offset)
        assert softmax_offset.data_ptr() % 16 == 0 and softmax_offset.shape == (1, 2, 1, 1)
        return math_fwd(*args, softmax_offset=softmax_offset, **kwargs)

    monkeypatch.setattr(groups_mod, "fused_attn_fwd", fwd)
    cp, h, b, s, d = 4, 8, 1, 8 * 4, 16
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, s, h, d, generator=g).bfloat16() for _ in range(3))
    offset = torch.randn(1, h, 1, 1, generator=g).requires_grad_()
    parts = [[shard(t, cp, r, "bshd") for r in range(cp)] for t in (q, k, v)]
    outs = simulate_context_parallel(*parts, "a2a", qkv_format="bshd", attn_mask_type="no_mask",
                                     softmax_type="learnable", softmax_offset=offset)  # fmt: skip
    sum(o.float().sum() for o in outs).backward()
    assert len(seen) == cp
    assert offset.grad is not None and torch.all(offset.grad != 0)


@pytest.mark.parametrize("cp,groups,fmt,mask,softmax_type", [
    (2, 2, "bshd", "causal", "vanilla"), (2, 4, "sbhd", "no_mask", "learnable"), (4, 2, "bshd", "causal", "off_by_one"),
    (1, 2, "bshd", "causal", "learnable"),
])  # fmt: skip
def test_a2a_head_groups_equal_one_group(monkeypatch, cp, groups, fmt, mask, softmax_type):
    """head_groups=G (the exchange and attention one head group at a time, both directions)
    gives the outputs and gradients (sink logits included) of one group, bit for bit: every
    head is computed by the same kernel on the same whole sequence."""
    install(monkeypatch, ring_mod)
    g = torch.Generator().manual_seed(cp * 7 + groups)
    b, s, h, hg, d = 1, 8 * cp, 16, 8, 16
    shape = lambda n: (b, s, n, d) if fmt == "bshd" else (s, b, n, d)  # noqa: E731
    q, k, v, d_out = (torch.randn(shape(n), generator=g).bfloat16() for n in (h, hg, hg, h))
    sink = None if softmax_type == "vanilla" else torch.randn(1, h, 1, 1, generator=g)
    results = []
    for head_groups in (1, groups):
        parts = [[shard(t, cp, r, fmt).requires_grad_() for r in range(cp)] for t in (q, k, v)]
        offset = None if sink is None or softmax_type != "learnable" else sink.clone().requires_grad_()
        outs = simulate_context_parallel(*parts, "a2a", qkv_format=fmt, attn_mask_type=mask, head_groups=head_groups,
                                         softmax_type=softmax_type, softmax_offset=offset)  # fmt: skip
        torch.autograd.backward(outs, [shard(d_out, cp, r, fmt) for r in range(cp)])
        results.append([unshard(outs, fmt)] + [unshard([p.grad for p in ps], fmt) for ps in parts]
                       + ([] if offset is None else [offset.grad]))  # fmt: skip
    for name, one, grouped in zip(("out", "dq", "dk", "dv", "d_sink"), *results):
        assert torch.equal(one, grouped), name
    want = _full_reference(q, k, v, d_out, mask, fmt, (-1, -1))[0] if softmax_type == "vanilla" else None
    if want is not None:
        assert (results[1][0].double() - want).abs().max().item() <= 2e-2 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("cp,groups,fmt,mask,softmax_type,window", [
    (2, 2, "bshd", "causal", "vanilla", None), (3, 4, "sbhd", "no_mask", "learnable", None),
    (4, 2, "bshd", "causal", "off_by_one", (6, 0)), (2, 2, "bshd", "causal", "learnable", (6, 0)),
    (1, 2, "sbhd", "causal", "vanilla", None), (3, 2, "bshd", "causal", "learnable", (3, 0)),
])  # fmt: skip
def test_p2p_head_groups_equal_one_group(monkeypatch, cp, groups, fmt, mask, softmax_type, window):
    """head_groups=G (the whole ring once per head group, forward and backward) gives the outputs
    and gradients of one group bit for bit (the sink logits' gradient to rounding), and the fp64
    reference."""
    install(monkeypatch, ring_mod)
    g = torch.Generator().manual_seed(cp * 11 + groups)
    b, s, h, hg, d = 1, 8 * cp, 8, 4, 16
    shape = lambda n: (b, s, n, d) if fmt == "bshd" else (s, b, n, d)  # noqa: E731
    q, k, v, d_out = (torch.randn(shape(n), generator=g).bfloat16() for n in (h, hg, hg, h))
    sink = torch.randn(1, h, 1, 1, generator=g)
    extra = {} if window is None else dict(window_size=window)
    results = []
    for head_groups in (1, groups):
        parts = [[shard(t, cp, r, fmt).requires_grad_() for r in range(cp)] for t in (q, k, v)]
        offset = sink.clone().requires_grad_() if softmax_type == "learnable" else None
        outs = simulate_context_parallel(*parts, "p2p", qkv_format=fmt, attn_mask_type=mask, head_groups=head_groups,
                                         softmax_type=softmax_type, softmax_offset=offset, **extra)  # fmt: skip
        torch.autograd.backward(outs, [shard(d_out, cp, r, fmt) for r in range(cp)])
        results.append([unshard(outs, fmt)] + [unshard([p.grad for p in ps], fmt) for ps in parts]
                       + ([] if offset is None else [offset.grad]))  # fmt: skip
    for name, one, grouped in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(one, grouped), name
    if softmax_type == "learnable":  # the same terms, summed over fewer heads at a time
        torch.testing.assert_close(results[0][4], results[1][4], rtol=1e-5, atol=1e-6)
    if softmax_type == "vanilla":
        full_window = (-1, -1) if window is None else (window[0], 0 if mask == "causal" else window[1])
        want = _full_reference(q, k, v, d_out, mask, fmt, full_window)
        for got, ref in zip(results[1], want):
            assert (got.double() - ref).abs().max().item() <= 2e-2 * max(1.0, ref.abs().max().item())


def _opts(comm: str, head_groups: int):
    return _options(comm, "bshd", "causal", None, 0.0, False, None, None, None, "vanilla", None, True, head_groups)


def test_head_groups_decline_with_reasons():
    q, k = torch.zeros(1, 8, 6, 16), torch.zeros(1, 8, 4, 16)
    assert any("divisible by 4" in w for w in cp_decline_reasons(_opts("p2p", head_groups=4), 2, q, k, k))
    assert any("for cp_comm_type='a2a' or 'p2p'" in w for w in cp_decline_reasons(_opts("all_gather", head_groups=2), 2, q, k, k))
    thd = _options("p2p", "thd", "padding_causal", None, 0.0, False, None, None, None, "vanilla", None, True, 2)
    assert any("packed strides" in w for w in cp_decline_reasons(thd, 2, q[0], k[0], k[0]))
    with pytest.raises(ValueError, match="head_groups must be a positive int"):
        _opts("p2p", head_groups=0)


def test_a2a_backward_runs_twice_with_retain_graph(monkeypatch):
    """The a2a function keeps what its backward needs (the caller's tensors and the stats), so a
    second backward (retain_graph=True) gives the same gradients."""
    install(monkeypatch, ring_mod)
    cp, fmt = 2, "bshd"
    g = torch.Generator().manual_seed(9)
    q, k, v, d_out = (torch.randn(1, 8 * cp, n, 16, generator=g).bfloat16() for n in (8, 4, 4, 8))
    parts = [[shard(t, cp, r, fmt).requires_grad_() for r in range(cp)] for t in (q, k, v)]
    outs = simulate_context_parallel(*parts, "a2a", qkv_format=fmt, attn_mask_type="causal", head_groups=2)
    grads_out = [shard(d_out, cp, r, fmt) for r in range(cp)]
    torch.autograd.backward(outs, grads_out, retain_graph=True)
    first = [p.grad.clone() for ps in parts for p in ps]
    for ps in parts:
        for p in ps:
            p.grad = None
    torch.autograd.backward(outs, grads_out)
    assert all(torch.equal(a, p.grad) for a, p in zip(first, [p for ps in parts for p in ps]))
