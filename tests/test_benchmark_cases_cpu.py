"""The benchmark cases (``te_cudnn.benchmark.cases``): names, groups and shapes, exact causal pair
counts and FLOPs, and the inputs made for a case on the CPU; CPU only."""

from __future__ import annotations

import pytest
import torch

from te_cudnn.benchmark.cases import QUICK, Case, all_cases, case_by_name, causal_pairs, select_cases, thd_lengths
from te_cudnn.benchmark.inputs import make_inputs, tensor_bytes


# ----------------------------------------------------------------------------- cases
def test_case_names_unique_and_quick_subset() -> None:
    names = [c.name for c in all_cases()]
    assert len(names) == len(set(names))
    quick = select_cases(quick=True)
    assert quick and [c.name for c in quick] == [n for n in names if n in QUICK]
    default = select_cases()
    assert {c.group for c in default} == {"te", "llama", "thd", "decode", "fp8", "memory"}
    assert [c.name for c in select_cases("decode_kv8k,te")] == ["test_0", "test_1", "test_2", "test_3", "decode_kv8k"]
    assert select_cases("none") == []
    assert len(select_cases("all")) == len(names)
    with pytest.raises(ValueError, match="unknown case or group 'nope'"):
        select_cases("nope")


def test_te_cases_follow_testing_configs() -> None:
    from te_cudnn.testing import BENCHMARK_CONFIGS

    for name, cfg in BENCHMARK_CONFIGS.items():
        c = case_by_name(name)
        assert (c.b, c.h, c.hg, c.d, c.sq, c.skv, c.mask, c.bias) == (cfg.b, cfg.h, cfg.hg, cfg.d, cfg.sq, cfg.skv,
                                                                     cfg.mask, cfg.bias)  # fmt: skip


def test_shapes_of_the_groups() -> None:
    for c in select_cases("llama"):
        assert (c.d, c.hg, c.mask, c.layout) == (128, 8, "causal", "bshd_bshd_bshd")
        assert 16384 <= c.tokens <= 32768
    thd = case_by_name("thd_mixed_16k")
    assert sum(thd.lengths) == thd.tokens == 16384 and thd.lengths == thd_lengths() and len(set(thd.lengths)) > 1
    for c in select_cases("decode"):
        assert (c.sq, c.b, c.h, c.hg, c.training) == (1, 8, 32, 8, False) and c.is_paged and c.modes == ("fwd",)
    mem = case_by_name("mem_h32_s64k")
    assert (mem.b, mem.h, mem.hg, mem.d, mem.sq, mem.mask) == (1, 32, 8, 128, 65536, "causal")


def _brute_pairs(lq: int, lkv: int, bottom_right: bool) -> int:
    shift = lkv - lq if bottom_right else 0
    return sum(1 for i in range(lq) for j in range(lkv) if j <= i + shift)


@pytest.mark.parametrize("lq,lkv", [(1, 1), (5, 5), (3, 8), (8, 3), (1, 7), (7, 1)])
@pytest.mark.parametrize("br", [False, True])
def test_causal_pairs_exact(lq: int, lkv: int, br: bool) -> None:
    assert causal_pairs(lq, lkv, br) == _brute_pairs(lq, lkv, br)


def test_flops_causal_vs_no_mask() -> None:
    s, b, h, d = 2048, 2, 16, 128
    full = Case("full", "x", b, h, h, d, s, s, "no_mask")
    causal = Case("causal", "x", b, h, h, d, s, s, "causal")
    assert full.unmasked_pairs() == b * s * s
    assert causal.unmasked_pairs() == b * s * (s + 1) // 2  # the diagonal counts
    f_full, b_full = full.flops()
    f_causal, b_causal = causal.flops()
    assert f_full == 4 * b * h * s * s * d and b_full == 2.5 * f_full
    assert f_causal / f_full == pytest.approx(0.5, rel=1e-3) and f_causal > f_full / 2
    thd = case_by_name("thd_mixed_16k")  # per sequence, not over the padded square
    assert thd.unmasked_pairs() == sum(n * (n + 1) // 2 for n in thd.lengths)
    dec = case_by_name("decode_kv8k")
    assert dec.unmasked_pairs() == 8 * 8192
    assert dec.kv_bytes() == 2 * 8 * 8192 * 8 * 128 * 2  # K and V, bf16


def test_inputs_on_cpu_are_shared_views() -> None:
    case = Case("tiny_decode", "decode", 2, 4, 2, 32, 1, 200, "padding", layout="paged_kv_bshd_bshd_bshd",
                training=False, page_size=64)  # fmt: skip
    inp = make_inputs(case, device="cpu")
    assert inp.k.shape == (2 * 4, 64, 2, 32) and inp.page_table_k.dtype == torch.int32
    k, _ = inp.dense_kv()
    assert k.shape == (2, 2, 200, 32)
    for b, pos in ((0, 0), (1, 130), (1, 199)):
        page = int(inp.page_table_k[b, pos // 64])
        assert torch.equal(inp.k[page, pos % 64], k[b, :, pos])
    assert inp.cu_seqlens_kv.tolist() == [0, 200, 400]
    dense = make_inputs(case_by_name("test_0"), device="cpu")
    assert Inputs_bhsd_is_view(dense.q)
    assert tensor_bytes([dense.q, dense.q[0], None]) == dense.q.numel() * 2


def Inputs_bhsd_is_view(t: torch.Tensor) -> bool:
    from te_cudnn.benchmark.inputs import Inputs

    v = Inputs.bhsd(t)
    return v.data_ptr() == t.data_ptr() and v.shape == (t.shape[0], t.shape[2], t.shape[1], t.shape[3])
