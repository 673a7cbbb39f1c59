"""The real cuDNN frontend builds and validates every graph the F16 arbitrary sub-backend
declares it serves; no GPU is needed for this (frontend 1.32 validates in Python).

Cases come from the sub-backend's declaration: every declared layout (dense, THD and mixed
q/kv formats) x mask x bias type x {MHA, GQA}, forward and backward. A test-side list of the
documented cross-rules splits them: combinations it serves must build and validate, the others
must decline with exactly the documented reasons; no case passes without checking either.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from te_cudnn import FusedAttnBackend, UnsupportedConfigError
from te_cudnn.backends import REGISTRY, Direction, Uid, select
from te_cudnn.backends.f16_arbitrary import F16ArbitrarySeqlen
from te_cudnn.config import describe_fwd, describe_shapes
from te_cudnn.enums import AttnBiasType, AttnMaskType, QKVFormat, QKVLayout
from te_cudnn.layouts import CORE_LAYOUTS, get_qkv_layout, layout_info
from te_cudnn.runtime import HOPPER_CUDNN_919

from _rules import documented_reasons

BACKEND = REGISTRY[0]
assert isinstance(BACKEND, F16ArbitrarySeqlen)
CAPS = BACKEND.caps
# Paged-KV layouts take page pools and page tables; they have their own tests (test_paged_cpu.py).
LAYOUTS = frozenset(l for l in CAPS.layouts if not layout_info(l).is_paged)


def _cases():
    for layout, mask, bias, gqa in itertools.product(
        sorted(LAYOUTS), sorted(CAPS.masks), sorted(CAPS.bias_types), (False, True)
    ):
        if gqa and layout_info(layout).packs_qkv:
            continue  # one packed buffer cannot hold fewer k/v heads than q heads
        cross = mask.is_bottom_right and not layout_info(layout).packs_qkv
        yield pytest.param(layout, mask, bias, gqa, cross, id=f"{layout.name}-{mask.name}-{bias.name}-{'gqa' if gqa else 'mha'}")


def _side(fmt: QKVFormat, b: int, s: int, h: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    shape = {QKVFormat.thd: (b * s, h, d), QKVFormat.bshd: (b, s, h, d), QKVFormat.sbhd: (s, b, h, d)}[fmt]
    return torch.empty(shape, dtype=dtype)


def _mixed_config(layout, mask, bias, sq, skv, h, hg, dtype, dropout=0.0, window_size=(-1, -1), b=2):
    """Mixed q/kv-format layouts (15-18) are described from CPU tensors: describe_shapes covers the core 15."""
    info = layout_info(layout)
    q = _side(info.q_format, b, sq, h, 64, dtype)
    k, v = _side(info.kv_format, b, skv, hg, 64, dtype), _side(info.kv_format, b, skv, hg, 64, dtype)
    need_cu = mask.is_padding or info.q_format == QKVFormat.thd
    cu = (lambda s: torch.arange(b + 1, dtype=torch.int32) * s) if need_cu else (lambda s: None)
    attn_bias = torch.zeros(1, h, sq, skv, dtype=dtype) if bias == AttnBiasType.post_scale_bias else None
    return describe_fwd(is_training=True, max_seqlen_q=sq, max_seqlen_kv=skv, cu_seqlens_q=cu(sq), cu_seqlens_kv=cu(skv),
                        q=q, k=k, v=v, qkv_dtype=dtype, attn_bias=attn_bias, attn_scale=None, dropout=dropout,
                        qkv_layout=layout, attn_bias_type=bias, attn_mask_type=mask, softmax_type="vanilla",
                        window_size=window_size, bottom_right_diagonal=None)  # fmt: skip


def _config(layout, mask, bias, gqa, cross, dtype=torch.bfloat16, **kw):
    sq, skv, h, hg = 64 if cross else 128, 128, 8, 2 if gqa else 8
    if QKVLayout(layout) not in CORE_LAYOUTS:
        assert not kw.get("bias_shape")
        return _mixed_config(QKVLayout(layout), AttnMaskType(mask), AttnBiasType(bias), sq, skv, h, hg, dtype, **kw)
    return describe_shapes(
        is_training=True, dtype=dtype, qkv_layout=layout, attn_bias_type=bias, attn_mask_type=mask,
        softmax_type="vanilla", dropout=kw.pop("dropout", 0.0), num_attn_heads=h, num_gqa_groups=hg,
        max_seqlen_q=sq, max_seqlen_kv=skv, head_dim_qk=64, head_dim_v=64,
        window_size=kw.pop("window_size", (-1, -1)), batch_size=2, **kw,
    )  # fmt: skip


def _expected_uids(cfg, direction: Direction) -> set[int]:
    expected = {Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS}
    if direction == Direction.BWD:
        expected |= {Uid.DO, Uid.DQ, Uid.DK, Uid.DV}
    if cfg.bias_type == AttnBiasType.post_scale_bias:
        expected |= {Uid.BIAS} | ({Uid.DBIAS} if direction == Direction.BWD and cfg.has_dbias else set())
    if cfg.has_dropout:
        expected |= {Uid.SEED, Uid.OFFSET}
    if cfg.mask.is_padding:
        expected |= {Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV}
    if cfg.ragged_q:
        expected |= {Uid.RAGGED_Q, Uid.RAGGED_O, Uid.RAGGED_STATS}
    if cfg.ragged_kv:
        expected |= {Uid.RAGGED_K, Uid.RAGGED_V}
    return expected


def _documented_reasons(layout, mask, bias, gqa, cross) -> list[str]:
    """The reasons a generated case (sq = skv = 128 or, with ``cross``, sq = 64 < skv) must be
    declined with: the documented cross-rules of tests/_rules.py."""
    return documented_reasons(layout, mask, bias, 64 if cross else 128, 128)


SERVED = [p for p in _cases() if not _documented_reasons(*p.values)]
DECLINED = [p for p in _cases() if _documented_reasons(*p.values)]


def test_cases_cover_thd_and_mixed_layouts():
    ids = {p.id for p in _cases()}
    assert LAYOUTS >= {QKVLayout.t3hd, QKVLayout.thd_thd_thd, QKVLayout.thd_sbhd_sbhd, QKVLayout.sbhd_bshd_bshd}
    assert {"t3hd-padding_causal-no_bias-mha", "thd_t2hd-padding_causal_bottom_right-no_bias-gqa",
            "thd_bshd_bshd-padding-no_bias-gqa", "bshd_sbhd_sbhd-causal-post_scale_bias-mha"} <= ids  # fmt: skip
    assert len(ids) == (19 * 2 - 6) * 6 * 3  # 6 layouts pack q with k/v: MHA only
    # every case is either built and validated or checked to decline with its exact reasons
    assert len(SERVED) == 224 and len(DECLINED) == 352
    served = {p.id for p in SERVED}
    assert {"t3hd-padding_causal-no_bias-mha", "bshd_sbhd_sbhd-causal-post_scale_bias-mha",
            "sb3hd-causal_bottom_right-alibi-mha", "thd_bshd_bshd-padding_causal_bottom_right-no_bias-gqa"} <= served  # fmt: skip
    assert any(layout_info(p.values[0]).q_format == QKVFormat.thd for p in SERVED)


@pytest.mark.parametrize("layout,mask,bias,gqa,cross", SERVED)
def test_declared_graphs_validate(layout, mask, bias, gqa, cross):
    """Every combination the declaration serves builds, and the real frontend validates it."""
    cfg = _config(layout, mask, bias, gqa, cross)
    info = layout_info(layout)
    assert (cfg.ragged_q, cfg.ragged_kv) == (info.q_format == QKVFormat.thd, info.kv_format == QKVFormat.thd)
    for direction in Direction:
        assert BACKEND.not_supported_reasons(cfg, HOPPER_CUDNN_919, direction) == []
        spec = BACKEND.build(cfg, direction)
        spec.graph.validate()  # the frontend's own checks (shapes, strides, mask rules, ragged offsets)
        assert spec.direction == direction
        assert set(spec.uids) == _expected_uids(cfg, direction)
        assert len(spec.uids) == len(set(spec.uids))
        # runtime tensors (seq lens, ragged offsets) are bound last, in runtime_uids order
        runtime = BACKEND.runtime_uids(cfg)
        assert list(spec.uids[len(spec.uids) - len(runtime):]) == runtime


@pytest.mark.parametrize("layout,mask,bias,gqa,cross", DECLINED)
def test_declared_combinations_decline_with_their_reasons(layout, mask, bias, gqa, cross):
    """Every combination the declaration does not serve declines with exactly the documented
    reasons (forward and backward), and selection raises rather than building a graph."""
    cfg = _config(layout, mask, bias, gqa, cross)
    expected = _documented_reasons(layout, mask, bias, gqa, cross)
    for direction in Direction:
        assert BACKEND.not_supported_reasons(cfg, HOPPER_CUDNN_919, direction) == expected
    with pytest.raises(UnsupportedConfigError) as ei:
        select(cfg, HOPPER_CUDNN_919, FusedAttnBackend.F16_arbitrary_seqlen)
    assert ei.value.reasons[FusedAttnBackend.F16_arbitrary_seqlen] == expected


@pytest.mark.parametrize("shape", [(1, 8, 128, 128), (1, 1, 128, 128), (2, 1, 128, 128), (2, 8, 128, 128)], ids=["1hss", "11ss", "b1ss", "bhss"])
def test_bias_shapes_validate_with_dbias(shape):
    cfg = _config(QKVLayout.bshd_bshd_bshd, AttnMaskType.causal, AttnBiasType.post_scale_bias, False, False, bias_shape=shape)
    assert cfg.has_dbias
    spec = BACKEND.build(cfg, Direction.BWD)
    spec.graph.validate()
    assert Uid.DBIAS in spec.uids


def test_dropout_window_and_determinism_validate():
    drop = _config(QKVLayout.sbh3d, AttnMaskType.causal, AttnBiasType.no_bias, False, False, dropout=0.1)
    assert drop.has_dropout
    for direction in Direction:
        spec = BACKEND.build(drop, direction)
        spec.graph.validate()
        assert {Uid.SEED, Uid.OFFSET} <= set(spec.uids)
    window = _config(QKVLayout.bshd_bshd_bshd, AttnMaskType.no_mask, AttnBiasType.no_bias, True, False, window_size=(16, 16))
    assert not BACKEND.not_supported_reasons(window, HOPPER_CUDNN_919, Direction.BWD)
    det = _config(QKVLayout.bshd_bshd_bshd, AttnMaskType.causal, AttnBiasType.no_bias, True, False, deterministic=True)
    for cfg in (window, det):
        for direction in Direction:
            BACKEND.build(cfg, direction).graph.validate()


def test_frontend_agrees_alibi_needs_causal():
    """Our declaration rejects alibi without a causal mask; the frontend's validator agrees."""
    cfg = _config(QKVLayout.bshd_bshd_bshd, AttnMaskType.no_mask, AttnBiasType.alibi, False, False)
    assert any(
        r.startswith("alibi needs attn_mask_type causal or causal_bottom_right (cuDNN requires right bound 0")
        and r.endswith("got no_mask")
        for r in BACKEND.not_supported_reasons(cfg, HOPPER_CUDNN_919)
    )
    with pytest.raises(Exception, match="alibi"):
        BACKEND.build_fwd(cfg).graph.validate()
    # alibi with a padding mask is declined by TransformerEngine's rule, not by cuDNN's validator
    padded = _config(QKVLayout.bshd_bshd_bshd, AttnMaskType.padding_causal, AttnBiasType.alibi, False, False)
    why = BACKEND.not_supported_reasons(padded, HOPPER_CUDNN_919)
    assert any("does not fuse it with padding), got padding_causal" in r for r in why), why
    BACKEND.build_fwd(padded).graph.validate()


@pytest.mark.parametrize("mask", [AttnMaskType.no_mask, AttnMaskType.causal], ids=lambda m: m.name)
def test_frontend_agrees_thd_needs_padding_mask(mask):
    """THD without a padding mask is declined; cuDNN's forward validator rejects ragged offsets without one too."""
    cfg = _config(QKVLayout.thd_thd_thd, mask, AttnBiasType.no_bias, False, False)
    assert cfg.ragged_q and cfg.ragged_kv
    assert any("(THD) needs a padding mask" in r for r in BACKEND.not_supported_reasons(cfg, HOPPER_CUDNN_919))
    with pytest.raises(Exception, match="[Pp]adding mask"):
        BACKEND.build_fwd(cfg).graph.validate()


@pytest.mark.parametrize("layout", [QKVLayout.th3d, QKVLayout.thd_bshd_bshd], ids=lambda l: l.name)
def test_ragged_dropout_window_and_determinism_validate(layout):
    """Dropout, a sliding window and a deterministic backward on THD sides, with padding masks."""
    drop = _config(layout, AttnMaskType.padding_causal, AttnBiasType.no_bias, False, False, dropout=0.1)
    window = _config(layout, AttnMaskType.padding, AttnBiasType.no_bias, False, False, window_size=(16, 16))
    assert drop.has_dropout and window.has_window and drop.ragged_q
    for cfg in (drop, window):
        assert not BACKEND.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.BWD)
        for direction in Direction:
            spec = BACKEND.build(cfg, direction)
            spec.graph.validate()
            assert set(spec.uids) == _expected_uids(cfg, direction)
    assert {Uid.SEED, Uid.OFFSET} <= set(BACKEND.build(drop, Direction.BWD).uids)
    det = _config(layout, AttnMaskType.padding_causal_bottom_right, AttnBiasType.no_bias, False, False)
    BACKEND.build(det.for_backward(det.o_stride, deterministic=True), Direction.BWD).graph.validate()


# BHSD strides (elements) of q, k, v for b=2, s=128, h=hg=8, d=64, worked out by hand from how
# each layout packs its buffer (independently of te_cudnn.layouts). THD sides are [t, h, d]
# token-major with t = b*s; their graph batch stride is the placeholder bucket(s) x token stride.
PB, PS, PH, PD = 2, 128, 8, 64
PACKED = {
    # [s, b, h, 3, d]: s-stride b*h*3*d = 3072, b-stride h*3*d = 1536, h-stride 3*d = 192
    QKVLayout.sbh3d: ("sbhd", ((1536, 192, 3072, 1),) * 3),
    # [s, b, 3, h, d]: s 3072, b 1536, h d = 64
    QKVLayout.sb3hd: ("sbhd", ((1536, 64, 3072, 1),) * 3),
    # [b, s, 3, h, d]: b s*3*h*d = 196608, s 3*h*d = 1536, h 64
    QKVLayout.bs3hd: ("bshd", ((196608, 64, 1536, 1),) * 3),
    # [b, s, h, 3, d]: b 196608, s 1536, h 192
    QKVLayout.bsh3d: ("bshd", ((196608, 192, 1536, 1),) * 3),
    # q [s, b, h, d]: s 1024, b 512, h 64; k/v [s, b, 2, h, d]: s 2048, b 1024, h 64
    QKVLayout.sbhd_sb2hd: ("sbhd", ((512, 64, 1024, 1), (1024, 64, 2048, 1), (1024, 64, 2048, 1))),
    # q [b, s, h, d]: b 65536, s 512, h 64; k/v [b, s, h, 2, d]: b 131072, s 1024, h 128
    QKVLayout.bshd_bsh2d: ("bshd", ((65536, 64, 512, 1), (131072, 128, 1024, 1), (131072, 128, 1024, 1))),
    # [t, 3, h, d]: token 3*h*d = 1536, h 64; batch placeholder 128 x 1536
    QKVLayout.t3hd: ("thd", ((196608, 64, 1536, 1),) * 3),
    # q [t, h, d]: token 512, h 64; k/v [t, h, 2, d]: token 1024, h 128
    QKVLayout.thd_th2d: ("thd", ((65536, 64, 512, 1), (131072, 128, 1024, 1), (131072, 128, 1024, 1))),
}  # fmt: skip


def _packed_views(layout: QKVLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as views of the buffers the layout names, built with plain torch."""
    lead = {"sb": (PS, PB), "bs": (PB, PS), "t": (PB * PS,)}[layout.name[:2] if layout.name[0] != "t" else "t"]
    empty = lambda *shape: torch.empty(*shape, dtype=torch.bfloat16)  # noqa: E731
    name = layout.name
    if "3hd" in name:
        return empty(*lead, 3, PH, PD).unbind(-3)
    if "h3d" in name:
        return empty(*lead, PH, 3, PD).unbind(-2)
    q = empty(*lead, PH, PD)
    if "2hd" in name:
        return (q, *empty(*lead, 2, PH, PD).unbind(-3))
    return (q, *empty(*lead, PH, 2, PD).unbind(-2))


def _bhsd_strides(fmt: str, t: torch.Tensor) -> tuple[int, ...]:
    """A tensor's strides in logical [b, h, s, d] order, read off the tensor itself."""
    st = t.stride()
    if fmt == "sbhd":
        return (st[1], st[2], st[0], st[3])
    if fmt == "bshd":
        return (st[0], st[2], st[1], st[3])
    return (PS * st[0], st[1], st[0], st[2])  # thd: [t, h, d], batch stride = bucketed max_seqlen x token


@pytest.mark.parametrize("layout", list(PACKED), ids=lambda layout: layout.name)
def test_packed_layouts_reach_the_graph_with_the_buffers_strides(layout):
    """q/k/v of packed layouts reach cuDNN with the packed buffer's own strides (no copies, no
    transposes), and the sizes-only description (TE's stride table, used by explain and plan
    warm-up) predicts the same strides: both checked against hand-computed values and the
    actual tensors' strides, in the forward and backward graphs (packed gradients too)."""
    fmt, expected = PACKED[layout]
    q, k, v = _packed_views(layout)
    assert tuple(_bhsd_strides(fmt, t) for t in (q, k, v)) == expected  # the table above matches real buffers
    assert get_qkv_layout(q, k, v, fmt) == layout.name
    thd = fmt == "thd"
    mask = AttnMaskType.padding_causal if thd else AttnMaskType.causal
    cu = torch.arange(PB + 1, dtype=torch.int32) * PS if thd else None
    from_tensors = describe_fwd(is_training=True, max_seqlen_q=PS, max_seqlen_kv=PS, cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                q=q, k=k, v=v, qkv_dtype=torch.bfloat16, attn_bias=None, attn_scale=None, dropout=0.0,
                                qkv_layout=layout, attn_bias_type="no_bias", attn_mask_type=mask,
                                softmax_type="vanilla", window_size=(-1, -1), bottom_right_diagonal=None)  # fmt: skip
    from_sizes = describe_shapes(is_training=True, dtype=torch.bfloat16, qkv_layout=layout, attn_bias_type="no_bias",
                                 attn_mask_type=mask, softmax_type="vanilla", dropout=0.0, num_attn_heads=PH,
                                 num_gqa_groups=PH, max_seqlen_q=PS, max_seqlen_kv=PS, head_dim_qk=PD, head_dim_v=PD,
                                 window_size=(-1, -1), batch_size=PB)  # fmt: skip
    for cfg in (from_tensors, from_sizes):
        assert (cfg.q_stride, cfg.k_stride, cfg.v_stride) == expected
        assert cfg.grad_strides == expected  # dq/dk/dv are views of one packed buffer, as TE returns them
    for direction in Direction:
        spec = BACKEND.build(from_tensors, direction)
        spec.graph.validate()
        declared = {t.uid: tuple(t.stride) for t in spec.graph._tensors.values()}
        assert (declared[Uid.Q], declared[Uid.K], declared[Uid.V]) == expected
        if direction == Direction.BWD:
            assert (declared[Uid.DQ], declared[Uid.DK], declared[Uid.DV]) == expected
