"""Where a variable-length call's lengths and offsets come from: derived from the call's own
``cu_seqlens*`` by default (so no write the version counter misses can leave stale lengths),
from a ``BatchLengths`` the caller passes, or from the version-keyed cache under the
``reuse_lengths`` opt-in. Real torch kernels on CPU tensors (``runtime_buffers`` is torch code)."""

from __future__ import annotations

import pytest
import torch

import te_cudnn as tc
from te_cudnn import decode, varlen

from test_runtime_cache_cpu import _cpu_stream, _prep  # noqa: F401 - the prepared-call builder, one "stream"


def _thd(total=100):
    q, k, v = (torch.randn(total, 4, 32, dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 30, 64, 100], dtype=torch.int32)
    return _prep("thd_thd_thd", "padding_causal", q, k, v, cu), cu


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# the writes the version counter does not see: each must be followed by the new lengths
WRITES = {
    ".data": lambda cu: cu.data.__setitem__(1, 5),
    "dlpack alias": lambda cu: torch.from_dlpack(cu).__setitem__(1, 50),
    "numpy alias": lambda cu: cu.numpy().__setitem__(1, 12),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_default_derives_from_the_values_of_each_call(write: str) -> None:
    prep, cu = _thd()
    before = varlen.buffers_for(prep, (cu, cu, None, None))
    version = cu._version
    WRITES[write](cu)
    assert cu._version == version, "the write under test is invisible to the version counter"
    after = varlen.buffers_for(prep, (cu, cu, None, None))
    assert _equal(after, varlen.runtime_buffers(prep, cu, cu, None, None))
    assert not _equal(before, after), "the new values reached the bound lengths"


@pytest.mark.parametrize("write", list(WRITES))
def test_reuse_lengths_is_the_documented_opt_in(write: str) -> None:
    """Under the opt-in the cache is keyed on identity and version: such a write is missed,
    which is exactly the contract the documentation states."""
    prep, cu = _thd()
    with tc.reuse_lengths():
        first = varlen.buffers_for(prep, (cu, cu, None, None))
        WRITES[write](cu)
        assert all(a is b for a, b in zip(first, varlen.buffers_for(prep, (cu, cu, None, None))))
        cu[1] = 40  # a torch in-place write bumps the version: recomputed
        fresh = varlen.buffers_for(prep, (cu, cu, None, None))
        assert _equal(fresh, varlen.runtime_buffers(prep, cu, cu, None, None)) and fresh[0] is not first[0]
    assert not varlen.runtime_cache, "leaving the opt-in forgets what it cached"
    again = varlen.buffers_for(prep, (cu, cu, None, None))
    assert again[0] is not fresh[0]


def test_batch_lengths_derive_once_and_refresh() -> None:
    prep, cu = _thd()
    batch = tc.BatchLengths(cu)
    first = varlen.buffers_for(prep, (cu, cu, None, None), batch)
    assert _equal(first, varlen.runtime_buffers(prep, cu, cu, None, None))
    assert all(a is b for a, b in zip(first, varlen.buffers_for(prep, (cu, cu, None, None), batch)))
    cu.data[1] = 5  # the caller's contract: refresh (or a new object) after writing new values
    batch.refresh()
    after = varlen.buffers_for(prep, (cu, cu, None, None), batch)
    assert _equal(after, varlen.runtime_buffers(prep, cu, cu, None, None)) and not _equal(first, after)
    assert "BatchLengths(b=3" in repr(batch)


def test_batch_lengths_are_per_call_kind() -> None:
    prep, cu = _thd()
    q, k, v = (torch.randn(100, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    other = _prep("thd_thd_thd", "padding_causal", q, k, v, cu)  # other heads/dims: other offsets
    batch = tc.BatchLengths(cu)
    a = varlen.buffers_for(prep, (cu, cu, None, None), batch)
    b = varlen.buffers_for(other, (cu, cu, None, None), batch)
    assert _equal(b, varlen.runtime_buffers(other, cu, cu, None, None)) and not _equal(a, b)


def test_batch_lengths_must_be_the_calls_tensors() -> None:
    prep, cu = _thd()
    batch = tc.BatchLengths(cu.clone())
    with pytest.raises(ValueError, match="lengths was built from other cu_seqlens tensors"):
        varlen.buffers_for(prep, (cu, cu, None, None), batch)
    with pytest.raises(TypeError, match="lengths must be a te_cudnn.BatchLengths or None, got dict"):
        varlen.buffers_for(prep, (cu, cu, None, None), {})
    with pytest.raises(TypeError, match="BatchLengths: cu_seqlens_kv must be an int32"):
        tc.BatchLengths(cu, [0, 1])
    with pytest.raises(TypeError, match="BatchLengths needs cu_seqlens_q"):
        tc.BatchLengths(None)


def test_decode_lengths_operand_copies_strided_and_unaligned_views() -> None:
    table = torch.tensor([[5, 100], [7, 100], [9, 100]], dtype=torch.int32)
    column = table[:, 0]
    assert column.stride() == (2,)
    got = decode._seqlens_operand(column, 3, column.device)
    assert got.is_contiguous() and got.tolist() == [5, 7, 9] and got.data_ptr() % 16 == 0
    unaligned = torch.tensor([0, 4, 5, 6], dtype=torch.int32)[1:]  # starts 4 bytes in
    got = decode._seqlens_operand(unaligned, 3, unaligned.device)
    assert got.data_ptr() % 16 == 0 and got.tolist() == [4, 5, 6]
    dense = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert decode._seqlens_operand(dense, 3, dense.device) is dense
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        decode._seqlens_operand(table[:, 0].long(), 3, column.device)
    with pytest.raises(ValueError, match=r"cache_seqlens must have shape \[b\] = \[4\]"):
        decode._seqlens_operand(column, 4, column.device)


def _spec_buffers(prep, cu_q, cu_kv, cu_q_padded, cu_kv_padded):
    """The buffers as ``te_cudnn.ragged``'s reference functions define them."""
    from te_cudnn.ragged import (every_key_lens, extend, offsets_view, one_query_lens, ragged_offsets,  # noqa: PLC0415
                                 seq_lens_pair)
    from te_cudnn.row_fill import Lengths  # noqa: PLC0415

    cfg, out, batch = prep.cfg, [], prep.cfg.b
    ext_q, ext_kv = extend(cu_q, batch), extend(cu_kv, batch)
    if cfg.mask.is_padding:
        if prep.lengths is Lengths.ONE_QUERY:
            out += one_query_lens(ext_q, ext_kv, batch, prep.one_query)
        elif prep.lengths is Lengths.EVERY_KEY:
            out += every_key_lens(*seq_lens_pair(cu_q, cu_kv, batch, ext_q, ext_kv))
        else:
            out += seq_lens_pair(cu_q, cu_kv, batch, ext_q, ext_kv)
    if cfg.ragged_q:
        off = ragged_offsets(cu_q, prep.mult_q, batch, extend(cu_q if cu_q_padded is None else cu_q_padded, batch))
        out += [offsets_view(off, i) for i in range(3)]
    if cfg.ragged_kv:
        off = ragged_offsets(cu_kv, prep.mult_kv, batch, extend(cu_kv if cu_kv_padded is None else cu_kv_padded, batch))
        out += [offsets_view(off, i) for i in range(2)]
    return out


@pytest.mark.parametrize("layout,mask,padded,cross,sq", [
    ("thd_thd_thd", "padding_causal", False, False, 64), ("thd_thd_thd", "padding", True, False, 64),
    ("thd_thd_thd", "padding", False, True, 64), ("thd_thd_thd", "padding_causal_bottom_right", True, True, 64),
    ("bshd_bshd_bshd", "padding", False, False, 64), ("bshd_bshd_bshd", "padding", False, True, 64),
    ("bshd_bshd_bshd", "padding_causal", False, True, 64), ("bshd_bshd_bshd", "padding", False, True, 1),
])  # fmt: skip
def test_runtime_buffers_equal_the_reference_functions(layout, mask, padded, cross, sq) -> None:
    gen = torch.Generator().manual_seed(7)
    for trial in range(20):
        b = int(torch.randint(1, 6, (1,), generator=gen))
        lq = torch.randint(0, sq + 1, (b,), generator=gen)
        lkv = torch.randint(0, 65, (b,), generator=gen) if cross else lq
        cu_q = torch.cat((torch.zeros(1, dtype=torch.int64), lq.cumsum(0))).to(torch.int32)
        cu_kv = torch.cat((torch.zeros(1, dtype=torch.int64), lkv.cumsum(0))).to(torch.int32) if cross else cu_q
        pad_q = pad_kv = None
        if padded:  # token offsets with gaps between the sequences
            pad_q = torch.cat((torch.zeros(1, dtype=torch.int64), (lq + 3).cumsum(0))).to(torch.int32)
            pad_kv = torch.cat((torch.zeros(1, dtype=torch.int64), (lkv + 5).cumsum(0))).to(torch.int32) if cross else pad_q
        if layout.startswith("thd"):
            tq, tkv = int((pad_q if padded else cu_q)[-1]) + 1, int((pad_kv if padded else cu_kv)[-1]) + 1
            q = torch.randn(tq, 4, 32, dtype=torch.bfloat16)
            k, v = (torch.randn(tkv, 2, 32, dtype=torch.bfloat16) for _ in range(2))
        else:
            q = torch.randn(b, sq, 4, 32, dtype=torch.bfloat16)
            k, v = (torch.randn(b, 64, 2, 32, dtype=torch.bfloat16) for _ in range(2))
        from te_cudnn.config import describe_fwd  # noqa: PLC0415
        from te_cudnn.enums import QKVLayout  # noqa: PLC0415
        cfg = describe_fwd(is_training=True, max_seqlen_q=sq, max_seqlen_kv=64, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                           q=q, k=k, v=v, qkv_dtype=q.dtype, qkv_layout=QKVLayout.coerce(layout),
                           attn_bias_type="no_bias", attn_mask_type=mask, window_size=(-1, -1), attn_bias=None,
                           attn_scale=None, dropout=0.0, softmax_type="vanilla", bottom_right_diagonal=None,
                           cu_seqlens_q_padded=pad_q, cu_seqlens_kv_padded=pad_kv)  # fmt: skip
        from te_cudnn.backends import BY_ENUM  # noqa: PLC0415
        from te_cudnn.enums import FusedAttnBackend  # noqa: PLC0415
        from te_cudnn import ops  # noqa: PLC0415
        prep = ops._Prepared(cfg=cfg, backend=BY_ENUM[FusedAttnBackend.F16_arbitrary_seqlen], key=None, out_shape=(),
                             stats_shape=(), device=q.device, rng_increment=0, varlen=True,
                             **varlen.mult_fields(cfg, q.device))  # fmt: skip
        varlen.length_fields(prep)
        got = varlen.runtime_buffers(prep, cu_q, cu_kv, pad_q, pad_kv)
        want = _spec_buffers(prep, cu_q, cu_kv, pad_q, pad_kv)
        assert len(got) == len(want), (trial, prep.lengths)
        for i, (a, w) in enumerate(zip(got, want)):
            assert a.shape == w.shape and a.dtype == w.dtype and torch.equal(a, w), (trial, i, prep.lengths, a, w)
            assert a.is_contiguous(), (trial, i)
