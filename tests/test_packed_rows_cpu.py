"""One query row over a contiguous, growing cache as a packed (THD) call, on the CPU: the THD
views it hands cuDNN are views (no copy) whose sequences give exactly the dense GQA attention,
the calls it declines, and the frontend validating the graph it asks for, one per bucket of
key lengths."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from te_cudnn import packed_rows
from te_cudnn.backends import REGISTRY, Direction
from te_cudnn.config import describe_fwd
from te_cudnn.ops import _thd_buckets
from te_cudnn.packed_rows import attend_one_row, packed_one_row, packed_views, signature
from te_cudnn.ragged import bucket_seqlen
from te_cudnn.runtime import HOPPER_CUDNN_919


def _decode_step(b, h, hg, skv, d, dv, dtype=torch.float64, seed=0):
    """A decode step as transformers hands it: q [b, h, 1, d] over [b, 1, h, d] memory (the
    projection's view), contiguous [b, hg, skv, d] keys and values (DynamicCache's torch.cat)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, 1, h, d, generator=g, dtype=dtype).transpose(1, 2)
    k = torch.randn(b, hg, skv, d, generator=g, dtype=dtype)
    v = torch.randn(b, hg, skv, dv, generator=g, dtype=dtype)
    return q, k, v


def _cu(n, skv):
    steps = torch.arange(n + 1, dtype=torch.int32)
    return steps, steps * skv  # what packed_rows binds (its buffers hold these values)


def _packed_attention(q, k, v, cu_q, cu_kv, scale):
    """Attention of every THD sequence on its own, in float64: the packed call's meaning."""
    outs = []
    for i in range(cu_q.shape[0] - 1):
        qi = q[cu_q[i]:cu_q[i + 1]].transpose(0, 1)  # [heads, tokens, d]
        ki, vi = (t[cu_kv[i]:cu_kv[i + 1]].transpose(0, 1) for t in (k, v))
        p = torch.softmax(qi @ ki.transpose(-2, -1) * scale, dim=-1)
        outs.append((p @ vi).transpose(0, 1))
    return torch.cat(outs)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), hg=st.integers(1, 4), rep=st.sampled_from([1, 2, 4]), skv=st.integers(1, 40),
       d=st.sampled_from([8, 16]), dv=st.sampled_from([8, 16]))  # fmt: skip
def test_packed_sequences_are_the_dense_gqa_attention(b, hg, rep, skv, d, dv):
    h = hg * rep
    q, k, v = _decode_step(b, h, hg, skv, d, dv)
    views = packed_views(q, k, v)
    assert views is not None
    pq, pk, pv = views
    assert (pq.data_ptr(), pk.data_ptr(), pv.data_ptr()) == (q.data_ptr(), k.data_ptr(), v.data_ptr())  # views
    assert pq.shape == (b * hg, rep, d) and pk.shape == (b * hg * skv, 1, d) and pv.shape == (b * hg * skv, 1, dv)
    assert pq.is_contiguous() and pk.is_contiguous() and pv.is_contiguous()
    cu_q, cu_kv = _cu(b * hg, skv)
    out = _packed_attention(pq, pk, pv, cu_q, cu_kv, d**-0.5)
    dense = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # [b, h, 1, dv]
    # the packed output [b*hg, rep, dv] is [b, 1, h, dv] memory, as attend_one_row returns it
    torch.testing.assert_close(out.reshape(b, 1, h, dv), dense.transpose(1, 2), rtol=1e-12, atol=1e-12)


def test_contiguous_bhsd_queries_are_taken_too():
    q, k, v = _decode_step(2, 8, 2, 5, 16, 16)
    assert packed_views(q.contiguous(), k, v) is not None  # [b, h, 1, d] contiguous: heads d apart, batches h*d


@pytest.mark.parametrize("case", ["two_rows", "heads_not_divided", "strided_cache", "d_mismatch", "query_heads_apart",
                                  "batch_mismatch", "no_keys"])  # fmt: skip
def test_other_geometries_are_declined(case):
    q, k, v = _decode_step(2, 8, 2, 6, 16, 16)
    if case == "two_rows":
        q = torch.randn(2, 8, 2, 16, dtype=torch.float64)
    elif case == "heads_not_divided":
        k, v = (torch.randn(2, 3, 6, 16, dtype=torch.float64) for _ in range(2))
    elif case == "strided_cache":  # a static cache's first 6 of 32 slots: head stride 32 * d
        k = torch.randn(2, 2, 32, 16, dtype=torch.float64)[:, :, :6]
    elif case == "d_mismatch":
        k = torch.randn(2, 2, 6, 8, dtype=torch.float64)
    elif case == "query_heads_apart":  # [b, h, s, d] memory with a query dim of 2, row 0 taken
        q = torch.randn(2, 8, 2, 16, dtype=torch.float64)[:, :, :1]
    elif case == "batch_mismatch":
        k, v = (torch.randn(1, 2, 6, 16, dtype=torch.float64) for _ in range(2))
    else:
        k, v = (torch.zeros(2, 2, 0, 16, dtype=torch.float64) for _ in range(2))
    assert packed_views(q, k, v) is None


def test_attend_one_row_declines_cpu_tensors_and_is_off_unless_enabled():
    q, k, v = _decode_step(1, 4, 2, 6, 16, 16, dtype=torch.bfloat16)
    was = packed_one_row(True)
    try:
        assert attend_one_row(q, k, v, None) is None  # not on a CUDA device
        assert packed_one_row(False) is True
        assert attend_one_row(q, k, v, None) is None
    finally:
        packed_one_row(was)


def _config(b, h, hg, skv, d):
    q, k, v = _decode_step(b, h, hg, skv, d, d, dtype=torch.bfloat16)
    pq, pk, pv = packed_views(q, k, v)
    cu_q, cu_kv = _cu(b * hg, skv)
    names = set(inspect.signature(describe_fwd).parameters)
    args = dict(is_training=False, max_seqlen_q=1, max_seqlen_kv=skv, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, q=pq,
                k=pk, v=pv, qkv_dtype=None, attn_bias=None, attn_scale=None, dropout=0.0, qkv_layout="thd_thd_thd",
                attn_bias_type="no_bias", attn_mask_type="padding", softmax_type="vanilla", window_size=(-1, -1),
                bottom_right_diagonal=None, page_table_k=None, page_table_v=None)  # fmt: skip
    return describe_fwd(**{n: a for n, a in args.items() if n in names}), (pq, pk, pv, cu_q, cu_kv)


@pytest.mark.parametrize("b,h,hg,skv,d", [(4, 32, 8, 600, 64), (1, 32, 8, 513, 128), (2, 8, 8, 70, 64), (3, 4, 1, 1, 64)])
def test_the_frontend_validates_the_packed_graph(b, h, hg, skv, d):
    cfg, _ = _config(b, h, hg, skv, d)
    backend = REGISTRY[0]
    assert backend.name == "F16_arbitrary_seqlen"
    assert not backend.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD)
    backend.build_fwd(cfg).graph.validate()


def test_one_plan_per_doubling_of_the_key_length():
    """What a THD plan key sees of a packed call (te_cudnn.ops' buckets) is the same for every key
    length from 513 to 1024, and changes at 1025: a 512-token generate from a 512-token prompt
    builds at most two plans where the dense path builds 512."""

    def buckets(skv):
        _, (pq, pk, pv, cu_q, cu_kv) = _config(4, 32, 8, skv, 64)
        return _thd_buckets(pq.shape, pk.shape, pv.shape, 1, skv, cu_q, cu_kv)

    assert len({buckets(s) for s in (513, 600, 777, 1024)}) == 1
    assert buckets(1025) != buckets(1024)


def _key_and_sizes(b, hg, rep, skv, d, dv, scale):
    """(packed_rows' key of a call, what fused_attn_fwd's signature holds of it), on meta tensors."""
    h = hg * rep
    q = torch.empty(b, 1, h, d, dtype=torch.bfloat16, device="meta").transpose(1, 2)
    k = torch.empty(b, hg, skv, d, dtype=torch.bfloat16, device="meta")
    v = torch.empty(b, hg, skv, dv, dtype=torch.bfloat16, device="meta")
    pq, pk, pv = packed_views(q, k, v)
    cu_q, cu_kv = _cu(b * hg, skv)
    key = signature((torch.bfloat16, pq.shape, d, dv, bucket_seqlen(skv)), skv, 0, scale)
    sizes = (_thd_buckets(pq.shape, pk.shape, pv.shape, 1, skv, cu_q, cu_kv), pq.stride(), pk.stride(), pv.stride(), scale)
    return key, sizes


@settings(max_examples=300, deadline=None)
@given(call=st.tuples(st.integers(1, 40), st.sampled_from([1, 2, 8]), st.sampled_from([1, 4]), st.sampled_from([64, 128]),
                      st.sampled_from([64, 128]), st.sampled_from([None, 0.1])),
       skv=st.tuples(st.integers(1, 5000), st.integers(1, 5000)), other=st.sampled_from(["length", "batch", "scale"]))  # fmt: skip
def test_the_packed_key_tells_apart_what_the_forward_signature_does(call, skv, other):
    """Two packed calls with one key share a prepared forward, so the forward's own signature
    (the THD buckets, the views' strides, the scale) must agree for them: the calls here differ
    in the key length, the batch or the scale."""
    b, hg, rep, d, dv, scale = call
    first = (b, hg, rep, skv[0], d, dv, scale)
    second = {"length": (b, hg, rep, skv[1], d, dv, scale), "batch": (b % 40 + 1, hg, rep, skv[0], d, dv, scale),
              "scale": (b, hg, rep, skv[0], d, dv, 0.3)}[other]  # fmt: skip
    key_a, sizes_a = _key_and_sizes(*first)
    key_b, sizes_b = _key_and_sizes(*second)
    assert (key_a == key_b) <= (sizes_a == sizes_b)
    assert _key_and_sizes(*first) == (key_a, sizes_a)  # a function of the call


class _Attention(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("case", ["decode", "two_rows", "grad", "mask", "training_dropout", "sinks"])
def test_hugging_face_decode_steps_take_the_packed_path(monkeypatch, case):
    """The Hugging Face attention function hands an inference decode step without a mask to the
    packed path (its result returned as is) and nothing else (those reach the dense path, which
    on this CPU-only machine names the device)."""
    pytest.importorskip("transformers")
    from te_cudnn.integrations import transformers as te_hf

    calls = []
    answer = torch.zeros(1, 1, 4, 16, dtype=torch.bfloat16)

    def spy(query, key, value, scale):
        calls.append((query.shape, key.shape, scale))
        return answer

    monkeypatch.setattr(te_hf, "attend_one_row", spy)
    module = _Attention().eval()
    q, k, v = _decode_step(1, 4, 2, 5, 16, 16, dtype=torch.bfloat16)
    kwargs, mask, dropout, grad = {}, None, 0.0, False
    if case == "two_rows":
        q = torch.randn(1, 4, 2, 16, dtype=torch.bfloat16)
    elif case == "grad":
        q.requires_grad_()
        grad = True
    elif case == "mask":
        mask = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    elif case == "training_dropout":
        module.train()
        dropout = 0.1
    elif case == "sinks":
        kwargs["s_aux"] = torch.zeros(4, dtype=torch.bfloat16)
    with torch.set_grad_enabled(grad):
        if case == "decode":
            out, weights = te_hf.attention_forward(module, q, k, v, mask, dropout=dropout, scaling=0.25, **kwargs)
            assert out is answer and weights is None and calls == [(q.shape, k.shape, 0.25)]
            return
        with pytest.raises(ValueError, match="executes on CUDA devices"):
            te_hf.attention_forward(module, q, k, v, mask, dropout=dropout, scaling=0.25, **kwargs)
    assert calls == []


@pytest.mark.parametrize("case", ["decode", "causal", "heads_without_gqa", "grad", "mask"])
def test_the_sdpa_drop_in_hands_decode_steps_to_the_packed_path(monkeypatch, case):
    """The drop-in hands a no-grad, unmasked, non-causal one-row call to the packed path and
    returns its ``[b, 1, h, d]`` result as ``[b, h, 1, d]``; torch's rules keep the rest: causal
    with one row sees only key 0 (top-left), differing head counts need ``enable_gqa``."""
    import te_cudnn.sdpa as sdpa_mod

    calls = []
    answer = torch.zeros(1, 1, 4, 16, dtype=torch.bfloat16)

    def spy(query, key, value, scale):
        calls.append(scale)
        return answer

    monkeypatch.setattr(sdpa_mod, "attend_one_row", spy)
    q, k, v = _decode_step(1, 4, 2, 5, 16, 16, dtype=torch.bfloat16)
    kw = dict(scale=0.25, enable_gqa=True)
    grad, mask = False, None
    if case == "causal":
        kw["is_causal"] = True
    elif case == "heads_without_gqa":
        kw["enable_gqa"] = False
    elif case == "grad":
        q.requires_grad_()
        grad = True
    elif case == "mask":
        mask = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    with torch.set_grad_enabled(grad):
        if case == "decode":
            out = sdpa_mod.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
            assert out.shape == (1, 4, 1, 16) and out.data_ptr() == answer.data_ptr() and calls == [0.25]
            return
        with pytest.raises((ValueError, TypeError)):
            sdpa_mod.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    assert calls == []
