"""te_cudnn.row_fill: the lengths a padding-mask call binds and what it zero-fills, on CPU
tensors (``te_cudnn.varlen.runtime_buffers`` is plain torch code; the remap and the static rule
are functions of the call's description). At prepare time no plan is known, so every
padding-mask / THD result is zero-filled; whether a checked engine lifts the fill is in
test_padded_rows_cpu.py. The GPU side, with results prefilled with NaN, is in
test_varlen_gpu.py and test_padded_rows_gpu.py."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from te_cudnn import ops
from te_cudnn import varlen
from te_cudnn.backends import BY_ENUM
from te_cudnn.config import describe_fwd
from te_cudnn.enums import FusedAttnBackend, QKVLayout
from te_cudnn.ragged import every_key_lens, one_query_lens
from te_cudnn.plans.padded_rows import fills_grads, fills_out
from te_cudnn.row_fill import Lengths, length_remap, skips_grads_fill, skips_out_fill

F16 = BY_ENUM[FusedAttnBackend.F16_arbitrary_seqlen]


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)


def _prep(mask: str, lens_q: list[int], lens_kv: list[int], *, sq: int = 1, layout: str = "bshd_bshd_bshd",
          window=(-1, -1), dropout: float = 0.0, backend=F16):  # fmt: skip
    b, skv = len(lens_q), 64
    thd = layout.startswith("thd")
    q = torch.randn(*((sum(lens_q),) if thd else (b, sq)), 4, 32, dtype=torch.bfloat16)
    k, v = (torch.randn(*((sum(lens_kv),) if thd else (b, skv)), 2, 32, dtype=torch.bfloat16) for _ in range(2))
    cu_q, cu_kv = _cu(lens_q), _cu(lens_kv)
    cfg = describe_fwd(is_training=dropout > 0, max_seqlen_q=sq, max_seqlen_kv=skv, cu_seqlens_q=cu_q,
                       cu_seqlens_kv=cu_kv, q=q, k=k, v=v, qkv_dtype=q.dtype, qkv_layout=QKVLayout.coerce(layout),
                       attn_bias_type="no_bias", attn_mask_type=mask, window_size=window, attn_bias=None,
                       attn_scale=None, dropout=dropout, softmax_type="vanilla", bottom_right_diagonal=None)  # fmt: skip
    prep = ops._Prepared(cfg=cfg, backend=backend, key=None, out_shape=(), stats_shape=(), device=q.device,
                         rng_increment=0, varlen=True, **varlen.mult_fields(cfg, q.device))  # fmt: skip
    varlen.length_fields(prep)
    return prep, cu_q, cu_kv


@pytest.mark.parametrize("mask", ["padding", "padding_causal", "padding_causal_bottom_right"])
def test_one_query_row_binds_a_query_everywhere_and_no_keys_without_one(mask: str) -> None:
    prep, cu_q, cu_kv = _prep(mask, [1, 0, 1, 0, 1], [40, 64, 0, 0, 3])
    assert prep.lengths is Lengths.ONE_QUERY
    lens_q, lens_kv = varlen.runtime_buffers(prep, cu_q, cu_kv, None, None)
    assert lens_q.shape == lens_kv.shape == (5, 1, 1, 1) and lens_q.dtype == lens_kv.dtype == torch.int32
    assert lens_q.flatten().tolist() == [1, 1, 1, 1, 1]
    assert lens_kv.flatten().tolist() == [40, 0, 0, 0, 3]
    assert skips_out_fill(prep.cfg, F16), "one query row, no window: O may be left to a checked engine"
    assert prep.fill_out, "no plan yet (prepare time): O is zero-filled"
    assert not skips_grads_fill(prep.cfg, F16) and prep.fill_grads, "the backward of one query row keeps its fill"


def test_longer_queries_under_bottom_right_causal_keep_lengths_and_fills() -> None:
    """A row sees no key whenever its sequence has more queries than keys: cuDNN may leave it
    unwritten, so the fills stay."""
    prep, cu_q, cu_kv = _prep("padding_causal_bottom_right", [16, 0, 5], [8, 30, 0], sq=16)
    assert prep.lengths is Lengths.AS_GIVEN and prep.fill_out and prep.fill_grads
    assert not skips_out_fill(prep.cfg, F16) and not skips_grads_fill(prep.cfg, F16)


@pytest.mark.parametrize("mask", ["padding", "padding_causal"])
def test_longer_queries_bind_a_key_everywhere_and_no_queries_without_one(mask: str) -> None:
    prep, cu_q, cu_kv = _prep(mask, [16, 0, 5, 0, 16], [64, 30, 0, 0, 16], sq=16)
    assert prep.lengths is Lengths.EVERY_KEY
    lens_q, lens_kv = varlen.runtime_buffers(prep, cu_q, cu_kv, None, None)
    assert lens_q.flatten().tolist() == [16, 0, 0, 0, 16]
    assert lens_kv.flatten().tolist() == [64, 30, 1, 1, 16]
    assert skips_out_fill(prep.cfg, F16) and skips_grads_fill(prep.cfg, F16)
    assert prep.fill_out and prep.fill_grads, "no plan yet (prepare time): zero-filled"


def test_self_attention_lengths() -> None:
    """The same cu_seqlens for q and kv (one subtraction): an empty sequence gets one key and no query."""
    lens = [7, 0, 64]
    prep, cu, _ = _prep("padding_causal", lens, lens, sq=64)
    lens_q, lens_kv = varlen.runtime_buffers(prep, cu, cu, None, None)
    assert lens_q.flatten().tolist() == [7, 0, 64] and lens_kv.flatten().tolist() == [7, 1, 64]


def test_one_query_key_lengths_never_exceed_the_callers() -> None:
    """``len_kv & -len_q``: exact for query lengths 0 and 1, within [0, len_kv] for any other
    (malformed) query length, so no key past the caller's is read."""
    lq = torch.tensor([0, 1, 2, 3, 7, -1, -5, 1, 0], dtype=torch.int32)
    lkv = torch.tensor([5, 5, 5, 6, 100, 9, 12, 0, 0], dtype=torch.int32)
    ones = torch.ones(len(lq), 1, 1, 1, dtype=torch.int32)
    got_q, got_kv = one_query_lens(_cu(lq.tolist()), _cu(lkv.tolist()), len(lq), ones)
    got = got_kv.flatten()
    assert got_q is ones and got_kv.shape == (len(lq), 1, 1, 1)
    assert got[lq == 1].tolist() == lkv[lq == 1].tolist() and (got[lq == 0] == 0).all()
    assert ((got >= 0) & (got <= lkv)).all()


def test_every_key_lengths() -> None:
    lq = torch.tensor([4, 0, 3, 0, -2], dtype=torch.int32)
    lkv = torch.tensor([9, 5, 0, 0, 3], dtype=torch.int32)
    got_q, got_kv = every_key_lens(lq, lkv)
    assert got_q.tolist() == [4, 0, 0, 0, -2] and got_kv.tolist() == [9, 5, 1, 1, 3]


@pytest.mark.parametrize("extra", [dict(window=(8, 0)), dict(dropout=0.1)], ids=["window", "dropout"])
@pytest.mark.parametrize("sq", [1, 16])
def test_unprobed_graphs_keep_the_fill(sq: int, extra) -> None:
    prep, _, _ = _prep("padding_causal_bottom_right", [sq, 0], [16, 16], sq=sq, **extra)
    assert prep.fill_out and prep.fill_grads
    assert not skips_out_fill(prep.cfg, F16) and not skips_grads_fill(prep.cfg, F16)
    # one query row is remapped anyway (a correction); longer queries keep their lengths
    assert prep.lengths is (Lengths.ONE_QUERY if sq == 1 else Lengths.AS_GIVEN)


def test_deterministic_backward_keeps_its_fill() -> None:
    prep, _, _ = _prep("padding", [16, 3], [16, 16], sq=16)
    bwd = prep.cfg.for_backward(prep.cfg.q_stride, deterministic=True)
    assert length_remap(bwd, F16) is Lengths.EVERY_KEY and not skips_grads_fill(bwd, F16) and skips_out_fill(bwd, F16)
    assert fills_grads(bwd, F16) and fills_out(bwd, F16)  # no plan: both filled


def test_thd_and_no_padding() -> None:
    thd = _prep("padding", [3, 5], [3, 5], sq=8, layout="thd_thd_thd")[0]
    assert thd.lengths is Lengths.AS_GIVEN and thd.fill_out and thd.fill_grads
    assert not skips_out_fill(thd.cfg, F16) and not skips_grads_fill(thd.cfg, F16)
    dense = _prep("no_mask", [8, 8], [64, 64], sq=8)[0]
    assert dense.lengths is Lengths.AS_GIVEN and not dense.fill_out and not dense.fill_grads


def test_other_sub_backends_keep_their_lengths_and_fills() -> None:
    fp8 = BY_ENUM[FusedAttnBackend.FP8]
    prep = _prep("padding", [16, 0], [16, 16], sq=16, backend=fp8)[0]
    assert prep.lengths is Lengths.AS_GIVEN and prep.fill_out and prep.fill_grads
    assert not skips_out_fill(prep.cfg, fp8) and not skips_grads_fill(prep.cfg, fp8)


# ------------------------------------------------------------------ properties (hypothesis)

_PAIRS = st.lists(st.tuples(st.integers(-3, 40), st.integers(0, 40)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None, database=None)
@given(_PAIRS)
def test_one_query_lengths_property(pairs) -> None:
    """Any query lengths (malformed ones too): every sequence is bound with one query row, a
    sequence with one query keeps its keys, one without gets none, and no sequence is ever bound
    with more keys than the caller's."""
    lq = torch.tensor([p[0] for p in pairs], dtype=torch.int32)
    lkv = torch.tensor([p[1] for p in pairs], dtype=torch.int32)
    ones = torch.ones(len(pairs), 1, 1, 1, dtype=torch.int32)
    got_q, got_kv = one_query_lens(_cu(lq.tolist()), _cu(lkv.tolist()), len(pairs), ones)
    got = got_kv.flatten()
    assert got_q is ones
    assert torch.equal(got[lq == 1], lkv[lq == 1]) and (got[lq == 0] == 0).all()
    assert ((got >= 0) & (got <= lkv)).all()


@settings(max_examples=300, deadline=None, database=None)
@given(_PAIRS)
def test_every_key_lengths_property(pairs) -> None:
    """Sequences with keys keep both lengths; one without keys is bound with one key and no query
    rows (every row then lies past its end, where cuDNN writes zeros)."""
    lq = torch.tensor([max(p[0], 0) for p in pairs], dtype=torch.int32)
    lkv = torch.tensor([p[1] for p in pairs], dtype=torch.int32)
    got_q, got_kv = every_key_lens(lq, lkv)
    has_keys = lkv > 0
    assert torch.equal(got_q[has_keys], lq[has_keys]) and torch.equal(got_kv[has_keys], lkv[has_keys])
    assert (got_q[~has_keys] == 0).all() and (got_kv[~has_keys] == 1).all()
