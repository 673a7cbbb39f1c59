"""Layouts: names, TE's stride table (spec §2.1) and zero-copy views; CPU only."""

from __future__ import annotations

import pytest
import torch

from te_cudnn.enums import QKVFormat, QKVLayout, QKVLayoutGroup
from te_cudnn.layouts import (
    CORE_LAYOUTS,
    DENSE_LAYOUTS,
    alloc_output,
    alloc_qkv_grads,
    bhsd_dims,
    get_qkv_layout,
    layout_info,
    layout_strides,
)

G, F = QKVLayoutGroup, QKVFormat

# ----------------------------------------------------------------------------- layout_info
# layout -> (group, q format, kv format, TE qkv_format), from the spec's group table.
INFO = {
    "sb3hd": (G.L_3HD, F.sbhd, F.sbhd, F.sbhd),
    "sbh3d": (G.L_H3D, F.sbhd, F.sbhd, F.sbhd),
    "sbhd_sb2hd": (G.L_HD_2HD, F.sbhd, F.sbhd, F.sbhd),
    "sbhd_sbh2d": (G.L_HD_H2D, F.sbhd, F.sbhd, F.sbhd),
    "sbhd_sbhd_sbhd": (G.L_HD_HD_HD, F.sbhd, F.sbhd, F.sbhd),
    "bs3hd": (G.L_3HD, F.bshd, F.bshd, F.bshd),
    "bsh3d": (G.L_H3D, F.bshd, F.bshd, F.bshd),
    "bshd_bs2hd": (G.L_HD_2HD, F.bshd, F.bshd, F.bshd),
    "bshd_bsh2d": (G.L_HD_H2D, F.bshd, F.bshd, F.bshd),
    "bshd_bshd_bshd": (G.L_HD_HD_HD, F.bshd, F.bshd, F.bshd),
    "t3hd": (G.L_3HD, F.thd, F.thd, F.thd),
    "th3d": (G.L_H3D, F.thd, F.thd, F.thd),
    "thd_t2hd": (G.L_HD_2HD, F.thd, F.thd, F.thd),
    "thd_th2d": (G.L_HD_H2D, F.thd, F.thd, F.thd),
    "thd_thd_thd": (G.L_HD_HD_HD, F.thd, F.thd, F.thd),
    # non-core layouts
    "sbhd_bshd_bshd": (G.L_HD_HD_HD, F.sbhd, F.bshd, F.sbhd_2bshd),
    "bshd_sbhd_sbhd": (G.L_HD_HD_HD, F.bshd, F.sbhd, F.bshd_2sbhd),
    "thd_bshd_bshd": (G.L_HD_HD_HD, F.thd, F.bshd, F.thd_2bshd),
    "thd_sbhd_sbhd": (G.L_HD_HD_HD, F.thd, F.sbhd, F.thd_2sbhd),
    "paged_kv_bshd_bshd_bshd": (G.Paged_KV_HD_HD_HD, F.bshd, F.bshd, F.bshd),
    "paged_kv_bshd_sbhd_sbhd": (G.Paged_KV_HD_HD_HD, F.bshd, F.sbhd, F.bshd_2sbhd),
    "paged_kv_sbhd_bshd_bshd": (G.Paged_KV_HD_HD_HD, F.sbhd, F.bshd, F.sbhd_2bshd),
    "paged_kv_sbhd_sbhd_sbhd": (G.Paged_KV_HD_HD_HD, F.sbhd, F.sbhd, F.sbhd),
    "paged_kv_thd_bshd_bshd": (G.Paged_KV_HD_HD_HD, F.thd, F.bshd, F.thd_2bshd),
    "paged_kv_thd_sbhd_sbhd": (G.Paged_KV_HD_HD_HD, F.thd, F.sbhd, F.thd_2sbhd),
    "bhsd_bhsd_bhsd": (G.SD_SD_SD, F.bhsd, F.bhsd, F.bhsd),
}
DENSE_NAMES = [
    "sb3hd", "sbh3d", "sbhd_sb2hd", "sbhd_sbh2d", "sbhd_sbhd_sbhd",
    "bs3hd", "bsh3d", "bshd_bs2hd", "bshd_bsh2d", "bshd_bshd_bshd",
]  # fmt: skip


@pytest.mark.parametrize("name", list(INFO))
def test_layout_info(name: str) -> None:
    layout = QKVLayout[name]
    info = layout_info(layout)
    group, q_fmt, kv_fmt, qkv_fmt = INFO[name]
    assert info.layout is layout
    assert info.group is group
    assert info.q_format is q_fmt
    assert info.kv_format is kv_fmt
    assert info.qkv_format is qkv_fmt
    assert info.is_paged == name.startswith("paged_kv_")
    assert info.is_dense == (name in DENSE_NAMES)
    assert info.packs_qkv == (group in (G.L_3HD, G.L_H3D))
    assert info.packs_kv == (group in (G.L_HD_2HD, G.L_HD_H2D))


def test_core_and_dense_sets() -> None:
    assert [l.name for l in CORE_LAYOUTS] == list(INFO)[:15]
    assert [l.name for l in DENSE_LAYOUTS] == DENSE_NAMES


# ----------------------------------------------------------------------------- layout_strides
# TE's generateMatrixStrides table written out as numbers, BHSD order [b, h, s, d].
# Case A: b=2, h=hg=4, sq=skv=16, d_qk=d_v=8  (hd=32, 3hd=96, 2hd=64, bhd=64, sq*hd=512).
A = dict(b=2, h=4, hg=4, sq=16, skv=16, d_qk=8, d_v=8)
_SB_PLAIN = (32, 8, 64, 1)
_BS_PLAIN = (512, 8, 32, 1)
STRIDES_A = {
    # layout: (q, k (= v), o)
    "sb3hd": ((96, 8, 192, 1), (96, 8, 192, 1), _SB_PLAIN),
    "sbh3d": ((96, 24, 192, 1), (96, 24, 192, 1), _SB_PLAIN),
    "sbhd_sb2hd": (_SB_PLAIN, (64, 8, 128, 1), _SB_PLAIN),
    "sbhd_sbh2d": (_SB_PLAIN, (64, 16, 128, 1), _SB_PLAIN),
    "sbhd_sbhd_sbhd": (_SB_PLAIN, _SB_PLAIN, _SB_PLAIN),
    "bs3hd": ((1536, 8, 96, 1), (1536, 8, 96, 1), _BS_PLAIN),
    "bsh3d": ((1536, 24, 96, 1), (1536, 24, 96, 1), _BS_PLAIN),
    "bshd_bs2hd": (_BS_PLAIN, (1024, 8, 64, 1), _BS_PLAIN),
    "bshd_bsh2d": (_BS_PLAIN, (1024, 16, 64, 1), _BS_PLAIN),
    "bshd_bshd_bshd": (_BS_PLAIN, _BS_PLAIN, _BS_PLAIN),
}
# THD rows are the bshd rows (batch stride is a placeholder).
for _t, _bs in (("t3hd", "bs3hd"), ("th3d", "bsh3d"), ("thd_t2hd", "bshd_bs2hd"),
                ("thd_th2d", "bshd_bsh2d"), ("thd_thd_thd", "bshd_bshd_bshd")):  # fmt: skip
    STRIDES_A[_t] = STRIDES_A[_bs]

# Case B (GQA, cross-attention): b=2, h=4, hg=2, sq=16, skv=32, d_qk=8;
# d_v=8 for the packed-kv layouts, d_v=16 for the separate ones.
B_PACKED = dict(b=2, h=4, hg=2, sq=16, skv=32, d_qk=8, d_v=8)
B_SEPARATE = dict(b=2, h=4, hg=2, sq=16, skv=32, d_qk=8, d_v=16)
STRIDES_B = {
    # layout: (sizes, q, k, v, o)
    "sbhd_sb2hd": (B_PACKED, (32, 8, 64, 1), (32, 8, 64, 1), (32, 8, 64, 1), (32, 8, 64, 1)),
    "sbhd_sbh2d": (B_PACKED, (32, 8, 64, 1), (32, 16, 64, 1), (32, 16, 64, 1), (32, 8, 64, 1)),
    "sbhd_sbhd_sbhd": (B_SEPARATE, (32, 8, 64, 1), (16, 8, 32, 1), (32, 16, 64, 1), (64, 16, 128, 1)),
    "bshd_bs2hd": (B_PACKED, (512, 8, 32, 1), (1024, 8, 32, 1), (1024, 8, 32, 1), (512, 8, 32, 1)),
    "bshd_bsh2d": (B_PACKED, (512, 8, 32, 1), (1024, 16, 32, 1), (1024, 16, 32, 1), (512, 8, 32, 1)),
    "bshd_bshd_bshd": (B_SEPARATE, (512, 8, 32, 1), (512, 8, 16, 1), (1024, 16, 32, 1), (1024, 16, 64, 1)),
}
for _t, _bs in (("thd_t2hd", "bshd_bs2hd"), ("thd_th2d", "bshd_bsh2d"), ("thd_thd_thd", "bshd_bshd_bshd")):
    STRIDES_B[_t] = STRIDES_B[_bs]


@pytest.mark.parametrize("name", list(STRIDES_A))
def test_layout_strides_mha(name: str) -> None:
    q, kv, o = STRIDES_A[name]
    got = layout_strides(QKVLayout[name], **A)
    assert got == {"q": q, "k": kv, "v": kv, "o": o}


@pytest.mark.parametrize("name", list(STRIDES_B))
def test_layout_strides_gqa(name: str) -> None:
    sizes, q, k, v, o = STRIDES_B[name]
    got = layout_strides(QKVLayout[name], **sizes)
    assert got == {"q": q, "k": k, "v": v, "o": o}


def test_layout_strides_rejects_non_core() -> None:
    with pytest.raises(ValueError, match="15 core layouts, not paged_kv_bshd_bshd_bshd"):
        layout_strides(QKVLayout.paged_kv_bshd_bshd_bshd, **A)


# ----------------------------------------------------------------------------- real views
def _views(name: str, b: int, h: int, hg: int, sq: int, skv: int, d_qk: int, d_v: int, dtype=torch.bfloat16):
    """q, k, v as a user would pass them: sliced from packed buffers where the layout packs."""
    info = layout_info(QKVLayout[name])
    sb = info.q_format == F.sbhd

    def shape(s: int, *rest: int) -> tuple[int, ...]:
        return (s, b, *rest) if sb else (b, s, *rest)

    def empty(*shp: int) -> torch.Tensor:
        return torch.empty(shp, dtype=dtype)

    g = info.group
    if g == G.L_3HD:
        return empty(*shape(sq, 3, h, d_qk)).unbind(-3)
    if g == G.L_H3D:
        return empty(*shape(sq, h, 3, d_qk)).unbind(-2)
    q = empty(*shape(sq, h, d_qk))
    if g == G.L_HD_2HD:
        k, v = empty(*shape(skv, 2, hg, d_qk)).unbind(-3)
    elif g == G.L_HD_H2D:
        k, v = empty(*shape(skv, hg, 2, d_qk)).unbind(-2)
    else:
        k, v = empty(*shape(skv, hg, d_qk)), empty(*shape(skv, hg, d_v))
    return q, k, v


def _view_cases():
    for name in DENSE_NAMES:
        q, kv, o = STRIDES_A[name]
        yield pytest.param(name, A, q, kv, kv, o, id=f"{name}-mha")
        if name in STRIDES_B:
            sizes, q, k, v, o = STRIDES_B[name]
            yield pytest.param(name, sizes, q, k, v, o, id=f"{name}-gqa")


@pytest.mark.parametrize(("name", "sizes", "q_st", "k_st", "v_st", "o_st"), list(_view_cases()))
def test_bhsd_views_have_te_strides(name, sizes, q_st, k_st, v_st, o_st) -> None:
    fmt = layout_info(QKVLayout[name]).q_format
    q, k, v = _views(name, **sizes)
    b, h, hg, sq, skv, d_qk, d_v = (sizes[x] for x in ("b", "h", "hg", "sq", "skv", "d_qk", "d_v"))
    assert bhsd_dims(fmt, q.shape, q.stride()) == ((b, h, sq, d_qk), q_st)
    assert bhsd_dims(fmt, k.shape, k.stride()) == ((b, hg, skv, d_qk), k_st)
    assert bhsd_dims(fmt, v.shape, v.stride()) == ((b, hg, skv, d_v), v_st)
    o = alloc_output(q, d_v)
    assert bhsd_dims(fmt, o.shape, o.stride()) == ((b, h, sq, d_v), o_st)


@pytest.mark.parametrize(("name", "sizes", "q_st", "k_st", "v_st", "o_st"), list(_view_cases()))
def test_alloc_qkv_grads_match_inputs(name, sizes, q_st, k_st, v_st, o_st) -> None:
    layout = QKVLayout[name]
    info = layout_info(layout)
    q, k, v = _views(name, **sizes)
    dq, dk, dv = alloc_qkv_grads(layout, q, k, v)
    for grad, inp in ((dq, q), (dk, k), (dv, v)):
        assert grad.shape == inp.shape
        assert grad.stride() == inp.stride()
        assert grad.dtype == inp.dtype and grad.device == inp.device
    esize = q.element_size()

    def same_buffer(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()

    if info.packs_qkv:
        assert same_buffer(dq, dk) and same_buffer(dq, dv)
        step = sizes["h"] * sizes["d_qk"] if info.group == G.L_3HD else sizes["d_qk"]
        assert dk.data_ptr() - dq.data_ptr() == step * esize
        assert dv.data_ptr() - dq.data_ptr() == 2 * step * esize
        assert dq.untyped_storage().nbytes() == 3 * q.numel() * esize
    elif info.packs_kv:
        assert same_buffer(dk, dv) and not same_buffer(dq, dk)
        step = sizes["hg"] * sizes["d_qk"] if info.group == G.L_HD_2HD else sizes["d_qk"]
        assert dv.data_ptr() - dk.data_ptr() == step * esize
    else:
        assert not same_buffer(dq, dk) and not same_buffer(dk, dv) and not same_buffer(dq, dv)
    # and the gradients identify as the same layout
    assert get_qkv_layout(dq, dk, dv, info.q_format.name) == name


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_alloc_output_shape(fmt: str) -> None:
    q = torch.empty((16, 2, 4, 64) if fmt == "sbhd" else (2, 16, 4, 64), dtype=torch.float16)
    o = alloc_output(q, 32)
    assert o.shape == (*q.shape[:-1], 32)
    assert o.is_contiguous() and o.dtype == torch.float16
    assert alloc_output(q, 64, torch.float32).dtype == torch.float32
    # from a packed view: contiguous, not the view's strides
    qp = torch.empty((2, 16, 3, 4, 64), dtype=torch.bfloat16).unbind(-3)[0]
    op = alloc_output(qp, 64)
    assert op.shape == qp.shape and op.is_contiguous()


# ----------------------------------------------------------------------------- get_qkv_layout
# GQA only where q is not packed with k and v (one buffer needs h == hg).
_IDENTIFY = [pytest.param(n, A, id=f"{n}-mha") for n in DENSE_NAMES] + [
    pytest.param(n, STRIDES_B[n][0], id=f"{n}-gqa") for n in DENSE_NAMES if n in STRIDES_B
]


@pytest.mark.parametrize(("name", "sizes"), _IDENTIFY)
def test_get_qkv_layout_identifies_dense_layouts(name: str, sizes: dict) -> None:
    info = layout_info(QKVLayout[name])
    q, k, v = _views(name, **sizes)
    assert get_qkv_layout(q, k, v, info.q_format.name) == name
    # case-insensitive format argument
    assert get_qkv_layout(q, k, v, info.q_format.name.upper()) == name


def test_get_qkv_layout_unrelated_slices_are_separate() -> None:
    buf = torch.empty(2, 16, 3, 4, 64, dtype=torch.bfloat16)
    q, k, v = buf.unbind(-3)
    # k/v swapped: not equally spaced in q, k, v order
    assert get_qkv_layout(q, v, k, "bshd") == "bshd_bshd_bshd"
    # contiguous clones of packed views
    assert get_qkv_layout(q.contiguous(), k.contiguous(), v.contiguous(), "bshd") == "bshd_bshd_bshd"


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_get_qkv_layout_rejects_non_unit_last_stride(which: str) -> None:
    t = {n: torch.empty(2, 16, 4, 64, dtype=torch.bfloat16) for n in "qkv"}
    t[which] = torch.empty(2, 16, 4, 128, dtype=torch.bfloat16)[..., ::2]
    with pytest.raises(ValueError, match=rf"^{which} must have a unit-stride last dimension, got stride \(8192, 512, 128, 2\)"):
        get_qkv_layout(t["q"], t["k"], t["v"], "bshd")


def test_get_qkv_layout_rejects_bad_format() -> None:
    t = torch.empty(2, 16, 4, 64)
    with pytest.raises(ValueError, match=r"qkv_format='bshd_2sbhd' must be one of 'sbhd', 'bshd', 'thd'"):
        get_qkv_layout(t, t, t, "bshd_2sbhd")
    with pytest.raises(ValueError, match=r"qkv_format='hbsd' is not a valid QKVFormat"):
        get_qkv_layout(t, t, t, "hbsd")


# ----------------------------------------------------------------------------- get_qkv_layout: the format argument
def _bshd(b: int, s: int, h: int, d: int) -> torch.Tensor:
    return torch.empty(b, s, h, d, dtype=torch.bfloat16)


def test_get_qkv_layout_default_format_is_sbhd() -> None:
    """As in TransformerEngine the format defaults to 'sbhd': a shape cannot tell [s, b, ...]
    from [b, s, ...], so self-attention tensors get the name of the format asked for."""
    q, k, v = _bshd(2, 16, 4, 64), _bshd(2, 16, 4, 64), _bshd(2, 16, 4, 64)
    assert get_qkv_layout(q, k, v) == "sbhd_sbhd_sbhd"
    assert get_qkv_layout(q, k, v, "bshd") == "bshd_bshd_bshd"


def test_get_qkv_layout_rejects_bshd_cross_attention_read_as_sbhd() -> None:
    """bshd cross-attention tensors under the default 'sbhd' have three batch sizes: an error
    that says which format would fit, not a wrong layout name."""
    q, k, v = _bshd(2, 128, 16, 64), _bshd(2, 256, 4, 64), _bshd(2, 256, 4, 64)
    with pytest.raises(ValueError, match=r"^qkv_format='sbhd' reads the batch size from dim 1 of \[s, b, h, d\], but "
                                         r"q, k, v have 128, 256, 256 there \(q \[2, 128, 16, 64\], k \[2, 256, 4, 64\], "
                                         r"v \[2, 256, 4, 64\]\); they would fit qkv_format='bshd'$"):  # fmt: skip
        get_qkv_layout(q, k, v)
    assert get_qkv_layout(q, k, v, "bshd") == "bshd_bshd_bshd"
    # and the other way round: sbhd tensors read as bshd
    qs, ks, vs = (t.transpose(0, 1) for t in (q, k, v))
    with pytest.raises(ValueError, match=r"qkv_format='bshd' reads the batch size from dim 0 .* they would fit "
                                         r"qkv_format='sbhd'$"):  # fmt: skip
        get_qkv_layout(qs, ks, vs, "bshd")
    assert get_qkv_layout(qs, ks, vs, "sbhd") == "sbhd_sbhd_sbhd"


def test_get_qkv_layout_batch_mismatch_without_a_fitting_format() -> None:
    q, k, v = _bshd(2, 16, 4, 64), _bshd(3, 32, 4, 64), _bshd(2, 32, 4, 64)
    with pytest.raises(ValueError, match=r"q, k, v have 2, 3, 2 there \(q \[2, 16, 4, 64\], k \[3, 32, 4, 64\], "
                                         r"v \[2, 32, 4, 64\]\)$"):  # fmt: skip
        get_qkv_layout(q, k, v, "bshd")


@pytest.mark.parametrize(
    ("fmt", "q", "k", "v"),
    [
        ("bshd", (2, 128, 16, 64), (2, 512, 16, 64), (2, 512, 16, 64)),  # cross-attention
        ("bshd", (2, 128, 32, 64), (2, 128, 4, 64), (2, 128, 4, 64)),  # GQA
        ("bshd", (2, 128, 32, 128), (2, 512, 1, 128), (2, 512, 1, 64)),  # MQA, cross, d_v != d_qk
        ("sbhd", (128, 2, 16, 64), (512, 2, 4, 64), (512, 2, 4, 64)),  # cross + GQA, sbhd
        ("sbhd", (1, 8, 32, 128), (4096, 8, 8, 128), (4096, 8, 8, 128)),  # decode
        ("thd", (100, 16, 64), (300, 4, 64), (300, 4, 32)),  # THD: q and kv token counts differ
    ],
    ids=["cross", "gqa", "mqa-cross-dv", "sbhd-cross-gqa", "decode", "thd-cross"],
)  # fmt: skip
def test_get_qkv_layout_accepts_valid_shapes(fmt: str, q: tuple, k: tuple, v: tuple) -> None:
    t = [torch.empty(s, dtype=torch.float16) for s in (q, k, v)]
    assert get_qkv_layout(*t, fmt) == f"{fmt}_{fmt}_{fmt}"


@pytest.mark.parametrize(
    ("fmt", "shapes", "message"),
    [
        ("sbhd", [(16, 2, 4, 64), (16, 2, 4, 64), (2, 16, 4)],
         r"qkv_format='sbhd' takes 4-d tensors \[s, b, h, d\], but v has shape \[2, 16, 4\]"),
        ("bshd", [(2, 16, 4, 64, 1), (2, 16, 4, 64), (2, 16, 4, 64)],
         r"qkv_format='bshd' takes 4-d tensors \[b, s, h, d\], but q has shape \[2, 16, 4, 64, 1\]"),
        ("thd", [(32, 4, 64), (32, 4, 64), (2, 16, 4, 64)],
         r"qkv_format='thd' takes 3-d tensors \[t, h, d\], but v has shape \[2, 16, 4, 64\]"),
        ("bshd", [(2, 16, 4, 64), (2, 16, 4, 64), (2, 32, 4, 64)],
         r"qkv_format='bshd': k holds 16 keys \(dim 1\) but v holds 32"),
        ("thd", [(40, 4, 64), (32, 4, 64), (31, 4, 64)], r"qkv_format='thd': k holds 32 tokens \(dim 0\) but v holds 31"),
    ],
    ids=["sbhd-3d", "bshd-5d", "thd-4d", "kv-lengths", "thd-kv-tokens"],
)  # fmt: skip
def test_get_qkv_layout_rejects_shapes_outside_the_format(fmt: str, shapes: list, message: str) -> None:
    t = [torch.empty(s, dtype=torch.float16) for s in shapes]
    with pytest.raises(ValueError, match=message):
        get_qkv_layout(*t, fmt)


@pytest.mark.parametrize("name", ["t3hd", "th3d", "thd_t2hd", "thd_th2d", "thd_thd_thd"])
def test_get_qkv_layout_identifies_thd_layouts(name: str) -> None:
    from te_cudnn.testing import make_qkv

    gqa = name in ("thd_t2hd", "thd_th2d", "thd_thd_thd")
    q, k, v = make_qkv(QKVLayout[name], 3, 8, 2 if gqa else 8, 16, 24 if gqa else 16, 64, device="cpu")
    assert q.dim() == 3 and q.shape[0] == 3 * 16 and k.shape[0] == 3 * (24 if gqa else 16)
    assert get_qkv_layout(q, k, v, "thd") == name


@pytest.mark.parametrize(("name", "sizes", "q_st", "k_st", "v_st", "o_st"), list(_view_cases()))
@pytest.mark.parametrize("view", ["as_given", "permuted", "strided"])
def test_meta_grads_have_the_geometry_of_real_ones(name, sizes, q_st, k_st, v_st, o_st, view) -> None:
    """``alloc_qkv_grads(..., device="meta")`` (the first call's geometry check) gives the
    shapes and strides real gradients get, also for permuted and non-dense inputs."""
    layout = QKVLayout[name]
    q, k, v = _views(name, **sizes)
    if view == "permuted" and q.dim() == 4:
        q, k, v = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))
    elif view == "strided" and q.dim() == 4:
        q, k, v = (torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)[..., ::2] for t in (q, k, v))
    real = alloc_qkv_grads(layout, q, k, v)
    meta = alloc_qkv_grads(layout, q, k, v, device="meta")
    via_meta_inputs = alloc_qkv_grads(layout, *(t.to("meta") for t in (q, k, v)))
    for r, m, w in zip(real, meta, via_meta_inputs):
        assert m.is_meta and (m.shape, m.stride()) == (r.shape, r.stride()) == (w.shape, w.stride())
