"""Variable-length (THD) support on CPU: shape buckets, seq-len/offset tensors, THD
descriptions, plan keys that ignore batch composition, and frontend validation of the
graphs built from those descriptions (no GPU needed)."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from te_cudnn.backends import REGISTRY, Direction, Uid
from te_cudnn.config import AttnConfig, describe_fwd
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.plans import make_key
from te_cudnn.ragged import bucket_batch, bucket_seqlen, bucket_tokens, extend, offsets_view, ragged_offsets, seq_lens, seq_lens_pair
from te_cudnn.runtime import HOPPER_CUDNN_919

BF16 = torch.bfloat16
I32 = torch.int32
BACKEND = REGISTRY[0]
assert BACKEND.enum is FusedAttnBackend.F16_arbitrary_seqlen


# ----------------------------------------------------------------------------- buckets
@pytest.mark.parametrize(("b", "bucket"), [(1, 32), (32, 32), (33, 64), (100, 128), (512, 512), (513, 1024), (1025, 1536)])
def test_bucket_batch(b: int, bucket: int) -> None:
    assert bucket_batch(b) == bucket


@pytest.mark.parametrize(
    ("t", "bucket"), [(1, 1024), (1024, 1024), (1025, 2048), (32768, 32768), (32769, 65536), (70000, 98304)]
)
def test_bucket_tokens(t: int, bucket: int) -> None:
    assert bucket_tokens(t) == bucket


@pytest.mark.parametrize(("s", "bucket"), [(1, 1), (2, 64), (64, 64), (65, 128), (1000, 1024)])
def test_bucket_seqlen(s: int, bucket: int) -> None:
    assert bucket_seqlen(s) == bucket


# ----------------------------------------------------------------------------- seq_lens / offsets
def _i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=I32)


def test_seq_lens_te_example() -> None:
    # [a, PAD, b, b, c, PAD, PAD, d, d]: cu_seqlens counts real tokens only
    lens = seq_lens(_i32(0, 1, 3, 4, 6), 4)
    assert lens.dtype == I32 and lens.shape == (4, 1, 1, 1)
    assert lens.flatten().tolist() == [1, 2, 1, 2]


def test_seq_lens_bucket_padding_and_empty_sequences() -> None:
    lens = seq_lens(_i32(0, 0, 3, 3, 5), 32)
    assert lens.dtype == I32 and lens.shape == (32, 1, 1, 1)
    assert lens.flatten().tolist() == [0, 3, 0, 2] + [0] * 28


@pytest.mark.parametrize("shared", [True, False], ids=["self-attention", "cross-attention"])
def test_seq_lens_pair_matches_seq_lens(shared: bool) -> None:
    """Both sides' lengths in one call (one foreach kernel on CUDA): the same values and shapes
    as two seq_lens calls, bucket padding included; self-attention returns one tensor twice."""
    cu_q = torch.tensor([0, 1, 1, 2, 3], dtype=torch.int32)
    cu_kv = cu_q if shared else torch.tensor([0, 8192, 12288, 12288, 20000], dtype=torch.int32)
    batch = 6
    ext_q = extend(cu_q, batch)
    ext_kv = ext_q if shared else extend(cu_kv, batch)
    lens_q, lens_kv = seq_lens_pair(cu_q, cu_kv, batch, ext_q, ext_kv)
    assert lens_q.shape == lens_kv.shape == (batch, 1, 1, 1) and lens_q.dtype == lens_kv.dtype == torch.int32
    assert torch.equal(lens_q, seq_lens(cu_q, batch)) and torch.equal(lens_kv, seq_lens(cu_kv, batch))
    assert (lens_q is lens_kv) == shared
    assert lens_kv.flatten().tolist() == ([1, 0, 1, 1, 0, 0] if shared else [8192, 4096, 0, 7712, 0, 0])


def test_ragged_offsets_te_example() -> None:
    padded = _i32(0, 2, 4, 7, 9)  # [a, PAD, b, b, c, PAD, PAD, d, d]
    h, d_qk, d_v = 4, 16, 8
    mult = torch.tensor([h * d_qk, h * d_v, h], dtype=torch.int64)  # q, o, stats elements per token
    off = ragged_offsets(padded, mult, 4)
    assert off.dtype == torch.int64 and off.shape == (3, 5)
    assert off.tolist() == [[0, 128, 256, 448, 576], [0, 64, 128, 224, 288], [0, 8, 16, 28, 36]]
    view = offsets_view(off, 1)
    assert view.shape == (5, 1, 1, 1) and view.dtype == torch.int64
    assert view.flatten().tolist() == [0, 64, 128, 224, 288]


def test_ragged_offsets_continue_last_value_over_bucket() -> None:
    padded = _i32(0, 0, 3, 3, 5)  # two empty sequences
    off = ragged_offsets(padded, torch.tensor([10, 3], dtype=torch.int64), 7)
    assert off.shape == (2, 8)
    assert off.tolist() == [[0, 0, 30, 30, 50, 50, 50, 50], [0, 0, 9, 9, 15, 15, 15, 15]]
    assert offsets_view(off, 0).shape == (8, 1, 1, 1)
    assert offsets_view(off, 0).flatten().tolist() == [0, 0, 30, 30, 50, 50, 50, 50]


# ----------------------------------------------------------------------------- describe_fwd on THD
H, HG, D = 4, 2, 64


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=I32)


def _describe(layout: str, q, k, v, *, cu_q: Optional[torch.Tensor], cu_kv: Optional[torch.Tensor], max_q: int,
              max_kv: int, mask: str = "padding_causal", **kw) -> AttnConfig:
    args = dict(is_training=True, max_seqlen_q=max_q, max_seqlen_kv=max_kv, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                q=q, k=k, v=v, qkv_dtype=BF16, attn_bias=None, attn_scale=None, dropout=0.0, qkv_layout=layout,
                attn_bias_type="no_bias", attn_mask_type=mask, softmax_type="vanilla", window_size=(-1, -1),
                bottom_right_diagonal=None)  # fmt: skip
    args.update(kw)
    return describe_fwd(**args)


def _thd3(lengths_q: list[int], lengths_kv: Optional[list[int]] = None, h: int = H, hg: int = HG, **kw) -> AttnConfig:
    """thd_thd_thd: separate contiguous [t, h, d] tensors."""
    lengths_kv = lengths_q if lengths_kv is None else lengths_kv
    tq, tkv = sum(lengths_q), sum(lengths_kv)
    q, k, v = torch.empty(tq, h, D, dtype=BF16), torch.empty(tkv, hg, D, dtype=BF16), torch.empty(tkv, hg, D, dtype=BF16)
    return _describe("thd_thd_thd", q, k, v, cu_q=_cu(lengths_q), cu_kv=_cu(lengths_kv), max_q=max(lengths_q),
                     max_kv=max(lengths_kv), **kw)  # fmt: skip


def _check_common(cfg: AttnConfig) -> None:
    assert cfg.dtype == BF16 and cfg.d_qk == cfg.d_v == D and cfg.device == -1
    assert cfg.stats_stride == ((cfg.sq * cfg.h, 1, cfg.h, 1) if cfg.ragged_q else (cfg.h * cfg.sq, cfg.sq, 1, 1))
    assert len(cfg.grad_strides) == 3


def test_describe_t3hd_packed_views() -> None:
    lengths = [5, 70, 3]  # t = 78, max 70 -> S = 128
    buf = torch.empty(78, 3, H, D, dtype=BF16)
    q, k, v = buf.unbind(1)
    cfg = _describe("t3hd", q, k, v, cu_q=_cu(lengths), cu_kv=_cu(lengths), max_q=70, max_kv=70)
    _check_common(cfg)
    assert cfg.ragged_q and cfg.ragged_kv and cfg.is_ragged
    assert (cfg.b, cfg.h, cfg.hg, cfg.sq, cfg.skv) == (32, H, H, 128, 128)
    tok = 3 * H * D
    assert cfg.q_stride == cfg.k_stride == cfg.v_stride == (128 * tok, D, tok, 1)
    assert cfg.o_stride == (128 * H * D, D, H * D, 1)  # O is allocated contiguous [t, h, d_v]
    assert cfg.stats_stride == (128 * H, 1, H, 1)  # token-major [t, h, 1]
    assert cfg.grad_strides == (cfg.q_stride,) * 3  # dqkv packed like qkv
    assert cfg.max_total_q == cfg.max_total_kv == 1024


def test_describe_thd_thd_thd_gqa() -> None:
    cfg = _thd3([100, 1200, 7], [300, 50, 2000])  # tq = 1307, tkv = 2350
    _check_common(cfg)
    assert (cfg.b, cfg.h, cfg.hg, cfg.sq, cfg.skv) == (32, H, HG, 2048, 2048)
    assert cfg.q_stride == (2048 * H * D, D, H * D, 1)
    assert cfg.k_stride == cfg.v_stride == (2048 * HG * D, D, HG * D, 1)
    assert cfg.o_stride == (2048 * H * D, D, H * D, 1)
    assert cfg.grad_strides == (cfg.q_stride, cfg.k_stride, cfg.v_stride)
    assert (cfg.max_total_q, cfg.max_total_kv) == (bucket_tokens(1307), bucket_tokens(2350)) == (2048, 4096)


def test_describe_thd_t2hd() -> None:
    lengths_q, lengths_kv = [10, 20], [40, 1]
    q = torch.empty(30, H, D, dtype=BF16)
    k, v = torch.empty(41, 2, HG, D, dtype=BF16).unbind(1)
    cfg = _describe("thd_t2hd", q, k, v, cu_q=_cu(lengths_q), cu_kv=_cu(lengths_kv), max_q=20, max_kv=40)
    _check_common(cfg)
    assert (cfg.b, cfg.sq, cfg.skv) == (32, 64, 64)
    assert cfg.q_stride == (64 * H * D, D, H * D, 1)
    kv_tok = 2 * HG * D
    assert cfg.k_stride == cfg.v_stride == (64 * kv_tok, D, kv_tok, 1)
    assert cfg.grad_strides == (cfg.q_stride, cfg.k_stride, cfg.v_stride)
    assert (cfg.max_total_q, cfg.max_total_kv) == (1024, 1024)


def test_describe_thd_bshd_bshd_keeps_dense_batch() -> None:
    b, skv = 3, 96
    lengths_q = [17, 1, 33]
    q = torch.empty(51, H, D, dtype=BF16)
    k, v = torch.empty(b, skv, HG, D, dtype=BF16), torch.empty(b, skv, HG, D, dtype=BF16)
    cfg = _describe("thd_bshd_bshd", q, k, v, cu_q=_cu(lengths_q), cu_kv=_cu([96, 50, 7]), max_q=33, max_kv=skv)
    _check_common(cfg)
    assert cfg.ragged_q and not cfg.ragged_kv
    assert (cfg.b, cfg.sq, cfg.skv) == (b, 64, skv)  # dense k/v fix b; only the THD side's S is a bucket
    assert cfg.q_stride == (64 * H * D, D, H * D, 1)
    assert cfg.k_stride == cfg.v_stride == (skv * HG * D, D, HG * D, 1)
    assert cfg.o_stride == (64 * H * D, D, H * D, 1)
    assert cfg.grad_strides == (cfg.q_stride, cfg.k_stride, cfg.v_stride)
    assert (cfg.max_total_q, cfg.max_total_kv) == (1024, 0)


def test_describe_sbhd_bshd_bshd_is_dense() -> None:
    b, sq, skv = 2, 80, 96
    q = torch.empty(sq, b, H, D, dtype=BF16)
    k, v = torch.empty(b, skv, HG, D, dtype=BF16), torch.empty(b, skv, HG, D, dtype=BF16)
    cfg = _describe("sbhd_bshd_bshd", q, k, v, cu_q=_cu([80, 3]), cu_kv=_cu([96, 9]), max_q=sq, max_kv=skv)
    _check_common(cfg)
    assert not cfg.is_ragged
    assert (cfg.b, cfg.sq, cfg.skv) == (b, sq, skv)  # nothing bucketed
    assert cfg.q_stride == (H * D, D, b * H * D, 1)
    assert cfg.k_stride == (skv * HG * D, D, HG * D, 1)
    assert cfg.o_stride == (H * D, D, b * H * D, 1)  # O in q's (sbhd) format
    assert cfg.stats_stride == (H * sq, sq, 1, 1)
    assert (cfg.max_total_q, cfg.max_total_kv) == (0, 0)


# ----------------------------------------------------------------------------- plan keys
def _key(cfg: AttnConfig, direction: Direction = Direction.FWD):
    return make_key(FusedAttnBackend.F16_arbitrary_seqlen, direction, cfg, 91900, "1.32.0")


def test_thd_batches_in_one_bucket_share_a_plan_key() -> None:
    a = _thd3([5, 40, 17])  # b = 3, t = 62, max 40
    b = _thd3([64] * 4 + [1] * 16, [33] * 20)  # b = 20, t = 272, max 64
    assert (a.b, a.sq, a.max_total_q) == (b.b, b.sq, b.max_total_q) == (32, 64, 1024)
    assert a == b
    assert _key(a) == _key(b) and hash(_key(a)) == hash(_key(b))
    assert _key(a, Direction.BWD) == _key(b, Direction.BWD)


@pytest.mark.parametrize(
    ("lengths", "what"),
    [([10] * 33, "b=33: batch bucket 64"), ([64] * 17, "t=1088: token bucket 2048"), ([65, 5], "max 65: S bucket 128")],
    ids=["batch", "tokens", "seqlen"],
)
def test_crossing_a_bucket_changes_the_plan_key(lengths: list[int], what: str) -> None:
    base = _thd3([5, 40, 17])
    other = _thd3(lengths)
    assert _key(other) != _key(base), what
    assert (other.b, other.sq, other.max_total_q) != (base.b, base.sq, base.max_total_q)


def test_dense_padding_batches_share_a_plan_key() -> None:
    def cfg(lengths: list[int]) -> AttnConfig:
        q, k, v = (torch.empty(2, 128, H, D, dtype=BF16) for _ in range(3))
        return _describe("bshd_bshd_bshd", q, k, v, cu_q=_cu(lengths), cu_kv=_cu(lengths), max_q=128, max_kv=128,
                         mask="padding")  # fmt: skip

    a, b = cfg([100, 50]), cfg([128, 3])
    assert (a.b, a.sq) == (2, 128)  # dense: actual sizes, nothing bucketed
    assert _key(a) == _key(b)


# ----------------------------------------------------------------------------- errors
def test_thd_q_must_be_3d() -> None:
    q, k, v = (torch.empty(2, 10, H, D, dtype=BF16) for _ in range(3))
    with pytest.raises(ValueError, match=r"q must be 3-d in format thd, got shape \[2, 10, 4, 64\]"):
        _describe("thd_thd_thd", q, k, v, cu_q=_cu([10, 10]), cu_kv=_cu([10, 10]), max_q=10, max_kv=10)


def test_thd_needs_cu_seqlens_q() -> None:
    q, k, v = (torch.empty(20, H, D, dtype=BF16) for _ in range(3))
    with pytest.raises(ValueError, match=r"qkv_layout=thd_thd_thd needs cu_seqlens_q"):
        _describe("thd_thd_thd", q, k, v, cu_q=None, cu_kv=_cu([10, 10]), max_q=10, max_kv=10)
    k, v = torch.empty(2, 10, H, D, dtype=BF16), torch.empty(2, 10, H, D, dtype=BF16)
    with pytest.raises(ValueError, match=r"cu_seqlens_q is required"):
        _describe("thd_bshd_bshd", q, k, v, cu_q=None, cu_kv=_cu([10, 10]), max_q=10, max_kv=10)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_thd_tensor_with_non_packed_strides_is_rejected(which: str) -> None:
    t = {n: torch.empty(20, H, D, dtype=BF16) for n in "qkv"}
    t[which] = torch.empty(20, 2, H, D, dtype=BF16)[:, 0]  # token stride 2*h*d
    assert t[which].stride() == (2 * H * D, D, 1)
    with pytest.raises(ValueError, match=rf"^{which} has strides \(512, 64, 1\); THD tensors of qkv_layout=thd_thd_thd"):
        _describe("thd_thd_thd", t["q"], t["k"], t["v"], cu_q=_cu([10, 10]), cu_kv=_cu([10, 10]), max_q=10, max_kv=10)


# ----------------------------------------------------------------------------- frontend validation
def _t3hd(mask: str) -> AttnConfig:
    q, k, v = torch.empty(78, 3, H, D, dtype=BF16).unbind(1)
    return _describe("t3hd", q, k, v, cu_q=_cu([5, 70, 3]), cu_kv=_cu([5, 70, 3]), max_q=70, max_kv=70, mask=mask)


def _thd_t2hd(mask: str) -> AttnConfig:
    q = torch.empty(30, H, D, dtype=BF16)
    k, v = torch.empty(41, 2, HG, D, dtype=BF16).unbind(1)
    return _describe("thd_t2hd", q, k, v, cu_q=_cu([10, 20]), cu_kv=_cu([40, 1]), max_q=20, max_kv=40, mask=mask)


def _thd_sbhd(mask: str) -> AttnConfig:
    q = torch.empty(51, H, D, dtype=BF16)
    k, v = torch.empty(96, 3, HG, D, dtype=BF16), torch.empty(96, 3, HG, D, dtype=BF16)
    return _describe("thd_sbhd_sbhd", q, k, v, cu_q=_cu([17, 1, 33]), cu_kv=_cu([96, 50, 7]), max_q=33, max_kv=96, mask=mask)


def _bshd_sbhd(mask: str) -> AttnConfig:
    q = torch.empty(2, 80, H, D, dtype=BF16)
    k, v = torch.empty(96, 2, HG, D, dtype=BF16), torch.empty(96, 2, HG, D, dtype=BF16)
    return _describe("bshd_sbhd_sbhd", q, k, v, cu_q=_cu([80, 3]), cu_kv=_cu([96, 9]), max_q=80, max_kv=96, mask=mask)


BUILDERS = {"t3hd": _t3hd, "thd_thd_thd": lambda m: _thd3([100, 1200, 7], [300, 50, 2000], mask=m),
            "thd_t2hd": _thd_t2hd, "thd_sbhd_sbhd": _thd_sbhd, "bshd_sbhd_sbhd": _bshd_sbhd}  # fmt: skip


@pytest.mark.parametrize("mask", ["padding", "padding_causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("layout", list(BUILDERS))
def test_frontend_validates_graphs_from_described_tensors(layout: str, mask: str) -> None:
    cfg = BUILDERS[layout](mask)
    assert BACKEND.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.BWD) == []
    runtime = [Uid.SEQ_LEN_Q, Uid.SEQ_LEN_KV]
    if cfg.ragged_q:
        runtime += [Uid.RAGGED_Q, Uid.RAGGED_O, Uid.RAGGED_STATS]
    if cfg.ragged_kv:
        runtime += [Uid.RAGGED_K, Uid.RAGGED_V]
    assert BACKEND.runtime_uids(cfg) == runtime
    for direction in Direction:
        spec = BACKEND.build(cfg, direction)
        spec.graph.validate()
        fixed = [Uid.Q, Uid.K, Uid.V, Uid.O, Uid.STATS]
        if direction == Direction.BWD:
            fixed += [Uid.DO, Uid.DQ, Uid.DK, Uid.DV]
        assert list(spec.uids) == fixed + runtime


def test_version_rules_for_thd_and_mixed_formats() -> None:
    """THD needs cuDNN 9.6 here (int64 ragged offsets, ragged stats); mixed formats need 9.7."""
    from te_cudnn.runtime import RuntimeEnv

    old = RuntimeEnv(sm=90, cudnn_version=90500)
    thd = REGISTRY[0].not_supported_reasons(_t3hd("padding"), old)
    assert any("THD layouts need cuDNN 9.6" in r for r in thd), thd
    mixed = REGISTRY[0].not_supported_reasons(_bshd_sbhd("padding"), RuntimeEnv(sm=90, cudnn_version=90600))
    assert any("mixed q/kv formats (bshd_sbhd_sbhd) need cuDNN 9.7" in r for r in mixed), mixed
    assert not REGISTRY[0].not_supported_reasons(_bshd_sbhd("padding"), HOPPER_CUDNN_919)


def test_thd_queries_are_never_bucketed_to_one_row() -> None:
    """One query row makes cuDNN pick engines that leave token-major stats unwritten."""
    from te_cudnn.ragged import bucket_q_seqlen  # noqa: PLC0415

    assert [bucket_q_seqlen(s) for s in (1, 2, 64, 65, 1000)] == [64, 64, 64, 128, 1024]
    assert bucket_q_seqlen(0) == bucket_seqlen(0)
