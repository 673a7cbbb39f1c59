"""GPU suite for variable-length attention: padding masks, THD and mixed layouts.

Every case runs forward and backward and compares the valid positions with the fp32
reference run on the same data scattered into a padded [b, h, s, d] batch with the same
per-sequence lengths; positions past a sequence's end must be exactly zero in O and in the
gradients.
"""

from __future__ import annotations

import itertools
import random
import zlib

import pytest
import torch

import te_cudnn as tc
from te_cudnn.enums import QKVFormat, QKVLayout, QKVLayoutGroup
from te_cudnn.layouts import layout_info
from te_cudnn.reference import attention_reference
from te_cudnn.testing import check_close

pytestmark = pytest.mark.gpu
PADDING_MASKS = ("padding", "padding_causal", "padding_causal_bottom_right")
DTYPES = (torch.float16, torch.bfloat16)


def _cu(lengths, gaps=None) -> torch.Tensor:
    gaps = gaps or [0] * len(lengths)
    out = [0]
    for n, gap in zip(lengths, gaps):
        out.append(out[-1] + n + gap)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


class Side:
    """One side (q or kv) of a batch: per-sequence lengths, where each sequence starts."""

    def __init__(self, fmt: QKVFormat, lengths, s_max: int, gaps=None):
        self.fmt, self.lengths, self.s_max = fmt, list(lengths), s_max
        self.cu = _cu(self.lengths)
        self.cu_padded = _cu(self.lengths, gaps) if gaps else None
        starts = (self.cu_padded if self.cu_padded is not None else self.cu).tolist()
        self.starts = starts[:-1]
        self.tokens = starts[-1] + (2 if gaps else 0)  # a little spare capacity past the last sequence

    @property
    def ragged(self) -> bool:
        return self.fmt == QKVFormat.thd

    def to_dense(self, t: torch.Tensor) -> torch.Tensor:
        """[b, h, s_max, d] float32, zeros past each sequence's end."""
        b = len(self.lengths)
        if self.fmt == QKVFormat.bshd:
            dense = t.float().permute(0, 2, 1, 3).clone()
        elif self.fmt == QKVFormat.sbhd:
            dense = t.float().permute(1, 2, 0, 3).clone()
        else:
            dense = torch.zeros(b, t.shape[1], self.s_max, t.shape[2], device=t.device)
            for i, (start, n) in enumerate(zip(self.starts, self.lengths)):
                dense[i, :, :n] = t[start:start + n].float().transpose(0, 1)
        for i, n in enumerate(self.lengths):
            dense[i, :, n:] = 0
        return dense

    def padding_positions(self, t: torch.Tensor) -> torch.Tensor:
        """The values of ``t`` at positions no sequence owns (must be exactly zero)."""
        if self.fmt == QKVFormat.thd:
            owned = torch.zeros(t.shape[0], dtype=torch.bool, device=t.device)
            for start, n in zip(self.starts, self.lengths):
                owned[start:start + n] = True
            return t[~owned]
        dense = t.permute(0, 2, 1, 3) if self.fmt == QKVFormat.bshd else t.permute(1, 2, 0, 3)
        return torch.cat([dense[i, :, n:].reshape(-1) for i, n in enumerate(self.lengths)])


def _tensors(layout: QKVLayout, qside: Side, kvside: Side, h: int, hg: int, d: int, dtype, gen):
    info = layout_info(layout)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    def lead(side):
        b = len(side.lengths)
        return {QKVFormat.thd: (side.tokens,), QKVFormat.bshd: (b, side.s_max), QKVFormat.sbhd: (side.s_max, b)}[side.fmt]

    g = info.group
    if g == QKVLayoutGroup.L_3HD:
        return rand(*lead(qside), 3, h, d).unbind(-3)
    if g == QKVLayoutGroup.L_H3D:
        return rand(*lead(qside), h, 3, d).unbind(-2)
    q = rand(*lead(qside), h, d)
    if g == QKVLayoutGroup.L_HD_2HD:
        k, v = rand(*lead(kvside), 2, hg, d).unbind(-3)
    elif g == QKVLayoutGroup.L_HD_H2D:
        k, v = rand(*lead(kvside), hg, 2, d).unbind(-2)
    else:
        k, v = rand(*lead(kvside), hg, d), rand(*lead(kvside), hg, d)
    return q, k, v


def _poison(*tensors: torch.Tensor) -> None:
    """Leave NaN in the caching allocator's free blocks of these tensors' sizes (after returning
    the other cached blocks to the driver): results of the same sizes allocated next reuse them,
    so a row cuDNN does not write shows up as NaN instead of stale memory."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.full_like(t, float("nan")) for t in tensors for _ in range(2)]
    del blocks


def run_varlen(layout, mask, dtype, lengths_q, lengths_kv, *, h=4, hg=4, d=64, s_max_q=None, s_max_kv=None,
               gaps=None, seed=0, check=True):  # fmt: skip
    layout = QKVLayout.coerce(layout)
    info = layout_info(layout)
    s_max_q = s_max_q or max(max(lengths_q), 1)
    s_max_kv = s_max_kv or max(max(lengths_kv), 1)
    qside = Side(info.q_format, lengths_q, s_max_q, gaps if info.q_format == QKVFormat.thd else None)
    kvside = Side(info.kv_format, lengths_kv, s_max_kv, gaps if info.kv_format == QKVFormat.thd else None)
    if info.packs_qkv:  # one buffer: q and kv share tokens
        kvside = qside
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = _tensors(layout, qside, kvside, h, hg, d, dtype, gen)
    kw = dict(qkv_layout=layout.name, attn_mask_type=mask,
              cu_seqlens_q_padded=qside.cu_padded, cu_seqlens_kv_padded=kvside.cu_padded)  # fmt: skip
    d_o = torch.randn((*q.shape[:-1], v.shape[-1]), generator=gen, device="cuda").to(dtype)
    _poison(d_o)  # O: rows cuDNN leaves unwritten would hold NaN (te_cudnn.row_fill drops fills where none are)
    out, aux = tc.fused_attn_fwd(True, s_max_q, s_max_kv, qside.cu, kvside.cu, q, k, v, dtype, None, **kw)
    if not info.packs_qkv:
        _poison(q, k, v)
    dq, dk, dv, _, _ = tc.fused_attn_bwd(s_max_q, s_max_kv, qside.cu, kvside.cu, q, k, v, out, d_o, dtype, aux, None, **kw)
    for name, t in (("O", out), ("dQ", dq)):
        pad = qside.padding_positions(t)
        assert torch.isfinite(t).all() and (pad == 0).all(), f"{name} must be exactly zero past each sequence"
    for name, t in (("dK", dk), ("dV", dv)):
        pad = kvside.padding_positions(t)
        assert torch.isfinite(t).all() and (pad == 0).all(), f"{name} must be exactly zero past each sequence"
    if not check:
        return out, aux
    lq = torch.tensor(lengths_q, device="cuda")
    lkv = torch.tensor(lengths_kv, device="cuda")
    dense_in = [qside.to_dense(q), kvside.to_dense(k), kvside.to_dense(v)]
    results = {}
    for compute in (torch.float32, dtype):
        leaves = [t.to(compute).requires_grad_() for t in dense_in]
        ref = attention_reference(*leaves, attn_mask_type=mask, seqlens_q=lq, seqlens_kv=lkv, compute_dtype=compute)
        grads = torch.autograd.grad(ref.out, leaves, qside.to_dense(d_o).to(compute))
        results[compute] = (ref, grads)
    (r32, g32), (rlp, glp) = results[torch.float32], results[dtype]
    if sum(lengths_q) and sum(lengths_kv):
        check_close("O", qside.to_dense(out), r32.out, rlp.out, dtype)
        check_close("dQ", qside.to_dense(dq), g32[0], glp[0], dtype)
        check_close("dK", kvside.to_dense(dk), g32[1], glp[1], dtype)
        check_close("dV", kvside.to_dense(dv), g32[2], glp[2], dtype)
    # softmax stats of valid rows: THD stats are token-major [t, h, 1]
    stats = aux[0]
    for i, (n, nk) in enumerate(zip(lengths_q, lengths_kv)):
        if n == 0 or nk == 0:
            continue
        want = r32.lse[i, :, :n, 0]
        got = stats[qside.starts[i]:qside.starts[i] + n, :, 0].T if qside.ragged else stats[i, :, :n, 0]
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    return out, aux


# ------------------------------------------------------------------ generated matrix
THD_LAYOUTS = [l for l in QKVLayout if layout_info(l).q_format == QKVFormat.thd and layout_info(l).kv_format == QKVFormat.thd and not layout_info(l).is_paged]
MIXED = [QKVLayout.sbhd_bshd_bshd, QKVLayout.bshd_sbhd_sbhd, QKVLayout.thd_bshd_bshd, QKVLayout.thd_sbhd_sbhd]
DENSE_PADDED = [QKVLayout.bshd_bshd_bshd, QKVLayout.sbhd_sbhd_sbhd, QKVLayout.bs3hd, QKVLayout.sbh3d, QKVLayout.bshd_bs2hd, QKVLayout.sbhd_sbh2d]


def _cases():
    for layout, mask, dtype, gqa in itertools.product(THD_LAYOUTS + MIXED + DENSE_PADDED, PADDING_MASKS, DTYPES, (False, True)):
        if gqa and layout_info(layout).packs_qkv:
            continue
        yield pytest.param(layout, mask, dtype, gqa, id=f"{layout.name}-{mask}-{str(dtype)[6:]}-{'gqa' if gqa else 'mha'}")


@pytest.mark.parametrize("layout,mask,dtype,gqa", list(_cases()))
def test_varlen_matrix(layout, mask, dtype, gqa):
    rng = random.Random(zlib.crc32(f"{layout.name}-{mask}-{dtype}-{gqa}".encode()))
    b = 3
    lengths_q = [rng.randint(1, 96) for _ in range(b)]
    packs = layout_info(layout).packs_qkv
    lengths_kv = lengths_q if packs else [rng.randint(1, 128) for _ in range(b)]
    if mask == "padding_causal_bottom_right" and not packs:
        lengths_kv = [max(nk, n) for n, nk in zip(lengths_q, lengths_kv)]  # bottom-right: each sq <= skv
    run_varlen(layout, mask, dtype, lengths_q, lengths_kv, hg=2 if gqa else 4, s_max_q=96,
               s_max_kv=96 if packs else 128, gaps=[rng.randint(0, 3) for _ in range(b)])  # fmt: skip


# ------------------------------------------------------------------ edge cases
@pytest.mark.parametrize("layout", ["thd_thd_thd", "bshd_bshd_bshd", "t3hd"])
def test_zero_and_one_length_sequences(layout):
    run_varlen(layout, "padding_causal", torch.bfloat16, [0, 5, 1, 0, 64], [0, 5, 1, 0, 64], s_max_q=64, s_max_kv=64)


def test_capacity_larger_than_tokens():
    """A THD buffer with spare capacity past the last sequence (TE's inter-sequence padding)."""
    run_varlen("thd_thd_thd", "padding", torch.float16, [17, 33, 8], [17, 33, 8], gaps=[3, 0, 5], s_max_q=64, s_max_kv=64)


@pytest.mark.parametrize("layout", ["thd_thd_thd", "bshd_bshd_bshd"])
def test_decode_sq_1(layout):
    """One query per sequence against cached keys of varying length (decode)."""
    info = layout_info(QKVLayout.coerce(layout))
    lengths_kv = [40, 1, 128]
    if info.q_format == QKVFormat.thd:
        out, _ = run_varlen(layout, "padding", torch.bfloat16, [1, 1, 1], lengths_kv, s_max_q=1, s_max_kv=128)
    else:
        out, _ = run_varlen(layout, "padding_causal_bottom_right", torch.bfloat16, [1, 1, 1], lengths_kv, s_max_q=1, s_max_kv=128)
    assert torch.isfinite(out).all()


ONE_ROW_LQ, ONE_ROW_LKV = [1, 0, 1, 0, 1, 1], [40, 64, 0, 0, 1, 17]


@pytest.mark.parametrize("mask", PADDING_MASKS)
@pytest.mark.parametrize("layout", ["bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bs3hd", "sbhd_sbh2d"])
def test_empty_sequences_without_fills(layout, mask):
    """Sequences without queries, without keys, and without either, in a dense padding batch:
    te_cudnn binds lengths under which cuDNN writes every row (te_cudnn.row_fill) and skips the
    zero-fills (bottom-right causal keeps them); results land in NaN-poisoned memory, so an
    unwritten row would show."""
    packs = layout_info(QKVLayout.coerce(layout)).packs_qkv
    lq = [16, 0, 5, 0, 16, 9]
    lkv = lq if packs else [64, 30, 0, 0, 16, 40]
    if mask == "padding_causal_bottom_right":  # bottom-right: rows before the last len_kv ones see no key
        lkv = [max(n, nk) if nk else 0 for n, nk in zip(lq, lkv)]
    run_varlen(layout, mask, torch.bfloat16, lq, lkv, h=8, hg=8 if packs else 2, s_max_q=16 if not packs else 64,
               s_max_kv=64)  # fmt: skip


@pytest.mark.parametrize("mask", ["padding", "padding_causal_bottom_right"])
@pytest.mark.parametrize("layout", ["bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bshd_bs2hd"])
def test_one_query_row_with_empty_sequences(layout, mask):
    """max_seqlen_q = 1 with sequences that have no query and sequences that have no key. cuDNN's
    one-row engines compute row 0 of a sequence with no query (cuDNN 9.19, NaN-prefilled results): te_cudnn
    remaps the lengths, so that row is exactly zero in O and no gradient flows from it. (Top-left
    causal is left to the forward test below: its one row sees exactly one key, so dQ is exactly
    zero and a relative comparison measures rounding noise against zero: H100 run, ‖dQ‖ ~ 2e-6.)"""
    run_varlen(layout, mask, torch.bfloat16, ONE_ROW_LQ, ONE_ROW_LKV, h=8, hg=2, s_max_q=1, s_max_kv=64)


@pytest.mark.parametrize("mask", PADDING_MASKS)
def test_one_query_row_writes_every_row_of_out(mask):
    """The same batch, inference, into an ``out`` prefilled with NaN: O is not zero-filled first
    there, so every row must be written by cuDNN: zeros for the sequences without a query or key,
    the reference's rows elsewhere."""
    _check_out_rows(mask, 1, ONE_ROW_LQ, ONE_ROW_LKV)


@pytest.mark.parametrize("mask", PADDING_MASKS)
def test_longer_queries_write_every_row_of_out(mask):
    lq, lkv = [16, 0, 5, 0, 16, 9], [64, 30, 0, 0, 16, 40]
    if mask == "padding_causal_bottom_right":
        lkv = [max(n, nk) if nk else 0 for n, nk in zip(lq, lkv)]
    _check_out_rows(mask, 16, lq, lkv)


def _check_out_rows(mask, sq, lens_q, lens_kv):
    b, h, hg, d, skv = len(lens_q), 8, 2, 64, 64
    gen = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(b, sq, h, d, generator=gen, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(b, skv, hg, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    cu_q, cu_kv = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device="cuda")
                   for n in (lens_q, lens_kv))  # fmt: skip
    out = torch.full((b, sq, h, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    for _ in range(2):  # the first call prepares, the second runs the cached path
        out.fill_(float("nan"))
        got, _ = tc.fused_attn_fwd(False, sq, skv, cu_q, cu_kv, q, k, v, torch.bfloat16, None,
                                   qkv_layout="bshd_bshd_bshd", attn_mask_type=mask, out=out)  # fmt: skip
        assert got is out and torch.isfinite(out).all(), "every row of O must be written"
    lq, lkv = (torch.tensor(n, device="cuda") for n in (lens_q, lens_kv))
    rows = torch.arange(sq, device="cuda")
    valid = (rows < lq[:, None]) & (lkv[:, None] > 0)  # [b, sq]: rows that hold a query and see a key
    assert (out[~valid] == 0).all(), "rows past a sequence's end, or that see no key, are exactly zero"
    bhsd = [t.transpose(1, 2).float() for t in (q, k, v)]
    ref = attention_reference(*bhsd, attn_mask_type=mask, seqlens_q=lq, seqlens_kv=lkv).out.transpose(1, 2)
    torch.testing.assert_close(out[valid].float(), ref[valid], rtol=2e-2, atol=2e-2)
    prep = next(p for p in tc.ops._fwd_memo.values() if p.cfg.sq == sq and p.cfg.b == b and p.cfg.mask.name == mask)
    # te_cudnn.row_fill: longer queries under bottom-right causal keep the fill (rows that see no key); elsewhere
    # the fill is skipped only for an engine whose check on this machine passed (te_cudnn.plans.padded_rows)
    from te_cudnn.plans.padded_rows import record_for  # noqa: PLC0415

    record = record_for(prep.plan)
    if sq > 1 and mask == "padding_causal_bottom_right":
        assert prep.fill_out
    else:
        assert record is not None, "the engine was checked before the fill was decided"
        assert prep.fill_out == (not record["ok"]), record


def test_random_batches_reuse_a_handful_of_plans():
    """50 batches of random composition: results are right every time, plans stay few."""
    rng = random.Random(2026)
    before = tc.plan_cache.stats()
    for i in range(50):
        b = rng.randint(1, 8)
        lengths = [rng.randint(1, 256) for _ in range(b)]
        run_varlen("thd_thd_thd", "padding_causal", torch.bfloat16, lengths, lengths, h=4, hg=2, s_max_q=256,
                   s_max_kv=256, seed=i, check=(i % 5 == 0))  # fmt: skip
    after = tc.plan_cache.stats()
    built = after.builds - before.builds
    print(f"\n50 random THD batches: {built} plans built, {after.hits - before.hits} cache hits")
    assert built <= 4, f"{built} plans for 50 batches: lengths must not key plans"


def test_padding_mask_lengths_are_runtime_data():
    before = tc.plan_cache.stats().builds
    run_varlen("bshd_bshd_bshd", "padding", torch.bfloat16, [10, 64, 33], [64, 7, 20], s_max_q=64, s_max_kv=64)
    mid = tc.plan_cache.stats().builds
    run_varlen("bshd_bshd_bshd", "padding", torch.bfloat16, [64, 1, 2], [3, 64, 64], s_max_q=64, s_max_kv=64, seed=1)
    assert tc.plan_cache.stats().builds == mid and mid - before <= 2


# ------------------------------------------------------------------ paged KV (inference)
@pytest.mark.parametrize(
    "layout,sq,mask",
    [("paged_kv_bshd_bshd_bshd", 1, "padding"), ("paged_kv_sbhd_sbhd_sbhd", 1, "padding"),
     ("paged_kv_bshd_sbhd_sbhd", 1, "padding"), ("paged_kv_thd_bshd_bshd", 1, "padding"),
     ("paged_kv_bshd_bshd_bshd", 16, "padding_causal_bottom_right"), ("paged_kv_thd_sbhd_sbhd", 16, "padding_causal_bottom_right")],
    ids=["bshd-decode", "sbhd-decode", "bshd_q-sbhd_pool-decode", "thd_q-decode", "bshd-chunk16-causal_br", "thd_q-sbhd_pool-chunk16-causal_br"],
)  # fmt: skip
def test_paged_kv_inference(layout, sq, mask):
    h, hg, d, page, pages, num_pages = 8, 2, 64, 16, 4, 32
    lengths_kv = [40, 17, 64]
    b = len(lengths_kv)
    gen = torch.Generator(device="cuda").manual_seed(5)
    info = layout_info(QKVLayout.coerce(layout))
    pool_shape = (num_pages, page, hg, d) if info.kv_format == QKVFormat.bshd else (page, num_pages, hg, d)
    k_pool, v_pool = (torch.randn(pool_shape, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(1))[: b * pages]
    table = perm.view(b, pages).to(torch.int32).cuda()
    qfmt = info.q_format
    q = torch.randn({QKVFormat.bshd: (b, sq, h, d), QKVFormat.sbhd: (sq, b, h, d), QKVFormat.thd: (b * sq, h, d)}[qfmt],
                    generator=gen, device="cuda").to(torch.bfloat16)  # fmt: skip
    cu_q, cu_kv = _cu([sq] * b), _cu(lengths_kv)
    out, aux = tc.fused_attn_fwd(False, sq, page * pages, cu_q, cu_kv, q, k_pool, v_pool, q.dtype, None,
                                 page_table_k=table, page_table_v=table, qkv_layout=layout, attn_mask_type=mask)  # fmt: skip
    # reference: gather each sequence's pages into a dense [b, hg, s, d] cache
    s_kv = page * pages
    pool_k = k_pool if info.kv_format == QKVFormat.bshd else k_pool.transpose(0, 1)
    pool_v = v_pool if info.kv_format == QKVFormat.bshd else v_pool.transpose(0, 1)
    dense_k = pool_k[table.long()].reshape(b, s_kv, hg, d).permute(0, 2, 1, 3).float()
    dense_v = pool_v[table.long()].reshape(b, s_kv, hg, d).permute(0, 2, 1, 3).float()
    q_dense = {QKVFormat.bshd: lambda t: t.permute(0, 2, 1, 3), QKVFormat.sbhd: lambda t: t.permute(1, 2, 0, 3),
               QKVFormat.thd: lambda t: t.view(b, sq, h, d).permute(0, 2, 1, 3)}[qfmt]  # fmt: skip
    lq, lkv = torch.tensor([sq] * b, device="cuda"), torch.tensor(lengths_kv, device="cuda")
    r32 = attention_reference(q_dense(q).float(), dense_k, dense_v, attn_mask_type=mask, seqlens_q=lq, seqlens_kv=lkv)
    rlp = attention_reference(q_dense(q), dense_k.to(q.dtype), dense_v.to(q.dtype), attn_mask_type=mask, seqlens_q=lq,
                              seqlens_kv=lkv, compute_dtype=q.dtype)  # fmt: skip
    check_close("O (paged)", q_dense(out), r32.out, rlp.out, torch.bfloat16)


@pytest.mark.parametrize("batch_lengths", [True, False], ids=["BatchLengths", "per call"])
def test_cuda_graph_of_layers_reads_new_lengths_on_replay(monkeypatch, batch_lengths):
    """Four padding-mask layers (forward and backward) sharing one pair of cu_seqlens tensors,
    captured in one CUDA graph. With a BatchLengths built in the step, the lengths are derived
    by the first call of the capture (keyed by the driver's capture id) and read by the
    others; without one, every call derives them. Each replay after new lengths are written
    into the cu_seqlens tensors equals eager calls on them (O bit for bit; gradients to bf16
    rounding, dQ's sum order varying; a zero-length sequence included)."""
    from te_cudnn import launch, varlen  # noqa: PLC0415

    b, s, h, d, layers = 3, 128, 4, 64, 4
    gen = torch.Generator(device="cuda").manual_seed(11)
    qkv = [[torch.randn(b, s, h, d, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4)] for _ in range(layers)]
    cu_q, cu_kv = _cu([100, 128, 5]), _cu([128, 60, 90])
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="padding_causal")

    def step():
        outs = []
        lengths = tc.BatchLengths(cu_q, cu_kv) if batch_lengths else None
        for q, k, v, d_o in qkv:
            o, aux = tc.fused_attn_fwd(True, s, s, cu_q, cu_kv, q, k, v, torch.bfloat16, lengths=lengths, **kw)
            dq, dk, dv, *_ = tc.fused_attn_bwd(s, s, cu_q, cu_kv, q, k, v, o, d_o, torch.bfloat16, aux,
                                               lengths=lengths, **kw)  # fmt: skip
            outs.append((o, dq, dk, dv))
        return outs

    step()  # builds the plans (a first call may not be captured)
    torch.cuda.synchronize()
    computed, ids = [], []
    real_buffers = varlen.runtime_buffers if batch_lengths else varlen.derived_runtime_buffers
    real_id = varlen.capture_id

    def counting(*args):
        computed.append(ids[-1] if ids else None)
        return real_buffers(*args)

    def recording(index):
        ids.append(real_id(index))
        return ids[-1]

    # the derivation each call asks for: a BatchLengths' (launched) or the call's own (launched or replayed)
    monkeypatch.setattr(varlen, "runtime_buffers" if batch_lengths else "derived_runtime_buffers", counting)
    monkeypatch.setattr(varlen, "capture_id", recording)
    step()
    per_step = len(computed)
    if batch_lengths:
        assert 1 <= per_step <= 2, f"an eager step of {layers} layers computed its lengths {per_step} times"
    else:
        assert per_step == 2 * layers, f"{2 * layers} calls without BatchLengths derived their lengths {per_step} times"
    computed.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    if batch_lengths:
        assert ids and ids[0] is not None, "the driver named no capture id"
        assert len(set(ids)) == 1, f"capture ids {set(ids)}"
    assert len(computed) == per_step, f"{2 * layers} captured calls computed their lengths {len(computed)} times"
    for lens_q, lens_kv in (([128, 7, 0], [128, 1, 90]), ([1, 64, 128], [33, 128, 0])):
        cu_q.copy_(_cu(lens_q))
        cu_kv.copy_(_cu(lens_kv))
        graph.replay()
        eager = step()
        torch.cuda.synchronize()
        for layer, (got, want) in enumerate(zip(captured, eager)):
            assert torch.equal(got[0], want[0]), f"layer {layer} O after lengths {lens_q} / {lens_kv}"
            for name, g, w in zip(("dQ", "dK", "dV"), got[1:], want[1:]):  # the backward's dQ sums in any order
                torch.testing.assert_close(g, w, atol=1e-2, rtol=1.6e-2,
                                           msg=lambda m, n=name, i=layer: f"layer {i} {n} after {lens_q} / {lens_kv}: {m}")

    computed.clear()
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2):
        step()
    assert len(computed) == per_step, f"second capture derived its lengths {len(computed)} times"
    if batch_lengths:
        assert ids[-1] not in (None, ids[0]), f"second capture: ids {ids}"
    assert launch.capture_id(torch.cuda.current_device()) is None  # not capturing


def _nan_cache(numel: int) -> None:
    """Leave a NaN-filled block of ``numel`` floats in torch's cache: the next allocation of
    that size most likely reuses it, so a row left unwritten shows as NaN."""
    junk = torch.full((numel,), float("nan"), device="cuda")
    del junk


@pytest.mark.parametrize("mask", PADDING_MASKS)
def test_stats_of_self_attention_rows_are_written_by_cudnn(mask):
    """One cu_seqlens tensor for q and kv: every query row inside a sequence sees its own key,
    so te_cudnn leaves the stats to cuDNN (no -inf fill); each such row holds its logsumexp.
    Another kv tensor (other lengths): rows that see no key are -inf."""
    lens, h, d, spare = [37, 0, 64, 5], 2, 64, 6
    cu = _cu(lens)
    t = sum(lens) + spare  # padding tokens past the last sequence
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(t, h, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    _nan_cache(t * h)
    _, aux = tc.fused_attn_fwd(True, 64, 64, cu, cu, q, k, v, q.dtype, None, qkv_layout="thd_thd_thd",
                               attn_mask_type=mask)  # fmt: skip
    stats, scale = aux[0], d**-0.5
    for start, n in zip(cu.tolist(), lens):
        if n == 0:
            continue
        s = torch.einsum("qhd,khd->hqk", q[start:start + n].float(), k[start:start + n].float()) * scale
        if mask != "padding":
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        want = torch.logsumexp(s, dim=-1).transpose(0, 1).unsqueeze(-1)  # [n, h, 1]
        got = stats[start:start + n]
        assert torch.isfinite(got).all(), f"{mask}: a row inside a sequence was left unwritten"
        torch.testing.assert_close(got, want, atol=2e-2, rtol=0)
    cu_kv = _cu([37, 0, 0, 5])  # the third sequence's 64 queries see no key
    _nan_cache(t * h)
    _, aux = tc.fused_attn_fwd(True, 64, 64, cu, cu_kv, q, k, v, q.dtype, None, qkv_layout="thd_thd_thd",
                               attn_mask_type="padding")  # fmt: skip
    start = cu.tolist()[2]
    assert bool((aux[0][start:start + 64] == float("-inf")).all())
