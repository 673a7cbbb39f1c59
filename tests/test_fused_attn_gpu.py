"""GPU suite: te_cudnn's F16 arbitrary-seqlen fused attention against the fp32 reference.

Every case runs forward and backward through ``fused_attn_fwd`` / ``fused_attn_bwd`` and
compares O, the softmax stats and dQ/dK/dV (and dBias) with ``te_cudnn.reference`` in fp32.
The bar is the error a same-precision PyTorch computation makes (``te_cudnn.testing``).
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch

import te_cudnn as tc
from te_cudnn.backends import REGISTRY
from te_cudnn.enums import AttnMaskType, QKVLayout
from te_cudnn.layouts import layout_info
from te_cudnn.reference import attention_reference
from te_cudnn.testing import check_close, make_qkv, rel_error, to_bhsd

pytestmark = pytest.mark.gpu
CAPS = REGISTRY[0].caps
DTYPES = (torch.float16, torch.bfloat16)


def _cu(b: int, s: int) -> torch.Tensor:
    return torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")


def run_and_check(
    layout, mask, dtype, b, h, hg, sq, skv, d_qk, d_v=None, *, bias_type="no_bias", bias_shape=None,
    window=(-1, -1), bottom_right_diagonal=None, seed=0, deterministic=False,
):  # fmt: skip
    """Forward + backward through te_cudnn, checked against the fp32 reference."""
    layout = QKVLayout.coerce(layout)
    d_v = d_qk if d_v is None else d_v
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = make_qkv(layout, b, h, hg, sq, skv, d_qk, d_v, dtype=dtype, generator=gen)
    bias = None
    if bias_type == "post_scale_bias":
        bias = torch.randn(bias_shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    kw = dict(
        qkv_layout=layout.name, attn_mask_type=mask, attn_bias_type=bias_type, window_size=window,
        bottom_right_diagonal=bottom_right_diagonal,
    )  # fmt: skip
    out, aux = tc.fused_attn_fwd(True, sq, skv, _cu(b, sq), _cu(b, skv), q, k, v, dtype, None, attn_bias=bias, **kw)
    assert out.shape == (*q.shape[:-1], d_v) and out.dtype == dtype
    d_o = (torch.randn(out.shape, generator=gen, device="cuda") * 0.5).to(dtype)
    dq, dk, dv, dbias, _ = tc.fused_attn_bwd(
        sq, skv, _cu(b, sq), _cu(b, skv), q, k, v, out, d_o, dtype, aux, None, deterministic=deterministic, **kw
    )
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape

    inputs = [to_bhsd(t, layout) for t in (q, k, v)] + ([bias] if bias is not None else [])
    ref_kw = dict(
        attn_mask_type=mask, attn_bias_type=bias_type, window_size=window, bottom_right_diagonal=bottom_right_diagonal
    )
    results = {}
    for compute in (torch.float32, dtype):  # the fp32 truth, then same-precision PyTorch
        leaves = [t.detach().to(compute).requires_grad_() for t in inputs]
        ref = attention_reference(*leaves[:3], attn_bias=leaves[3] if bias is not None else None, compute_dtype=compute, **ref_kw)
        grads = torch.autograd.grad(ref.out, leaves, to_bhsd(d_o, layout).to(compute))
        results[compute] = (ref, grads)
    (ref32, g32), (reflp, glp) = results[torch.float32], results[dtype]
    errors = {
        "o": check_close("O", to_bhsd(out, layout), ref32.out, reflp.out, dtype),
        "dq": check_close("dQ", to_bhsd(dq, layout), g32[0], glp[0], dtype),
        "dk": check_close("dK", to_bhsd(dk, layout), g32[1], glp[1], dtype),
        "dv": check_close("dV", to_bhsd(dv, layout), g32[2], glp[2], dtype),
    }
    finite = torch.isfinite(ref32.lse)
    assert rel_error(aux[0][finite], ref32.lse[finite]) < 1e-4, "softmax stats (logsumexp) differ from the reference"
    if bias is not None:
        if bias.shape[:3] != (1, 1, 1):
            assert dbias is not None and dbias.shape == bias.shape
            errors["dbias"] = check_close("dBias", dbias, g32[3], glp[3], dtype)
    else:
        assert dbias is None
    return errors, (q, k, v, out, aux, dq, dk, dv)


# ------------------------------------------------------------------ the main matrix
def _matrix():
    masks = [m for m in (AttnMaskType.no_mask, AttnMaskType.causal, AttnMaskType.causal_bottom_right) if m in CAPS.masks]
    # the dense layouts here; padding masks, THD, mixed and paged layouts: test_varlen_gpu.py
    dense = sorted(l for l in CAPS.layouts if layout_info(l).is_dense)
    for layout, mask, dtype, gqa in itertools.product(dense, masks, DTYPES, (False, True)):
        packs_qkv = layout_info(layout).packs_qkv
        if gqa and packs_qkv:
            continue  # one packed buffer holds as many k/v heads as q heads
        yield pytest.param(
            layout, mask, dtype, gqa,
            id=f"{layout.name}-{mask.name}-{str(dtype)[6:]}-{'gqa' if gqa else 'mha'}",
        )  # fmt: skip


@pytest.mark.parametrize("layout,mask,dtype,gqa", list(_matrix()))
def test_layout_mask_dtype_matrix(layout, mask, dtype, gqa):
    # bottom-right gets sq < skv where the layout allows distinct lengths (else it equals top-left)
    cross = mask == AttnMaskType.causal_bottom_right and not layout_info(layout).packs_qkv
    sq, skv = (96, 160) if cross else (128, 128)
    run_and_check(layout, mask, dtype, b=2, h=4, hg=2 if gqa else 4, sq=sq, skv=skv, d_qk=64)


# ------------------------------------------------------------------ bias, alibi, window, head dims
@pytest.mark.parametrize("shape_name", ["1hss", "11ss", "b1ss", "bhss"])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
def test_post_scale_bias_and_dbias(shape_name, mask):
    b, h, s = 2, 4, 128
    shape = {"1hss": (1, h, s, s), "11ss": (1, 1, s, s), "b1ss": (b, 1, s, s), "bhss": (b, h, s, s)}[shape_name]
    errors, _ = run_and_check("bshd_bshd_bshd", mask, torch.bfloat16, b, h, h, s, s, 64, bias_type="post_scale_bias", bias_shape=shape)
    assert "dbias" in errors


@pytest.mark.parametrize("layout", ["bshd_bshd_bshd", "sb3hd"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_alibi(layout, dtype):
    run_and_check(layout, "causal", dtype, 2, 8, 8, 128, 128, 64, bias_type="alibi")


@pytest.mark.parametrize(
    "mask,window,sq,skv,gqa",
    [
        ("causal", (16, 0), 128, 128, False),
        ("no_mask", (8, 8), 128, 128, True),
        ("no_mask", (32, 0), 128, 128, False),
        ("causal_bottom_right", (16, 0), 64, 128, False),
        ("no_mask", (4, 12), 96, 160, True),
    ],
    ids=["causal-16-0", "nomask-8-8-gqa", "nomask-32-0", "causalbr-16-0-cross", "nomask-4-12-cross-gqa"],
)
def test_sliding_window(mask, window, sq, skv, gqa):
    br = True if sq != skv else None
    run_and_check("bshd_bshd_bshd", mask, torch.bfloat16, 2, 4, 2 if gqa else 4, sq, skv, 64, window=window, bottom_right_diagonal=br)


@pytest.mark.parametrize("d_qk,d_v", [(32, 32), (128, 128), (256, 256), (192, 128), (128, 64)])
def test_head_dims(d_qk, d_v):
    run_and_check("bshd_bshd_bshd", "causal", torch.bfloat16, 2, 4, 4, 128, 128, d_qk, d_v)


# ------------------------------------------------------------------ dropout
# Dropout statistics, mask replay in the backward, seeds and the generator: tests/test_dropout_gpu.py


# ------------------------------------------------------------------ determinism, cache, streams
def test_deterministic_backward_is_bit_identical():
    b, h, s = 2, 8, 512
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, b, h, h, s, s, 64, generator=g)
    cu = _cu(b, s)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    d_o = torch.randn(out.shape, generator=g, device="cuda").to(q.dtype)
    runs = [tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, q.dtype, aux, None, deterministic=True, **kw) for _ in range(3)]
    for later in runs[1:]:
        for a, b_ in zip(runs[0][:3], later[:3]):
            assert torch.equal(a, b_), "deterministic backward must be bit-identical across runs"
    out2, _ = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    assert torch.equal(out, out2), "the forward is deterministic"


def test_plan_cache_hits_on_repeat_calls():
    b, h, s = 1, 2, 192
    q, k, v = make_qkv(QKVLayout.sbhd_sbhd_sbhd, b, h, h, s, s, 64)
    cu = _cu(b, s)
    kw = dict(qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="causal")
    tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    before = tc.plan_cache.stats()
    for _ in range(5):
        tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    after = tc.plan_cache.stats()
    assert after.hits - before.hits == 5 and after.builds == before.builds and after.misses == before.misses
    # New tensors of the same shape hit too: values are not part of the key.
    q2, k2, v2 = make_qkv(QKVLayout.sbhd_sbhd_sbhd, b, h, h, s, s, 64)
    tc.fused_attn_fwd(False, s, s, cu, cu, q2, k2, v2, q.dtype, None, **kw)
    assert tc.plan_cache.stats().builds == before.builds
    # A plan describes itself for the inspection tool.
    def ours(key: dict) -> bool:  # this call's plan, not another test's of the same length and layout
        return (key["backend"], key["direction"], key["sq"], key["skv"], key["b"], key["h"], key["layout"], key["mask"]) == (
            "F16_arbitrary_seqlen", "fwd", s, s, b, h, "sbhd_sbhd_sbhd", "causal")

    info = [p for p in tc.plan_cache.snapshot() if ours(p["key"])]
    assert info and info[0]["hits"] >= 6 and info[0]["plan_name"] and info[0]["build_ms"] > 0


def test_inference_and_training_forward_agree():
    b, h, s = 2, 4, 128
    q, k, v = make_qkv(QKVLayout.bs3hd, b, h, h, s, s, 64)
    cu = _cu(b, s)
    kw = dict(qkv_layout="bs3hd", attn_mask_type="causal")
    o_train, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    o_inf, aux_inf = tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    assert torch.equal(o_train, o_inf) and torch.equal(aux[0], aux_inf[0])


def _sleep_cycles(ms: float) -> int:
    """GPU clock cycles of ``torch.cuda._sleep`` that last about ``ms`` milliseconds (measured)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # load the kernel
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(ms * 10_000_000 / start.elapsed_time(end))


def test_runs_on_the_callers_stream_and_threads():
    """On a side stream: a 200 ms GPU sleep, then a write of new q values, then the call; only
    that stream is synchronised before the check. A call that ran on any other stream would
    read q before the write (the old values) and differ from the result on the new values; a
    call that waited for the GPU would keep the host busy for the sleep. The same holds in 4
    threads at once, each with its own stream and buffer."""
    b, h, s = 2, 4, 256
    q_old, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, b, h, h, s, s, 64)
    q_new = torch.randn_like(q_old)
    cu = _cu(b, s)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
    expected, _ = tc.fused_attn_fwd(False, s, s, cu, cu, q_new, k, v, q_new.dtype, None, **kw)
    stale, _ = tc.fused_attn_fwd(False, s, s, cu, cu, q_old, k, v, q_old.dtype, None, **kw)
    sleep_ms, cycles = 200, _sleep_cycles(200)
    buffers = [q_old.clone() for _ in range(5)]
    torch.cuda.synchronize()
    assert not torch.equal(stale, expected)

    def on_side_stream(buf: torch.Tensor) -> tuple[torch.Tensor, float, bool]:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            t0 = time.perf_counter()
            torch.cuda._sleep(cycles)
            buf.copy_(q_new)  # ordered after the sleep on this stream only
            got, _ = tc.fused_attn_fwd(False, s, s, cu, cu, buf, k, v, buf.dtype, None, **kw)
            host_ms = (time.perf_counter() - t0) * 1e3
        busy = not side.query()
        side.synchronize()  # this stream only
        return got, host_ms, busy

    got, host_ms, busy = on_side_stream(buffers[0])
    assert torch.equal(got, expected), "the call did not run in the current stream's order: it read q before the write"
    assert busy and host_ms < sleep_ms / 2, f"queuing the call took {host_ms:.1f} ms behind a {sleep_ms} ms sleep"

    results, errors = {}, []

    def worker(i):
        try:
            results[i] = on_side_stream(buffers[1 + i])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 4
    for i, (o, _, _) in results.items():
        assert torch.equal(o, expected), f"thread {i}: the call did not run in its stream's order"


def test_cuda_graph_capture_replays():
    b, h, s = 2, 4, 128
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, b, h, h, s, s, 64)
    cu = _cu(b, s)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    expected, _ = tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)  # builds the plan
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)  # warm up on the capture stream
        with torch.cuda.graph(graph, stream=side):
            captured, _ = tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    torch.cuda.current_stream().wait_stream(side)
    q.copy_(torch.randn_like(q))
    fresh, _ = tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, fresh) and not torch.equal(fresh, expected)


def test_autograd_function_matches_reference():
    b, h, hg, s = 2, 8, 2, 128
    layout = QKVLayout.bshd_bshd_bshd
    q, k, v = (t.detach().requires_grad_() for t in make_qkv(layout, b, h, hg, s, s, 64, dtype=torch.float16))
    out = tc.fused_attention(q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    grad = torch.randn_like(out)
    out.backward(grad.transpose(1, 2).contiguous().transpose(1, 2))  # a non-contiguous incoming gradient
    leaves = [to_bhsd(t.detach(), layout).float().requires_grad_() for t in (q, k, v)]
    ref = attention_reference(*leaves, attn_mask_type="causal")
    g32 = torch.autograd.grad(ref.out, leaves, to_bhsd(grad, layout).float())
    lp_leaves = [to_bhsd(t.detach(), layout).requires_grad_() for t in (q, k, v)]
    lp = attention_reference(*lp_leaves, attn_mask_type="causal", compute_dtype=torch.float16)
    glp = torch.autograd.grad(lp.out, lp_leaves, to_bhsd(grad, layout))
    check_close("O", to_bhsd(out.detach(), layout), ref.out, lp.out, torch.float16)
    for name, t, want, low in zip("qkv", (q, k, v), g32, glp):
        check_close(f"d{name}", to_bhsd(t.grad, layout), want, low, torch.float16)


def test_forced_backend_that_declines_raises_and_default_padding_mask():
    b, h, s = 2, 4, 128
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, b, h, h, s, s, 64)
    with pytest.raises(tc.UnsupportedConfigError, match="F16_max512_seqlen(.|\n)*padding masks"):
        tc.fused_attn_fwd(False, s, s, _cu(b, s), _cu(b, s), q, k, v, q.dtype, "F16_max512_seqlen",
                          qkv_layout="bshd_bshd_bshd", attn_mask_type="padding")  # fmt: skip
    # TransformerEngine's default mask is "padding": with full-length cu_seqlens it equals no_mask
    padded, _ = tc.fused_attn_fwd(False, s, s, _cu(b, s), _cu(b, s), q, k, v, q.dtype, None, qkv_layout="bshd_bshd_bshd")
    plain, _ = tc.fused_attn_fwd(False, s, s, _cu(b, s), _cu(b, s), q, k, v, q.dtype, None, qkv_layout="bshd_bshd_bshd",
                                 attn_mask_type="no_mask")  # fmt: skip
    torch.testing.assert_close(padded, plain, rtol=0, atol=2e-3)


def test_direct_launch_matches_public_execute():
    """The plan launcher's native fast path computes exactly what graph.execute computes."""
    import cudnn

    b, h, s = 2, 4, 128
    q, k, v = make_qkv(QKVLayout.sbh3d, b, h, h, s, s, 64)
    cu = _cu(b, s)
    kw = dict(qkv_layout="sbh3d", attn_mask_type="causal")
    out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    c = None
    plan = next(
        p for p in tc.plan_cache.plans()
        if (c := p.key.config).layout == QKVLayout.sbh3d and c.dtype == q.dtype and c.mask.name == "causal"
        and (c.b, c.h, c.sq, c.d_qk) == (b, h, s, 64) and p.key.direction.value == "fwd" and c.is_training
    )  # fmt: skip
    if cudnn.__version__.startswith("1.32."):
        assert plan.launch.mode == "raw", "frontend 1.32 should take the pointer-array launch path"
    out2, stats2 = torch.empty_like(out), torch.empty_like(aux[0])
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    handle = tc.plans.handle_for(0)
    plan.graph.execute([q, k, v, out2, stats2], ws, handle=handle, tensor_uids=plan.uids)
    torch.cuda.synchronize()
    assert torch.equal(out, out2) and torch.equal(aux[0], stats2)


LAUNCH_CASES = [
    dict(layout="bshd_bshd_bshd", mask="causal"),
    dict(layout="sbh3d", mask="no_mask", bias=True),
    dict(layout="bshd_bshd_bshd", mask="padding_causal"),
    dict(layout="bshd_bshd_bshd", mask="causal", alibi=True),
    dict(layout="bshd_bshd_bshd", mask="causal", dropout=0.1),
    dict(layout="thd_thd_thd", mask="padding_causal"),
    dict(layout="bshd_bshd_bshd", mask="causal", max512=True),
]


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: "-".join(str(v) if v is not True else k for k, v in c.items()))
def test_launch_modes_agree(case):
    """Every launch mode the plan launcher can take gives bit-identical results (fwd and bwd):
    the pointer-array path, the native ordered reader and the public graph.execute."""
    b, h, s, d = 2, 4, 256, 64
    layout = QKVLayout[case["layout"]]
    gen = torch.Generator(device="cuda").manual_seed(3)
    if layout == QKVLayout.thd_thd_thd:
        q, k, v = (torch.randn(b * s, h, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    else:
        q, k, v = make_qkv(layout, b, h, h, s, s, d, generator=gen)
    padded = "padding" in case["mask"]
    cu = torch.tensor([0, s - 17, 2 * s - 40], dtype=torch.int32, device="cuda") if padded else _cu(b, s)
    bias = torch.randn(1, h, s, s, generator=gen, device="cuda").to(q.dtype) if case.get("bias") else None
    kw = dict(qkv_layout=layout.name, attn_mask_type=case["mask"], dropout=case.get("dropout", 0.0),
              attn_bias_type="post_scale_bias" if bias is not None else ("alibi" if case.get("alibi") else "no_bias"))
    backend = tc.FusedAttnBackend.F16_max512_seqlen if case.get("max512") else None
    d_o = None

    def run():
        nonlocal d_o
        rng = torch.Generator(device="cuda").manual_seed(7)
        out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, backend, attn_bias=bias, rng_gen=rng, **kw)
        d_o = torch.randn(out.shape, generator=torch.Generator(device="cuda").manual_seed(5), device="cuda").to(q.dtype)
        grads = tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, q.dtype, aux, backend, **kw)
        return [out, *[g for g in grads if g is not None]]

    tc.plan_cache.clear()  # only this case's plans: other tests leave plans of the same layout and mask
    first = run()
    used = [p for p in tc.plan_cache.plans() if p.key.config.layout == layout and p.key.config.mask.name == case["mask"]]
    modes = {p.launch.mode for p in used}
    assert modes <= {"raw", "ordered"}, modes
    if backend is None:
        assert modes == {"raw"}
    saved = {id(p): p.launch.mode for p in used}
    try:
        for forced in ("ordered", "public"):
            for p in used:
                p.launch.mode = forced
            again = run()
            for a, b_ in zip(first, again):
                assert torch.equal(a, b_), forced
    finally:
        for p in used:
            p.launch.mode = saved[id(p)]


def test_misaligned_pointer_is_rejected():
    b, h, s = 1, 2, 64
    buf = torch.randn(b * s * h * 64 + 1, device="cuda").to(torch.bfloat16)
    q = buf[1:].view(b, s, h, 64)  # starts 2 bytes past an aligned address
    k = v = torch.randn(b, s, h, 64, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="16-byte aligned.*q"):
        tc.fused_attn_fwd(False, s, s, _cu(b, s), _cu(b, s), q, k, v, q.dtype, None,
                          qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")  # fmt: skip


def test_preallocated_out_and_softmax_lse():
    b, h, s = 2, 4, 128
    q, k, v = make_qkv(QKVLayout.sbhd_sbhd_sbhd, b, h, h, s, s, 64)
    cu = _cu(b, s)
    kw = dict(qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="causal")
    fresh, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
    out, lse = torch.full_like(fresh, float("nan")), torch.full_like(aux[0], float("nan"))
    got, aux2 = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, out=out, softmax_lse=lse, **kw)
    assert got is out and aux2[0] is lse
    assert torch.equal(out, fresh) and torch.equal(lse, aux[0])
