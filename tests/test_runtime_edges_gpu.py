"""No answer depends on how a length tensor was written or laid out (GPU).

Each test writes new lengths in a way torch's version counter does not see (``.data``, a
DLPack alias, a CUDA-graph replay into a static buffer) or passes them through a strided
view, then compares with the same call on a fresh tensor holding the same values: the same
plan and the same lengths, so the forward agrees bit for bit."""

from __future__ import annotations

import pytest
import torch

import te_cudnn as tc
from te_cudnn.reference import attention_reference

pytestmark = pytest.mark.gpu


def check_close(actual, expected, name):
    torch.testing.assert_close(actual.float(), expected.float(), atol=2e-2, rtol=2e-2, msg=lambda m: f"{name}: {m}")

H, D = 4, 64


def _thd(lens, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lens)
    q, k, v = (torch.randn(total, H, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    return q, k, v, cu


def _fwd(q, k, v, cu, **kw):
    out, _ = tc.fused_attn_fwd(False, 128, 128, cu, cu, q, k, v, q.dtype, None, qkv_layout="thd_thd_thd",
                               attn_mask_type="padding_causal", **kw)  # fmt: skip
    return out


def _check_fresh(q, k, v, cu, **kw):
    got = _fwd(q, k, v, cu, **kw)
    want = _fwd(q, k, v, cu.clone())  # a new tensor of the same values
    assert torch.equal(got, want), f"stale lengths: max abs diff {(got - want).abs().max().item()}"
    return got


def test_write_through_data_is_seen():
    q, k, v, cu = _thd([30, 34, 36])
    _check_fresh(q, k, v, cu)
    cu.data[1] = 5
    _check_fresh(q, k, v, cu)


def test_write_through_dlpack_alias_is_seen():
    q, k, v, cu = _thd([30, 34, 36])
    _check_fresh(q, k, v, cu)
    torch.from_dlpack(cu)[1] = 50
    _check_fresh(q, k, v, cu)


def test_cuda_graph_replay_into_static_lengths_is_seen():
    q, k, v, cu = _thd([30, 34, 36])
    src = torch.tensor([0, 12, 64, 100], dtype=torch.int32, device="cuda")
    _check_fresh(q, k, v, cu)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        cu.copy_(src)  # graph-captured preprocessing writing the static lengths buffer
    torch.cuda.current_stream().wait_stream(stream)
    cu.copy_(torch.tensor([0, 30, 64, 100], dtype=torch.int32, device="cuda"))
    _check_fresh(q, k, v, cu)
    graph.replay()
    torch.cuda.synchronize()
    assert cu.tolist() == [0, 12, 64, 100]
    _check_fresh(q, k, v, cu)


def test_padding_mask_dense_layout_write_through_data_is_seen():
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(3, 64, H, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 30, 64, 100], dtype=torch.int32, device="cuda")

    def run(c):
        return tc.fused_attn_fwd(False, 64, 64, c, c, q, k, v, q.dtype, None, qkv_layout="bshd_bshd_bshd",
                                 attn_mask_type="padding")[0]  # fmt: skip

    assert torch.equal(run(cu), run(cu.clone()))
    cu.data[1] = 10
    assert torch.equal(run(cu), run(cu.clone()))


def test_batch_lengths_reused_across_layers_and_refreshed():
    q, k, v, cu = _thd([30, 34, 36])
    batch = tc.BatchLengths(cu)
    first = _check_fresh(q, k, v, cu, lengths=batch)
    assert torch.equal(_fwd(q, k, v, cu, lengths=batch), first)  # a later layer reuses the derived lengths
    cu.data[1] = 5
    batch.refresh()
    _check_fresh(q, k, v, cu, lengths=batch)
    with pytest.raises(ValueError, match="lengths was built from other cu_seqlens tensors"):
        _fwd(q, k, v, cu.clone(), lengths=batch)


def test_backward_uses_its_forwards_lengths():
    """fused_attention hands the forward's lengths to its backward: a write between the two
    does not make the gradients those of other lengths."""
    lens = [30, 34, 36]
    q, k, v, cu = _thd(lens, seed=2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = tc.fused_attention(*leaves, cu_seqlens_q=cu, cu_seqlens_kv=cu, qkv_layout="thd_thd_thd",
                             attn_mask_type="padding_causal")  # fmt: skip
    grad = torch.randn_like(out)
    cu.data[1] = 5  # after the forward, before the backward
    out.backward(grad)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    cu_ref = torch.tensor([0, 30, 64, 100], dtype=torch.int32, device="cuda")
    ref = tc.fused_attention(*ref_leaves, cu_seqlens_q=cu_ref, cu_seqlens_kv=cu_ref, qkv_layout="thd_thd_thd",
                             attn_mask_type="padding_causal")  # fmt: skip
    ref.backward(grad)
    for name, a, b in zip("qkv", leaves, ref_leaves):
        check_close(a.grad, b.grad, f"d{name}")


def test_decode_strided_cache_seqlens():
    b, hg, page_s = 3, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(3)
    kc, vc = (torch.randn(b, page_s, hg, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    q = torch.randn(b, 1, H, D, generator=gen, device="cuda").to(torch.bfloat16)
    table = torch.tensor([[5, 100, 0, 0], [7, 100, 0, 0], [9, 100, 0, 0]], dtype=torch.int32, device="cuda")
    want = tc.fused_attn_decode(q, kc, vc, torch.tensor([5, 7, 9], dtype=torch.int32, device="cuda"))
    got = tc.fused_attn_decode(q, kc, vc, table[:, 0])  # a column: stride 4
    assert torch.equal(got, want), f"max abs diff {(got - want).abs().max().item()}"
    got = tc.fused_attn_decode(q, kc, vc, table[:, 1].sub_(95))  # stride 4, 4 bytes in: [5, 5, 5]
    assert torch.equal(got, tc.fused_attn_decode(q, kc, vc, torch.full((b,), 5, dtype=torch.int32, device="cuda")))
    # against the fp32 reference on the first lengths
    lens = [5, 7, 9]
    for i in range(b):
        ref = attention_reference(q[i:i + 1].float().transpose(1, 2), kc[i:i + 1, :lens[i]].float().transpose(1, 2),
                                  vc[i:i + 1, :lens[i]].float().transpose(1, 2)).out  # fmt: skip
        check_close(want[i:i + 1], ref.transpose(1, 2), f"decode row {i}")


def test_decode_strided_cache_seqlens_in_a_cuda_graph():
    b, hg, s = 2, 2, 64
    gen = torch.Generator(device="cuda").manual_seed(4)
    kc, vc = (torch.randn(b, s, hg, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    q = torch.randn(b, 1, H, D, generator=gen, device="cuda").to(torch.bfloat16)
    table = torch.tensor([[10, 1], [20, 1]], dtype=torch.int32, device="cuda")
    tc.fused_attn_decode(q, kc, vc, table[:, 0])  # prepare eagerly first
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = tc.fused_attn_decode(q, kc, vc, table[:, 0])
    torch.cuda.current_stream().wait_stream(stream)
    table[:, 0] = torch.tensor([33, 3], dtype=torch.int32, device="cuda")
    graph.replay()
    torch.cuda.synchronize()
    want = tc.fused_attn_decode(q, kc, vc, torch.tensor([33, 3], dtype=torch.int32, device="cuda"))
    check_close(out, want, "replayed decode")
