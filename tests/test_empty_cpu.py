"""Zero-size calls on the CPU: they describe as empty, never reach a graph, and h/hg/d of 0 is
malformed input. (Their results are GPU-tested in test_empty_gpu.py.)"""

from __future__ import annotations

import pytest
import torch

import te_cudnn as tc
from te_cudnn.backends import REGISTRY, Direction
from te_cudnn.config import aligned_contiguous_strides, describe_fwd, describe_shapes
from te_cudnn.enums import QKVLayout
from te_cudnn.runtime import HOPPER_CUDNN_919
from te_cudnn.testing import make_qkv

DENSE = ("bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bs3hd", "sbh3d", "bshd_bs2hd", "sbhd_sbh2d")


def _describe(q, k, v, layout, mask="no_mask", sq=None, skv=None, cu_q=None, cu_kv=None, **kw):
    info_s = 0 if layout.startswith("sb") else 1
    sq = q.shape[info_s] if sq is None else sq
    skv = k.shape[info_s] if skv is None else skv
    args = dict(is_training=True, max_seqlen_q=sq, max_seqlen_kv=skv, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                q=q, k=k, v=v, qkv_dtype=q.dtype, attn_bias=None, attn_scale=None, dropout=0.0, qkv_layout=layout,
                attn_bias_type="no_bias", attn_mask_type=mask, softmax_type="vanilla", window_size=(-1, -1),
                bottom_right_diagonal=None)  # fmt: skip
    args.update(kw)
    return describe_fwd(**args)


@pytest.mark.parametrize("layout", DENSE)
@pytest.mark.parametrize("b,s", [(0, 64), (2, 0), (0, 0)], ids=["b0", "s0", "b0s0"])
def test_dense_zero_batch_or_sequence_is_empty(layout, b, s):
    q, k, v = make_qkv(QKVLayout[layout], b, 4, 4, s, s, 64, device="cpu")
    cfg = _describe(q, k, v, layout)
    assert cfg.empty and (cfg.b, cfg.sq) == (b, s)
    for backend in REGISTRY:  # the guard every graph passes: no zero dimension reaches cuDNN
        with pytest.raises(ValueError, match="empty"):
            backend.build(cfg, Direction.FWD)


def test_padding_mask_with_zero_length_batch_is_empty():
    """b=1, s=0 with a padding mask: the call that killed the process with SIGFPE in cuDNN."""
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 1, 4, 4, 0, 0, 64, device="cpu")
    cu = torch.zeros(2, dtype=torch.int32)
    assert _describe(q, k, v, "bshd_bshd_bshd", "padding", cu_q=cu, cu_kv=cu).empty


@pytest.mark.parametrize(
    "tokens_q,tokens_kv,cu,max_q,max_kv",
    [(0, 0, [0, 0, 0], 0, 0), (0, 0, [0], 0, 0), (16, 16, [0, 8, 16], 0, 8), (8, 0, [0, 8], 8, 0), (8, 8, [0, 8], 8, 0)],
    ids=["all-empty", "b0", "max_q0", "no-kv-tokens", "max_kv0"],
)
def test_thd_empty_batches(tokens_q, tokens_kv, cu, max_q, max_kv):
    q = torch.randn(tokens_q, 4, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(tokens_kv, 4, 64, dtype=torch.bfloat16) for _ in range(2))
    cu_q = torch.tensor(cu, dtype=torch.int32)
    cu_kv = cu_q if tokens_kv else torch.zeros_like(cu_q)
    cfg = _describe(q, k, v, "thd_thd_thd", "padding", sq=max_q, skv=max_kv, cu_q=cu_q, cu_kv=cu_kv)
    assert cfg.empty


def test_thd_with_tokens_and_lengths_is_not_empty():
    q, k, v = (torch.randn(16, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 0, 16], dtype=torch.int32)  # one empty sequence inside a non-empty batch
    assert not _describe(q, k, v, "thd_thd_thd", "padding", sq=16, skv=16, cu_q=cu, cu_kv=cu).empty


@pytest.mark.parametrize(
    "shape,what",
    [((2, 8, 0, 64), "heads"), ((2, 8, 4, 0), "head dim")],
    ids=["h0", "d0"],
)
def test_zero_heads_or_head_dim_is_malformed(shape, what):
    q = torch.randn(*shape, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"q has shape \[{', '.join(map(str, shape))}\].*{what} of 0"):
        _describe(q, q.clone(), q.clone(), "bshd_bshd_bshd")


def test_zero_kv_heads_is_malformed():
    q = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 8, 0, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"k has shape \[2, 8, 0, 64\].*heads of 0"):
        _describe(q, k, k.clone(), "bshd_bshd_bshd")


def test_explain_and_backend_choice_for_empty_sizes():
    ex = tc.explain(is_training=True, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd",
                    attn_bias_type="no_bias", attn_mask_type="causal", softmax_type="vanilla", dropout=0.0,
                    num_attn_heads=16, num_gqa_groups=16, max_seqlen_q=0, max_seqlen_kv=0, head_dim_qk=128,
                    head_dim_v=128, batch_size=0, env=HOPPER_CUDNN_919)  # fmt: skip
    assert ex.empty and "an empty call" in str(ex)
    assert ex.backend == tc.FusedAttnBackend.F16_arbitrary_seqlen  # what serves the non-empty calls of this shape
    with pytest.raises(ValueError, match="num_attn_heads=0"):
        tc.explain(True, torch.bfloat16, torch.bfloat16, "bshd_bshd_bshd", "no_bias", "causal", "vanilla", 0.0,
                   0, 0, 64, 64, 128, 128, env=HOPPER_CUDNN_919)  # fmt: skip
    with pytest.raises(ValueError, match="batch_size=-1"):
        describe_shapes(is_training=True, dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias",
                        attn_mask_type="causal", softmax_type="vanilla", dropout=0.0, num_attn_heads=4,
                        num_gqa_groups=4, max_seqlen_q=8, max_seqlen_kv=8, head_dim_qk=64, head_dim_v=64,
                        window_size=(-1, -1), batch_size=-1)  # fmt: skip


# ------------------------------------------------------------------ unaligned post-scale bias


@pytest.mark.parametrize(
    "shape", [(1, 4, 100, 100), (1, 1, 100, 100), (2, 1, 100, 100), (2, 4, 100, 100)], ids=["1hss", "11ss", "b1ss", "bhss"]
)
def test_unaligned_bias_is_described_as_copied(shape):
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 100, 100, 64, device="cpu")
    bias = torch.randn(*shape, dtype=torch.bfloat16)
    cfg = _describe(q, k, v, "bshd_bshd_bshd", attn_bias=bias, attn_bias_type="post_scale_bias")
    assert cfg.bias_copy and cfg.bias_shape == shape
    assert cfg.bias_stride == aligned_contiguous_strides(shape, 2) and cfg.bias_stride[-2] == 104
    graph = REGISTRY[0].build(cfg, Direction.BWD).graph  # the real frontend takes the padded bias and dBias
    graph.validate()


def test_aligned_bias_is_read_in_place():
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 128, 128, 64, device="cpu")
    bias = torch.randn(1, 4, 128, 128, dtype=torch.bfloat16)
    cfg = _describe(q, k, v, "bshd_bshd_bshd", attn_bias=bias, attn_bias_type="post_scale_bias")
    assert not cfg.bias_copy and cfg.bias_stride == tuple(bias.stride())


@pytest.mark.parametrize("view", ["transposed", "offset"])
def test_bias_strides_or_start_cudnn_cannot_read_are_copied(view):
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 128, 128, 64, device="cpu")
    base = torch.randn(1, 4, 128, 136, dtype=torch.bfloat16)
    bias = base.transpose(-1, -2)[..., :128, :] if view == "transposed" else base[..., 1:129]
    cfg = _describe(q, k, v, "bshd_bshd_bshd", attn_bias=bias, attn_bias_type="post_scale_bias")
    assert cfg.bias_copy and cfg.bias_stride == (128 * 128 * 4, 128 * 128, 128, 1)


def test_aligned_contiguous_strides():
    assert aligned_contiguous_strides((1, 16, 128, 100), 2) == (16 * 128 * 104, 128 * 104, 104, 1)
    assert aligned_contiguous_strides((2, 4, 64, 64), 2) == (4 * 64 * 64, 64 * 64, 64, 1)
    assert aligned_contiguous_strides((1, 1, 1, 7), 4) == (8, 8, 8, 1)
