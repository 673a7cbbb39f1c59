"""``fused_attn_decode`` on the CPU: input validation (every message names its argument),
the window rule, and the operands it binds checked against the forward graph's own uid list
for every kind of decode call, with the real frontend validating those graphs."""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import te_cudnn as tc
from te_cudnn.backends import REGISTRY, Direction
from te_cudnn.config import describe_fwd
from te_cudnn.decode import _window, binding_order
from te_cudnn.runtime import HOPPER_CUDNN_919

B, H, HG, D, PAGE, PAGES = 3, 8, 2, 64, 16, 4
BF16 = torch.bfloat16


def _inputs(paged: bool = True, b: int = B, sq: int = 1):
    q = torch.zeros(b, sq, H, D, dtype=BF16)
    if paged:
        k = v = torch.zeros(b * PAGES, PAGE, HG, D, dtype=BF16)
        table = torch.arange(b * PAGES, dtype=torch.int32).view(b, PAGES)
    else:
        k = v = torch.zeros(b, PAGE * PAGES, HG, D, dtype=BF16)
        table = None
    return q, k, v, torch.full((b,), 5, dtype=torch.int32), table


def _describe(paged: bool, window=(-1, -1), sq: int = 1):
    """The forward configuration fused_attn_decode prepares (its placeholders included)."""
    q, k, v, _, table = _inputs(paged, sq=sq)
    window, mask = _window(window, sq)
    cu = torch.arange(B + 1, dtype=torch.int32)
    names = set(inspect.signature(describe_fwd).parameters)
    args = dict(is_training=False, max_seqlen_q=sq, max_seqlen_kv=PAGE * PAGES, cu_seqlens_q=cu, cu_seqlens_kv=cu,
                q=q, k=k, v=v, qkv_dtype=None, attn_bias=None, attn_scale=None, dropout=0.0,
                qkv_layout="paged_kv_bshd_bshd_bshd" if paged else "bshd_bshd_bshd", attn_bias_type="no_bias",
                attn_mask_type=mask, softmax_type="vanilla", window_size=window, bottom_right_diagonal=None,
                page_table_k=table, page_table_v=table)  # fmt: skip
    return describe_fwd(**{n: a for n, a in args.items() if n in names})


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "dense"])
@pytest.mark.parametrize("window", [(-1, -1), (7, 0)], ids=["full", "window7"])
@pytest.mark.parametrize("sq", [1, 4], ids=["decode", "speculative4"])
def test_binding_order_is_the_graphs(paged, window, sq):
    cfg = _describe(paged, window, sq)
    assert cfg.sq == sq and cfg.mask.is_padding and (cfg.mask.is_causal == (sq > 1 or window != (-1, -1)))
    backend = REGISTRY[0]
    assert backend.name == "F16_arbitrary_seqlen"
    why = backend.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD)
    assert not why  # paged caches take (left, 0) windows too
    order = binding_order(paged)
    assert backend.operand_uids(cfg, Direction.FWD) == order
    spec = backend.build_fwd(cfg)
    spec.graph.validate()  # the real frontend, no GPU needed
    assert tuple(spec.uids) == order


@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
def test_no_sink_in_decode(softmax_type):
    """Why decode takes no softmax_type: the sub-backend declines sinks with one query row."""
    q, k, v, lens, table = _inputs(paged=False)
    cu = torch.arange(B + 1, dtype=torch.int32)
    cfg = describe_fwd(is_training=False, max_seqlen_q=1, max_seqlen_kv=k.shape[1], cu_seqlens_q=cu, cu_seqlens_kv=cu,
                       q=q, k=k, v=v, qkv_dtype=None, attn_bias=None, attn_scale=None, dropout=0.0,
                       qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias", attn_mask_type="padding",
                       softmax_type=softmax_type, window_size=(-1, -1), bottom_right_diagonal=None,
                       softmax_offset=torch.zeros(1, H, 1, 1))  # fmt: skip
    why = REGISTRY[0].not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD)
    assert any("no sink with sq = 1" in r for r in why), why
    assert "softmax_type" not in inspect.signature(tc.fused_attn_decode).parameters


def test_window_rule():
    assert _window((-1, -1)) == ((-1, -1), "padding")
    assert _window((-1, -1), 4) == ((-1, -1), "padding_causal_bottom_right")  # several new tokens: causal
    assert _window((5, 0)) == ((5, 0), "padding_causal_bottom_right")
    assert _window([5, -1]) == ((5, 0), "padding_causal_bottom_right")
    for bad in ((1, 1), (-2, 0), (1,), "x", (True, 0)):
        with pytest.raises(ValueError, match="window_size"):
            _window(bad)


@pytest.mark.parametrize(
    "change,exc,match",
    [
        (dict(q=torch.zeros(B, H, D, dtype=BF16)), ValueError, "q must be 4-D"),
        (dict(q=torch.zeros(B, 1, H, D)), TypeError, "q.dtype must be bfloat16 or float16"),
        (dict(k_cache=[1]), TypeError, "k_cache must be a torch.Tensor"),
        (dict(cache_seqlens=torch.zeros(B, dtype=torch.int64)), TypeError, "cache_seqlens must be int32"),
        (dict(cache_seqlens=torch.zeros(B + 1, dtype=torch.int32)), ValueError, r"cache_seqlens must have shape \[b\] = \[3\]"),
        (dict(cache_seqlens=[1, 2, 3]), TypeError, "cache_seqlens must be a torch.Tensor"),
        (dict(page_table=torch.zeros(B, PAGES, dtype=torch.int64)), TypeError, "page_table must be int32"),
        (dict(page_table=torch.zeros(B + 1, PAGES, dtype=torch.int32)), ValueError, r"page_table must have shape \[b, pages_per_seq\]"),
        (dict(page_table=torch.zeros(PAGES, B, dtype=torch.int32).t()), ValueError, "page_table must be contiguous"),
        (dict(window_size=(3, 3)), ValueError, "window_size"),
    ],
    ids=["3d-q", "fp32", "k-not-tensor", "lens-int64", "lens-shape", "lens-list", "table-int64",
         "table-rows", "table-strided", "window-right"],
)  # fmt: skip
def test_malformed_input_names_the_argument(change, exc, match):
    q, k, v, lens, table = _inputs()
    args = dict(q=q, k_cache=k, v_cache=v, cache_seqlens=lens, page_table=table)
    window = change.pop("window_size", (-1, -1))
    args.update(change)
    with pytest.raises(exc, match=match):
        tc.fused_attn_decode(**args, window_size=window)


def test_dense_cache_batch_must_match_q():
    q, _, _, lens, _ = _inputs()
    k = torch.zeros(B + 1, 64, HG, D, dtype=BF16)
    with pytest.raises(ValueError, match="a dense k_cache must be"):
        tc.fused_attn_decode(q, k, k, lens)


def test_well_formed_call_needs_cuda():
    q, k, v, lens, table = _inputs()
    with pytest.raises(ValueError, match="executes on CUDA devices"):
        tc.fused_attn_decode(q, k, v, lens, table)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from([torch.int8, torch.int16, torch.int32, torch.int64, torch.float32]),
       n=st.integers(min_value=0, max_value=6), dims=st.integers(min_value=0, max_value=2))  # fmt: skip
def test_cache_seqlens_property(dtype, n, dims):
    """Any cache_seqlens that is not int32 [b] is refused with a message naming it."""
    q, k, v, _, table = _inputs()
    lens = torch.zeros((n,) * dims, dtype=dtype) if dims else torch.tensor(1, dtype=dtype)
    ok = dtype == torch.int32 and dims == 1 and n == B
    with pytest.raises((TypeError, ValueError), match="executes on CUDA" if ok else "cache_seqlens"):
        tc.fused_attn_decode(q, k, v, lens, table)


def test_fwd_call_args():
    """decode prepares its forward from fused_attn_fwd's own defaults (te_cudnn.ops.fwd_call_args)."""
    from te_cudnn.ops import fwd_call_args

    needed = dict(is_training=False, max_seqlen_q=1, max_seqlen_kv=8, cu_seqlens_q=None, cu_seqlens_kv=None, q=None,
                  k=None, v=None, qkv_dtype=None)  # fmt: skip
    args = fwd_call_args(**needed, attn_mask_type="no_mask")
    assert args.attn_mask_type == "no_mask" and args.qkv_layout == "sbh3d" and args.amax_o_offset == tc.META_O
    assert set(inspect.signature(tc.fused_attn_fwd).parameters) - {"_prepared"} == set(args._fields)
    with pytest.raises(TypeError, match="no parameters"):
        fwd_call_args(**needed, page_table=None)
    with pytest.raises(TypeError, match="needs"):
        fwd_call_args(q=None)


@pytest.mark.parametrize("sq,paged", [(1, True), (4, False)], ids=["decode-paged", "speculative4-dense"])
def test_compile_traces_to_the_decode_op(sq, paged):
    """Under torch.compile (fullgraph: no graph break) the call is one te_cudnn::decode node whose
    fake gives O [b, s_q, h, d_v] and the stats [b, h, s_q, 1]; a given out= is written by a copy."""
    graphs = []

    def backend(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    def step(q, k, v, lens, table, out):
        o, lse = tc.fused_attn_decode(q, k, v, lens, table, out=out, return_softmax_lse=True)
        return o * 2, lse

    q, k, v, lens, table = (t if t is None else t.to("meta") for t in _inputs(paged, sq=sq))
    out = torch.empty(B, sq, H, D, dtype=BF16, device="meta")
    torch._dynamo.reset()
    o, lse = torch.compile(step, backend=backend, fullgraph=True)(q, k, v, lens, table, out)
    torch._dynamo.reset()
    assert o.shape == (B, sq, H, D) and o.dtype == BF16 and o.device.type == "meta"
    assert lse.shape == (B, H, sq, 1) and lse.dtype == torch.float32
    (gm,) = graphs
    assert "torch.ops.te_cudnn.decode" in gm.code and "copy_" in gm.code
