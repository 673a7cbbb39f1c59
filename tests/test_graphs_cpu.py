"""The real cuDNN frontend builds and validates every graph the F16 arbitrary sub-backend
declares it serves; no GPU is needed for this (frontend 1.32 validates in Python).

Cases come from the sub-backend's declaration: every declared layout (dense, THD and mixed
q/kv formats) x mask x bias type x {MHA, GQA}, forward and backward. Combinations the
declaration rejects are checked to be rejected with a reason instead.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from te_cudnn.backends import REGISTRY, Direction, Uid
from te_cudnn.backends.f16_arbitrary import F16ArbitrarySeqlen
from te_cudnn.config import describe_fwd, describe_shapes
from te_cudnn.enums import AttnBiasType, AttnMaskType, QKVFormat, QKVLayout
from te_cudnn.layouts import CORE_LAYOUTS, layout_info
from te_cudnn.runtime import HOPPER_CUDNN_919

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


def test_cases_cover_thd_and_mixed_layouts():
    ids = {p.id for p in _cases()}
    assert LAYOUTS >= {QKVLayout.t3hd, QKVLayout.thd_thd_thd, QKVLayout.thd_sbhd_sbhd, QKVLayout.sbhd_bshd_bshd}
    assert {"t3hd-padding_causal-no_bias-mha", "thd_t2hd-padding_causal_bottom_right-no_bias-gqa",
            "thd_bshd_bshd-padding-no_bias-gqa", "bshd_sbhd_sbhd-causal-post_scale_bias-mha"} <= ids  # fmt: skip
    assert len(ids) == (19 * 2 - 6) * 6 * 3  # 6 layouts pack q with k/v: MHA only


@pytest.mark.parametrize("layout,mask,bias,gqa,cross", list(_cases()))
def test_declared_graphs_validate(layout, mask, bias, gqa, cross):
    cfg = _config(layout, mask, bias, gqa, cross)
    info = layout_info(layout)
    assert (cfg.ragged_q, cfg.ragged_kv) == (info.q_format == QKVFormat.thd, info.kv_format == QKVFormat.thd)
    reasons = BACKEND.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.BWD)
    if reasons:
        # Declined combinations say why, and the reason names the rule.
        assert any(word in " ".join(reasons) for word in ("alibi", "causal_bottom_right", "bias", "padding mask")), reasons
        if cfg.is_ragged and not mask.is_padding:
            assert any("(THD) needs a padding mask" in r for r in reasons), reasons
        return
    for direction in Direction:
        spec = BACKEND.build(cfg, direction)
        spec.graph.validate()  # the frontend's own checks (shapes, strides, mask rules, ragged offsets)
        assert spec.direction == direction
        assert set(spec.uids) == _expected_uids(cfg, direction)
        assert len(spec.uids) == len(set(spec.uids))
        # runtime tensors (seq lens, ragged offsets) are bound last, in runtime_uids order
        runtime = BACKEND.runtime_uids(cfg)
        assert list(spec.uids[len(spec.uids) - len(runtime):]) == runtime


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


def test_graph_tensors_carry_caller_strides():
    """q/k/v reach cuDNN with the packed buffer's strides: no copies, no transposes."""
    from te_cudnn.layouts import layout_strides

    cfg = _config(QKVLayout.sbh3d, AttnMaskType.causal, AttnBiasType.no_bias, False, False)
    spec = BACKEND.build_fwd(cfg)
    spec.graph.validate()
    dump = str(spec.graph)
    expected = layout_strides(QKVLayout.sbh3d, 2, 8, 8, 128, 128, 64, 64)
    for name in ("q", "k", "v"):
        assert tuple(cfg.__getattribute__(f"{name}_stride")) == expected[name]
    assert str(list(expected["q"])).replace(" ", "") in dump.replace(" ", "").replace("\n", "")
