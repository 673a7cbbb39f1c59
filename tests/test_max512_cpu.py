"""The F16 max512 sub-backend without a GPU: its graphs are built with the real cuDNN frontend
for every declared layout x mask x bias type, in the exact op pattern cuDNN's engine 0
recognises, and its eligibility rules decline with reasons.

The frontend validates these generic (matmul/pointwise/reduction) graphs in C++ against
libcudnn, which a CPU-only machine lacks: ``validate()`` here must get through the
frontend's own Python checks and stop only at that missing library. The GPU suite
(test_max512_gpu.py) validates, builds and runs them.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from te_cudnn.backends import BY_ENUM, Direction, Uid, select
from te_cudnn.config import describe_shapes
from te_cudnn.enums import AttnBiasType, AttnMaskType, FusedAttnBackend
from te_cudnn.runtime import HOPPER_CUDNN_919, RuntimeEnv

MAX512 = BY_ENUM[FusedAttnBackend.F16_max512_seqlen]
ARB = BY_ENUM[FusedAttnBackend.F16_arbitrary_seqlen]
CAPS = MAX512.caps


def _cfg(layout="bshd_bshd_bshd", mask="causal", bias="no_bias", s=128, skv=None, h=4, hg=None, d=64, dtype=torch.bfloat16,
         dropout=0.0, window=(-1, -1), training=True):  # fmt: skip
    return describe_shapes(is_training=training, dtype=dtype, qkv_layout=layout, attn_bias_type=bias, attn_mask_type=mask,
                           softmax_type="vanilla", dropout=dropout, num_attn_heads=h, num_gqa_groups=hg or h,
                           max_seqlen_q=s, max_seqlen_kv=skv or s, head_dim_qk=d, head_dim_v=d, window_size=window,
                           batch_size=2)  # fmt: skip


def _bwd(cfg):
    return replace(cfg.for_backward(cfg.o_stride, False), saved_softmax=True)


def _validate_up_to_libcudnn(graph) -> None:
    try:
        graph.validate()
    except Exception as exc:  # only the missing library may stop it here
        text = f"{type(exc).__name__}: {exc}"
        assert any(w in text for w in ("DynamicLibNotFound", "libcudnn", "cudnnGetVersion", "driver library")), text


CASES = [
    pytest.param(layout, mask, bias, dtype, id=f"{layout.name}-{mask.name}-{bias.name}-{str(dtype)[6:]}")
    for layout, mask, bias, dtype in itertools.product(sorted(CAPS.layouts), sorted(CAPS.masks), sorted(CAPS.bias_types),
                                                       (torch.float16, torch.bfloat16))  # fmt: skip
]

FWD_PATTERN = ["k_scaled", "bmm1", "row", "col", "row_valid", "col_valid", "padding_mask", "masked", "row_max", "shifted", "exp",
               "row_sum", "softmax", "bmm2"]  # fmt: skip


@pytest.mark.parametrize("layout,mask,bias,dtype", CASES)
def test_graphs_build_in_the_engines_pattern(layout, mask, bias, dtype):
    cfg = _cfg(layout.name, mask.name, bias.name, dtype=dtype)
    assert MAX512.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD) == []
    assert MAX512.not_supported_reasons(_bwd(cfg), HOPPER_CUDNN_919, Direction.BWD) == []
    fwd = MAX512.build(cfg, Direction.FWD)
    names = [n.name for n in fwd.graph._nodes]
    expected = list(FWD_PATTERN)
    if bias == AttnBiasType.post_scale_bias:
        expected.insert(2, "bias_add")
    if mask == AttnMaskType.causal:
        expected[expected.index("masked"):expected.index("masked")] = ["causal", "causal_mask"]
    assert names == expected
    has_bias = [Uid.BIAS] if bias == AttnBiasType.post_scale_bias else []
    assert fwd.uids == (Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS, *has_bias, Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV)
    # the saved softmax: written, io dtype, the engine's F16x16 tile order
    p = next(t for t in fwd.graph._tensors.values() if t.uid == Uid.STATS)
    assert list(p.dim) == [cfg.b, cfg.h, cfg.sq, cfg.skv] and p.reordering_type is not None
    # the scale multiplies K in the io dtype (the engine declines a float32 product)
    scale = [t for t in fwd.graph._data_bindings.values() if t.dtype == dtype]
    assert len(scale) == 1 and scale[0].item() == pytest.approx(cfg.attn_scale, rel=1e-2)
    _validate_up_to_libcudnn(fwd.graph)

    bwd = MAX512.build(_bwd(cfg), Direction.BWD)
    dbias = [Uid.DBIAS] if bias == AttnBiasType.post_scale_bias else []
    assert bwd.uids == (Uid.Q, Uid.K, Uid.V, Uid.STATS, Uid.DO, Uid.DQ, Uid.DK, Uid.DV, Uid.DS, *dbias, Uid.SEQ_LEN_Q,
                        Uid.SEQ_LEN_KV)  # fmt: skip
    # dS is written to its own buffer: the saved softmax is an input only
    virtual = {t.uid: t.is_virtual for t in bwd.graph._tensors.values() if t.uid in (Uid.DS, Uid.STATS, Uid.DQ)}
    assert virtual == {Uid.DS: False, Uid.STATS: False, Uid.DQ: False}
    written = {out.uid for node in bwd.graph._nodes for out in node.outputs.values() if out is not None}
    assert Uid.DS in written and Uid.STATS not in written
    _validate_up_to_libcudnn(bwd.graph)


DECLINED = [
    ("padding", dict(mask="padding"), "padding masks"),
    ("padding_causal", dict(mask="padding_causal"), "matmul overrides"),
    ("causal_bottom_right", dict(mask="causal_bottom_right", skv=256), "attn_mask_type=causal_bottom_right"),
    ("gqa", dict(h=8, hg=2), "grouped-query attention"),
    ("head_dim_128", dict(d=128), "(supported: [64])"),
    ("seqlen_576", dict(s=576), "exceed 512"),
    ("seqlen_96", dict(s=96), "multiples of 64"),
    ("dropout", dict(dropout=0.1), "dropout=0.1 is not supported"),
    ("window", dict(mask="causal", window=(64, 0)), "sliding window"),
    ("layout_bshd_bsh2d", dict(layout="bshd_bsh2d"), "qkv_layout=bshd_bsh2d"),
    ("dbias_skv_192", dict(bias="post_scale_bias", s=192), "dBias needs skv of 128, 256 or 512"),
    ("alibi", dict(bias="alibi"), "attn_bias_type=alibi"),
]  # fmt: skip


@pytest.mark.parametrize("over,fragment", [c[1:] for c in DECLINED], ids=[c[0] for c in DECLINED])
def test_declines_with_reason(over, fragment):
    why = MAX512.not_supported_reasons(_cfg(**over), HOPPER_CUDNN_919, Direction.BWD)
    assert any(fragment in r for r in why), why


def test_sbhd_sb2hd_batch_of_three_is_declined_only_there():
    """cuDNN 9.19's engine 0 gives wrong results for sbhd_sb2hd at b=3 (tools/probe_max512_layouts.py, H100)."""
    def cfg(layout, b):
        return replace(_cfg(layout=layout, training=False), b=b)

    assert any("sbhd_sb2hd with b=3" in r for r in MAX512.not_supported_reasons(cfg("sbhd_sb2hd", 3), HOPPER_CUDNN_919))
    for layout, b in (("sbhd_sb2hd", 2), ("sbhd_sb2hd", 4), ("sb3hd", 3), ("bshd_bs2hd", 3)):
        assert MAX512.not_supported_reasons(cfg(layout, b), HOPPER_CUDNN_919) == [], (layout, b)


def test_dbias_rule_is_training_only():
    inference = _cfg(bias="post_scale_bias", s=192, training=False)
    assert MAX512.not_supported_reasons(inference, HOPPER_CUDNN_919, Direction.FWD) == []


@pytest.mark.parametrize("sm", [86, 89, 100, 120])
def test_only_sm80_and_sm90(sm):
    why = MAX512.not_supported_reasons(_cfg(), RuntimeEnv(sm=sm, cudnn_version=91900))
    assert any("sm80 and sm90 only" in r or f"sm{sm}" in r for r in why), why
    assert MAX512.not_supported_reasons(_cfg(), RuntimeEnv(sm=80, cudnn_version=91900)) == []


def test_backward_follows_the_saved_aux():
    cfg = _cfg()
    with_softmax = _bwd(cfg)
    with_stats = cfg.for_backward(cfg.o_stride, False)
    assert select(with_softmax, HOPPER_CUDNN_919, direction=Direction.BWD) is MAX512
    assert any("full softmax S an F16_max512_seqlen forward saved" in r for r in ARB.not_supported_reasons(with_softmax, HOPPER_CUDNN_919, Direction.BWD))
    assert select(with_stats, HOPPER_CUDNN_919, direction=Direction.BWD) is ARB
    assert any("holds fp32 softmax stats" in r for r in MAX512.not_supported_reasons(with_stats, HOPPER_CUDNN_919, Direction.BWD))


def test_selection_prefers_flash_and_falls_back_to_max512():
    cfg = _cfg()
    assert select(cfg, HOPPER_CUDNN_919) is ARB  # measured faster at every size
    # TE's policy: where the flash path cannot serve (here: cuDNN 9.10.0, bad for it), max512 does
    old = RuntimeEnv(sm=90, cudnn_version=91000)
    assert select(cfg, old) is MAX512


def test_max512_plans_are_not_persisted():
    assert CAPS.persistable is False and ARB.caps.persistable is True
