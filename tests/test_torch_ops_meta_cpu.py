"""te_cudnn's custom operators on fake and meta tensors: the fake implementations against what the
real implementation allocates, for every layout and for FP8, and the registered autograd formula
on meta tensors; CPU only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from te_cudnn import torch_ops
from te_cudnn.config import describe_fwd
from te_cudnn.enums import META_QKV, FusedAttnBackend, QKVFormat, QKVLayout, QKVLayoutGroup
from te_cudnn.fp8 import Fp8AttentionMeta, Fp8Table, quantize
from te_cudnn.layouts import alloc_output, alloc_qkv_grads, layout_info
from te_cudnn.torch_ops import unpack_grads


BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
MAX512 = int(FusedAttnBackend.F16_max512_seqlen)
PAGE, PAGES, NUM_PAGES = 8, 4, 12  # paged KV: tokens per page, pages per sequence, pages in the pool


# ================================================================================ inputs per layout


@dataclass(frozen=True)
class Dims:
    b: int = 2
    h: int = 4
    hg: int = 4
    sq: int = 16
    skv: int = 16
    d_qk: int = 64
    d_v: int = 64


MHA = Dims()
GQA_CROSS = Dims(h=4, hg=2, sq=16, skv=32)  # packed k/v: one head dim
GQA_CROSS_DV = Dims(h=4, hg=2, sq=16, skv=32, d_v=32)


def _layout_cases():
    """Every QKVLayout member: MHA self-attention, plus GQA + cross attention (and d_v != d_qk
    where k and v are separate tensors) wherever the layout allows it."""
    for layout in QKVLayout:
        info = layout_info(layout)
        yield pytest.param(layout, MHA, id=f"{layout.name}-mha")
        if info.packs_kv:
            yield pytest.param(layout, GQA_CROSS, id=f"{layout.name}-gqa-cross")
        elif not info.packs_qkv:  # one q/k/v buffer needs h == hg, sq == skv, d_qk == d_v
            yield pytest.param(layout, GQA_CROSS_DV, id=f"{layout.name}-gqa-cross-dv")


def _shape(fmt: QKVFormat, b: int, s: int, *rest: int) -> tuple[int, ...]:
    if fmt == QKVFormat.sbhd:
        return (s, b, *rest)
    if fmt == QKVFormat.bshd:
        return (b, s, *rest)
    if fmt == QKVFormat.thd:
        return (b * s, *rest)
    assert fmt == QKVFormat.bhsd and len(rest) == 2
    return (b, rest[0], s, rest[1])


def make_inputs(layout: QKVLayout, d: Dims, device: str, dtype: torch.dtype = BF16) -> dict:
    """q, k, v (views of one buffer where the layout packs), cu_seqlens, page tables and the
    max sequence lengths, as a caller passes them; paged layouts get page pools
    ``[num_pages, page_size, hg, d]`` (bshd pools) or ``[page_size, num_pages, hg, d]`` (sbhd)."""
    info = layout_info(layout)
    qf, kvf, g = info.q_format, info.kv_format, info.group

    def empty(shape) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device)

    page_k = page_v = None
    max_kv = d.skv
    if g == QKVLayoutGroup.L_3HD:
        q, k, v = empty(_shape(qf, d.b, d.sq, 3, d.h, d.d_qk)).unbind(-3)
    elif g == QKVLayoutGroup.L_H3D:
        q, k, v = empty(_shape(qf, d.b, d.sq, d.h, 3, d.d_qk)).unbind(-2)
    else:
        q = empty(_shape(qf, d.b, d.sq, d.h, d.d_qk))
        if g == QKVLayoutGroup.L_HD_2HD:
            k, v = empty(_shape(kvf, d.b, d.skv, 2, d.hg, d.d_qk)).unbind(-3)
        elif g == QKVLayoutGroup.L_HD_H2D:
            k, v = empty(_shape(kvf, d.b, d.skv, d.hg, 2, d.d_qk)).unbind(-2)
        elif info.is_paged:
            def pool(dim: int) -> torch.Tensor:
                return empty((NUM_PAGES, PAGE, d.hg, dim) if kvf == QKVFormat.bshd else (PAGE, NUM_PAGES, d.hg, dim))

            k, v = pool(d.d_qk), pool(d.d_v)
            page_k = torch.zeros(d.b, PAGES, dtype=torch.int32, device=device)
            page_v = torch.zeros(d.b, PAGES, dtype=torch.int32, device=device)
            max_kv = PAGE * PAGES
        else:
            k = empty(_shape(kvf, d.b, d.skv, d.hg, d.d_qk))
            v = empty(_shape(kvf, d.b, d.skv, d.hg, d.d_v))
    cu_q = torch.arange(d.b + 1, dtype=torch.int32, device=device) * d.sq
    cu_kv = torch.arange(d.b + 1, dtype=torch.int32, device=device) * min(d.skv, max_kv)
    return dict(q=q, k=k, v=v, cu_q=cu_q, cu_kv=cu_kv, page_k=page_k, page_v=page_v, max_q=d.sq, max_kv=max_kv)


def _real_config(layout: QKVLayout, d: Dims, bias_shape: Optional[tuple] = None):
    """What the real forward describes for these inputs (its stats are ``[b, h, sq, 1]``, or
    ``[t, h, 1]`` for a THD q, or ``[b, h, sq, skv]`` for max512), from CPU tensors."""
    a = make_inputs(layout, d, "cpu")
    bias = None if bias_shape is None else torch.empty(bias_shape, dtype=BF16)
    return describe_fwd(is_training=True, max_seqlen_q=a["max_q"], max_seqlen_kv=a["max_kv"], cu_seqlens_q=a["cu_q"],
                        cu_seqlens_kv=a["cu_kv"], q=a["q"], k=a["k"], v=a["v"], qkv_dtype=BF16, attn_bias=bias,
                        attn_scale=None, dropout=0.0, qkv_layout=layout, attn_bias_type="no_bias" if bias is None
                        else "post_scale_bias", attn_mask_type="padding", softmax_type="vanilla",
                        window_size=(-1, -1), bottom_right_diagonal=None, page_table_k=a["page_k"],
                        page_table_v=a["page_v"])  # fmt: skip


def _config(layout: QKVLayout, bias=None, backend=None) -> str:
    return torch_ops.op_config(True, layout.name, "padding", "no_bias" if bias is None else "post_scale_bias", -1, -1,
                               None, backend, "vanilla", False)  # fmt: skip


def _fwd(a: dict, layout: QKVLayout, *, bias=None, backend=None, rng_state=None, dropout=0.0):
    return torch.ops.te_cudnn.fwd(
        a["q"], a["k"], a["v"], bias, a["cu_q"], a["cu_kv"], None, None, a["page_k"], a["page_v"], rng_state, None,
        a["max_q"], a["max_kv"], None, dropout, _config(layout, bias, backend),
    )  # fmt: skip


def _bwd(a: dict, layout: QKVLayout, o, d_o, stats, *, bias=None):
    return torch.ops.te_cudnn.bwd(
        a["q"], a["k"], a["v"], o, d_o, stats, None, bias, None, a["cu_q"], a["cu_kv"], None, None, a["max_q"],
        a["max_kv"], None, 0.0, _config(layout, bias),
    )  # fmt: skip


def _expected_stats(cfg, q_tokens: int) -> tuple[int, ...]:
    return (q_tokens, cfg.h, 1) if cfg.ragged_q else (cfg.b, cfg.h, cfg.sq, 1)


# ================================================================================ fake implementations


def test_cases_cover_every_layout_and_family() -> None:
    layouts = {case.values[0] for case in _layout_cases()}
    assert layouts == set(QKVLayout) and len(layouts) == 26
    groups = {layout_info(layout).group for layout in layouts}
    assert groups == set(QKVLayoutGroup)
    cross = {case.values[0] for case in _layout_cases() if case.values[1] is not MHA}
    assert cross == {l for l in QKVLayout if not layout_info(l).packs_qkv}


@pytest.mark.parametrize(("layout", "dims"), list(_layout_cases()))
def test_fwd_fake_matches_real_allocation(layout: QKVLayout, dims: Dims) -> None:
    cfg = _real_config(layout, dims)
    with FakeTensorMode():
        a = make_inputs(layout, dims, "cuda")
        out, stats = _fwd(a, layout)
        q = a["q"]
    q_meta = make_inputs(layout, dims, "meta")["q"]
    ref_out = alloc_output(q_meta, dims.d_v)
    assert out.shape == (*q.shape[:-1], dims.d_v) == ref_out.shape
    assert out.stride() == ref_out.stride() and out.is_contiguous()
    assert out.dtype == BF16 and out.device.type == "cuda"
    assert stats.shape == _expected_stats(cfg, q.shape[0])
    assert stats.dtype == torch.float32 and stats.is_contiguous() and stats.device.type == "cuda"
    if layout_info(layout).q_format == QKVFormat.thd:
        assert stats.shape == (dims.b * dims.sq, dims.h, 1)
    else:
        assert stats.shape == (dims.b, dims.h, dims.sq, 1)


def _max512_cases():
    for case in _layout_cases():
        info = layout_info(case.values[0])
        if info.q_format != QKVFormat.thd and not info.is_paged:  # max512 has no THD / paged layouts
            yield case


@pytest.mark.parametrize(("layout", "dims"), list(_max512_cases()))
def test_fwd_fake_max512_saves_the_softmax(layout: QKVLayout, dims: Dims) -> None:
    cfg = _real_config(layout, dims)
    with FakeTensorMode():
        a = make_inputs(layout, dims, "cuda")
        out, stats = _fwd(a, layout, backend=MAX512)
    assert out.shape == (*a["q"].shape[:-1], dims.d_v) and out.dtype == BF16
    assert stats.shape == (cfg.b, cfg.h, cfg.sq, cfg.skv) == (dims.b, dims.h, dims.sq, dims.skv)
    assert stats.dtype == BF16 and stats.is_contiguous()


def _bwd_cases():
    return [case for case in _layout_cases() if not layout_info(case.values[0]).is_paged]  # paged: inference only


def test_bwd_cases_skip_only_paged_layouts() -> None:
    assert {case.values[0] for case in _bwd_cases()} == {l for l in QKVLayout if not layout_info(l).is_paged}


@pytest.mark.parametrize(("layout", "dims"), _bwd_cases())
def test_bwd_fake_matches_alloc_qkv_grads(layout: QKVLayout, dims: Dims) -> None:
    info = layout_info(layout)
    with FakeTensorMode():
        a = make_inputs(layout, dims, "cuda")
        o, stats = _fwd(a, layout)
        g0, g1, g2, dbias, d_offset = _bwd(a, layout, o, torch.empty_like(o), stats)
        dq, dk, dv = unpack_grads(layout.name, g0, g1, g2)
    m = make_inputs(layout, dims, "meta")
    ref = alloc_qkv_grads(layout, m["q"], m["k"], m["v"])
    for name, got, want, inp in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, (a["q"], a["k"], a["v"])):
        assert got.shape == want.shape == inp.shape, name
        assert got.stride() == want.stride(), (name, got.stride(), want.stride())
        assert got.storage_offset() == want.storage_offset(), name
        assert got.dtype == BF16 and got.device.type == "cuda", name
    assert dbias.numel() == 0
    if info.packs_qkv:  # g0 is the packed dqkv buffer; dq, dk, dv are views of it
        assert g0.shape == ref[0]._base.shape and g0.is_contiguous()
        assert all(t._base is g0 for t in (dq, dk, dv)) and g1.numel() == 0 and g2.numel() == 0
        assert ref[1]._base is ref[0]._base and ref[2]._base is ref[0]._base
    elif info.packs_kv:  # g1 is the packed dkv buffer
        assert dq is g0 and dq._base is None and g1.shape == ref[1]._base.shape and g1.is_contiguous()
        assert dk._base is g1 and dv._base is g1 and g2.numel() == 0
        assert ref[2]._base is ref[1]._base
    else:
        assert (dq, dk, dv) == (g0, g1, g2) and all(t._base is None and t.is_contiguous() for t in (g0, g1, g2))


@pytest.mark.parametrize(
    "bias_shape",
    [(1, 4, 16, 32), (2, 1, 16, 32), (2, 4, 16, 32), (1, 1, 16, 32), (2, 1, 1, 32), (1, 1, 1, 32), "expanded"],
    ids=["1hss", "b1ss", "bhss", "11ss", "b11s", "111s-no-dbias", "expanded-bhss"],
)  # fmt: skip
def test_bwd_fake_dbias(bias_shape) -> None:
    layout, dims = QKVLayout.bshd_bshd_bshd, GQA_CROSS_DV
    full = (dims.b, dims.h, dims.sq, dims.skv)
    cfg = _real_config(layout, dims, full if bias_shape == "expanded" else bias_shape)
    with FakeTensorMode():
        a = make_inputs(layout, dims, "cuda")
        if bias_shape == "expanded":  # stride 0 over b: the gradient still comes back contiguous
            bias = torch.empty((1, *full[1:]), dtype=BF16, device="cuda").expand(full)
        else:
            bias = torch.empty(bias_shape, dtype=BF16, device="cuda")
        o, stats = _fwd(a, layout, bias=bias)
        *_, dbias, _ = _bwd(a, layout, o, torch.empty_like(o), stats, bias=bias)
    if cfg.has_dbias:
        assert dbias.shape == bias.shape and dbias.is_contiguous() and dbias.dtype == BF16
    else:
        assert bias_shape == (1, 1, 1, 32) and dbias.numel() == 0


def test_fwd_fake_follows_symbolic_sizes() -> None:
    """Under dynamic shapes the fake results carry the inputs' symbolic sizes."""
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC, DimDynamic.STATIC,
                                                  DimDynamic.STATIC])  # fmt: skip
    real = torch.empty(2, 16, 4, 64, dtype=BF16)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        q = mode.from_tensor(real, symbolic_context=ctx, source=LocalSource("q"))
        b, s = q.shape[0], q.shape[1]
        assert isinstance(b, torch.SymInt) and isinstance(s, torch.SymInt)
        config = torch_ops.op_config(True, "bshd_bshd_bshd", "causal", "no_bias", -1, 0, None, None, "vanilla", False)
        out, stats = torch.ops.te_cudnn.fwd(q, q, q, None, None, None, None, None, None, None, None, None, s, s, None,
                                            0.0, config)  # fmt: skip
        assert out.shape == q.shape and tuple(stats.shape) == (b, 4, s, 1)
        assert str(out.shape[0]) == str(b) and str(stats.shape[2]) == str(s) and str(stats.shape[0]) == str(b)
        assert isinstance(stats.shape[2], torch.SymInt)


# ================================================================================ FP8 fakes


def _fp8_inputs(case: str, device: str):
    """(q, k, v, layout, d_v) of an FP8 case; 'bshd-view' is a non-contiguous bshd view of a
    [b, h, s, d] buffer (non-overlapping and dense: empty_like keeps its strides)."""
    if case == "bshd":
        q, k, v = (torch.empty(2, 16, 4, 128, dtype=BF16, device=device) for _ in range(3))
        return q, k, v, "bshd_bshd_bshd", 128
    if case == "sbhd-gqa-cross":
        q = torch.empty(16, 2, 4, 128, dtype=BF16, device=device)
        k, v = (torch.empty(32, 2, 2, 128, dtype=BF16, device=device) for _ in range(2))
        return q, k, v, "sbhd_sbhd_sbhd", 128
    if case == "bshd-dv":
        q, k = (torch.empty(2, 16, 4, 128, dtype=BF16, device=device) for _ in range(2))
        return q, k, torch.empty(2, 16, 4, 64, dtype=BF16, device=device), "bshd_bshd_bshd", 64
    if case == "bshd-view":
        q, k, v = (torch.empty(2, 4, 16, 128, dtype=BF16, device=device).transpose(1, 2) for _ in range(3))
        assert not q.is_contiguous()
        return q, k, v, "bshd_bshd_bshd", 128
    assert case == "bs3hd-packed"  # packed views are not dense: empty_like gives contiguous tensors
    q, k, v = torch.empty(2, 16, 3, 4, 128, dtype=BF16, device=device).unbind(-3)
    return q, k, v, "bs3hd", 128


FP8_CASES = ["bshd", "sbhd-gqa-cross", "bshd-dv", "bshd-view", "bs3hd-packed"]


def _meta_tensors(meta: Fp8AttentionMeta) -> tuple:
    f, b = meta.fwd, meta.bwd
    return f.scale, f.scale_inv, f.amax_history, meta.fwd_format, b.scale, b.scale_inv, b.amax_history, meta.bwd_format


def _fp8_fwd(q, k, v, layout: str, meta: Fp8AttentionMeta):
    s_dim = 0 if layout.startswith("sb") else 1
    return torch.ops.te_cudnn.fp8_fwd(q, k, v, None, None, *_meta_tensors(meta), q.shape[s_dim], k.shape[s_dim],
                                      layout, "causal", None, None, False)  # fmt: skip


@pytest.mark.parametrize("case", FP8_CASES)
def test_fp8_fwd_fake(case: str) -> None:
    cq, ck, cv, layout, d_v = _fp8_inputs(case, "cpu")
    table = Fp8Table.create(9, 4, "cpu")
    real8 = [quantize(t, table, META_QKV, E4M3) for t in (cq, ck, cv)]  # what the real op casts with
    with FakeTensorMode():
        meta = Fp8AttentionMeta(device="cuda", history=4)
        assert meta.fwd.scale.device.type == "cuda"
        q, k, v, _, _ = _fp8_inputs(case, "cuda")
        out, q8, k8, v8, o8, stats, row = _fp8_fwd(q, k, v, layout, meta)
    out_shape = (*q.shape[:-1], d_v)
    assert out.shape == out_shape and out.dtype == BF16 and out.is_contiguous()
    assert o8.shape == out_shape and o8.dtype == E4M3 and o8.is_contiguous()
    for t8, t, r8 in zip((q8, k8, v8), (q, k, v), real8):
        assert t8.dtype == E4M3 and t8.shape == t.shape
        assert t8.stride() == r8.stride()
        if case == "bshd-view":
            assert t8.stride() == t.stride() and not t8.is_contiguous()
        else:
            assert t8.is_contiguous()
    b, sq, h = (q.shape[1], q.shape[0], q.shape[2]) if layout.startswith("sb") else q.shape[:3]
    assert stats.shape == (b, h, sq, 1) and stats.dtype == torch.float32 and stats.is_contiguous()
    assert row.shape == (9,) and row.dtype == torch.float32


@pytest.mark.parametrize("out_dtype", [BF16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", FP8_CASES)
def test_fp8_bwd_fake(case: str, out_dtype: torch.dtype) -> None:
    with FakeTensorMode():
        meta = Fp8AttentionMeta(device="cuda")
        q, k, v, layout, d_v = _fp8_inputs(case, "cuda")
        out, q8, k8, v8, o8, stats, _ = _fp8_fwd(q, k, v, layout, meta)
        s_dim = 0 if layout.startswith("sb") else 1
        f, bw = meta.fwd, meta.bwd
        dq, dk, dv, row = torch.ops.te_cudnn.fp8_bwd(
            torch.empty_like(out), q8, k8, v8, o8, stats, None, None, f.scale, f.scale_inv, bw.scale, bw.scale_inv,
            bw.amax_history, meta.bwd_format, out_dtype, q.shape[s_dim], k.shape[s_dim], layout, "causal", None, None,
            False,
        )  # fmt: skip
    for g, t in ((dq, q), (dk, k), (dv, v)):
        assert g.shape == t.shape and g.dtype == out_dtype and g.is_contiguous()
    assert row.shape == (6,) and row.dtype == torch.float32


def test_fp8_packed_layout_passes_validation(monkeypatch) -> None:
    """FP8 attention of packed bf16 views (qkv_layout='bs3hd', a layout the FP8 sub-backend
    serves) should get through validation and then need a GPU."""
    from te_cudnn import first_call

    monkeypatch.setattr(first_call, "_is_capturing", lambda: False)  # the CPU-only capture-probe bug, out of the way
    q, k, v, layout, _ = _fp8_inputs("bs3hd-packed", "cpu")
    meta = Fp8AttentionMeta(device="cpu")
    args = (q, k, v, None, None, *_meta_tensors(meta), 16, 16, layout, "causal", None, None, False)
    with pytest.raises(ValueError, match="executes on CUDA devices"):
        torch_ops._fp8_fwd_impl(*args)


# ================================================================================ autograd on meta


@pytest.mark.parametrize(("layout", "dims"), _bwd_cases())
def test_registered_autograd_on_meta(layout: QKVLayout, dims: Dims) -> None:
    """The op's autograd formula (fwd -> bwd -> unpack_grads) on meta tensors: every leaf gets
    a gradient of its own shape; packed inputs accumulate into their one buffer."""
    a = make_inputs(layout, dims, "meta")
    info = layout_info(layout)
    if info.packs_qkv:
        buf = a["q"]._base.detach().requires_grad_()
        a["q"], a["k"], a["v"] = buf.unbind(-3 if info.group == QKVLayoutGroup.L_3HD else -2)
        leaves = [buf]
    elif info.packs_kv:
        a["q"] = a["q"].detach().requires_grad_()
        buf = a["k"]._base.detach().requires_grad_()
        a["k"], a["v"] = buf.unbind(-3 if info.group == QKVLayoutGroup.L_HD_2HD else -2)
        leaves = [a["q"], buf]
    else:
        leaves = [a[n].requires_grad_() for n in "qkv"]
    out, stats = _fwd(a, layout)
    assert out.requires_grad and not stats.requires_grad
    out.sum().backward()
    for leaf in leaves:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape


@pytest.mark.parametrize(("bias_shape", "has_grad"), [((1, 4, 16, 16), True), ((1, 1, 1, 16), False)],
                         ids=["1hss-dbias", "111s-none"])  # fmt: skip
def test_registered_autograd_bias_gradient(bias_shape, has_grad) -> None:
    a = make_inputs(QKVLayout.bshd_bshd_bshd, MHA, "meta")
    for n in "qkv":
        a[n].requires_grad_()
    bias = torch.empty(bias_shape, dtype=BF16, device="meta", requires_grad=True)
    out, _ = _fwd(a, QKVLayout.bshd_bshd_bshd, bias=bias)
    out.sum().backward()
    assert (bias.grad is not None) == has_grad
    if has_grad:
        assert bias.grad.shape == bias_shape
    assert all(a[n].grad.shape == a[n].shape for n in "qkv")
