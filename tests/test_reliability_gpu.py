"""GPU: unaligned post-scale biases (copied, dBias in the caller's strides), aligned ones read in
place, per-call checks of what the call signature does not key on (cu_seqlens, page tables),
the device guard, release_workspaces() and the atomic generator advance."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

import te_cudnn as tc
from te_cudnn import launchers, ops
from te_cudnn import launch
from te_cudnn.enums import QKVLayout
from te_cudnn.reference import attention_reference
from te_cudnn.testing import check_close, make_qkv

from test_fused_attn_gpu import run_and_check

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape_name", ["1hss", "11ss", "b1ss", "bhss"])
@pytest.mark.parametrize("skv", [100, 36])
def test_unaligned_bias_matches_reference_and_dbias_has_callers_strides(shape_name, skv):
    b, h, sq = 2, 4, 64
    shape = tuple({"1": 1, "b": b, "h": h, "s": s}[c] for c, s in zip(shape_name, (0, 0, sq, skv)))
    errors, _ = run_and_check("bshd_bshd_bshd", "no_mask", torch.bfloat16, b, h, h, sq, skv, 64,
                              bias_type="post_scale_bias", bias_shape=shape)  # fmt: skip
    assert "dbias" in errors


@pytest.mark.parametrize("skv", [128, 100])
def test_bias_broadcast_over_queries_111s_inference(skv):
    """[1, 1, 1, skv] (TE's 111s): the forward is fused (aligned or copied) and right; training is
    declined before any GPU work (cuDNN 9.19's backward for it gives wrong dQ, measured)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 64, skv, 64, generator=gen)
    bias = torch.randn(1, 1, 1, skv, generator=gen, device="cuda").to(q.dtype)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask", attn_bias_type="post_scale_bias", attn_bias=bias)
    out, _ = tc.fused_attn_fwd(False, 64, skv, None, None, q, k, v, q.dtype, None, **kw)
    bhsd = [t.permute(0, 2, 1, 3) for t in (q, k, v)]
    ref32 = attention_reference(*(t.float() for t in bhsd), attn_bias_type="post_scale_bias", attn_bias=bias.float())
    reflp = attention_reference(*bhsd, attn_bias_type="post_scale_bias", attn_bias=bias, compute_dtype=q.dtype)
    check_close("O (111s)", out.permute(0, 2, 1, 3), ref32.out, reflp.out, q.dtype)
    before = tc.plan_cache.stats()
    with pytest.raises(tc.UnsupportedConfigError, match=r"111s\) in training"):
        tc.fused_attn_fwd(True, 64, skv, None, None, q, k, v, q.dtype, None, **kw)
    assert tc.plan_cache.stats().misses == before.misses


def _spy_execute(monkeypatch):
    seen = []
    real = launchers._execute

    def spy(plan, buffers, device, checked=()):
        seen.append([t.data_ptr() for t in buffers])
        return real(plan, buffers, device, checked)

    monkeypatch.setattr(launchers, "_execute", spy)
    return seen


@pytest.mark.parametrize("skv", [128, 100])
def test_aligned_bias_is_zero_copy_and_unaligned_is_copied(monkeypatch, caplog, skv):
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 64, skv, 64)
    bias = torch.randn(1, 4, 64, skv, device="cuda", dtype=torch.bfloat16)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask", attn_bias_type="post_scale_bias")
    seen = _spy_execute(monkeypatch)
    with caplog.at_level(logging.DEBUG, logger="te_cudnn"):
        out, aux = tc.fused_attn_fwd(True, 64, skv, None, None, q, k, v, q.dtype, None, attn_bias=bias, **kw)
        dq, dk, dv, dbias, _ = tc.fused_attn_bwd(64, skv, None, None, q, k, v, out, out, q.dtype, aux, None, **kw)
    fwd_bias_ptr, bwd_bias_ptr = seen[0][5], seen[1][9]  # uid order: q k v o stats bias | ... dv bias dbias
    assert aux[2] is bias
    if skv % 8 == 0:
        assert fwd_bias_ptr == bwd_bias_ptr == bias.data_ptr(), "an aligned bias must reach cuDNN in place"
        assert "copies it" not in caplog.text
    else:
        assert fwd_bias_ptr != bias.data_ptr() and bwd_bias_ptr != bias.data_ptr()
        assert "copies it into an aligned buffer" in caplog.text
    assert dbias.shape == bias.shape and dbias.stride() == bias.stride()


def test_unaligned_bias_permuted_caller_strides_come_back():
    """A dense but permuted unaligned bias: dBias comes back with the caller's strides."""
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 1, 4, 4, 64, 100, 64)
    bias = torch.randn(1, 64, 4, 100, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # [1, 4, 64, 100]
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask", attn_bias_type="post_scale_bias")
    out, aux = tc.fused_attn_fwd(True, 64, 100, None, None, q, k, v, q.dtype, None, attn_bias=bias, **kw)
    ref_out, ref_aux = tc.fused_attn_fwd(True, 64, 100, None, None, q, k, v, q.dtype, None,
                                         attn_bias=bias.contiguous(), **kw)  # fmt: skip
    assert torch.equal(out, ref_out)
    _, _, _, dbias, _ = tc.fused_attn_bwd(64, 100, None, None, q, k, v, out, out, q.dtype, aux, None, **kw)
    _, _, _, ref_dbias, _ = tc.fused_attn_bwd(64, 100, None, None, q, k, v, ref_out, ref_out, q.dtype, ref_aux, None, **kw)
    assert dbias.stride() == bias.stride() and torch.equal(dbias, ref_dbias)


# ------------------------------------------------------------------ what the call signature does not key on


def _padding_call(cu):
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 64, 64, 64)
    return tc.fused_attn_fwd(True, 64, 64, cu, cu, q, k, v, q.dtype, None, qkv_layout="bshd_bshd_bshd",
                             attn_mask_type="padding")  # fmt: skip


@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda cu: cu.long(), "int32"),
        (lambda cu: cu.float(), "int32"),
        (lambda cu: cu.cpu(), "cpu"),
        (lambda cu: cu[:2], r"\[b\+1\]"),
    ],
    ids=["int64", "float", "cpu", "too-short"],
)
def test_forward_rechecks_cu_seqlens_after_the_first_call(bad, match):
    cu = torch.tensor([0, 40, 104], dtype=torch.int32, device="cuda")
    _padding_call(cu)  # the signature is now remembered
    with pytest.raises((TypeError, ValueError), match=match):
        _padding_call(bad(cu))


def test_thd_and_paged_recheck_runtime_tensors():
    h, d = 4, 64
    q, k, v = (torch.randn(96, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 32, 96], dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout="thd_thd_thd", attn_mask_type="padding")
    tc.fused_attn_fwd(True, 64, 64, cu, cu, q, k, v, q.dtype, None, **kw)
    with pytest.raises((TypeError, ValueError), match="int32"):
        tc.fused_attn_fwd(True, 64, 64, cu.long(), cu.long(), q, k, v, q.dtype, None, **kw)
    with pytest.raises(ValueError, match="cu_seqlens_q_padded"):
        tc.fused_attn_fwd(True, 64, 64, cu, cu, q, k, v, q.dtype, None, cu_seqlens_q_padded=cu[:2].clone(),
                          cu_seqlens_kv_padded=cu[:2].clone(), **kw)  # fmt: skip
    # paged: the page tables' dtype and device are checked on every call
    qd = torch.randn(2, 1, h, d, device="cuda", dtype=torch.bfloat16)
    pool = torch.randn(8, 16, h, d, device="cuda", dtype=torch.bfloat16)
    table = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
    lens_q, lens_kv = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda"), cu
    pkw = dict(qkv_layout="paged_kv_bshd_bshd_bshd", attn_mask_type="padding")
    tc.fused_attn_fwd(False, 1, 64, lens_q, lens_kv, qd, pool, pool, qd.dtype, None, page_table_k=table,
                      page_table_v=table, **pkw)  # fmt: skip
    with pytest.raises(ValueError, match="page_table_k"):
        tc.fused_attn_fwd(False, 1, 64, lens_q, lens_kv, qd, pool, pool, qd.dtype, None,
                          page_table_k=table.cpu(), page_table_v=table, **pkw)  # fmt: skip


# ------------------------------------------------------------------ device guard


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_a_device_that_is_not_current():
    """Tensors on cuda:1 while cuda:0 is current (one-process model parallel, device_map):
    build, launch and results as with cuda:1 current."""
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    gen = torch.Generator(device="cuda:1").manual_seed(3)
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 4, 4, 128, 128, 64, device="cuda:1", generator=gen)
    with torch.cuda.device(1):
        ref_out, ref_aux = tc.fused_attn_fwd(True, 128, 128, None, None, q, k, v, q.dtype, None, **kw)
        ref = tc.fused_attn_bwd(128, 128, None, None, q, k, v, ref_out, ref_out, q.dtype, ref_aux, None, **kw)
        torch.cuda.synchronize()
    tc.plan_cache.clear()  # the next calls build again, from cuda:0's context
    ops._fwd_memo.clear()
    ops._bwd_memo.clear()
    with torch.cuda.device(0):
        out, aux = tc.fused_attn_fwd(True, 128, 128, None, None, q, k, v, q.dtype, None, **kw)
        grads = tc.fused_attn_bwd(128, 128, None, None, q, k, v, out, out, q.dtype, aux, None, **kw)
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert out.device == q.device and torch.equal(out, ref_out)
    for a, b in zip(grads[:3], ref[:3]):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ workspaces and the generator


def test_release_workspaces_frees_and_calls_still_work():
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 2, 8, 8, 1024, 1024, 128)
    out, aux = tc.fused_attn_fwd(True, 1024, 1024, None, None, q, k, v, q.dtype, None, **kw)
    first = tc.fused_attn_bwd(1024, 1024, None, None, q, k, v, out, out, q.dtype, aux, None, deterministic=True, **kw)
    torch.cuda.synchronize()
    plans = [p for p in tc.plan_cache.plans() if p.workspace_size > 0]
    assert plans, "expected a backward plan with a workspace"
    def allocated():  # every device: release_workspaces() drops the workspaces of all of them
        return sum(torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count()))

    before = allocated()
    released = tc.release_workspaces()
    assert released >= max(p.workspace_size for p in plans)
    assert allocated() <= before - released
    again = tc.fused_attn_bwd(1024, 1024, None, None, q, k, v, out, out, q.dtype, aux, None, deterministic=True, **kw)
    for a, b in zip(first[:3], again[:3]):
        assert torch.equal(a, b)


def test_generator_advance_is_atomic_across_threads():
    """8 threads drawing dropout states from one generator: every offset drawn once, and the
    generator advanced by exactly calls x 16 (TE's increment)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    start = gen.get_offset()
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 1, 2, 2, 64, 64, 64)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask", dropout=0.2)
    tc.fused_attn_fwd(True, 64, 64, None, None, q, k, v, q.dtype, None, rng_gen=gen, **kw)  # build outside the race
    states, errors = [], []
    barrier = threading.Barrier(8)

    def worker():
        try:
            barrier.wait()
            for _ in range(100):
                _, aux = tc.fused_attn_fwd(True, 64, 64, None, None, q, k, v, q.dtype, None, rng_gen=gen, **kw)
                states.append(aux[1])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    offsets = sorted(int(s[1]) for s in states)
    assert len(offsets) == 800 and len(set(offsets)) == 800, "two calls drew the same Philox offset"
    assert gen.get_offset() == start + 801 * 16


def test_head_dim_cudnn_cannot_take_is_reported_as_the_head_dim():
    """d = 7 in bf16 (14-byte rows) packed as sb3hd: declined for its head dim by every
    sub-backend, before any GPU work (separate q, k, v are served padded: te_cudnn.served)."""
    qkv = torch.randn(64, 2, 3, 4, 7, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    before = tc.plan_cache.stats()
    with pytest.raises(tc.UnsupportedConfigError, match=r"head dims d_qk=7, d_v=7 must be multiples of 8"):
        tc.fused_attn_fwd(True, 64, 64, None, None, q, k, v, q.dtype, None, qkv_layout="sb3hd",
                          attn_mask_type="causal")  # fmt: skip
    assert tc.plan_cache.stats().misses == before.misses


# ------------------------------------------------------------------ workspace growth


def test_a_growing_workspace_never_holds_both_buffers():
    """Backward calls of growing workspace (a context-parallel ring alternates such plans): the
    smaller buffer is let go before the larger one is allocated, so the peak is the larger one."""
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    tc.release_workspaces()
    calls = []
    for s in (1024, 4096):  # the second backward needs a 4x larger workspace
        q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, 1, 16, 16, s, s, 128)
        out, aux = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, q.dtype, None, **kw)
        calls.append((s, q, k, v, out, aux))
    for s, q, k, v, out, aux in calls:  # build both plans; the workspace ends at the larger size
        tc.fused_attn_bwd(s, s, None, None, q, k, v, out, out, q.dtype, aux, None, **kw)
    torch.cuda.synchronize()
    big = max(t.numel() for t in launch._workspaces.values())
    tc.release_workspaces()
    s, q, k, v, out, aux = calls[0]
    tc.fused_attn_bwd(s, s, None, None, q, k, v, out, out, q.dtype, aux, None, **kw)  # the smaller workspace
    torch.cuda.synchronize()
    small = max(t.numel() for t in launch._workspaces.values())
    assert small < big
    base = torch.cuda.memory_allocated()  # includes the smaller workspace
    torch.cuda.reset_peak_memory_stats()
    s, q, k, v, out, aux = calls[1]
    grads = tc.fused_attn_bwd(s, s, None, None, q, k, v, out, out, q.dtype, aux, None, **kw)  # grows it
    torch.cuda.synchronize()
    results = sum(g.numel() * g.element_size() for g in grads[:3])
    peak = torch.cuda.max_memory_allocated() - base  # the larger workspace replaces the smaller one
    assert peak <= big - small + results + (1 << 20), (peak, big, small, results)
