"""torch.compile tracing through te_cudnn's custom operators on meta tensors: ``fused_attention``,
the module and FP8 attention with no graph break, static and dynamic shapes, the backward, and the
dropout RNG state drawn inside the graph; CPU only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

import te_cudnn
from te_cudnn import torch_ops
from te_cudnn.enums import QKVLayout
from te_cudnn.fp8 import Fp8AttentionMeta

BF16 = torch.bfloat16


# ================================================================================ torch.compile on meta


class Recorder:
    """A torch.compile backend recording Dynamo's graph and AOT autograd's forward and backward
    graphs, running them as they are (aot_eager with a look inside)."""

    def __init__(self) -> None:
        self.dynamo: list = []
        self.fw: list = []
        self.bw: list = []

        def fw(gm, _inputs):
            self.fw.append(gm)
            return make_boxed_func(gm.forward)

        def bw(gm, _inputs):
            self.bw.append(gm)
            return make_boxed_func(gm.forward)

        self._aot = aot_autograd(fw_compiler=fw, bw_compiler=bw)

    def __call__(self, gm, example_inputs):
        self.dynamo.append(gm)
        return self._aot(gm, example_inputs)


def _fwd_nodes(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and "te_cudnn.fwd" in str(n.target)]


@pytest.fixture
def compile_env():
    """A clean Dynamo cache, and te_cudnn's lookup caches filled before tracing (filling them
    inside a trace is test_compile_in_a_fresh_process's case)."""
    from te_cudnn import autograd, enums

    for enum in (enums.QKVLayout, enums.QKVFormat, enums.AttnMaskType, enums.AttnBiasType, enums.SoftmaxType,
                 enums.FusedAttnBackend):  # fmt: skip
        for member in enum:
            enum.coerce(member.name)
    seq_dim = getattr(autograd, "_seq_dim", None)
    if seq_dim is not None:
        for layout in QKVLayout:
            seq_dim(layout.name)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@dataclass(frozen=True)
class Case:
    fmt: str
    h: int = 4
    hg: int = 4
    bias: Optional[str] = None  # None, "1hss", "bhss"
    dropout: float = 0.0


COMPILE_CASES = {
    "sbhd": Case("sbhd"),
    "bshd-gqa": Case("bshd", h=8, hg=2),
    "thd-gqa": Case("thd", h=8, hg=2),
    "sbhd-bias": Case("sbhd", bias="1hss"),
    "bshd-bias-b": Case("bshd", bias="bhss"),
    "bshd-dropout": Case("bshd", dropout=0.1),
}
D = 64


def _compile_inputs(c: Case, b: int, s: int):
    def t(heads: int) -> torch.Tensor:
        shape = {"sbhd": (s, b, heads, D), "bshd": (b, s, heads, D), "thd": (b * s, heads, D)}[c.fmt]
        return torch.randn(shape, dtype=BF16, device="meta", requires_grad=True)

    q, k, v = t(c.h), t(c.hg), t(c.hg)
    bias = None
    if c.bias is not None:
        bias = torch.randn((1 if c.bias == "1hss" else b, c.h, s, s), dtype=BF16, device="meta", requires_grad=True)
    cu = torch.arange(b + 1, dtype=torch.int32, device="meta") if c.fmt == "thd" else None
    return q, k, v, bias, cu


def _fused_fn(c: Case):
    layout = f"{c.fmt}_{c.fmt}_{c.fmt}"
    mask = "padding_causal" if c.fmt == "thd" else "causal"

    def fn(q, k, v, bias, cu):
        return te_cudnn.fused_attention(q, k, v, attn_bias=bias, cu_seqlens_q=cu, cu_seqlens_kv=cu, qkv_layout=layout,
                                        attn_mask_type=mask, dropout=c.dropout,
                                        attn_bias_type="no_bias" if bias is None else "post_scale_bias")  # fmt: skip

    return fn


def _module_fn(c: Case):
    mod = te_cudnn.DotProductAttention(c.h, D, num_gqa_groups=c.hg, attention_dropout=c.dropout, qkv_format=c.fmt)
    mod.train()

    def fn(q, k, v, bias, cu):
        return mod(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, core_attention_bias=bias,
                   core_attention_bias_type="no_bias" if bias is None else "post_scale_bias")  # fmt: skip

    return fn, mod


#: (batch, sequence length) across calls. The first call's sizes are all distinct from the heads,
#: head dims, b + 1 and the FP8 tables' sizes: Dynamo gives equal sizes one symbol (duck sizing),
#: which would make a later call recompile.
SHAPES = [(5, 24), (3, 40), (7, 56)]


def _check_compiled(fn, c: Case, dynamic: bool, out_shape) -> Recorder:
    rec = Recorder()
    compiled = torch.compile(fn, backend=rec, fullgraph=True, dynamic=dynamic)
    shapes = SHAPES if dynamic else SHAPES[:2]  # static: each shape compiles anew
    for b, s in shapes:
        q, k, v, bias, cu = _compile_inputs(c, b, s)
        out = compiled(q, k, v, bias, cu)
        assert out.device.type == "meta" and out.dtype == BF16
        assert tuple(out.shape) == out_shape(q, b, s)
        out.sum().backward()
        for t in (q, k, v):
            assert t.grad is not None and t.grad.shape == t.shape
        if bias is not None:  # [1|b, h, s, s] does not broadcast over sq: it gets a gradient
            assert bias.grad is not None and bias.grad.shape == bias.shape
    # one graph for every shape when dynamic; one per shape when static (Dynamo may hand the
    # backend a graph it then abandons, e.g. when it restarts to specialize a float)
    graphs = [gm for gm in rec.dynamo if _fwd_nodes(gm)]
    assert len(graphs) == (1 if dynamic else len(shapes))
    assert len([gm for gm in rec.fw if "te_cudnn.fwd" in gm.code]) == len(graphs)
    assert len([gm for gm in rec.bw if "te_cudnn.bwd" in gm.code]) == len(graphs)
    for gm in graphs:
        assert "torch.ops.te_cudnn.fwd" in gm.code
        (node,) = _fwd_nodes(gm)
        rng = node.args[10]
        if c.dropout > 0:  # the Philox [seed, offset] is drawn on the device inside the graph
            assert "torch.randint" in gm.code and rng is not None and "randint" in str(rng.target)
        else:
            assert rng is None and "randint" not in gm.code
        if not dynamic:
            assert isinstance(node.args[12], int) and isinstance(node.args[13], int)
        elif c.fmt != "thd":  # the sequence lengths reach the op as symbols
            assert isinstance(node.args[12], torch.fx.Node) and isinstance(node.args[13], torch.fx.Node)
        assert isinstance(node.args[16], str)  # the options: one constant config string
    q, k, v, bias, cu = _compile_inputs(c, *SHAPES[0])
    assert torch._dynamo.explain(fn)(q, k, v, bias, cu).graph_break_count == 0
    return graphs


def _modes(cases: list, static: tuple) -> list:
    """(case, dynamic) pairs: every case with dynamic shapes, those in ``static`` also static
    (each static shape is a compile of its own: the slow part of this file)."""
    return [pytest.param(c, d, id=f"{c}-{'dynamic' if d else 'static'}") for c in cases for d in (False, True)
            if d or c in static]  # fmt: skip


@pytest.mark.parametrize(("case", "dynamic"), _modes(list(COMPILE_CASES), ("sbhd", "thd-gqa", "bshd-dropout")))
def test_compile_fused_attention(compile_env, case: str, dynamic: bool) -> None:
    c = COMPILE_CASES[case]
    _check_compiled(_fused_fn(c), c, dynamic, lambda q, b, s: tuple(q.shape))


@pytest.mark.parametrize(("case", "dynamic"), _modes(["sbhd", "bshd-gqa", "thd-gqa", "sbhd-bias", "bshd-dropout"],
                                                    ("sbhd",)))  # fmt: skip
def test_compile_module(compile_env, case: str, dynamic: bool) -> None:
    c = COMPILE_CASES[case]
    fn, _ = _module_fn(c)
    graphs = _check_compiled(fn, c, dynamic, lambda q, b, s: (*q.shape[:-2], c.h * D))
    for gm in graphs:
        (node,) = _fwd_nodes(gm)
        config = torch_ops.parse_op_config(node.args[16])
        assert config.qkv_layout == f"{c.fmt}_{c.fmt}_{c.fmt}"
        assert config.attn_mask_type == ("padding_causal" if c.fmt == "thd" else "causal")  # TE default mask
        if dynamic:  # THD: the token count bounds max_seqlen, a symbol like the sbhd/bshd lengths
            assert isinstance(node.args[12], torch.fx.Node) and isinstance(node.args[13], torch.fx.Node)


def test_fused_attention_thd_max_seqlen(monkeypatch) -> None:
    """THD q is [t, h, d]: fused_attention must not take the head count for max_seqlen."""
    from te_cudnn import autograd

    seen = {}

    def record(q, k, v, bias, cu_q, cu_kv, max_q, max_kv, *rest, **kw):
        seen.update(max_q=max_q, max_kv=max_kv)
        return q

    monkeypatch.setattr(autograd, "attend", record)
    b, s, h = 3, 16, 4
    q = torch.empty(b * s, h, D, dtype=BF16, device="meta")
    cu = torch.arange(b + 1, dtype=torch.int32, device="meta") * s
    te_cudnn.fused_attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_kv=cu, qkv_layout="thd_thd_thd",
                             attn_mask_type="padding")  # fmt: skip
    assert seen["max_q"] >= s and seen["max_kv"] >= s, seen


@pytest.mark.parametrize(("entry", "dynamic"), _modes(["fp8_attention", "module"], ("fp8_attention",)))
def test_compile_fp8(compile_env, entry: str, dynamic: bool) -> None:
    meta = Fp8AttentionMeta(device="meta")
    if entry == "module":
        mod = te_cudnn.DotProductAttention(4, 128, qkv_format="bshd", fp8_meta=meta).eval()

        def fn(q, k, v):
            return mod(q, k, v)
    else:

        def fn(q, k, v):
            return te_cudnn.fp8_attention(q, k, v, meta, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")

    rec = Recorder()
    compiled = torch.compile(fn, backend=rec, fullgraph=True, dynamic=dynamic)
    for b, s in SHAPES[:2]:
        q, k, v = (torch.randn(b, s, 4, 128, dtype=BF16, device="meta", requires_grad=True) for _ in range(3))
        out = compiled(q, k, v)
        assert tuple(out.shape) == ((b, s, 512) if entry == "module" else (b, s, 4, 128)) and out.dtype == BF16
        out.sum().backward()
        assert all(t.grad.shape == t.shape for t in (q, k, v))
    graphs = [gm for gm in rec.dynamo if "torch.ops.te_cudnn.fp8_fwd" in gm.code]
    assert len(graphs) == (1 if dynamic else 2)
    for gm in graphs:
        assert "copy_" in gm.code  # this step's amax row folded into the forward history
    assert len([gm for gm in rec.bw if "te_cudnn.fp8_bwd" in gm.code]) == len(graphs)
    q, k, v = (torch.randn(2, 16, 4, 128, dtype=BF16, device="meta") for _ in range(3))
    assert torch._dynamo.explain(fn)(q, k, v).graph_break_count == 0


def test_dropout_rng_state_shape_on_meta() -> None:
    """The device-drawn [seed, offset] a training graph feeds the op: int64 [2] on q's device."""
    from te_cudnn.ops import _device_rng_state

    state = _device_rng_state(torch.device("meta"))
    assert state.shape == (2,) and state.dtype == torch.int64 and state.device.type == "meta"
