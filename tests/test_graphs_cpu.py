"""The real cuDNN frontend builds and validates every graph the F16 arbitrary sub-backend
declares it serves; no GPU is needed for this (frontend 1.32 validates in Python).

Cases come from the sub-backend's declaration: every dense layout x mask x bias type x
{MHA, GQA}, forward and backward. Combinations the declaration rejects are checked to be
rejected with a reason instead.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from te_cudnn.backends import REGISTRY, Direction, Uid
from te_cudnn.backends.f16_arbitrary import F16ArbitrarySeqlen
from te_cudnn.config import describe_shapes
from te_cudnn.enums import AttnBiasType, AttnMaskType, QKVLayout
from te_cudnn.layouts import layout_info
from te_cudnn.runtime import HOPPER_CUDNN_919

BACKEND = REGISTRY[0]
assert isinstance(BACKEND, F16ArbitrarySeqlen)
CAPS = BACKEND.caps


def _cases():
    for layout, mask, bias, gqa in itertools.product(
        sorted(CAPS.layouts), sorted(CAPS.masks), sorted(CAPS.bias_types), (False, True)
    ):
        if gqa and layout_info(layout).packs_qkv:
            continue  # one packed buffer cannot hold fewer k/v heads than q heads
        cross = mask == AttnMaskType.causal_bottom_right and not layout_info(layout).packs_qkv
        yield pytest.param(layout, mask, bias, gqa, cross, id=f"{layout.name}-{mask.name}-{bias.name}-{'gqa' if gqa else 'mha'}")


def _config(layout, mask, bias, gqa, cross, dtype=torch.bfloat16, **kw):
    return describe_shapes(
        is_training=True, dtype=dtype, qkv_layout=layout, attn_bias_type=bias, attn_mask_type=mask,
        softmax_type="vanilla", dropout=kw.pop("dropout", 0.0), num_attn_heads=8, num_gqa_groups=2 if gqa else 8,
        max_seqlen_q=64 if cross else 128, max_seqlen_kv=128, head_dim_qk=64, head_dim_v=64,
        window_size=kw.pop("window_size", (-1, -1)), batch_size=2, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("layout,mask,bias,gqa,cross", list(_cases()))
def test_declared_graphs_validate(layout, mask, bias, gqa, cross):
    cfg = _config(layout, mask, bias, gqa, cross)
    reasons = BACKEND.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.BWD)
    if reasons:
        # Declined combinations say why, and the reason names the rule.
        assert any(word in " ".join(reasons) for word in ("alibi", "causal_bottom_right", "bias")), reasons
        return
    for direction in Direction:
        spec = BACKEND.build(cfg, direction)
        spec.graph.validate()  # the frontend's own checks (shapes, strides, mask rules)
        assert spec.direction == direction
        expected = {Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS}
        if direction == Direction.BWD:
            expected |= {Uid.DO, Uid.DQ, Uid.DK, Uid.DV}
        if bias == AttnBiasType.post_scale_bias:
            expected |= {Uid.BIAS} | ({Uid.DBIAS} if direction == Direction.BWD else set())
        assert set(spec.uids) == expected
        assert len(spec.uids) == len(set(spec.uids))


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
    assert any("alibi needs a causal mask" in r for r in BACKEND.not_supported_reasons(cfg, HOPPER_CUDNN_919))
    with pytest.raises(Exception, match="alibi"):
        BACKEND.build_fwd(cfg).graph.validate()


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
