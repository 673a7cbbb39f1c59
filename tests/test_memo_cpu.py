"""The memos of prepared calls: least recently used eviction under an entry bound and a bound
on the device bytes their entries hold (result templates, constants), never a wholesale flush."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from te_cudnn import decode, ops
from te_cudnn.memo import MAX_DEVICE_BYTES, MAX_ENTRIES, SigMemo, held_bytes


@dataclass
class _Entry:
    template: Optional[torch.Tensor] = None
    consts: tuple = ()


def test_held_bytes_counts_each_storage_once() -> None:
    t = torch.empty(1024, dtype=torch.float32)
    assert held_bytes(t) == 4096
    assert held_bytes(_Entry(t, (t[:10], torch.empty(8, dtype=torch.int32)))) == 4096 + 32
    assert held_bytes(_Entry(torch.empty(1, dtype=torch.bfloat16).expand(1 << 20))) == 2  # an expanded template
    assert held_bytes(object()) == 0


def test_prepared_calls_declare_every_tensor_field() -> None:
    """held_bytes reads a prepared call's declared fields only (not its configuration, key or
    plan): the declaration must name every field that can hold a tensor."""
    from dataclasses import fields

    from te_cudnn.prepared import _Prepared

    holding = {f.name for f in fields(_Prepared) if "Tensor" in str(f.type) or "list" in str(f.type)}
    assert holding == set(_Prepared.held_fields)
    t = torch.empty(16, dtype=torch.float32)
    prep = _Prepared(cfg=None, backend=None, key=None, out_shape=(), stats_shape=(), device=torch.device("cpu"),  # type: ignore[arg-type]
                     rng_increment=0, out_template=t, zero_sink=torch.empty(2, dtype=torch.float32), full_lens=[t[:4]])  # fmt: skip
    assert held_bytes(prep) == 64 + 8


def test_lru_eviction_by_entries_keeps_the_hot_signatures() -> None:
    memo = SigMemo(max_entries=3, max_bytes=1 << 20)
    for i in range(3):
        memo.remember((i,), _Entry())
    assert memo.find((0,)) is not None  # (0,) is now the most recent
    memo.remember((3,), _Entry())
    assert list(memo) == [(2,), (0,), (3,)]
    assert (1,) not in memo and (0,) in memo and len(memo) == 3


def test_lru_eviction_by_device_bytes() -> None:
    memo = SigMemo(max_entries=100, max_bytes=10_000)
    for i in range(5):
        memo.remember((i,), _Entry(torch.empty(1000, dtype=torch.float32)))  # 4000 bytes each
        assert memo.device_bytes <= 10_000
    assert list(memo) == [(3,), (4,)] and memo.device_bytes == 8000
    memo.remember(("big",), _Entry(torch.empty(10_001, dtype=torch.uint8)))  # alone over the bound: not kept
    assert ("big",) not in memo and memo.device_bytes == 8000
    memo.remember((3,), _Entry(torch.empty(10, dtype=torch.uint8)))  # replacing an entry replaces its bytes
    assert memo.device_bytes == 4010


def test_last_pair_follows_eviction_and_clear() -> None:
    memo = SigMemo(max_entries=1, max_bytes=1 << 20)
    a = _Entry()
    memo.remember(("a",), a)
    assert memo.find(("a",)) is a and memo.last[1] is a
    memo.remember(("b",), _Entry())
    assert memo.last[1] is None and memo.find(("a",)) is None
    memo.clear()
    assert memo.device_bytes == 0 and not memo and memo.last[1] is None


def test_the_library_memos_are_bounded() -> None:
    for memo in (ops._fwd_memo, ops._bwd_memo, decode._memo):
        assert isinstance(memo, SigMemo)
        assert memo.max_bytes <= MAX_DEVICE_BYTES and memo.max_entries <= MAX_ENTRIES


def test_thd_signature_sizes_are_memoised_on_ints_only() -> None:
    """The THD signature sizes come from a bounded memo keyed on shapes and int maxima, equal
    to computing them; maxima of other types are computed and never held."""
    ops._thd_memo.clear()
    cu = torch.zeros(5, dtype=torch.int32)
    q = torch.empty(300, 8, 64)
    args = (q.shape, q.shape, q.shape, 100, 90, cu, cu)
    assert ops._thd_sizes(*args) == ops._thd_buckets(*args)
    assert ops._thd_sizes(*args) is ops._thd_sizes(*args) and len(ops._thd_memo) == 1
    other = (q.shape, q.shape, q.shape, 100, 90, cu, torch.zeros(6, dtype=torch.int32))
    assert ops._thd_sizes(*other) != ops._thd_sizes(*args)  # cu_seqlens_kv's length is in the key
    with pytest.raises(AttributeError):  # fused_attn_fwd's slow path then names the bad argument
        ops._thd_sizes(q.shape, q.shape, q.shape, torch.tensor(100), 90, cu, cu)
    assert all(x.__class__ is int for key in ops._thd_memo for x in key[3:5])
    for i in range(ops._THD_MEMO_SIZE + 5):
        ops._thd_sizes(q.shape, q.shape, q.shape, i + 1, 90, cu, cu)
    assert len(ops._thd_memo) <= ops._THD_MEMO_SIZE
    ops._thd_memo.clear()


def test_result_templates_are_shared_by_geometry_and_bounded() -> None:
    """Prepared calls of one result geometry (a dynamic KV cache's decode steps) share one
    template; large results share one expanded element; the template memo is bounded."""
    from te_cudnn import prepared

    prepared._templates.clear()
    bf16, cpu = torch.bfloat16, torch.device("cpu")
    small = prepared._template((1, 1, 32, 64), bf16, cpu)
    assert small is prepared._template((1, 1, 32, 64), bf16, cpu) and small.is_contiguous()
    big = prepared._template((4, 2048, 32, 64), bf16, cpu)
    assert big.shape == (4, 2048, 32, 64) and big.untyped_storage().nbytes() == 2
    assert torch.empty_like(big).is_contiguous()
    strided = prepared.shared_template((2, 3, 4), (12, 1, 3), bf16, cpu)
    assert strided.stride() == (12, 1, 3)
    for i in range(prepared._TEMPLATES_LIMIT + 3):
        prepared.shared_template((i + 1,), None, bf16, cpu)
    assert len(prepared._templates) <= prepared._TEMPLATES_LIMIT
    prepared._templates.clear()
