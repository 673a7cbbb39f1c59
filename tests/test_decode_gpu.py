"""``fused_attn_decode`` on the GPU: against the fp32 reference on the gathered cache, bit for
bit against ``fused_attn_fwd`` on the same data (the same plan, lengths bound differently),
idle slots, windows, CUDA-graph replay with lengths updated in place, and the per-call
checks; and a seeded set of random configurations (``TE_CUDNN_TEST_SEED`` replays one, the
seed is printed and is in every failure message)."""

from __future__ import annotations

import random

import pytest
import torch

import te_cudnn as tc
from te_cudnn.reference import attention_reference
from te_cudnn.testing import check_close

from _random_cases import seed_from_env

pytestmark = pytest.mark.gpu

H, HG, D = 8, 2, 64


def _cache(b, page, pages, *, head_major=False, paged=True, dtype=torch.bfloat16, seed=0, hg=HG, d=D):
    """K/V caches (paged pools with a shuffled page table, or dense) and their dense [b, hg, s, d] view."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    s = page * pages

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    if paged:
        n = b * pages + 3  # spare pages nobody points at
        if head_major:  # [n, hg, page, d] in memory, seen as [n, page, hg, d]
            k, v = rand(n, hg, page, d).transpose(1, 2), rand(n, hg, page, d).transpose(1, 2)
        else:
            k, v = rand(n, page, hg, d), rand(n, page, hg, d)
        table = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: b * pages]
        table = table.view(b, pages).to(torch.int32).cuda()
        dense = [t[table.long()].reshape(b, s, hg, d).permute(0, 2, 1, 3) for t in (k, v)]
        return k, v, table, dense
    if head_major:
        k, v = rand(b, hg, s, d).transpose(1, 2), rand(b, hg, s, d).transpose(1, 2)
    else:
        k, v = rand(b, s, hg, d), rand(b, s, hg, d)
    return k, v, None, [t.permute(0, 2, 1, 3) for t in (k, v)]


def _reference(q, dense, lens, window=(-1, -1)):
    sq = q.shape[1]
    mask = "padding" if window == (-1, -1) and sq == 1 else "padding_causal_bottom_right"
    qb = q.permute(0, 2, 1, 3)
    lq = torch.full_like(lens, sq)
    kw = dict(attn_mask_type=mask, window_size=window, seqlens_q=lq, seqlens_kv=lens)
    r32 = attention_reference(qb.float(), dense[0].float(), dense[1].float(), **kw)
    rlp = attention_reference(qb, dense[0], dense[1], compute_dtype=q.dtype, **kw)
    return r32, rlp


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


CASES = [  # (paged, head_major, page, pages, lengths, dtype)
    (True, False, 16, 4, [40, 17, 64, 1], torch.bfloat16),
    (True, True, 16, 4, [40, 17, 64, 1], torch.bfloat16),
    (True, False, 64, 3, [192, 100, 65], torch.float16),
    (False, False, 1, 96, [96, 5, 50], torch.bfloat16),
    (False, True, 1, 96, [96, 5, 50], torch.float16),
]
IDS = ["paged16-bshd", "paged16-head_major", "paged64-fp16", "dense", "dense-head_major-fp16"]


@pytest.mark.parametrize("paged,head_major,page,pages,lengths,dtype", CASES, ids=IDS)
def test_decode_matches_reference_and_fused_attn_fwd(paged, head_major, page, pages, lengths, dtype):
    b = len(lengths)
    k, v, table, dense = _cache(b, page, pages, head_major=head_major, paged=paged, dtype=dtype)
    q = torch.randn(b, 1, H, D, device="cuda").to(dtype)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = tc.fused_attn_decode(q, k, v, lens, table, return_softmax_lse=True)
    assert out.shape == (b, 1, H, D) and out.dtype == dtype and lse.shape == (b, H, 1, 1)
    r32, rlp = _reference(q, dense, lens)
    check_close("O (decode)", out.permute(0, 2, 1, 3), r32.out, rlp.out, dtype)
    torch.testing.assert_close(lse, r32.lse.view(b, H, 1, 1), atol=2e-3, rtol=1e-4)
    # TE's entry point on the same data: the same plan, the lengths derived from cu_seqlens
    layout = "paged_kv_bshd_bshd_bshd" if paged else "bshd_bshd_bshd"
    pt = dict(page_table_k=table, page_table_v=table) if paged else {}
    ref, _ = tc.fused_attn_fwd(False, 1, page * pages, _cu([1] * b), _cu(lengths), q, k, v, dtype,
                               tc.FusedAttnBackend.F16_arbitrary_seqlen,
                               qkv_layout=layout, attn_mask_type="padding", **pt)  # fmt: skip
    assert torch.equal(out, ref)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "dense"])
def test_idle_slot_gives_zero_row(paged):
    """A slot with cache_seqlens 0: cuDNN must write its row (no fill runs), and writes zeros."""
    b = 4
    k, v, table, dense = _cache(b, 16, 4, paged=paged)
    q = torch.randn(b, 1, H, D, device="cuda").to(torch.bfloat16)
    lens = torch.tensor([33, 0, 64, 0], dtype=torch.int32, device="cuda")
    out = torch.full((b, 1, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    tc.fused_attn_decode(q, k, v, lens, table, out=out)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(out[3], torch.zeros_like(out[3]))
    r32, rlp = _reference(q, dense, lens)
    check_close("O (decode, idle slots)", out.permute(0, 2, 1, 3), r32.out, rlp.out, torch.bfloat16)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "dense"])
@pytest.mark.parametrize("sq", [2, 4])
def test_speculative_tokens(paged, sq):
    """s_q new tokens per sequence attend causally from the end of each cache; a row that sees
    no key (cache_seqlens < s_q) is zero; bit for bit what fused_attn_fwd gives from cu_seqlens."""
    lengths = [40, 2, 64, 0, 17]
    b = len(lengths)
    k, v, table, dense = _cache(b, 16, 4, paged=paged)
    q = torch.randn(b, sq, H, D, device="cuda").to(torch.bfloat16)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full((b, sq, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    _, lse = tc.fused_attn_decode(q, k, v, lens, table, out=out, return_softmax_lse=True)
    assert lse.shape == (b, H, sq, 1)
    r32, rlp = _reference(q, dense, lens)
    check_close(f"O (s_q={sq})", out.permute(0, 2, 1, 3), r32.out, rlp.out, torch.bfloat16)
    assert torch.equal(out[3], torch.zeros_like(out[3]))  # an idle slot
    if sq == 4:  # 2 cached tokens, 4 queries: the first two see nothing
        assert torch.equal(out[1, :2], torch.zeros_like(out[1, :2]))
    layout = "paged_kv_bshd_bshd_bshd" if paged else "bshd_bshd_bshd"
    pt = dict(page_table_k=table, page_table_v=table) if paged else {}
    ref, _ = tc.fused_attn_fwd(False, sq, 64, _cu([sq] * b), _cu(lengths), q, k, v, q.dtype,
                               tc.FusedAttnBackend.F16_arbitrary_seqlen, qkv_layout=layout,
                               attn_mask_type="padding_causal_bottom_right", **pt)  # fmt: skip
    assert torch.equal(out, ref)


def test_window_dense():
    b, left = 4, 20
    k, v, _, dense = _cache(b, 1, 128, paged=False)
    q = torch.randn(b, 1, H, D, device="cuda").to(torch.bfloat16)
    lens = torch.tensor([128, 7, 90, 0], dtype=torch.int32, device="cuda")
    out = torch.full((b, 1, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    tc.fused_attn_decode(q, k, v, lens, window_size=(left, 0), out=out)
    assert torch.equal(out[3], torch.zeros_like(out[3]))  # an idle slot under a window: zero
    r32, rlp = _reference(q, dense, lens, window=(left, 0))
    check_close("O (decode, window)", out.permute(0, 2, 1, 3), r32.out, rlp.out, torch.bfloat16)
    full = tc.fused_attn_decode(q, k, v, lens)
    assert not torch.equal(out[0], full[0]) and torch.equal(out[1], full[1])  # 7 keys: all inside the window


def test_paged_window():
    """A (left, 0) window on a paged cache (head-major pages too), against the fp32 reference."""
    for head_major, left in ((False, 8), (True, 30)):
        k, v, table, dense = _cache(4, 16, 4, head_major=head_major, seed=left)
        q = torch.randn(4, 1, H, D, device="cuda").to(torch.bfloat16)
        lens = torch.tensor([64, 9, 0, 40], dtype=torch.int32, device="cuda")
        out = tc.fused_attn_decode(q, k, v, lens, table, window_size=(left, 0))
        assert torch.equal(out[2], torch.zeros_like(out[2]))  # an idle slot: zero
        r32, rlp = _reference(q, dense, lens, window=(left, 0))
        check_close(f"O (paged decode, window {left})", out.permute(0, 2, 1, 3), r32.out, rlp.out, torch.bfloat16)


def test_cuda_graph_replay_reads_updated_lengths():
    """Capture one step; a decode loop then writes K/V and bumps cache_seqlens in place and
    replays: each replay equals an eager call on the same data."""
    b, page, pages = 4, 16, 8
    k, v, table, dense = _cache(b, page, pages)
    q = torch.randn(b, 1, H, D, device="cuda").to(torch.bfloat16)
    lens = torch.tensor([5, 17, 1, 60], dtype=torch.int32, device="cuda")
    tc.fused_attn_decode(q, k, v, lens, table)  # builds the plan (a first call may not be captured)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tc.fused_attn_decode(q, k, v, lens, table)
    for step in range(3):
        lens += 1 + step
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
        graph.replay()
        eager = tc.fused_attn_decode(q, k, v, lens, table)
        again = tc.fused_attn_decode(q, k, v, lens, table)
        torch.cuda.synchronize()
        if torch.equal(eager, again):  # a deterministic engine: the replay reads the same lengths, bit for bit
            assert torch.equal(out, eager), step
        else:  # cuDNN's split-KV decode engine may round differently from call to call (a bf16 ulp)
            torch.testing.assert_close(out, eager, rtol=1.6e-2, atol=1e-3, msg=f"replay {step}")
        r32, rlp = _reference(q, dense, lens)
        check_close(f"O (replay {step})", out.permute(0, 2, 1, 3), r32.out, rlp.out, torch.bfloat16)


def test_per_call_checks_and_empty_batch():
    k, v, table, _ = _cache(2, 16, 2)
    q = torch.randn(2, 1, H, D, device="cuda").to(torch.bfloat16)
    lens = torch.tensor([3, 4], dtype=torch.int32, device="cuda")
    tc.fused_attn_decode(q, k, v, lens, table)
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        tc.fused_attn_decode(q, k, v, lens.long(), table)
    with pytest.raises(ValueError, match="cache_seqlens is on cpu"):
        tc.fused_attn_decode(q, k, v, lens.cpu(), table)
    unaligned = torch.tensor([0, 3, 4, 0], dtype=torch.int32, device="cuda")[1:3]  # 4 bytes in: copied, not misread
    assert torch.equal(tc.fused_attn_decode(q, k, v, unaligned, table), tc.fused_attn_decode(q, k, v, lens, table))
    with pytest.raises(TypeError, match="page_table must be int32"):
        tc.fused_attn_decode(q, k, v, lens, table.long())
    out, lse = tc.fused_attn_decode(q[:0], k, v, lens[:0], table[:0], return_softmax_lse=True)
    assert out.shape == (0, 1, H, D) and lse.shape == (0, H, 1, 1)


def test_random_configurations():
    """Random decode calls: batch, heads and GQA groups, head dim, dtype, paged (token- or
    head-major pages of 16-64 tokens) or dense caches, lengths from 0 to the capacity, windows;
    each against the fp32 reference."""
    seed = seed_from_env()
    print(f"decode random configurations: seed={seed} (replay: TE_CUDNN_TEST_SEED={seed})")
    rng = random.Random(seed)
    for i in range(24):
        hg = rng.choice([1, 2, 4, 8])
        h, d, dtype = hg * rng.choice([1, 2, 4]), rng.choice([64, 128]), rng.choice([torch.float16, torch.bfloat16])
        b, paged, head_major = rng.randint(1, 9), rng.random() < 0.7, rng.random() < 0.5
        sq = rng.choice([1, 1, 1, 2, 4])
        page, pages = (rng.choice([16, 32, 64]), rng.randint(1, 6)) if paged else (1, rng.randint(16, 300))
        cap = page * pages
        lengths = [rng.choice([0, 1, cap, rng.randint(1, cap)]) for _ in range(b)]
        window = (-1, -1) if rng.random() < 0.6 else (rng.randint(0, cap), 0)
        what = (f"seed={seed} case {i}: b={b} sq={sq} h={h}/{hg} d={d} {str(dtype)[6:]} {'paged' if paged else 'dense'} "
                f"page={page}x{pages}{' head-major' if head_major else ''} lengths={lengths} window={window}")  # fmt: skip
        k, v, table, dense = _cache(b, page, pages, head_major=head_major, paged=paged, dtype=dtype, seed=i, hg=hg,
                                    d=d)  # fmt: skip
        q = torch.randn(b, sq, h, d, device="cuda").to(dtype)
        lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        out = tc.fused_attn_decode(q, k, v, lens, table, window_size=window)
        assert torch.isfinite(out).all(), what
        r32, rlp = _reference(q, dense, lens, window)
        check_close(f"O ({what})", out.permute(0, 2, 1, 3), r32.out, rlp.out, dtype)


def test_custom_op_and_torch_compile():
    """te_cudnn::decode passes torch.library.opcheck (fake vs real, schema, autograd registration);
    a compiled step (fullgraph) gives the eager bits, and reads lengths bumped in place."""
    k, v, table, _ = _cache(3, 16, 4)
    q = torch.randn(3, 1, H, D, device="cuda").to(torch.bfloat16)
    lens = torch.tensor([9, 40, 1], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.te_cudnn.decode.default, (q, k, v, lens, table, None, -1))
    kd, vd, _, _ = _cache(3, 1, 64, paged=False)
    torch.library.opcheck(torch.ops.te_cudnn.decode.default, (q, kd, vd, lens, None, 0.1, 7))

    def step(q, k, v, lens, table):
        return tc.fused_attn_decode(q, k, v, lens, table, return_softmax_lse=True)

    compiled = torch.compile(step, fullgraph=True)
    for _ in range(2):
        (out_c, lse_c), (out_e, lse_e) = compiled(q, k, v, lens, table), step(q, k, v, lens, table)
        assert torch.equal(out_c, out_e) and torch.equal(lse_c, lse_e)
        lens += 5
