"""GPU: te_cudnn as a PyTorch operator: opcheck, torch.compile, CUDA graphs with
dropout, the DotProductAttention module against the fp32 reference."""

from __future__ import annotations

import math

import pytest
import torch

import te_cudnn as tc
from te_cudnn import torch_ops
from te_cudnn.reference import attention_reference
from te_cudnn.testing import make_qkv, rel_error

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def _opts(layout="bshd_bshd_bshd", mask="causal", bias_type="no_bias", dropout=0.0, window=(-1, -1), det=False,
          training=True):
    return (None, dropout, torch_ops.op_config(training, layout, mask, bias_type, window[0], window[1], None, None,
                                               "vanilla", det))  # fmt: skip


def _fwd_args(q, k, v, sq, skv, *, bias=None, cu=(None, None), rng=None, training=True, **kw):
    return (q, k, v, bias, cu[0], cu[1], None, None, None, None, rng, None, sq, skv, *_opts(training=training, **kw))


# ------------------------------------------------------------------------------------------ opcheck

def _opcheck_cases():
    g = torch.Generator(device="cuda").manual_seed(7)
    cases = {}
    q, k, v = make_qkv(tc.QKVLayout.bshd_bshd_bshd, 2, 4, 4, 128, 128, 64, generator=g)
    cases["dense-causal"] = _fwd_args(q, k, v, 128, 128)
    q, k, v = make_qkv(tc.QKVLayout.sb3hd, 2, 4, 4, 128, 128, 64, generator=g)
    cases["sbhd-interleaved"] = _fwd_args(q, k, v, 128, 128, layout="sbhd_sbhd_sbhd", mask="no_mask")
    q, k, v = make_qkv(tc.QKVLayout.bshd_bshd_bshd, 2, 8, 2, 96, 160, 128, generator=g)
    cases["gqa-cross"] = _fwd_args(q, k, v, 96, 160, mask="no_mask")
    bias = torch.randn(1, 4, 128, 128, device="cuda", dtype=BF16, generator=g)
    q, k, v = make_qkv(tc.QKVLayout.bshd_bshd_bshd, 2, 4, 4, 128, 128, 64, generator=g)
    cases["bias"] = _fwd_args(q, k, v, 128, 128, bias=bias, bias_type="post_scale_bias", mask="no_mask")
    rng = torch.tensor([1234, 0], dtype=torch.int64, device="cuda")
    cases["dropout"] = _fwd_args(q, k, v, 128, 128, rng=rng, dropout=0.2)
    lens = torch.tensor([100, 37, 128], dtype=torch.int32, device="cuda")
    cu = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
    t = int(lens.sum())
    q, k, v = (torch.randn(t, 4, 64, device="cuda", dtype=BF16, generator=g) for _ in range(3))
    cases["thd-padding"] = _fwd_args(q, k, v, 128, 128, cu=(cu, cu), layout="thd_thd_thd", mask="padding_causal")
    return cases


_OPCHECK = None


@pytest.mark.parametrize("case", ["dense-causal", "sbhd-interleaved", "gqa-cross", "bias", "dropout", "thd-padding"])
def test_opcheck_fwd_with_autograd(case):
    global _OPCHECK
    if _OPCHECK is None:
        _OPCHECK = _opcheck_cases()
    args = list(_OPCHECK[case])  # (opcheck clones its inputs, so packed layouts are checked below instead)
    for i in (0, 1, 2):
        args[i] = args[i].detach().requires_grad_()
    if args[3] is not None:
        args[3] = args[3].detach().requires_grad_()
    torch.library.opcheck(torch.ops.te_cudnn.fwd.default, tuple(args))


def test_opcheck_bwd_direct():
    args = _opcheck_cases()["dropout"]
    out, stats = torch.ops.te_cudnn.fwd(*args)
    q, k, v = args[:3]
    bwd = (q, k, v, out, torch.randn_like(out), stats, args[10], None, None, None, None, None, None, 128, 128,
           *_opts(dropout=0.2))
    torch.library.opcheck(torch.ops.te_cudnn.bwd.default, bwd)


def test_op_path_equals_direct_path_bitwise():
    """The custom-op path and the direct path run the same plans: identical bits, dropout too
    once both use the same rng_state."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, 256, 8, 64, device="cuda", dtype=BF16, generator=g).requires_grad_() for _ in range(3))
    d_o = torch.randn(2, 256, 8, 64, device="cuda", dtype=BF16, generator=g)
    rng = torch.tensor([99, 4], dtype=torch.int64, device="cuda")
    out_op, stats_op = torch.ops.te_cudnn.fwd(*_fwd_args(q, k, v, 256, 256, rng=rng, dropout=0.1))
    out_op.backward(d_o)
    grads_op = [t.grad.clone() for t in (q, k, v)]
    out_d, aux = tc.fused_attn_fwd(True, 256, 256, None, None, q, k, v, BF16, None, qkv_layout="bshd_bshd_bshd",
                                   attn_mask_type="causal", dropout=0.1, rng_state=rng)
    grads_d = tc.fused_attn_bwd(256, 256, None, None, q, k, v, out_d, d_o, BF16, aux, None, qkv_layout="bshd_bshd_bshd",
                                attn_mask_type="causal", dropout=0.1)[:3]
    assert torch.equal(out_op, out_d) and torch.equal(stats_op, aux[0])
    for a, b in zip(grads_op, grads_d):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["sb3hd", "bsh3d", "sbhd_sb2hd", "bshd_bsh2d", "t3hd"])
def test_op_path_packed_layouts_equal_direct(layout):
    """Packed layouts through the ops: the bwd op returns the packed buffer, the wrapper its
    views; gradients equal the direct path's bit for bit."""
    lay = tc.QKVLayout[layout]
    b, s = 2, 128
    q, k, v = make_qkv(lay, b, 4, 4, s, s, 64)
    base_q = q._base if q._base is not None else q
    thd = layout.startswith("t")
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda") if thd else None
    mask = "padding_causal" if thd else "causal"
    d_o = torch.randn((*q.shape[:-1], 64), device="cuda", dtype=BF16)
    grads = []
    for use_ops in (True, False):
        leaves = [t.detach().requires_grad_() for t in {id(t._base if t._base is not None else t): (t._base if t._base is not None else t) for t in (q, k, v)}.values()]
        views = {}
        for t in (q, k, v):
            src = t._base if t._base is not None else t
            leaf = next(lf for lf in leaves if lf.shape == src.shape and lf.data_ptr() == src.data_ptr())
            views[id(t)] = leaf if t._base is None else leaf.as_strided(t.shape, t.stride(), t.storage_offset())
        qq, kk, vv = views[id(q)], views[id(k)], views[id(v)]
        opts = tc.AttnOptions(qkv_layout=layout, attn_mask_type=mask)
        if use_ops:
            out = torch_ops.attention(qq, kk, vv, None, cu, cu, s, s, True, qkv_layout=layout, attn_mask_type=mask,
                                      attn_bias_type="no_bias", attn_scale=None, dropout=0.0, window_size=(-1, 0),
                                      bottom_right_diagonal=None, backend=None, softmax_type="vanilla",
                                      deterministic=False)
        else:
            out = tc.FusedAttnFunc.apply(True, s, s, cu, cu, qq, kk, vv, None, None, opts)
        out.backward(d_o)
        grads.append([lf.grad for lf in leaves])
    assert base_q is not None
    for a, e in zip(*grads):
        assert torch.equal(a, e)


# ------------------------------------------------------------------------------------------ torch.compile

class TinyBlock(torch.nn.Module):
    def __init__(self, width=256, heads=4, kv_heads=2, fmt="bshd", dropout=0.0):
        super().__init__()
        self.h, self.hg, self.d, self.fmt = heads, kv_heads, width // heads, fmt
        self.q = torch.nn.Linear(width, width, dtype=BF16, device="cuda")
        self.kv = torch.nn.Linear(width, 2 * kv_heads * self.d, dtype=BF16, device="cuda")
        self.attn = tc.DotProductAttention(heads, self.d, num_gqa_groups=kv_heads, attention_dropout=dropout,
                                           qkv_format=fmt, attn_mask_type="causal")
        self.proj = torch.nn.Linear(width, width, dtype=BF16, device="cuda")

    def forward(self, x):  # x: [b, s, width] (bshd) or [s, b, width] (sbhd)
        q = self.q(x).unflatten(-1, (self.h, self.d))
        k, v = self.kv(x).unflatten(-1, (2, self.hg, self.d)).unbind(-3)
        return self.proj(self.attn(q, k, v))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_compile_fullgraph_matches_eager(dynamic, fmt):
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = TinyBlock(fmt=fmt)
    cm = torch.compile(m, fullgraph=True, dynamic=dynamic)
    for b, s in ((2, 128), (3, 192), (1, 320)):
        x = torch.randn((b, s, 256) if fmt == "bshd" else (s, b, 256), device="cuda", dtype=BF16)
        ref = m(x)
        ref.float().square().mean().backward()
        g_ref = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        out = cm(x)
        out.float().square().mean().backward()
        g = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        # the linear layers are compiled by inductor (rounding may differ), attention runs the same plan
        assert rel_error(out, ref) < 2e-2
        for a, r in zip(g, g_ref):
            assert rel_error(a, r) < 3e-2


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_module_bit_identical(dynamic):
    """The attention module alone, compiled: the same plan runs, so the same bits come out."""
    torch._dynamo.reset()
    attn = tc.DotProductAttention(8, 64, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal")
    cattn = torch.compile(attn, fullgraph=True, dynamic=dynamic)
    for b, s in ((2, 128), (4, 256), (1, 384)):
        q = torch.randn(b, s, 8, 64, device="cuda", dtype=BF16, requires_grad=True)
        k, v = (torch.randn(b, s, 2, 64, device="cuda", dtype=BF16, requires_grad=True) for _ in range(2))
        _assert_bit_identical(attn, cattn, (q, k, v), torch.randn(b, s, 8 * 64, device="cuda", dtype=BF16))


def _assert_bit_identical(f, g, inputs, d_o):
    """f and g give the same output and input gradients, bit for bit."""
    out_f = f(*inputs)
    grads_f = torch.autograd.grad(out_f, inputs, d_o)
    out_g = g(*inputs)
    grads_g = torch.autograd.grad(out_g, inputs, d_o)
    assert torch.equal(out_f, out_g)
    for a, b in zip(grads_f, grads_g):
        assert torch.equal(a, b)


def test_compile_explain_no_break_thd_and_bias():
    torch._dynamo.reset()
    attn = tc.DotProductAttention(4, 64, qkv_format="thd", attn_mask_type="padding_causal")
    lens = torch.tensor([50, 128, 7], dtype=torch.int32, device="cuda")
    cu = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
    q, k, v = (torch.randn(int(lens.sum()), 4, 64, device="cuda", dtype=BF16) for _ in range(3))
    ex = torch._dynamo.explain(attn)(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=128, max_seqlen_kv=128)
    assert ex.graph_break_count == 0
    out_c = torch.compile(attn, fullgraph=True)(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=128,
                                                max_seqlen_kv=128)
    out = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=128, max_seqlen_kv=128)
    assert torch.equal(out, out_c)
    bias_attn = tc.DotProductAttention(4, 64, qkv_format="bshd", attn_mask_type="no_mask")
    q = torch.randn(2, 128, 4, 64, device="cuda", dtype=BF16)
    bias = torch.randn(1, 4, 128, 128, device="cuda", dtype=BF16)
    f = lambda q: bias_attn(q, q, q, core_attention_bias_type="post_scale_bias", core_attention_bias=bias)  # noqa: E731
    assert torch._dynamo.explain(f)(q).graph_break_count == 0
    assert torch.equal(torch.compile(f, fullgraph=True)(q), f(q))


# ------------------------------------------------------------------------------------------ CUDA graphs

def _dropout_reference_grads(q, k, v, out, d_o, p, scale):
    """One-hot V (skv <= d_v) makes O = P_dropped[:, :, :, :skv]: the replay's own dropout mask
    is read off its output, and the fp32 gradients for exactly that mask follow."""
    qb, kb, vb = (t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v))
    skv = k.shape[1]
    p_drop = out.detach().float().transpose(1, 2)[..., :skv]  # [b, h, sq, skv]
    keep = p_drop != 0
    ref = attention_reference(qb, kb, vb, attn_scale=scale, attn_mask_type="causal", dropout_p=p,
                              dropout_keep_mask=keep)
    ref.out.backward(d_o.float().transpose(1, 2))
    return ref.out.transpose(1, 2), [t.grad.transpose(1, 2) for t in (qb, kb, vb)]


def test_cuda_graph_dropout_fresh_masks_and_matching_grads():
    """Forward + backward of the module captured in one CUDA graph, dropout 0.3: each replay
    draws a new mask, and each replay's gradients are those of its own mask (fp32 reference)."""
    b, s, h, d, p = 2, 64, 2, 64, 0.3
    attn = tc.DotProductAttention(h, d, attention_dropout=p, qkv_format="bshd", attn_mask_type="causal").train()
    q = torch.randn(b, s, h, d, device="cuda", dtype=BF16, requires_grad=True)
    k = torch.randn(b, s, h, d, device="cuda", dtype=BF16, requires_grad=True)
    eye = torch.eye(s, d, device="cuda", dtype=BF16)  # one-hot values
    v = eye.view(1, s, 1, d).expand(b, s, h, d).contiguous().requires_grad_()
    d_o = torch.randn(b, s, h * d, device="cuda", dtype=BF16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager warm-up: plans built, call signatures known
        for _ in range(2):
            attn(q, k, v).backward(d_o)
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attn(q, k, v)
        out.backward(d_o)
    outs, masks = [], []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        o = out.detach().view(b, s, h, d)
        ref_out, ref_grads = _dropout_reference_grads(q, k, v, o, d_o.view(b, s, h, d), p, 1 / math.sqrt(d))
        assert rel_error(o, ref_out) < 2e-2
        for name, g, r in zip("qkv", (q.grad, k.grad, v.grad), ref_grads):
            assert rel_error(g, r) < 3e-2, name
        outs.append(o.clone())
        masks.append(o != 0)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    kept = torch.stack(masks).float().mean().item()  # causal rows: keep fraction of allowed entries
    allowed = torch.tril(torch.ones(s, s, device="cuda")).mean().item() * s / d
    assert abs(kept / allowed - (1 - p)) < 0.05


def test_cuda_graph_direct_functions_dropout_rng_state_replays():
    """fused_attn_fwd/bwd captured: each replay's rng_state (drawn on the device) reproduces
    that replay's output and gradients in an eager call."""
    b, s, h, d = 2, 128, 4, 64
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=BF16) for _ in range(3))
    d_o = torch.randn_like(q)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", dropout=0.25)

    def step():
        out, aux = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, BF16, None, **kw)
        return out, aux, tc.fused_attn_bwd(s, s, None, None, q, k, v, out, d_o, BF16, aux, None, **kw)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, aux, grads = step()
    states = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        state = aux[1].clone()
        states.append(state)
        out_e, aux_e = tc.fused_attn_fwd(True, s, s, None, None, q, k, v, BF16, None, rng_state=state, **kw)
        grads_e = tc.fused_attn_bwd(s, s, None, None, q, k, v, out_e, d_o, BF16, aux_e, None, **kw)
        assert torch.equal(out, out_e)
        for a, e in zip(grads[:3], grads_e[:3]):
            assert torch.equal(a, e)
    assert len({tuple(t.tolist()) for t in states}) == 3  # a fresh seed per replay


def test_cuda_graph_without_dropout_equals_eager():
    attn = tc.DotProductAttention(4, 64, num_gqa_groups=2, qkv_format="sbhd", attn_mask_type="causal")
    q = torch.randn(256, 2, 4, 64, device="cuda", dtype=BF16)
    k, v = (torch.randn(256, 2, 2, 64, device="cuda", dtype=BF16) for _ in range(2))
    graphed = torch.cuda.make_graphed_callables(attn, (q.requires_grad_(), k.requires_grad_(), v.requires_grad_()))
    _assert_bit_identical(graphed, attn, (q, k, v), torch.randn(256, 2, 256, device="cuda", dtype=BF16))


def test_make_graphed_callables_dropout_fresh_per_replay():
    attn = tc.DotProductAttention(4, 64, attention_dropout=0.2, qkv_format="bshd", attn_mask_type="no_mask").train()
    q, k, v = (torch.randn(2, 128, 4, 64, device="cuda", dtype=BF16, requires_grad=True) for _ in range(3))
    graphed = torch.cuda.make_graphed_callables(attn, (q, k, v))
    a = graphed(q, k, v).detach().clone()
    b = graphed(q, k, v).detach().clone()
    assert not torch.equal(a, b)
    ref = attn.eval()(q, k, v).detach()
    attn.train()
    mean = torch.stack([graphed(q, k, v).detach().float() for _ in range(32)]).mean(0)
    assert rel_error(mean, ref) < 0.2  # dropout is unbiased: the average tends to the dropout-free output


def test_capture_miss_raises_clear_error():
    attn = tc.DotProductAttention(4, 64, qkv_format="bshd", attn_mask_type="causal")
    q = torch.randn(1, 200 + 8, 4, 64, device="cuda", dtype=BF16)  # a shape no other test uses
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(tc.CaptureMissError, match="eager step"):
        with torch.cuda.graph(graph):
            attn(q, q, q)
    out = attn(q, q, q)  # the process is healthy afterwards
    assert torch.isfinite(out).all()


# ------------------------------------------------------------------------------------------ module vs reference

MODULE_CASES = {
    "sbhd-causal-gqa": dict(fmt="sbhd", mask="causal", h=8, hg=2, sq=256, skv=256, d=64),
    "bshd-nomask-cross-dv": dict(fmt="bshd", mask="no_mask", h=4, hg=4, sq=96, skv=200, d=128, dv=64, kind="cross"),
    "bshd-window": dict(fmt="bshd", mask="causal", h=4, hg=4, sq=256, skv=256, d=64, window=(64, 0)),
    "bshd-padding-mask": dict(fmt="bshd", mask="padding_causal", h=4, hg=2, sq=128, skv=128, d=64, padding=True),
    "bshd-arbitrary": dict(fmt="bshd", mask="arbitrary", h=4, hg=4, sq=128, skv=128, d=64),
    "bshd-bias": dict(fmt="bshd", mask="no_mask", h=4, hg=4, sq=128, skv=128, d=64, bias=True),
    "thd-padding": dict(fmt="thd", mask="padding_causal", h=4, hg=4, sq=128, skv=128, d=64),
}


@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_against_fp32_reference(case):
    c = MODULE_CASES[case]
    g = torch.Generator(device="cuda").manual_seed(11)
    fmt, h, hg, d, dv = c["fmt"], c["h"], c["hg"], c["d"], c.get("dv", c["d"])
    b, sq, skv = 3, c["sq"], c["skv"]
    attn = tc.DotProductAttention(h, (d, dv), num_gqa_groups=hg, qkv_format=fmt, attn_mask_type=c["mask"],
                                  window_size=c.get("window"), attention_type=c.get("kind", "self"))
    kwargs, ref_kw = {}, dict(attn_mask_type=c["mask"], window_size=c.get("window") or (-1, -1))
    lens = torch.tensor([sq, sq // 2 + 3, 17][:b], dtype=torch.int32, device="cuda")

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", dtype=BF16, generator=g).requires_grad_()

    if fmt == "thd":
        cu = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
        t = int(lens.sum())
        q, k, v = rnd(t, h, d), rnd(t, hg, d), rnd(t, hg, dv)
        kwargs = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=sq, max_seqlen_kv=skv)

        def pad(x, s):  # THD -> [b, h, s, d] zero-padded, for the reference
            outp = x.new_zeros(b, s, *x.shape[1:])
            for i in range(b):
                outp[i, : lens[i]] = x[cu[i]: cu[i + 1]]
            return outp.transpose(1, 2)

        qb, kb, vb = pad(q, sq), pad(k, skv), pad(v, skv)
        ref_kw.update(seqlens_q=lens, seqlens_kv=lens)
    else:
        shp = (lambda s, n, dd: (s, b, n, dd)) if fmt == "sbhd" else (lambda s, n, dd: (b, s, n, dd))
        q, k, v = rnd(*shp(sq, h, d)), rnd(*shp(skv, hg, d)), rnd(*shp(skv, hg, dv))
        perm = (1, 2, 0, 3) if fmt == "sbhd" else (0, 2, 1, 3)
        qb, kb, vb = (t.permute(perm) for t in (q, k, v))
        if c.get("padding"):
            pad_mask = torch.arange(sq, device="cuda").view(1, 1, 1, sq) >= lens.view(b, 1, 1, 1)
            kwargs["attention_mask"] = pad_mask
            ref_kw.update(seqlens_q=lens, seqlens_kv=lens)
        if c["mask"] == "arbitrary":
            m = torch.rand(b, 1, sq, skv, device="cuda", generator=g) < 0.3
            m[..., 0] = False  # every row keeps a key
            kwargs["attention_mask"] = m
            ref_kw = dict(attn_mask_type="no_mask", attn_bias_type="post_scale_bias",
                          attn_bias=torch.zeros(b, 1, sq, skv, device="cuda").masked_fill(m, float("-inf")))
        if c.get("bias"):
            bias = (torch.randn(1, h, sq, skv, device="cuda", dtype=BF16, generator=g)).requires_grad_()
            kwargs.update(core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
            ref_kw.update(attn_bias_type="post_scale_bias", attn_bias=bias)
    out = attn(q, k, v, **kwargs)
    d_o = torch.randn_like(out)
    out.backward(d_o)
    ref_in = [t.detach().float().requires_grad_() for t in (qb, kb, vb)]
    ref = attention_reference(*ref_in, **{
        n: (x.detach().float() if n == "attn_bias" and x.dtype == BF16 else x) for n, x in ref_kw.items()})  # fmt: skip
    if fmt == "thd":
        ref_out = torch.cat([ref.out[i, :, : lens[i]].transpose(0, 1) for i in range(b)])
    else:
        ref_out = ref.out.permute(2, 0, 1, 3) if fmt == "sbhd" else ref.out.transpose(1, 2)
    ref_out = ref_out.reshape(out.shape)
    valid = torch.ones_like(out, dtype=torch.bool)
    if c.get("padding"):
        valid = (torch.arange(sq, device="cuda").view(1, sq, 1) < lens.view(b, 1, 1)).expand_as(out)
    assert rel_error(out[valid], ref_out[valid]) < 2e-2, "out"
    ref_out.backward(torch.where(valid, d_o, 0).float())
    if fmt != "thd":
        for name, t, r in zip("qkv", (q, k, v), ref_in):
            rg = r.grad.permute(2, 0, 1, 3) if fmt == "sbhd" else r.grad.transpose(1, 2)
            if c.get("padding"):  # padded positions: te_cudnn gives zeros, compare the valid ones
                keep = (torch.arange(t.shape[1], device="cuda").view(1, -1, 1, 1) < lens.view(b, 1, 1, 1)).expand_as(t)
                assert rel_error(t.grad[keep], rg[keep]) < 3e-2, name
            else:
                assert rel_error(t.grad, rg) < 3e-2, name
    else:
        assert torch.isfinite(q.grad).all() and torch.isfinite(v.grad).all()


def test_module_fp8_meta_against_reference():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("FP8 attention needs sm90+")
    meta = tc.Fp8AttentionMeta(device="cuda")
    attn = tc.DotProductAttention(4, 128, qkv_format="bshd", attn_mask_type="causal", fp8_meta=meta)
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, 256, 4, 128, device="cuda", dtype=BF16, generator=g, requires_grad=True) for _ in range(3))
    for _ in range(3):  # delayed scaling settles after an update
        out = attn(q, k, v)
        out.float().sum().backward()
        meta.update()
    ref = attention_reference(*(t.detach().float().transpose(1, 2) for t in (q, k, v)), attn_mask_type="causal")
    assert rel_error(out, ref.out.transpose(1, 2).reshape(out.shape)) < 0.1
    assert torch.isfinite(q.grad).all()
    out_c = torch.compile(attn, fullgraph=True)(q, k, v)
    assert rel_error(out_c, out) < 0.05  # the same FP8 kernels, scales one update later


def test_module_thd_packed_views_eager():
    """THD q, k, v as views of one [t, 3, h, d] buffer: the module names the packed layout."""
    lens = torch.tensor([64, 3, 100], dtype=torch.int32, device="cuda")
    cu = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
    buf = torch.randn(int(lens.sum()), 3, 4, 64, device="cuda", dtype=BF16)
    attn = tc.DotProductAttention(4, 64, qkv_format="thd", attn_mask_type="padding_causal")
    kw = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=100, max_seqlen_kv=100)
    packed = attn(*buf.unbind(1), **kw)
    separate = attn(*(t.contiguous() for t in buf.unbind(1)), **kw)
    assert torch.equal(packed, separate)
