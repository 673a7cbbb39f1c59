"""Lengths and offsets replayed from a CUDA graph (``te_cudnn.replayed``) equal the launched
derivation, after every kind of write and for every layout of the cu_seqlens tensors (GPU)."""

from __future__ import annotations

import random

import pytest
import torch

import te_cudnn as tc
from te_cudnn import replayed

pytestmark = pytest.mark.gpu

H, D = 4, 64


@pytest.fixture(autouse=True)
def _fresh_graphs():
    replayed.replay_derivations(True)
    replayed.clear()
    yield
    replayed.replay_derivations(True)
    replayed.clear()


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _qkv(total, seed=0, hk=H):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(total, h, D, generator=gen, device="cuda").to(torch.bfloat16) for h in (H, hk, hk)]


def _fwd(q, k, v, cu_q, cu_kv=None, mask="padding_causal", **kw):
    cu_kv = cu_q if cu_kv is None else cu_kv
    out, aux = tc.fused_attn_fwd(True, 128, 128, cu_q, cu_kv, q, k, v, q.dtype, None, qkv_layout="thd_thd_thd",
                                 attn_mask_type=mask, **kw)  # fmt: skip
    return out, aux


def _by_batch_lengths(q, k, v, cu):
    """The call on a copy of ``cu`` with its lengths from a BatchLengths (derived by launching
    the kernels), for reference."""
    cu = cu.clone()
    return _fwd(q, k, v, cu, lengths=tc.BatchLengths(cu))[0]


def _launched(fn):
    """``fn()`` with replays off (dropping every graph): every derivation launches its kernels."""
    replayed.replay_derivations(False)
    try:
        return fn()
    finally:
        replayed.replay_derivations(True)


def test_third_call_replays_and_every_write_is_seen():
    lens = [30, 34, 36]
    q, k, v = _qkv(sum(lens))
    cu = _cu(lens)
    want = _launched(lambda: _fwd(q, k, v, cu)[0])
    for _ in range(3):  # launched, captured, replayed
        assert torch.equal(_fwd(q, k, v, cu)[0], want)
    assert replayed.entries() == 1
    writes = [lambda: cu.data.__setitem__(1, 5), lambda: torch.from_dlpack(cu).__setitem__(1, 50)]
    for write in writes:
        write()
        got = _fwd(q, k, v, cu)[0]
        assert replayed.entries() == 1  # the same graph, replayed
        assert torch.equal(got, _by_batch_lengths(q, k, v, cu))
    # a captured graph of the caller's writes new values into the static cu_seqlens buffer
    src = torch.tensor([0, 12, 64, 100], dtype=torch.int32, device="cuda")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        cu.copy_(src)
    torch.cuda.current_stream().wait_stream(stream)
    before = _fwd(q, k, v, cu)[0]
    graph.replay()
    got = _fwd(q, k, v, cu)[0]
    assert cu.tolist() == [0, 12, 64, 100]
    assert replayed.entries() == 1
    assert torch.equal(got, _by_batch_lengths(q, k, v, cu))
    assert not torch.equal(got, before)


def test_replays_launch_through_the_driver_and_torch_alike():
    """Replays go through ``cuGraphLaunch`` where torch exposes the instantiated graph, and
    through torch's ``CUDAGraph.replay`` otherwise: the same answers after the same writes."""
    lens = [30, 34, 36]
    q, k, v = _qkv(sum(lens), seed=3)
    cu = _cu(lens)
    for _ in range(3):
        _fwd(q, k, v, cu)
    (key, entry), = replayed._graphs.items()
    if hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec"):
        assert entry[3] and entry[4] is not None
    by_driver = []
    for value in (5, 50):
        cu.data[1] = value
        by_driver.append(_fwd(q, k, v, cu)[0])
    replayed._graphs[key] = (*entry[:4], None)  # torch's replay
    for value, want in zip((5, 50), by_driver):
        cu.data[1] = value
        got = _fwd(q, k, v, cu)[0]
        assert torch.equal(got, want) and torch.equal(got, _by_batch_lengths(q, k, v, cu))
    assert replayed.entries() == 1


def test_same_address_other_stride_is_another_graph():
    """A strided view at the address of a contiguous tensor of the same length is keyed apart."""
    buf = torch.tensor([0, 20, 50, 100, 70, 0, 100, 0], dtype=torch.int32, device="cuda")
    dense, strided = buf[:4], buf[::2]  # [0, 20, 50, 100] and [0, 50, 70, 100]
    assert dense.data_ptr() == strided.data_ptr() and dense.tolist() != strided.tolist()
    q, k, v = _qkv(100, seed=1)
    for view in (dense, strided, dense, strided, dense, strided):
        want = _by_batch_lengths(q, k, v, view)
        assert torch.equal(_fwd(q, k, v, view)[0], want), f"stride {view.stride()}"
    assert replayed.entries() == 2


def test_streams_keep_their_own_graphs():
    lens = [64, 1, 35]
    q, k, v = _qkv(sum(lens), seed=2)
    cu = _cu(lens)
    want = _launched(lambda: _fwd(q, k, v, cu)[0])
    side = torch.cuda.Stream()
    for _ in range(3):
        assert torch.equal(_fwd(q, k, v, cu)[0], want)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = _fwd(q, k, v, cu)[0]
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(got, want)
    assert replayed.entries() == 2


def test_random_calls_equal_the_launched_derivation():
    """Seeded random THD calls (zero-length sequences, padded offsets, cross attention, GQA,
    a batch smaller than its bucket), forward and backward, each three times: the replayed
    results equal the launched ones bit for bit."""
    seed = 20261127
    print(f"seed {seed}")
    rng = random.Random(seed)
    for case in range(12):
        b = rng.randint(1, 6)
        lens_q = [rng.choice([0, rng.randint(1, 96)]) for _ in range(b)]
        lens_kv = lens_q if rng.random() < 0.5 else [rng.randint(0, 96) for _ in range(b)]
        pad = rng.random() < 0.4
        hk = rng.choice([H, 2, 1])
        cu_q, cu_kv = _cu(lens_q), (_cu(lens_kv) if lens_kv is not lens_q else None)
        kw = {}
        tq, tkv = sum(lens_q), sum(lens_kv)
        if pad:  # room after each sequence: the padded offsets differ from the lengths
            cu_q_pad = _cu([n + 3 for n in lens_q])
            kw = {"cu_seqlens_q_padded": cu_q_pad, "cu_seqlens_kv_padded": cu_q_pad if cu_kv is None else _cu([n + 5 for n in lens_kv])}
            tq = int(cu_q_pad[-1])
            tkv = int(kw["cu_seqlens_kv_padded"][-1])
        q = _qkv(tq, seed=case)[0]
        _, k, v = _qkv(tkv, seed=100 + case, hk=hk)
        mask = rng.choice(["padding", "padding_causal", "padding_causal_bottom_right"])
        d_o = torch.randn_like(q)

        def step():
            o, aux = _fwd(q, k, v, cu_q, cu_kv, mask, **kw)
            grads = tc.fused_attn_bwd(128, 128, cu_q, cu_q if cu_kv is None else cu_kv, q, k, v, o, d_o, q.dtype, aux,
                                      None, qkv_layout="thd_thd_thd", attn_mask_type=mask, **kw)  # fmt: skip
            return [o, *grads[:3]]

        want = _launched(step)
        for call in range(3):
            got = step()
            for name, a, w in zip(("out", "dq", "dk", "dv"), got, want):
                assert torch.equal(a, w), f"case {case} call {call} {name}: lens_q {lens_q} lens_kv {lens_kv} pad {pad} {mask}"
    assert replayed.entries() > 0


def test_a_capture_of_the_callers_records_the_kernels():
    """Inside the caller's CUDA-graph capture the derivation is launched (and so captured):
    replaying the caller's graph after a write derives the new lengths."""
    lens = [30, 34, 36]
    q, k, v = _qkv(sum(lens), seed=3)
    cu = _cu(lens)
    for _ in range(3):
        _fwd(q, k, v, cu)
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = _fwd(q, k, v, cu)[0]
    torch.cuda.current_stream().wait_stream(stream)
    cu.copy_(torch.tensor([0, 10, 64, 100], dtype=torch.int32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _by_batch_lengths(q, k, v, cu))
