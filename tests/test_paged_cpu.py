"""Paged-KV layouts on the CPU: description from page pools and page tables, declared
rules, and the real frontend validating the forward graph."""

from __future__ import annotations

import pytest
import torch

from te_cudnn.backends import REGISTRY, Direction, Uid
from te_cudnn.config import describe_fwd
from te_cudnn.runtime import HOPPER_CUDNN_919

H, HG, D, PAGE, PAGES, NUM_PAGES = 8, 2, 64, 16, 4, 24


def _describe(layout: str, *, sq: int = 1, b: int = 3, mask: str = "padding", training: bool = False, tables=None):
    fmt_q = layout.split("_")[2]
    q = {"bshd": torch.empty(b, sq, H, D), "sbhd": torch.empty(sq, b, H, D), "thd": torch.empty(b * sq, H, D)}[fmt_q]
    q = q.to(torch.bfloat16)
    kv_fmt = layout.split("_")[3]
    pool = (NUM_PAGES, PAGE, HG, D) if kv_fmt == "bshd" else (PAGE, NUM_PAGES, HG, D)
    k, v = torch.empty(pool, dtype=torch.bfloat16), torch.empty(pool, dtype=torch.bfloat16)
    table = torch.zeros(b, PAGES, dtype=torch.int32) if tables is None else tables
    cu_q = torch.arange(b + 1, dtype=torch.int32) * sq
    cu_kv = torch.arange(b + 1, dtype=torch.int32) * 40
    return describe_fwd(is_training=training, max_seqlen_q=sq, max_seqlen_kv=PAGE * PAGES, cu_seqlens_q=cu_q,
                        cu_seqlens_kv=cu_kv, q=q, k=k, v=v, qkv_dtype=torch.bfloat16, attn_bias=None, attn_scale=None,
                        dropout=0.0, qkv_layout=layout, attn_bias_type="no_bias", attn_mask_type=mask,
                        softmax_type="vanilla", window_size=(-1, -1), bottom_right_diagonal=None,
                        page_table_k=table, page_table_v=table)  # fmt: skip


@pytest.mark.parametrize("layout", ["paged_kv_bshd_bshd_bshd", "paged_kv_sbhd_sbhd_sbhd", "paged_kv_bshd_sbhd_sbhd",
                                    "paged_kv_thd_bshd_bshd"])  # fmt: skip
def test_paged_description_and_graph(layout):
    cfg = _describe(layout, sq=1 if "thd" not in layout else 2)
    assert cfg.paged == (NUM_PAGES, PAGE, PAGES) and cfg.skv == PAGE * PAGES
    # k/v strides are the pool's, in [num_pages, hg, page_size, d] order
    if "_bshd_bshd" in layout or layout.endswith("thd_bshd_bshd"):
        assert cfg.k_stride == (PAGE * HG * D, D, HG * D, 1)
    else:
        assert cfg.k_stride == (HG * D, D, NUM_PAGES * HG * D, 1)
    assert not REGISTRY[0].not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD)
    spec = REGISTRY[0].build_fwd(cfg)
    spec.graph.validate()
    assert spec.uids[-2:] == (Uid.PAGE_TABLE_K, Uid.PAGE_TABLE_V)
    assert "paged_attention_k_table" in str(spec.graph)


def test_paged_rules():
    why = REGISTRY[0].not_supported_reasons(_describe("paged_kv_bshd_bshd_bshd", training=True), HOPPER_CUDNN_919)
    assert any("inference-only" in r for r in why), why
    why = REGISTRY[0].not_supported_reasons(_describe("paged_kv_bshd_bshd_bshd", mask="causal"), HOPPER_CUDNN_919)
    assert any("paged KV caches need a padding mask" in r for r in why), why


def test_paged_errors():
    with pytest.raises(ValueError, match="page_table_k must be a contiguous int32"):
        _describe("paged_kv_bshd_bshd_bshd", tables=torch.zeros(3, PAGES, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"has b=3 as qkv_layout=paged_kv_bshd_bshd_bshd reads it, but the page tables "
                                         r"have 2 rows"):
        _describe("paged_kv_bshd_bshd_bshd", tables=torch.zeros(2, PAGES, dtype=torch.int32))
    with pytest.raises(ValueError, match="exceeds the page tables' capacity"):
        _describe("paged_kv_bshd_bshd_bshd", tables=torch.zeros(3, 2, dtype=torch.int32))


def test_one_query_row_under_top_left_causal_is_declined_with_its_reason() -> None:
    """cuDNN 9.19 builds no plan for a paged cache with sq = 1 under padding_causal (seen on an
    H200 by the seeded random edge test); bottom-right causal (decode) and padding are served."""
    cfg = _describe("paged_kv_bshd_bshd_bshd", mask="padding_causal", sq=1)
    why = REGISTRY[0].not_supported_reasons(cfg, HOPPER_CUDNN_919)
    assert any("one query row under a top-left causal mask" in w for w in why), why
    for mask in ("padding_causal_bottom_right", "padding"):
        assert not REGISTRY[0].not_supported_reasons(_describe("paged_kv_bshd_bshd_bshd", mask=mask, sq=1),
                                                     HOPPER_CUDNN_919)  # fmt: skip
