"""GPU: every entry point with the operand check on (``te_cudnn.launch.check_operands(True)``,
as ``TE_CUDNN_CHECK_OPERANDS=1`` does) binds exactly what its plans' graphs declare.

Each valid call must run with the check on without a mismatch being raised (a ValueError from
the check fails the test with the operand, its declared and its bound geometry), must be
checked (the check's counters move: on the tensors wherever a launch path hands tensors to
``execute``, on the pointers where it launches from pointers), and must still give the answer
of ``te_cudnn.reference`` (tolerances of ``te_cudnn.testing.check_close``): ``fused_attn_fwd``
and ``fused_attn_bwd`` over dense, packed, padding-mask, THD, bias, sink, max512, paged-KV and
FP8 configurations, ``fused_attn_decode`` over dense and paged caches (with ``cache_seqlens`` as a
column of an int32 [b, 2] table: a right answer or a ValueError naming ``cache_seqlens``, never a
wrong answer), ``DotProductAttention``, ``scaled_dot_product_attention`` and ``fused_attention``.
A wrong binding raises before anything is launched.
"""

from __future__ import annotations

from array import array
from typing import Any, Callable

import pytest
import torch

import te_cudnn as tc
from te_cudnn import launch
from te_cudnn.enums import META_DO, META_DQKV, META_O, META_QKV, META_S, QKVLayout
from te_cudnn.reference import attention_reference, attention_reference_fp8
from te_cudnn.testing import check_close, make_qkv, rel_error, to_bhsd

pytestmark = pytest.mark.gpu

BF16, F16 = torch.bfloat16, torch.float16
MAX512 = tc.FusedAttnBackend.F16_max512_seqlen


@pytest.fixture(autouse=True)
def _checking():
    before = launch.checking_operands()
    launch.check_operands(True)
    yield
    launch.check_operands(before)


def _counts() -> tuple[int, int]:
    return launch.operand_checks["tensors"], launch.operand_checks["pointers"]


def checked(fn: Callable, *args: Any, on_tensors: bool = False, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with the check on: it must compare the operands of what ``fn``
    launches, at least as pointers, and as tensors with ``on_tensors``, or when ``fn`` is
    fused_attn_fwd / fused_attn_bwd given ``_prepared`` and its prepared call is not the plain
    one (the plain path launches from pointers; every other path hands tensors to execute)."""
    tensors, pointers = _counts()
    result = fn(*args, **kwargs)
    torch.cuda.synchronize()
    now_tensors, now_pointers = _counts()
    name = getattr(fn, "__name__", type(fn).__name__)
    assert now_tensors + now_pointers > tensors + pointers, f"{name}: no launch was checked"
    prepared = kwargs.get("_prepared")
    if on_tensors or (prepared and not prepared[-1].plain):
        assert now_tensors > tensors, f"{name}: its launches were not checked on their tensors"
    return result


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _references(inputs: list[torch.Tensor], d_o: torch.Tensor, dtype: torch.dtype, **ref_kw: Any) -> dict:
    """The fp32 reference and the same computation in ``dtype`` (``check_close``'s yardstick):
    compute dtype -> (ReferenceOutput, gradients of ``inputs``: q, k, v, then any of attn_bias and
    softmax_offset named in ``ref_kw`` as ``None`` placeholders, in that order)."""
    out = {}
    for compute in (torch.float32, dtype):
        leaves = [t.detach().to(compute).requires_grad_() for t in inputs]
        kw = dict(ref_kw)
        extra = iter(leaves[3:])
        for name in ("attn_bias", "softmax_offset"):
            if name in kw and kw[name] is None:
                kw[name] = next(extra)
        ref = attention_reference(*leaves[:3], compute_dtype=compute, **kw)
        out[compute] = (ref, torch.autograd.grad(ref.out, leaves, d_o.to(compute)))
    return out


# ============================================================ fused_attn_fwd / fused_attn_bwd, dense formats

DENSE_CASES = {
    "bshd-gqa-causal": dict(layout="bshd_bshd_bshd", mask="causal", hg=2),
    "sbhd-no_mask-fp16": dict(layout="sbhd_sbhd_sbhd", mask="no_mask", dtype=F16),
    "sbh3d-packed-causal": dict(layout="sbh3d", mask="causal"),
    "bshd_bs2hd-cross": dict(layout="bshd_bs2hd", mask="no_mask", sq=96, skv=160),
    "bshd-padding_causal": dict(layout="bshd_bshd_bshd", mask="padding_causal", hg=2, lengths=([100, 37], [128, 64])),
    "sbhd-padding-fp16": dict(layout="sbhd_sbhd_sbhd", mask="padding", dtype=F16, lengths=([128, 5], [77, 128])),
    "bshd-post_scale_bias": dict(layout="bshd_bshd_bshd", mask="no_mask", bias_shape=(1, 4, 128, 128)),
    "bshd-post_scale_bias-skv100": dict(layout="bshd_bshd_bshd", mask="causal", sq=100, skv=100,
                                        bias_shape=(1, 4, 100, 100)),  # rows not 16-byte multiples: copied
    "bshd-learnable-sink": dict(layout="bshd_bshd_bshd", mask="causal", hg=2, softmax="learnable"),
    "sbhd-off_by_one-sink": dict(layout="sbhd_sbhd_sbhd", mask="no_mask", softmax="off_by_one"),
    "max512-bshd-causal": dict(layout="bshd_bshd_bshd", mask="causal", backend=MAX512),
    "max512-sb3hd-bias": dict(layout="sb3hd", mask="no_mask", backend=MAX512, bias_shape=(1, 4, 128, 128)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(DENSE_CASES))
def test_fused_attn_fwd_bwd(name: str) -> None:
    c = {"dtype": BF16, "b": 2, "h": 4, "hg": 4, "sq": 128, "skv": 128, "d": 64, "bias_shape": None,
         "softmax": "vanilla", "backend": None, "lengths": None, **DENSE_CASES[name]}  # fmt: skip
    layout, dtype, b, h, sq, skv = QKVLayout[c["layout"]], c["dtype"], c["b"], c["h"], c["sq"], c["skv"]
    gen = _gen(7)
    q, k, v = make_qkv(layout, b, h, c["hg"], sq, skv, c["d"], dtype=dtype, generator=gen)
    bias = None
    if c["bias_shape"] is not None:
        bias = (torch.randn(c["bias_shape"], generator=gen, device="cuda") * 0.5).to(dtype)
    offset = torch.randn(1, h, 1, 1, generator=gen, device="cuda") if c["softmax"] == "learnable" else None
    lens_q, lens_kv = c["lengths"] or ([sq] * b, [skv] * b)
    cu_q, cu_kv = _cu(lens_q), _cu(lens_kv)
    kw = dict(qkv_layout=layout.name, attn_mask_type=c["mask"], softmax_type=c["softmax"],
              attn_bias_type="no_bias" if bias is None else "post_scale_bias")  # fmt: skip

    out, aux = checked(tc.fused_attn_fwd, True, sq, skv, cu_q, cu_kv, q, k, v, dtype, c["backend"], attn_bias=bias,
                       softmax_offset=offset, _prepared=[], **kw)  # fmt: skip
    d_o = (torch.randn(out.shape, generator=gen, device="cuda") * 0.5).to(dtype)
    dq, dk, dv, dbias, d_sink = checked(tc.fused_attn_bwd, sq, skv, cu_q, cu_kv, q, k, v, out, d_o, dtype, aux,
                                        c["backend"], _prepared=[], **kw)  # fmt: skip

    inputs = [to_bhsd(t, layout) for t in (q, k, v)] + [t for t in (bias, offset) if t is not None]
    ref_kw = dict(attn_mask_type=c["mask"], attn_bias_type=kw["attn_bias_type"], softmax_type=c["softmax"])
    if bias is not None:
        ref_kw["attn_bias"] = None  # a leaf: its gradient is compared with dBias
    if offset is not None:
        ref_kw["softmax_offset"] = None
    if "padding" in c["mask"]:
        ref_kw.update(seqlens_q=cu_q.diff(), seqlens_kv=cu_kv.diff())
    refs = _references(inputs, to_bhsd(d_o, layout), dtype, **ref_kw)
    (ref32, g32), (reflp, glp) = refs[torch.float32], refs[dtype]
    check_close(f"O {name}", to_bhsd(out, layout), ref32.out, reflp.out, dtype)
    for grad_name, got, want, same in zip(("dQ", "dK", "dV"), (dq, dk, dv), g32, glp):
        check_close(f"{grad_name} {name}", to_bhsd(got, layout), want, same, dtype)
    if c["backend"] != MAX512:  # aux[0]: the fp32 logsumexp (max512 saves the softmax itself)
        finite = torch.isfinite(ref32.lse)
        assert rel_error(aux[0][finite], ref32.lse[finite]) < 1e-4, f"{name}: softmax stats"
    if bias is not None:
        assert dbias is not None and dbias.shape == bias.shape
        check_close(f"dBias {name}", dbias, g32[3], glp[3], dtype)
    if offset is not None:
        assert d_sink is not None and d_sink.shape == offset.shape
        assert rel_error(d_sink, g32[-1]) < 2e-2, f"{name}: d_softmax_offset"


def test_dropout_binds_its_seed_and_offset() -> None:
    """Dropout binds rng_state's seed and offset as [1, 1, 1, 1] int64 operands (the backward the
    forward's): no mismatch; without the reference's mask, the results are only checked finite and
    the backward is checked to replay the forward's mask (two backwards agree up to the order of
    their accumulations; another mask would move dV by its order of magnitude)."""
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 2, 128, 128, 64, generator=_gen(3))
    cu = _cu([128, 128])
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", dropout=0.1)
    out, aux = checked(tc.fused_attn_fwd, True, 128, 128, cu, cu, q, k, v, BF16, None, **kw)
    d_o = torch.randn_like(out)
    first = checked(tc.fused_attn_bwd, 128, 128, cu, cu, q, k, v, out, d_o, BF16, aux, None, **kw)
    second = checked(tc.fused_attn_bwd, 128, 128, cu, cu, q, k, v, out, d_o, BF16, aux, None, **kw)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in first[:3])
    assert all(rel_error(a, b) < 1e-2 for a, b in zip(first[:3], second[:3]))


# ============================================================================ THD

def _thd_maps(lengths: list[int], s_max: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index maps between THD tokens and a padded [b, s_max] batch: for each (sequence, position)
    its token and whether it holds one; for each token its sequence and position."""
    lens = torch.tensor(lengths, device="cuda")
    starts = torch.cat([lens.new_zeros(1), lens.cumsum(0)[:-1]])
    pos = torch.arange(s_max, device="cuda")
    valid = pos.view(1, -1) < lens.view(-1, 1)
    token = torch.where(valid, starts.view(-1, 1) + pos.view(1, -1), 0)
    seq_of = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), lens)
    pos_of = torch.arange(int(lens.sum()), device="cuda") - starts[seq_of]
    return token, valid, seq_of, pos_of


@pytest.mark.parametrize("layout", ["thd_thd_thd", "t3hd", "thd_bshd_bshd"])
def test_fused_attn_fwd_bwd_thd(layout: str) -> None:
    """THD tensors (ragged offsets, packed tokens; THD queries against a bshd cache) against the
    reference on the same sequences scattered into a padded batch."""
    gen = _gen(11)
    lengths, s_max, h, hg, d, dtype = [100, 37, 64], 128, 4, 4 if layout == "t3hd" else 2, 64, BF16
    b, t = len(lengths), sum(lengths)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    if layout == "t3hd":
        q, k, v = rnd(t, 3, h, d).unbind(1)
    elif layout == "thd_thd_thd":
        q, k, v = rnd(t, h, d), rnd(t, hg, d), rnd(t, hg, d)
    else:  # every sequence's cache is full length: s_max keys each
        q, k, v = rnd(t, h, d), rnd(b, s_max, hg, d), rnd(b, s_max, hg, d)
    kv_lengths = lengths if layout != "thd_bshd_bshd" else [s_max] * b
    cu_q, cu_kv = _cu(lengths), _cu(kv_lengths)
    kw = dict(qkv_layout=layout, attn_mask_type="padding_causal_bottom_right")
    out, aux = checked(tc.fused_attn_fwd, True, s_max, s_max, cu_q, cu_kv, q, k, v, dtype, None, on_tensors=True, **kw)
    assert out.shape == (t, h, d)
    d_o = rnd(t, h, d)
    dq, dk, dv, _, _ = checked(tc.fused_attn_bwd, s_max, s_max, cu_q, cu_kv, q, k, v, out, d_o, dtype, aux, None,
                               on_tensors=True, **kw)  # fmt: skip

    token, valid, seq_of, pos_of = _thd_maps(lengths, s_max)
    kv_token, kv_valid, _, _ = _thd_maps(kv_lengths, s_max)

    def dense(x: torch.Tensor, tok: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:  # [t, h, d] -> [b, h, s, d]
        return (x[tok] * ok[..., None, None]).transpose(1, 2)

    results = {}
    for compute in (torch.float32, dtype):
        leaves = [x.detach().to(compute).requires_grad_() for x in (q, k, v)]
        qb = dense(leaves[0], token, valid)
        kb, vb = ((dense(x, kv_token, kv_valid) for x in leaves[1:]) if layout != "thd_bshd_bshd"
                  else (x.transpose(1, 2) for x in leaves[1:]))  # fmt: skip
        ref = attention_reference(qb, kb, vb, attn_mask_type="padding_causal_bottom_right",
                                  seqlens_q=cu_q.diff(), seqlens_kv=cu_kv.diff(), compute_dtype=compute)  # fmt: skip
        ref_out = ref.out.transpose(1, 2)[seq_of, pos_of]  # back to [t, h, d]
        results[compute] = (ref_out, torch.autograd.grad(ref_out, leaves, d_o.to(compute)))
    (o32, g32), (olp, glp) = results[torch.float32], results[dtype]
    check_close(f"O {layout}", out, o32, olp, dtype)
    for grad_name, got, want, same in zip(("dQ", "dK", "dV"), (dq, dk, dv), g32, glp):
        check_close(f"{grad_name} {layout}", got, want, same, dtype)


# ============================================================================ paged KV, FP8


def test_fused_attn_fwd_paged_kv() -> None:
    """A paged K/V cache with a shuffled page table (inference), against the reference on the
    gathered cache."""
    gen = _gen(5)
    b, h, hg, d, page, pages, sq, dtype = 3, 8, 2, 64, 64, 4, 16, BF16
    lengths = [256, 100, 17]
    k, v = (torch.randn(b, page * pages, hg, d, generator=gen, device="cuda").to(dtype) for _ in range(2))
    q = torch.randn(b, sq, h, d, generator=gen, device="cuda").to(dtype)
    table = torch.randperm(b * pages, generator=torch.Generator().manual_seed(5)).to(torch.int32).cuda().view(b, pages)
    k_pool, v_pool = (torch.empty(b * pages, page, hg, d, dtype=dtype, device="cuda") for _ in range(2))
    k_pool[table.long()] = k.view(b, pages, page, hg, d)
    v_pool[table.long()] = v.view(b, pages, page, hg, d)
    cu_q, cu_kv = _cu([sq] * b), _cu(lengths)
    out, _ = checked(tc.fused_attn_fwd, False, sq, page * pages, cu_q, cu_kv, q, k_pool, v_pool, dtype, None,
                     page_table_k=table, page_table_v=table, qkv_layout="paged_kv_bshd_bshd_bshd",
                     attn_mask_type="padding_causal_bottom_right", on_tensors=True)  # fmt: skip
    ref_kw = dict(attn_mask_type="padding_causal_bottom_right", seqlens_q=cu_q.diff(), seqlens_kv=cu_kv.diff())
    bhsd = [x.transpose(1, 2) for x in (q, k, v)]
    r32 = attention_reference(*(x.float() for x in bhsd), **ref_kw)
    rlp = attention_reference(*bhsd, compute_dtype=dtype, **ref_kw)
    check_close("O paged", out.transpose(1, 2), r32.out, rlp.out, dtype)


@pytest.mark.fp8
def test_fused_attn_fwd_bwd_fp8() -> None:
    """FP8 (E4M3 forward, E5M2 backward, TE's explicit-tensor scaling): the scaling operands are
    one-slot views of the metadata tables. Bounds as tests/test_fp8_gpu.py's."""
    b, h, s, d = 2, 4, 256, 128
    gen = _gen(0)
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, b, h, h, s, s, d, dtype=BF16, generator=gen)
    meta = tc.Fp8AttentionMeta(device="cuda")
    for x in (q, k, v):  # one calibration step, so the scales fit the data (delayed scaling)
        meta.quantize(x, "qkv")
    meta.fwd.amax_history[0, META_S] = 1.0
    meta.fwd.amax_history[0, META_O] = v.abs().max()
    meta.bwd.amax_history[0, :] = 1.0
    meta.update()
    q8, k8, v8 = (meta.quantize(x, "qkv") for x in (q, k, v))
    cu = _cu([s] * b)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    out8, aux = checked(tc.fused_attn_fwd, True, s, s, cu, cu, q8, k8, v8, torch.float8_e4m3fn, None, on_tensors=True,
                        **kw, **meta.fwd_kwargs())  # fmt: skip
    f = meta.fwd
    qb, kb, vb = (x.transpose(1, 2) for x in (q8, k8, v8))
    emu = attention_reference_fp8(qb, kb, vb, descale_qkv=f.scale_inv[META_QKV], scale_s=f.scale[META_S],
                                  descale_s=f.scale_inv[META_S], scale_o=f.scale[META_O],
                                  attn_mask_type="causal")  # fmt: skip
    out = out8.transpose(1, 2).float() * f.scale_inv[META_O]
    assert _rmse_range(out, emu.out) < 0.01
    leaves = [x.float() * f.scale_inv[META_QKV] for x in (qb, kb, vb)]
    leaves = [x.clone().requires_grad_() for x in leaves]
    ref = attention_reference(*leaves, attn_mask_type="causal")
    assert _rmse_range(out, ref.out) < 0.05
    d_o8 = meta.quantize(torch.randn(out8.shape, device="cuda") * 0.1, "do")
    dq8, dk8, dv8, _, _ = checked(tc.fused_attn_bwd, s, s, cu, cu, q8, k8, v8, out8, d_o8, torch.float8_e4m3fn, aux,
                                  None, on_tensors=True, **kw, **meta.bwd_kwargs())  # fmt: skip
    bw = meta.bwd
    grads = torch.autograd.grad(ref.out, leaves, d_o8.transpose(1, 2).float() * bw.scale_inv[META_DO])
    for grad_name, got, want in zip(("dQ", "dK", "dV"), (dq8, dk8, dv8), grads):
        err = _rmse_range(got.transpose(1, 2).float() * bw.scale_inv[META_DQKV], want)
        assert err < 0.10, f"{grad_name}: {err:.4f}"


def _rmse_range(a: torch.Tensor, b: torch.Tensor) -> float:
    """TransformerEngine's FP8 error measure: RMSE over the reference's value range."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).pow(2).mean().sqrt() / (b.max() - b.min()).clamp_min(1e-12))


# ============================================================================ fused_attn_decode


def _decode_cache(b: int, paged: bool, dtype: torch.dtype = BF16):
    """A K/V cache (a page pool with a shuffled page table, or dense) and its [b, hg, s, d] view."""
    gen = _gen(21)
    hg, d, page, pages = 2, 64, 16, 6

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    if not paged:
        k, v = rnd(b, page * pages, hg, d), rnd(b, page * pages, hg, d)
        return k, v, None, [x.transpose(1, 2) for x in (k, v)]
    n = b * pages + 2
    k, v = rnd(n, page, hg, d), rnd(n, page, hg, d)
    table = torch.randperm(n, generator=torch.Generator().manual_seed(21))[: b * pages].view(b, pages)
    table = table.to(torch.int32).cuda()
    dense = [x[table.long()].reshape(b, page * pages, hg, d).transpose(1, 2) for x in (k, v)]
    return k, v, table, dense


def _decode_reference(q: torch.Tensor, dense: list, lens: torch.Tensor):
    mask = "padding" if q.shape[1] == 1 else "padding_causal_bottom_right"
    kw = dict(attn_mask_type=mask, seqlens_q=torch.full_like(lens, q.shape[1]), seqlens_kv=lens)
    qb = q.transpose(1, 2)
    return (attention_reference(qb.float(), dense[0].float(), dense[1].float(), **kw),
            attention_reference(qb, dense[0], dense[1], compute_dtype=q.dtype, **kw))  # fmt: skip


@pytest.mark.parametrize("sq", [1, 3], ids=["decode", "speculative"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_fused_attn_decode(paged: bool, sq: int) -> None:
    b, h = 4, 8
    k, v, table, dense = _decode_cache(b, paged)
    q = torch.randn(b, sq, h, 64, device="cuda", generator=_gen(2)).to(BF16)
    lens = torch.tensor([96, 17, 0, 50], dtype=torch.int32, device="cuda")
    lens[2] = sq  # every query sees at least itself
    out, lse = checked(tc.fused_attn_decode, q, k, v, lens, table, return_softmax_lse=True, on_tensors=True)
    r32, rlp = _decode_reference(q, dense, lens)
    check_close("O decode", out.transpose(1, 2), r32.out, rlp.out, BF16)
    torch.testing.assert_close(lse, r32.lse, atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("column", [0, 1], ids=["column0", "column1-unaligned"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_fused_attn_decode_cache_seqlens_column_view(paged: bool, column: int) -> None:
    """``cache_seqlens`` as ``lens2d[:, column]`` of an int32 [b, 2] table (stride 2; column 1
    also starts 4 bytes past a 16-byte boundary); the other column holds other lengths, so a
    read with the wrong stride gives a wrong answer. The call must answer right or raise a
    ValueError naming cache_seqlens."""
    b, h = 4, 8
    k, v, table, dense = _decode_cache(b, paged)
    q = torch.randn(b, 1, h, 64, device="cuda", generator=_gen(4)).to(BF16)
    lens = torch.tensor([96, 17, 1, 50], dtype=torch.int32, device="cuda")
    other = torch.tensor([3, 90, 64, 2], dtype=torch.int32, device="cuda")
    lens2d = torch.stack([lens, other], dim=1) if column == 0 else torch.stack([other, lens], dim=1)
    view = lens2d[:, column]
    assert view.stride() == (2,) and torch.equal(view, lens)
    try:
        out = checked(tc.fused_attn_decode, q, k, v, view, table)
    except ValueError as err:
        assert "cache_seqlens" in str(err), f"a ValueError that does not name cache_seqlens: {err}"
        return
    r32, rlp = _decode_reference(q, dense, lens)
    check_close(f"O decode, cache_seqlens column {column}", out.transpose(1, 2), r32.out, rlp.out, BF16)
    again = checked(tc.fused_attn_decode, q, k, v, lens, table)  # the dense lengths: the same answer
    assert torch.equal(out, again)


# ============================================================================ the module, SDPA, the autograd function


@pytest.mark.parametrize("fmt,mask", [("bshd", "causal"), ("sbhd", "no_mask")])
def test_dot_product_attention_module(fmt: str, mask: str) -> None:
    b, h, hg, s, d = 2, 8, 2, 128, 64
    gen = _gen(9)
    shape = (lambda n: (b, s, n, d)) if fmt == "bshd" else (lambda n: (s, b, n, d))
    q, k, v = (torch.randn(*shape(n), generator=gen, device="cuda").to(BF16).requires_grad_() for n in (h, hg, hg))
    attn = tc.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type=mask)
    out = checked(attn, q, k, v)
    d_out = torch.randn(out.shape, generator=gen, device="cuda").to(BF16)
    checked(out.backward, d_out)
    perm = (0, 2, 1, 3) if fmt == "bshd" else (1, 2, 0, 3)
    back = (0, 2, 1, 3) if fmt == "bshd" else (2, 0, 1, 3)  # [b, h, s, d] -> the format
    for compute in (torch.float32, BF16):
        leaves = [x.detach().permute(perm).to(compute).requires_grad_() for x in (q, k, v)]
        ref = attention_reference(*leaves, attn_mask_type=mask, compute_dtype=compute)
        ref_out = ref.out.permute(back).reshape(out.shape)
        grads = torch.autograd.grad(ref_out, leaves, d_out.to(compute))
        if compute == torch.float32:
            o32, g32 = ref_out, grads
        else:
            olp, glp = ref_out, grads
    check_close("O module", out, o32, olp, BF16)
    for name, x, want, same in zip(("dQ", "dK", "dV"), (q, k, v), g32, glp):
        check_close(f"{name} module", x.grad.permute(perm), want, same, BF16)


@pytest.mark.parametrize("mask", ["causal", "float"])
def test_scaled_dot_product_attention(mask: str) -> None:
    """The SDPA drop-in on [b, h, s, d] views of [b, s, h, d] tensors, causal or with a float mask
    (a post-scale bias, with its gradient)."""
    b, h, sq, skv, d = 2, 4, 96, 160, 64
    gen = _gen(13)

    def leaf(s: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(b, s, h, d, generator=gen, device="cuda").to(F16).requires_grad_()
        return x, x.transpose(1, 2)

    (q_leaf, q), (k_leaf, k), (v_leaf, v) = leaf(sq), leaf(skv), leaf(skv)
    attn_mask = None
    if mask == "float":
        attn_mask = (torch.randn(1, h, sq, skv, generator=gen, device="cuda") * 0.5).to(F16).requires_grad_()
    out = checked(tc.scaled_dot_product_attention, q, k, v, attn_mask=attn_mask, is_causal=mask == "causal")
    d_out = torch.randn(out.shape, generator=gen, device="cuda").to(F16)
    checked(out.backward, d_out)
    inputs = [q, k, v] + ([attn_mask] if attn_mask is not None else [])
    if mask == "causal":  # torch's is_causal: top-left aligned
        ref_kw: dict[str, Any] = {"attn_mask_type": "causal"}
    else:  # a float mask is added to the scaled scores: a post-scale bias, its gradient dBias
        ref_kw = {"attn_mask_type": "no_mask", "attn_bias_type": "post_scale_bias", "attn_bias": None}
    refs = _references(inputs, d_out, F16, **ref_kw)
    (ref32, g32), (reflp, glp) = refs[torch.float32], refs[F16]
    check_close("O sdpa", out, ref32.out, reflp.out, F16)
    for name, x, want, same in zip(("dQ", "dK", "dV"), (q_leaf, k_leaf, v_leaf), g32, glp):
        check_close(f"{name} sdpa", x.grad.transpose(1, 2), want, same, F16)
    if attn_mask is not None:
        # broadcast over the batch: rounded twice (cuDNN's dBias, then its sum over b)
        check_close("d_mask sdpa", attn_mask.grad, g32[3], glp[3], F16, roundings=2)


@pytest.mark.parametrize("softmax", ["vanilla", "learnable"])
def test_fused_attention_autograd_function(softmax: str) -> None:
    b, h, hg, s, d = 2, 8, 2, 128, 64
    layout = QKVLayout.bshd_bshd_bshd
    gen = _gen(17)
    q, k, v = (t.detach().requires_grad_() for t in make_qkv(layout, b, h, hg, s, s, d, dtype=F16, generator=gen))
    offset = None
    if softmax == "learnable":
        offset = torch.randn(1, h, 1, 1, generator=gen, device="cuda").requires_grad_()
    out = checked(tc.fused_attention, q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal",
                  softmax_type=softmax, softmax_offset=offset)  # fmt: skip
    grad = torch.randn(out.shape, generator=gen, device="cuda").to(F16)
    checked(out.backward, grad.transpose(1, 2).contiguous().transpose(1, 2))  # a non-contiguous incoming gradient
    inputs = [to_bhsd(t.detach(), layout) for t in (q, k, v)] + ([offset.detach()] if offset is not None else [])
    ref_kw: dict[str, Any] = {"attn_mask_type": "causal", "softmax_type": softmax}
    if offset is not None:
        ref_kw["softmax_offset"] = None
    refs = _references(inputs, to_bhsd(grad, layout), F16, **ref_kw)
    (ref32, g32), (reflp, glp) = refs[torch.float32], refs[F16]
    check_close("O fused_attention", to_bhsd(out.detach(), layout), ref32.out, reflp.out, F16)
    for name, x, want, same in zip(("dQ", "dK", "dV"), (q, k, v), g32, glp):
        check_close(f"{name} fused_attention", to_bhsd(x.grad, layout), want, same, F16)
    if offset is not None:
        assert rel_error(offset.grad, g32[3]) < 2e-2, "d_softmax_offset"


# ============================================================================ wrong bindings


def test_a_wrong_binding_raises_before_anything_is_launched() -> None:
    """The plan of a real call, bound wrongly by hand: execute refuses other strides, a pointer
    array of the wrong length or with a null pointer is refused by launch; the output buffer
    stays untouched."""
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 128, 128, 64, generator=_gen(1))
    cu = _cu([128, 128])
    prepared: list = []
    out, aux = checked(tc.fused_attn_fwd, False, 128, 128, cu, cu, q, k, v, BF16, None, qkv_layout="bshd_bshd_bshd",
                       attn_mask_type="causal", _prepared=prepared)  # fmt: skip
    plan = prepared[0].get_plan()
    sentinel = torch.full_like(out, 7.0)
    buffers = [q.transpose(1, 2).contiguous().transpose(1, 2), k, v, sentinel, torch.empty_like(aux[0])]
    with pytest.raises(ValueError, match=r"q \(uid 1\): geometry differs"):
        launch.execute(plan, buffers, q.device)
    ptrs = [t.data_ptr() for t in [q, k, v, sentinel, aux[0]]]
    with pytest.raises(ValueError, match="pointers for the"):
        launch.launch(plan, array("Q", ptrs[:-1]), q.device.index)
    with pytest.raises(ValueError, match="is null"):
        launch.launch(plan, array("Q", [0, *ptrs[1:]]), q.device.index)
    torch.cuda.synchronize()
    assert bool((sentinel == 7.0).all()), "a refused binding must launch nothing"


def test_a_malformed_o_on_a_repeated_signature_is_refused() -> None:
    """O of a batch of one has the strides of a batch of two; after a valid backward of the same
    call signature, such an O must still be refused (by validation or by the operand check), not
    read past its end."""
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 128, 128, 64, generator=_gen(2))
    cu = _cu([128, 100])
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="padding_causal")
    out, aux = checked(tc.fused_attn_fwd, True, 128, 128, cu, cu, q, k, v, BF16, None, **kw)
    d_o = torch.randn_like(out)
    checked(tc.fused_attn_bwd, 128, 128, cu, cu, q, k, v, out, d_o, BF16, aux, None, **kw)
    small = out[:1].clone()
    assert small.stride() == out.stride()
    with pytest.raises(ValueError, match=r"\bo\b"):
        tc.fused_attn_bwd(128, 128, cu, cu, q, k, v, small, d_o, BF16, aux, None, **kw)
