"""te_cudnn's custom operators without a GPU: the fake (meta) implementations against what the
real implementation allocates, for every layout; torch.compile tracing through them on meta
tensors (no graph break, static and dynamic shapes, backward); when the public entry points
take the custom-op path; the op schemas."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode

import te_cudnn
from te_cudnn import torch_ops
from te_cudnn.config import describe_fwd
from te_cudnn.enums import META_QKV, FusedAttnBackend, QKVFormat, QKVLayout, QKVLayoutGroup
from te_cudnn.fp8 import Fp8AttentionMeta, Fp8Table, quantize
from te_cudnn.layouts import alloc_output, alloc_qkv_grads, layout_info
from te_cudnn.torch_ops import unpack_grads, use_custom_ops

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
MAX512 = int(FusedAttnBackend.F16_max512_seqlen)
PAGE, PAGES, NUM_PAGES = 8, 4, 12  # paged KV: tokens per page, pages per sequence, pages in the pool


def test_capture_probe_is_false_without_cuda() -> None:
    """CPU-only torch defines the capture probe as a stub that raises; te_cudnn replaces it."""
    from te_cudnn import ops

    if not torch.cuda.is_available():
        assert ops._is_capturing() is False


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


# ================================================================================ schemas


FWD_ARGS = ["q", "k", "v", "attn_bias", "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded",
            "page_table_k", "page_table_v", "rng_state", "softmax_offset", "max_seqlen_q", "max_seqlen_kv", "attn_scale",
            "dropout", "config"]  # fmt: skip
BWD_ARGS = ["q", "k", "v", "o", "d_o", "stats", "rng_state", "attn_bias", "softmax_offset", "cu_seqlens_q",
            "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", *FWD_ARGS[12:]]  # fmt: skip
FP8_OPTS = ["max_seqlen_q", "max_seqlen_kv", "qkv_layout", "attn_mask_type", "attn_scale", "backend", "deterministic"]
FP8_FWD_ARGS = ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_kv", "fwd_scale", "fwd_scale_inv", "fwd_amax_history",
                "fwd_format", "bwd_scale", "bwd_scale_inv", "bwd_amax_history", "bwd_format", *FP8_OPTS]  # fmt: skip
FP8_BWD_ARGS = ["d_out", "q8", "k8", "v8", "o8", "stats", "cu_seqlens_q", "cu_seqlens_kv", "fwd_scale", "fwd_scale_inv",
                "bwd_scale", "bwd_scale_inv", "bwd_amax_history", "bwd_format", "out_dtype", *FP8_OPTS]  # fmt: skip


@pytest.mark.parametrize(("name", "args", "n_out"), [("fwd", FWD_ARGS, 2), ("bwd", BWD_ARGS, 5),
                                                     ("fp8_fwd", FP8_FWD_ARGS, 7), ("fp8_bwd", FP8_BWD_ARGS, 4)],
                         ids=["fwd", "bwd", "fp8_fwd", "fp8_bwd"])  # fmt: skip
def test_op_schema(name: str, args: list, n_out: int) -> None:
    op = getattr(torch.ops.te_cudnn, name).default
    schema = op._schema
    assert schema.name == f"te_cudnn::{name}"
    assert [a.name for a in schema.arguments] == args
    assert len(schema.returns) == n_out and all(str(r.type) == "Tensor" for r in schema.returns)
    assert all(a.alias_info is None for a in schema.arguments)  # functional: nothing mutated or aliased
    types = {a.name: a.real_type for a in schema.arguments}
    for arg in ("max_seqlen_q", "max_seqlen_kv"):  # dynamic sequence lengths trace
        assert isinstance(types[arg], torch.SymIntType), (arg, types[arg])
    if name in ("fwd", "bwd"):
        assert str(types["config"]) == "str"
    else:
        assert str(types["qkv_layout"]) == "str" and str(types["deterministic"]) == "bool"
    if hasattr(torch.Tag, "needs_exact_strides"):
        assert torch.Tag.needs_exact_strides in op.tags
    registered = torch_ops.OPS[name]  # an OpOverload, or a CustomOpDef (torch.library.custom_op)
    assert getattr(registered, "_qualname", None) == f"te_cudnn::{name}" or registered is op


def test_fwd_schema_types() -> None:
    types = {a.name: str(a.type) for a in torch.ops.te_cudnn.fwd.default._schema.arguments}
    for name in FWD_ARGS[3:12]:
        assert types[name] == "Optional[Tensor]", name
    assert types["config"] == "str" and types["attn_scale"] == "Optional[float]" and types["dropout"] == "float"
    fp8 = {a.name: str(a.real_type) for a in torch.ops.te_cudnn.fp8_fwd.default._schema.arguments}
    assert fp8["fwd_format"] == fp8["bwd_format"] == "ScalarType"


OPTION_CASES = {
    "defaults": (True, "bshd_bshd_bshd", "causal", "no_bias", -1, 0, None, None, "vanilla", False),
    "every field set": (False, "thd_thd_thd", "padding_causal", "post_scale_bias", 128, 0, True, 1, "learnable", True),
    "others": (True, "sbhd_sb2hd", "no_mask", "no_bias", -1, -1, False, 2, "off_by_one", False),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_op_config_round_trips_exactly(case: str) -> None:
    values = OPTION_CASES[case]
    config = torch_ops.op_config(*values)
    parsed = torch_ops.parse_op_config(config)
    assert tuple(parsed) == values
    assert parsed is torch_ops.parse_op_config(config)  # decoded once per string


@pytest.mark.parametrize("bad", ["", "train=1", "train=1;layout=x;mask=y;bias=z;window=-1,oops;brd=None;backend=None;"
                                 "softmax=vanilla;det=0"])  # fmt: skip
def test_op_config_rejects_malformed_strings(bad: str) -> None:
    with pytest.raises(ValueError, match="not a te_cudnn op config"):
        torch_ops.parse_op_config(bad)


# ================================================================================ use_custom_ops


_FRESH_COMPILE = """
import torch, te_cudnn
counts = []
def backend(gm, example_inputs):
    counts.append("torch.ops.te_cudnn.fwd" in gm.code)
    return gm.forward
def f(q):
    return te_cudnn.fused_attention(q, q, q, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
compiled = torch.compile(f, backend=backend, fullgraph=True, dynamic=True)
for b, s in ((2, 16), (3, 24), (4, 40)):
    out = compiled(torch.randn(b, s, 4, 64, dtype=torch.bfloat16, device="meta"))
    assert tuple(out.shape) == (b, s, 4, 64)
print("RESULT", sum(counts))
"""

#: Subprocesses: TE_CUDNN_CUSTOM_OPS is read at import, and the fresh-process compile needs a
#: process where te_cudnn has not run yet. They start with the module's first test and run
#: alongside the others.
_PROBES = {
    "env=1": ("1", "from te_cudnn.torch_ops import use_custom_ops; print('RESULT', use_custom_ops())"),
    "env=on": ("on", "from te_cudnn.torch_ops import use_custom_ops; print('RESULT', use_custom_ops())"),
    "env=0": ("0", "from te_cudnn.torch_ops import use_custom_ops; print('RESULT', use_custom_ops())"),
    "fresh-compile": (None, _FRESH_COMPILE),
}


@pytest.fixture(scope="module", autouse=True)
def probes():
    procs = {}
    for name, (value, code) in _PROBES.items():
        env = {k: v for k, v in os.environ.items() if k != "TE_CUDNN_CUSTOM_OPS"}
        if value is not None:
            env["TE_CUDNN_CUSTOM_OPS"] = value
        procs[name] = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)  # fmt: skip
    results: dict = {}

    def result(name: str) -> str:
        if name not in results:
            stdout, stderr = procs[name].communicate(timeout=300)
            line = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
            last = [l for l in stderr.splitlines() if l.strip()][-1:]  # the exception, on failure
            results[name] = line[0].split(None, 1)[1] if line else f"exit {procs[name].returncode}: {last}"
        return results[name]

    yield result
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.communicate()


@pytest.mark.slow
def test_env_forces_custom_ops_in_eager(probes) -> None:
    assert probes("env=1") == "True"
    assert probes("env=on") == "True"


@pytest.mark.slow
def test_env_off_means_plain_eager(probes) -> None:
    assert probes("env=0") == "False"


@pytest.mark.slow
def test_compile_in_a_fresh_process(probes) -> None:
    """te_cudnn's first call in a process inside torch.compile (its lookup caches still empty):
    no failure, and one graph for three shapes (dynamic=True)."""
    result = probes("fresh-compile")
    assert result == "1", result  # "2": a lookup cache filled during the first trace made the next call recompile


def test_use_custom_ops_false_in_eager() -> None:
    assert torch_ops._FORCE_OPS is (os.environ.get("TE_CUDNN_CUSTOM_OPS", "0").lower() in ("1", "true", "yes", "on"))
    assert use_custom_ops() is torch_ops._FORCE_OPS


def test_use_custom_ops_true_while_compiling() -> None:
    seen: list = []

    def fn(x):
        seen.append(use_custom_ops())  # a side effect Dynamo replays after the graph runs
        return x + 1

    torch._dynamo.reset()
    y = torch.compile(fn, backend="eager")(torch.ones(3))
    assert seen == [True] and torch.equal(y, torch.full((3,), 2.0))


# ================================================================================ torch.compile on meta


class Recorder:
    """A torch.compile backend recording Dynamo's graph and AOT autograd's forward and backward
    graphs, running them as they are (aot_eager with a look inside)."""

    def __init__(self) -> None:
        self.dynamo: list = []
        self.fw: list = []
        self.bw: list = []

        def fw(gm, _inputs):
            self.fw.append(gm)
            return make_boxed_func(gm.forward)

        def bw(gm, _inputs):
            self.bw.append(gm)
            return make_boxed_func(gm.forward)

        self._aot = aot_autograd(fw_compiler=fw, bw_compiler=bw)

    def __call__(self, gm, example_inputs):
        self.dynamo.append(gm)
        return self._aot(gm, example_inputs)


def _fwd_nodes(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and "te_cudnn.fwd" in str(n.target)]


@pytest.fixture
def compile_env():
    """A clean Dynamo cache, and te_cudnn's lookup caches filled before tracing (filling them
    inside a trace is test_compile_in_a_fresh_process's case)."""
    from te_cudnn import autograd, enums

    for enum in (enums.QKVLayout, enums.QKVFormat, enums.AttnMaskType, enums.AttnBiasType, enums.SoftmaxType,
                 enums.FusedAttnBackend):  # fmt: skip
        for member in enum:
            enum.coerce(member.name)
    seq_dim = getattr(autograd, "_seq_dim", None)
    if seq_dim is not None:
        for layout in QKVLayout:
            seq_dim(layout.name)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@dataclass(frozen=True)
class Case:
    fmt: str
    h: int = 4
    hg: int = 4
    bias: Optional[str] = None  # None, "1hss", "bhss"
    dropout: float = 0.0


COMPILE_CASES = {
    "sbhd": Case("sbhd"),
    "bshd-gqa": Case("bshd", h=8, hg=2),
    "thd-gqa": Case("thd", h=8, hg=2),
    "sbhd-bias": Case("sbhd", bias="1hss"),
    "bshd-bias-b": Case("bshd", bias="bhss"),
    "bshd-dropout": Case("bshd", dropout=0.1),
}
D = 64


def _compile_inputs(c: Case, b: int, s: int):
    def t(heads: int) -> torch.Tensor:
        shape = {"sbhd": (s, b, heads, D), "bshd": (b, s, heads, D), "thd": (b * s, heads, D)}[c.fmt]
        return torch.randn(shape, dtype=BF16, device="meta", requires_grad=True)

    q, k, v = t(c.h), t(c.hg), t(c.hg)
    bias = None
    if c.bias is not None:
        bias = torch.randn((1 if c.bias == "1hss" else b, c.h, s, s), dtype=BF16, device="meta", requires_grad=True)
    cu = torch.arange(b + 1, dtype=torch.int32, device="meta") if c.fmt == "thd" else None
    return q, k, v, bias, cu


def _fused_fn(c: Case):
    layout = f"{c.fmt}_{c.fmt}_{c.fmt}"
    mask = "padding_causal" if c.fmt == "thd" else "causal"

    def fn(q, k, v, bias, cu):
        return te_cudnn.fused_attention(q, k, v, attn_bias=bias, cu_seqlens_q=cu, cu_seqlens_kv=cu, qkv_layout=layout,
                                        attn_mask_type=mask, dropout=c.dropout,
                                        attn_bias_type="no_bias" if bias is None else "post_scale_bias")  # fmt: skip

    return fn


def _module_fn(c: Case):
    mod = te_cudnn.DotProductAttention(c.h, D, num_gqa_groups=c.hg, attention_dropout=c.dropout, qkv_format=c.fmt)
    mod.train()

    def fn(q, k, v, bias, cu):
        return mod(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, core_attention_bias=bias,
                   core_attention_bias_type="no_bias" if bias is None else "post_scale_bias")  # fmt: skip

    return fn, mod


#: (batch, sequence length) across calls. The first call's sizes are all distinct from the heads,
#: head dims, b + 1 and the FP8 tables' sizes: Dynamo gives equal sizes one symbol (duck sizing),
#: which would make a later call recompile.
SHAPES = [(5, 24), (3, 40), (7, 56)]


def _check_compiled(fn, c: Case, dynamic: bool, out_shape) -> Recorder:
    rec = Recorder()
    compiled = torch.compile(fn, backend=rec, fullgraph=True, dynamic=dynamic)
    shapes = SHAPES if dynamic else SHAPES[:2]  # static: each shape compiles anew
    for b, s in shapes:
        q, k, v, bias, cu = _compile_inputs(c, b, s)
        out = compiled(q, k, v, bias, cu)
        assert out.device.type == "meta" and out.dtype == BF16
        assert tuple(out.shape) == out_shape(q, b, s)
        out.sum().backward()
        for t in (q, k, v):
            assert t.grad is not None and t.grad.shape == t.shape
        if bias is not None:  # [1|b, h, s, s] does not broadcast over sq: it gets a gradient
            assert bias.grad is not None and bias.grad.shape == bias.shape
    # one graph for every shape when dynamic; one per shape when static (Dynamo may hand the
    # backend a graph it then abandons, e.g. when it restarts to specialize a float)
    graphs = [gm for gm in rec.dynamo if _fwd_nodes(gm)]
    assert len(graphs) == (1 if dynamic else len(shapes))
    assert len([gm for gm in rec.fw if "te_cudnn.fwd" in gm.code]) == len(graphs)
    assert len([gm for gm in rec.bw if "te_cudnn.bwd" in gm.code]) == len(graphs)
    for gm in graphs:
        assert "torch.ops.te_cudnn.fwd" in gm.code
        (node,) = _fwd_nodes(gm)
        rng = node.args[10]
        if c.dropout > 0:  # the Philox [seed, offset] is drawn on the device inside the graph
            assert "torch.randint" in gm.code and rng is not None and "randint" in str(rng.target)
        else:
            assert rng is None and "randint" not in gm.code
        if not dynamic:
            assert isinstance(node.args[12], int) and isinstance(node.args[13], int)
        elif c.fmt != "thd":  # the sequence lengths reach the op as symbols
            assert isinstance(node.args[12], torch.fx.Node) and isinstance(node.args[13], torch.fx.Node)
        assert isinstance(node.args[16], str)  # the options: one constant config string
    q, k, v, bias, cu = _compile_inputs(c, *SHAPES[0])
    assert torch._dynamo.explain(fn)(q, k, v, bias, cu).graph_break_count == 0
    return graphs


def _modes(cases: list, static: tuple) -> list:
    """(case, dynamic) pairs: every case with dynamic shapes, those in ``static`` also static
    (each static shape is a compile of its own: the slow part of this file)."""
    return [pytest.param(c, d, id=f"{c}-{'dynamic' if d else 'static'}") for c in cases for d in (False, True)
            if d or c in static]  # fmt: skip


@pytest.mark.parametrize(("case", "dynamic"), _modes(list(COMPILE_CASES), ("sbhd", "thd-gqa", "bshd-dropout")))
def test_compile_fused_attention(compile_env, case: str, dynamic: bool) -> None:
    c = COMPILE_CASES[case]
    _check_compiled(_fused_fn(c), c, dynamic, lambda q, b, s: tuple(q.shape))


@pytest.mark.parametrize(("case", "dynamic"), _modes(["sbhd", "bshd-gqa", "thd-gqa", "sbhd-bias", "bshd-dropout"],
                                                    ("sbhd",)))  # fmt: skip
def test_compile_module(compile_env, case: str, dynamic: bool) -> None:
    c = COMPILE_CASES[case]
    fn, _ = _module_fn(c)
    graphs = _check_compiled(fn, c, dynamic, lambda q, b, s: (*q.shape[:-2], c.h * D))
    for gm in graphs:
        (node,) = _fwd_nodes(gm)
        config = torch_ops.parse_op_config(node.args[16])
        assert config.qkv_layout == f"{c.fmt}_{c.fmt}_{c.fmt}"
        assert config.attn_mask_type == ("padding_causal" if c.fmt == "thd" else "causal")  # TE default mask
        if dynamic:  # THD: the token count bounds max_seqlen, a symbol like the sbhd/bshd lengths
            assert isinstance(node.args[12], torch.fx.Node) and isinstance(node.args[13], torch.fx.Node)


def test_fused_attention_thd_max_seqlen(monkeypatch) -> None:
    """THD q is [t, h, d]: fused_attention must not take the head count for max_seqlen."""
    from te_cudnn import autograd

    seen = {}

    def record(q, k, v, bias, cu_q, cu_kv, max_q, max_kv, *rest, **kw):
        seen.update(max_q=max_q, max_kv=max_kv)
        return q

    monkeypatch.setattr(autograd, "attend", record)
    b, s, h = 3, 16, 4
    q = torch.empty(b * s, h, D, dtype=BF16, device="meta")
    cu = torch.arange(b + 1, dtype=torch.int32, device="meta") * s
    te_cudnn.fused_attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_kv=cu, qkv_layout="thd_thd_thd",
                             attn_mask_type="padding")  # fmt: skip
    assert seen["max_q"] >= s and seen["max_kv"] >= s, seen


@pytest.mark.parametrize(("entry", "dynamic"), _modes(["fp8_attention", "module"], ("fp8_attention",)))
def test_compile_fp8(compile_env, entry: str, dynamic: bool) -> None:
    meta = Fp8AttentionMeta(device="meta")
    if entry == "module":
        mod = te_cudnn.DotProductAttention(4, 128, qkv_format="bshd", fp8_meta=meta).eval()

        def fn(q, k, v):
            return mod(q, k, v)
    else:

        def fn(q, k, v):
            return te_cudnn.fp8_attention(q, k, v, meta, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")

    rec = Recorder()
    compiled = torch.compile(fn, backend=rec, fullgraph=True, dynamic=dynamic)
    for b, s in SHAPES[:2]:
        q, k, v = (torch.randn(b, s, 4, 128, dtype=BF16, device="meta", requires_grad=True) for _ in range(3))
        out = compiled(q, k, v)
        assert tuple(out.shape) == ((b, s, 512) if entry == "module" else (b, s, 4, 128)) and out.dtype == BF16
        out.sum().backward()
        assert all(t.grad.shape == t.shape for t in (q, k, v))
    graphs = [gm for gm in rec.dynamo if "torch.ops.te_cudnn.fp8_fwd" in gm.code]
    assert len(graphs) == (1 if dynamic else 2)
    for gm in graphs:
        assert "copy_" in gm.code  # this step's amax row folded into the forward history
    assert len([gm for gm in rec.bw if "te_cudnn.fp8_bwd" in gm.code]) == len(graphs)
    q, k, v = (torch.randn(2, 16, 4, 128, dtype=BF16, device="meta") for _ in range(3))
    assert torch._dynamo.explain(fn)(q, k, v).graph_break_count == 0


def test_dropout_rng_state_shape_on_meta() -> None:
    """The device-drawn [seed, offset] a training graph feeds the op: int64 [2] on q's device."""
    from te_cudnn.ops import _device_rng_state

    state = _device_rng_state(torch.device("meta"))
    assert state.shape == (2,) and state.dtype == torch.int64 and state.device.type == "meta"


@pytest.mark.slow
def test_exit_hook_drops_cudnn_objects() -> None:
    """The atexit hook empties what holds cuDNN objects (torch.library keeps te_cudnn's module
    state alive to the end; plans alive when the frontend's native module is finalized are
    reported on stderr as leaked). In a subprocess: the hook clears process-wide caches."""
    import subprocess
    import sys

    code = (
        "import te_cudnn\n"
        "from te_cudnn import ops\n"
        "from te_cudnn.plans import handles, plan_cache\n"
        "ops._fwd_memo[('probe',)] = object(); ops._bwd_memo[('probe',)] = object()\n"
        "handles._idle.setdefault(0, []).append(object())\n"
        "ops._drop_cudnn_objects()\n"
        "print(len(ops._fwd_memo), len(ops._bwd_memo), len(handles._idle), len(plan_cache))\n"
    )  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "0 0 0 0", proc.stdout
