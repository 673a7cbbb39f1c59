"""Context-parallel partitioning (te_cudnn.parallel.partition): dual-chunk split/gather, dense and THD; CPU only."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from te_cudnn.parallel.partition import (
    dual_chunks,
    gather_sequence,
    gather_thd,
    pad_cu_seqlens,
    pad_thd,
    seq_dim,
    shard,
    split_sequence,
    split_thd,
    thd_local_cu_seqlens,
    thd_partition_index,
    thd_valid_lengths,
    unpad_thd,
    unshard,
)

CPS = (1, 2, 3, 4, 8)


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0).int()


def _random_lengths(cp: int, seed: int, b: int = 7) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5 * 2 * cp, (b,), generator=gen).tolist()
    lengths[1] = 0  # always one empty sequence
    lengths[2] = 2 * cp + 1  # and one not divisible by 2 * cp
    return lengths


def _thd_round_trip(lengths: list[int], cp: int) -> None:
    cu = _cu(lengths)
    x = torch.arange(1, sum(lengths) + 1, dtype=torch.float32)[:, None, None].expand(-1, 2, 3).contiguous()
    x_padded, cu_padded = pad_thd(x, cu, cp)
    parts = [split_thd(x_padded, cu_padded, cp, r) for r in range(cp)]
    assert all(p.shape[0] == int(cu_padded[-1]) // cp for p in parts)
    assert torch.equal(gather_thd(parts, cu_padded), x_padded)
    assert torch.equal(unpad_thd(gather_thd(parts, cu_padded), cu, cu_padded), x)
    valid = sum(thd_valid_lengths(cu, cu_padded, cp, r) for r in range(cp))
    assert torch.equal(valid, torch.tensor(lengths, dtype=torch.int32))


# ----------------------------------------------------------------------------- dense
@pytest.mark.parametrize("cp", CPS)
@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd"])
def test_dense_round_trip(cp, qkv_format):
    s = 2 * cp * 3
    shape = (2, s, 3, 4) if qkv_format == "bshd" else (s, 2, 3, 4)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(cp))
    parts = [split_sequence(x, cp, r, qkv_format) for r in range(cp)]
    for part in parts:
        assert part.is_contiguous() and part.shape[seq_dim(qkv_format)] == s // cp
    assert torch.equal(gather_sequence(parts, qkv_format), x)
    assert torch.equal(unshard([shard(x, cp, r, qkv_format) for r in range(cp)], qkv_format), x)


@pytest.mark.parametrize("qkv_format", ["bshd", "sbhd"])
def test_dense_example_cp2_s8(qkv_format):
    tokens = torch.arange(8)
    x = tokens[None, :, None, None] if qkv_format == "bshd" else tokens[:, None, None, None]
    flat = [split_sequence(x, 2, r, qkv_format).flatten().tolist() for r in range(2)]
    assert flat == [[0, 1, 6, 7], [2, 3, 4, 5]]


def test_dual_chunks_and_seq_dim():
    assert [dual_chunks(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert dual_chunks(1, 0) == (0, 1)
    assert (seq_dim("bshd"), seq_dim("sbhd"), seq_dim("thd")) == (1, 0, 0)


# ----------------------------------------------------------------------------- THD
def test_pad_cu_seqlens_rounds_each_length():
    cu = _cu([0, 1, 4, 5, 8, 9])
    assert pad_cu_seqlens(cu, 2).tolist() == [0, 0, 4, 8, 16, 24, 36]
    assert pad_cu_seqlens(cu, 1).tolist() == [0, 0, 2, 6, 12, 20, 30]
    assert pad_cu_seqlens(cu, 2).dtype == torch.int32


@pytest.mark.parametrize("cp", CPS)
def test_thd_round_trip(cp):
    _thd_round_trip(_random_lengths(cp, seed=cp), cp)


@pytest.mark.parametrize("cp", CPS)
def test_thd_pad_rows_zero(cp):
    lengths = _random_lengths(cp, seed=10 + cp)
    cu = _cu(lengths)
    x = torch.randn(sum(lengths), 3, generator=torch.Generator().manual_seed(cp)) + 10  # never 0
    x_padded, cu_padded = pad_thd(x, cu, cp)
    for i, n in enumerate(lengths):
        start, end = int(cu_padded[i]), int(cu_padded[i + 1])
        assert (end - start) % (2 * cp) == 0 and end - start - n < 2 * cp
        assert torch.equal(x_padded[start : start + n], x[int(cu[i]) : int(cu[i + 1])])
        assert not x_padded[start + n : end].any()


@pytest.mark.parametrize("cp", CPS)
def test_thd_local_cu_seqlens_and_prefix(cp):
    lengths = _random_lengths(cp, seed=20 + cp)
    cu = _cu(lengths)
    cu_padded = pad_cu_seqlens(cu, cp)
    mask, _ = pad_thd(torch.ones(sum(lengths), dtype=torch.bool), cu, cp)  # True on valid global rows
    total = torch.zeros(len(lengths), dtype=torch.int32)
    for r in range(cp):
        cu_local, cu_local_padded = thd_local_cu_seqlens(cu, cu_padded, cp, r)
        assert cu_local.dtype == cu_local_padded.dtype == torch.int32
        assert torch.equal(cu_local_padded, cu_padded // cp)
        valid = cu_local[1:] - cu_local[:-1]
        total += valid
        v1, v2 = (thd_valid_lengths(cu, cu_padded, cp, r, first=h == 0, second=h == 1) for h in range(2))
        assert torch.equal(v1 + v2, valid)
        local_mask = split_thd(mask, cu_padded, cp, r)
        for i in range(len(lengths)):
            seq = local_mask[int(cu_local_padded[i]) : int(cu_local_padded[i + 1])]
            k = seq.numel() // 2
            for half, v in ((seq[:k], int(v1[i])), (seq[k:], int(v2[i]))):
                assert half[:v].all() and not half[v:].any()  # valid tokens are a prefix of each half
    assert total.tolist() == lengths


@pytest.mark.parametrize("cp", CPS)
def test_thd_partition_index_is_permutation(cp):
    cu_padded = pad_cu_seqlens(_cu(_random_lengths(cp, seed=30 + cp)), cp)
    index = torch.cat([thd_partition_index(cu_padded, cp, r) for r in range(cp)])
    assert index.dtype == torch.int64
    assert torch.equal(index.sort().values, torch.arange(int(cu_padded[-1])))
    given_total = thd_partition_index(cu_padded, cp, cp - 1, total_tokens=int(cu_padded[-1]))
    assert torch.equal(given_total, thd_partition_index(cu_padded, cp, cp - 1))


def test_thd_partition_index_example():
    # cp=2: sequence 0 of length 8 (k=2), sequence 1 of length 4 (k=1), at global rows 8..11
    cu_padded = torch.tensor([0, 8, 12], dtype=torch.int32)
    assert thd_partition_index(cu_padded, 2, 0).tolist() == [0, 1, 6, 7, 8, 11]
    assert thd_partition_index(cu_padded, 2, 1).tolist() == [2, 3, 4, 5, 9, 10]


def test_thd_empty_batch_and_all_empty():
    for lengths in ([], [0, 0]):
        _thd_round_trip(lengths, 2)


def test_thd_shard_unshard():
    cu = _cu([5, 0, 9])
    x_padded, cu_padded = pad_thd(torch.randn(14, 2), cu, 2)
    parts = [shard(x_padded, 2, r, "thd", cu_padded) for r in range(2)]
    assert torch.equal(parts[1], split_thd(x_padded, cu_padded, 2, 1))
    assert torch.equal(unshard(parts, "thd", cu_padded), x_padded)


@settings(max_examples=60, deadline=None)
@given(cp=st.sampled_from(CPS), lengths=st.lists(st.integers(0, 40), max_size=8))
def test_thd_round_trip_property(cp, lengths):
    _thd_round_trip(lengths, cp)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: dual_chunks(0, 0), r"cp=0"),
        (lambda: dual_chunks(2, 3), r"rank=3 with cp=2"),
        (lambda: dual_chunks(2, -1), r"rank=-1"),
        (lambda: seq_dim("bhsd"), r"qkv_format='bhsd'"),
        (lambda: split_sequence(torch.zeros(1, 10, 2, 2), 2, 0, "bshd"), r"S=10 .*2\*cp=4"),
        (lambda: split_sequence(torch.zeros(1, 8, 2, 2), 2, 0, "thd"), r"qkv_format='thd'"),
        (lambda: split_sequence(torch.zeros(8), 2, 0, "bshd"), r"sequence dim 1"),
        (lambda: gather_sequence([], "bshd"), r"len\(parts\)=0"),
        (lambda: gather_sequence([torch.zeros(1, 4), torch.zeros(1, 2)], "bshd"), r"len\(parts\)=2"),
        (lambda: gather_sequence([torch.zeros(3, 1)], "sbhd"), r"local sequence length 3"),
        (lambda: gather_thd([], torch.zeros(1, dtype=torch.int32)), r"len\(parts\)=0"),
        (lambda: pad_cu_seqlens(torch.zeros(2, 2, dtype=torch.int32), 2), r"cu_seqlens"),
        (lambda: pad_cu_seqlens(torch.zeros(3), 2), r"cu_seqlens"),
        (lambda: pad_thd(torch.zeros(4, 2), _cu([3]), 2), r"cu_seqlens\[-1\]=3"),
        (lambda: thd_partition_index(_cu([4]), 2, 0, total_tokens=3), r"total_tokens=3"),
        (lambda: thd_partition_index(_cu([4]), 2, 2), r"rank=2 with cp=2"),
        (lambda: shard(torch.zeros(8, 2), 2, 0, "thd"), r"cu_seqlens_padded"),
        (lambda: unshard([torch.zeros(4, 2)] * 2, "thd"), r"cu_seqlens_padded"),
        (lambda: shard(torch.zeros(8, 2), 2, 0, "bhsd"), r"qkv_format='bhsd'"),
    ],
)
def test_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("cp", [2.0, True, "2"])
def test_type_errors(cp):
    with pytest.raises(TypeError, match=r"cp must be an int"):
        dual_chunks(cp, 0)
