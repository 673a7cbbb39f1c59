"""Attention sinks (softmax_type "off_by_one" / "learnable") and TE 2.x call parity on the CPU.

The real cuDNN frontend builds and validates the sink graphs of every layout family (dense,
packed, THD, mixed, paged, FP8) forward and backward; the declared rules decline what cuDNN
9.19 cannot serve with their reasons; malformed ``softmax_offset`` / aux arguments raise
errors naming the argument; the fake implementations of the custom ops give the sink
gradient's shape; the module owns TransformerEngine's learnable parameter.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import te_cudnn as tc
from te_cudnn import FusedAttnBackend, UnsupportedConfigError, torch_ops
from te_cudnn.backends import BY_ENUM, REGISTRY, Direction, Uid, select
from te_cudnn.config import describe_fwd, describe_shapes
from te_cudnn.enums import QKVFormat, QKVLayout
from te_cudnn.layouts import CORE_LAYOUTS, layout_info
from te_cudnn.plans.key import make_key
from te_cudnn.runtime import HOPPER_CUDNN_919, RuntimeEnv

ARB = REGISTRY[0]
FP8 = BY_ENUM[FusedAttnBackend.FP8]
SINKS = ("off_by_one", "learnable")
BF16 = torch.bfloat16


def _shapes(layout: QKVLayout, softmax: str, *, training: bool = True, gqa: bool = False, **kw):
    thd = layout_info(layout).q_format == QKVFormat.thd
    h, hg, d = 8, (2 if gqa else 8), kw.pop("d", 64)
    return describe_shapes(
        is_training=training, dtype=kw.pop("dtype", BF16), qkv_layout=layout, attn_bias_type=kw.pop("bias", "no_bias"),
        attn_mask_type=kw.pop("mask", "padding_causal" if thd else "causal"), softmax_type=softmax,
        dropout=kw.pop("dropout", 0.0), num_attn_heads=h, num_gqa_groups=hg, max_seqlen_q=128, max_seqlen_kv=128,
        head_dim_qk=d, head_dim_v=d, window_size=kw.pop("window", (-1, -1)), batch_size=2,
        **kw,
    )  # fmt: skip


def _layout_cases():
    for layout in sorted(CORE_LAYOUTS):
        for softmax in SINKS:
            for gqa in (False, True):
                if gqa and layout_info(layout).packs_qkv:
                    continue
                yield pytest.param(layout, softmax, gqa, id=f"{layout.name}-{softmax}-{'gqa' if gqa else 'mha'}")


@pytest.mark.parametrize("layout,softmax,gqa", list(_layout_cases()))
def test_sink_graphs_validate_for_every_core_layout(layout, softmax, gqa):
    """Forward and backward sink graphs build and the real frontend validates them; the sink
    operands sit after the dropout operands and before the per-call runtime tensors."""
    cfg = _shapes(layout, softmax, gqa=gqa)
    assert cfg.has_sink and cfg.has_dsink == (softmax == "learnable")
    for direction in Direction:
        spec = ARB.build(cfg, direction)
        spec.graph.validate()
        # learnable: d_softmax_offset comes from cuDNN's graph for THD; dense, te_cudnn computes it
        # (launchers._sink_grad)
        in_graph = direction == Direction.BWD and softmax == "learnable" and layout_info(layout).q_format == QKVFormat.thd
        assert cfg.dsink_in_graph == (softmax == "learnable" and layout_info(layout).q_format == QKVFormat.thd)
        sink = [Uid.SINK, Uid.DSINK] if in_graph else [Uid.SINK]
        runtime = ARB.runtime_uids(cfg)
        assert list(spec.uids[len(spec.uids) - len(runtime) - len(sink):len(spec.uids) - len(runtime)]) == sink
        assert "sink_token" in str(spec.graph).lower() or "softmax_offset" in str(spec.graph)
        if layout_info(layout).q_format == QKVFormat.thd:  # cuDNN 9.19 reads out of bounds: declined in training
            assert any("ragged backward with a sink needs 9.26" in r for r in ARB.not_supported_reasons(cfg, HOPPER_CUDNN_919, direction))
        else:
            assert ARB.not_supported_reasons(cfg, HOPPER_CUDNN_919, direction) == []


@pytest.mark.parametrize("softmax", SINKS)
def test_sink_thd_inference_is_served(softmax):
    cfg = _shapes(QKVLayout.thd_thd_thd, softmax, training=False, gqa=True)
    assert ARB.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD) == []
    ARB.build_fwd(cfg).graph.validate()


@pytest.mark.parametrize("softmax", SINKS)
@pytest.mark.parametrize("extra", [dict(dropout=0.1), dict(bias="post_scale_bias", mask="no_mask"),
                                   dict(window=(32, 0)), dict(bias="alibi"), dict(deterministic=True)],
                         ids=["dropout", "bias", "window", "alibi", "deterministic"])  # fmt: skip
def test_sinks_with_dropout_bias_window_validate(softmax, extra):
    cfg = _shapes(QKVLayout.bshd_bshd_bshd, softmax, gqa="bias" not in extra, **extra)
    assert ARB.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.BWD) == []
    for direction in Direction:
        spec = ARB.build(cfg, direction)
        spec.graph.validate()
        if cfg.has_dropout:  # seed and offset come before the sink
            i = spec.uids.index(Uid.SEED)
            assert spec.uids[i:i + 3] == (Uid.SEED, Uid.OFFSET, Uid.SINK)


def _mixed(layout: str, softmax: str, offset: bool = True) -> tc.config.AttnConfig:
    info = layout_info(QKVLayout[layout])
    b, s, h, hg, d = 2, 128, 8, 2, 64
    side = {QKVFormat.thd: lambda n: torch.empty(b * s, n, d, dtype=BF16),
            QKVFormat.bshd: lambda n: torch.empty(b, s, n, d, dtype=BF16),
            QKVFormat.sbhd: lambda n: torch.empty(s, b, n, d, dtype=BF16)}  # fmt: skip
    q, k, v = side[info.q_format](h), side[info.kv_format](hg), side[info.kv_format](hg)
    cu = torch.arange(b + 1, dtype=torch.int32) * s
    return describe_fwd(is_training=False, max_seqlen_q=s, max_seqlen_kv=s, cu_seqlens_q=cu, cu_seqlens_kv=cu, q=q,
                        k=k, v=v, qkv_dtype=BF16, attn_bias=None, attn_scale=None, dropout=0.0, qkv_layout=layout,
                        attn_bias_type="no_bias", attn_mask_type="padding_causal", softmax_type=softmax,
                        window_size=(-1, -1), bottom_right_diagonal=None,
                        softmax_offset=torch.zeros(1, h, 1, 1) if offset else None)  # fmt: skip


@pytest.mark.parametrize("layout", ["sbhd_bshd_bshd", "bshd_sbhd_sbhd", "thd_bshd_bshd", "thd_sbhd_sbhd"])
def test_sink_graphs_validate_for_mixed_formats(layout):
    cfg = _mixed(layout, "learnable")
    assert cfg.has_sink and ARB.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD) == []
    spec = ARB.build_fwd(cfg)
    spec.graph.validate()
    assert Uid.SINK in spec.uids


@pytest.mark.parametrize("layout", ["paged_kv_bshd_bshd_bshd", "paged_kv_sbhd_sbhd_sbhd", "paged_kv_thd_bshd_bshd"])
def test_sink_graphs_validate_for_paged_kv(layout):
    h, hg, d, page, pages, num_pages, b, sq = 8, 2, 64, 16, 4, 24, 3, 2
    fmt_q = layout.split("_")[2]
    q = {"bshd": torch.empty(b, sq, h, d), "sbhd": torch.empty(sq, b, h, d), "thd": torch.empty(b * sq, h, d)}[fmt_q]
    pool = (num_pages, page, hg, d) if layout.split("_")[3] == "bshd" else (page, num_pages, hg, d)
    table = torch.zeros(b, pages, dtype=torch.int32)
    cfg = describe_fwd(is_training=False, max_seqlen_q=sq, max_seqlen_kv=page * pages,
                       cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32) * sq,
                       cu_seqlens_kv=torch.arange(b + 1, dtype=torch.int32) * 40, q=q.to(BF16),
                       k=torch.empty(pool, dtype=BF16), v=torch.empty(pool, dtype=BF16), qkv_dtype=BF16, attn_bias=None,
                       attn_scale=None, dropout=0.0, qkv_layout=layout, attn_bias_type="no_bias",
                       attn_mask_type="padding", softmax_type="learnable", window_size=(-1, -1),
                       bottom_right_diagonal=None, page_table_k=table, page_table_v=table,
                       softmax_offset=torch.zeros(1, h, 1, 1))  # fmt: skip
    assert cfg.paged is not None and cfg.has_sink
    assert ARB.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD) == []
    spec = ARB.build_fwd(cfg)
    spec.graph.validate()
    runtime = ARB.runtime_uids(cfg)  # lengths, (ragged q offsets), page tables
    assert runtime[-2:] == [Uid.PAGE_TABLE_K, Uid.PAGE_TABLE_V]
    assert spec.uids[-len(runtime) - 1:] == (Uid.SINK, *runtime)


@pytest.mark.parametrize("softmax", SINKS)
def test_fp8_sink_graphs_validate_and_decline_before_cudnn_9_21(softmax):
    cfg = _shapes(QKVLayout.bshd_bshd_bshd, softmax, dtype=torch.float8_e4m3fn, d=128)
    fwd = FP8.build_fwd(cfg)
    fwd.graph.validate()
    assert fwd.uids[-1] == Uid.SINK
    bwd = FP8.build_bwd(replace(cfg, do_dtype=torch.float8_e5m2))
    bwd.graph.validate()
    assert list(bwd.uids[-2:] if softmax == "learnable" else bwd.uids[-1:]) == (
        [Uid.SINK, Uid.DSINK] if softmax == "learnable" else [Uid.SINK])
    why = FP8.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD)
    assert why == [f"softmax_type={softmax}: FP8 attention takes sinks from cuDNN 9.21 (TransformerEngine's gate), got 9.19.0"]
    assert FP8.not_supported_reasons(cfg, RuntimeEnv(sm=90, cudnn_version=92100), Direction.BWD) == []


def test_max512_declines_sinks_with_a_reason():
    max512 = BY_ENUM[FusedAttnBackend.F16_max512_seqlen]
    cfg = _shapes(QKVLayout.bshd_bshd_bshd, "learnable")
    assert "softmax_type=learnable (supported: vanilla)" in max512.not_supported_reasons(cfg, HOPPER_CUDNN_919)
    with pytest.raises(UnsupportedConfigError, match="softmax_type=learnable"):
        select(cfg, HOPPER_CUDNN_919, FusedAttnBackend.F16_max512_seqlen)


def test_max_logit_graph_validates_and_is_declined_before_cudnn_9_21():
    cfg = _shapes(QKVLayout.bshd_bshd_bshd, "vanilla", return_max_logit=True)
    spec = ARB.build_fwd(cfg)
    spec.graph.validate()
    assert spec.uids[-1] == Uid.MAX
    why = ARB.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD)
    assert why == ["return_max_logit needs cuDNN 9.21 or newer (before it cuDNN's SDPA cannot output the softmax stats "
                   "and the maximum logit together), found cuDNN 9.19.0"]  # fmt: skip
    assert ARB.not_supported_reasons(cfg, RuntimeEnv(sm=90, cudnn_version=92100), Direction.FWD) == []
    assert Uid.MAX not in ARB.operand_uids(cfg, Direction.BWD)


def test_plan_keys_carry_the_softmax_type():
    keys = {make_key(FusedAttnBackend.F16_arbitrary_seqlen, Direction.FWD, _shapes(QKVLayout.bshd_bshd_bshd, s), 91900, "1.32.0")
            for s in ("vanilla", *SINKS)}  # fmt: skip
    assert len(keys) == 3
    assert {k.describe()["softmax_type"] for k in keys} == {"vanilla", "off_by_one", "learnable"}
    # cuda_graph changes eligibility only: the same plan
    a = _shapes(QKVLayout.bshd_bshd_bshd, "learnable")
    b = replace(a, cuda_graph=True)
    assert make_key(ARB.enum, Direction.FWD, a, 91900, "1.32.0") == make_key(ARB.enum, Direction.FWD, b, 91900, "1.32.0")


@pytest.mark.parametrize(
    "over,kind,fragment",
    [
        (dict(softmax_type="learnable"), ValueError, "softmax_type='learnable' needs softmax_offset"),
        (dict(softmax_type="vanilla", softmax_offset=torch.zeros(1, 4, 1, 1)), ValueError, "but softmax_type='vanilla'"),
        (dict(softmax_type="learnable", softmax_offset=torch.zeros(4)), ValueError, "float32 [1, 4, 1, 1]"),
        (dict(softmax_type="learnable", softmax_offset=torch.zeros(1, 4, 1, 1, dtype=BF16)), ValueError,
         "got bfloat16 [1, 4, 1, 1]"),
        (dict(softmax_type="learnable", softmax_offset=torch.zeros(1, 8, 1, 1)[:, ::2]), ValueError, "must be contiguous"),
        (dict(softmax_type="learnable", softmax_offset=torch.zeros(1, 4, 1, 1, device="meta")), ValueError,
         "softmax_offset is on meta but q is on cpu"),
        (dict(softmax_type="learnable", softmax_offset=[0.0] * 4), TypeError, "softmax_offset must be a torch.Tensor"),
        (dict(softmax_type="sinks"), ValueError, "softmax_type='sinks' is not a valid SoftmaxType"),
        (dict(return_max_logit=1), TypeError, "return_max_logit must be a bool"),
        (dict(cuda_graph="yes"), TypeError, "cuda_graph must be a bool"),
    ],
    ids=["learnable-missing", "vanilla-given", "shape", "dtype", "strided", "device", "not-a-tensor", "unknown-type",
         "max-logit-type", "cuda-graph-type"],
)  # fmt: skip
def test_forward_argument_errors(over, kind, fragment):
    q = torch.empty(2, 64, 4, 64, dtype=BF16)
    with pytest.raises(kind) as ei:
        tc.fused_attn_fwd(True, 64, 64, None, None, q, q, q, BF16, None, qkv_layout="bshd_bshd_bshd",
                          attn_mask_type="causal", **over)  # fmt: skip
    assert fragment in str(ei.value)


@pytest.mark.parametrize("softmax", SINKS)
def test_backward_needs_the_offset_in_aux(softmax):
    q = torch.empty(2, 64, 4, 64, dtype=BF16)
    aux = [torch.empty(2, 4, 64, 1), torch.zeros(2, dtype=torch.int64)]
    with pytest.raises(ValueError, match=rf"softmax_offset at index 2 for softmax_type={softmax}"):
        tc.fused_attn_bwd(64, 64, None, None, q, q, q, q, q, BF16, aux, None, qkv_layout="bshd_bshd_bshd",
                          attn_mask_type="causal", softmax_type=softmax)  # fmt: skip
    with pytest.raises(ValueError, match=r"aux_ctx_tensors\[2\] \(softmax_offset\) must be a float32 \[1, 4, 1, 1\]"):
        tc.fused_attn_bwd(64, 64, None, None, q, q, q, q, q, BF16, [*aux, torch.zeros(4)], None,
                          qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", softmax_type=softmax)  # fmt: skip


def test_explain_and_get_backend_take_softmax_type_and_max_logit():
    args = (True, BF16, BF16, "bshd_bshd_bshd", "no_bias", "causal")
    rest = (0.0, 64, 8, 4096, 4096, 64, 64, 128, 0)
    ex = tc.explain(*args, "learnable", *rest, env=HOPPER_CUDNN_919)
    assert ex.backend == FusedAttnBackend.F16_arbitrary_seqlen and "softmax=learnable" in str(ex)
    assert tc.get_fused_attn_backend(*args, "off_by_one", *rest, env=HOPPER_CUDNN_919) == FusedAttnBackend.F16_arbitrary_seqlen
    ex = tc.explain(*args, "vanilla", *rest, True, env=HOPPER_CUDNN_919)
    assert ex.backend == FusedAttnBackend.No_Backend
    assert any("return_max_logit needs cuDNN 9.21" in r for r in ex.reasons["F16_arbitrary_seqlen"])


# ------------------------------------------------------------------------------------------ ops and module


def _op_args(q, offset, softmax):
    config = torch_ops.op_config(True, "bshd_bshd_bshd", "causal", "no_bias", -1, 0, None, None, softmax, False)
    return (q, q, q, None, None, None, None, None, None, None, None, offset, q.shape[1], q.shape[1], None, 0.0, config)


@pytest.mark.parametrize("softmax", ["vanilla", *SINKS])
def test_bwd_fake_gives_the_sink_gradient(softmax):
    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 64, dtype=BF16, device="cuda")
        offset = torch.empty(1, 4, 1, 1, device="cuda") if softmax != "vanilla" else None
        out, stats = torch.ops.te_cudnn.fwd(*_op_args(q, offset, softmax))
        args = _op_args(q, offset, softmax)
        grads = torch.ops.te_cudnn.bwd(q, q, q, out, out, stats, None, None, offset, None, None, None, None,
                                       *args[12:])  # fmt: skip
    assert len(grads) == 5
    d_offset = grads[4]
    if softmax == "learnable":
        assert d_offset.shape == (1, 4, 1, 1) and d_offset.dtype == torch.float32 and d_offset.device.type == "cuda"
    else:
        assert d_offset.numel() == 0


def test_module_owns_tes_learnable_parameter():
    m = tc.DotProductAttention(16, 64, num_gqa_groups=4, softmax_type="learnable")
    params = dict(m.named_parameters())
    assert set(params) == {"softmax_offset"}
    p = params["softmax_offset"]
    assert p.shape == (16,) and p.dtype == torch.float32 and p.requires_grad and not p.any()
    assert "softmax_type='learnable'" in repr(m)
    assert "softmax_offset" in m.state_dict()
    off = tc.DotProductAttention(16, 64, softmax_type="off_by_one")
    assert list(off.parameters()) == [] and off.softmax_offset is None
    assert list(tc.DotProductAttention(16, 64).parameters()) == []
    with pytest.raises(ValueError, match="softmax_type='sink' is not one of 'vanilla', 'off_by_one', 'learnable'"):
        tc.DotProductAttention(16, 64, softmax_type="sink")


def test_module_fp8_path_refuses_sinks_clearly():
    meta = tc.Fp8AttentionMeta(device="cpu")
    m = tc.DotProductAttention(4, 64, qkv_format="bshd", softmax_type="learnable", fp8_meta=meta)
    q = torch.empty(2, 64, 4, 64, dtype=BF16)
    with pytest.raises(ValueError, match="takes no attention sinks"):
        m.eval()(q, q, q)


def test_fused_attention_takes_softmax_offset():
    q = torch.empty(2, 64, 4, 64, dtype=BF16)
    with pytest.raises(ValueError, match="softmax_type='learnable' needs softmax_offset"):
        tc.fused_attention(q, q, q, softmax_type="learnable")
    with pytest.raises(ValueError, match="fused attention executes on CUDA devices"):  # validated, then needs a GPU
        tc.fused_attention(q, q, q, softmax_type="learnable", softmax_offset=torch.zeros(1, 4, 1, 1))


@pytest.mark.parametrize("seq_first", [False, True], ids=["bshd", "sbhd"])
@pytest.mark.parametrize("padding", [False, True], ids=["dense", "padding"])
def test_sink_gradient_formula_matches_autograd_of_the_reference(seq_first, padding):
    """d_softmax_offset = -Σ exp(α - lse) · rowsum(dO ∘ O) (te_cudnn.sink_grad's torch path) is
    the reference's autograd gradient, with GQA, a causal mask and padded rows left out."""
    from te_cudnn.reference import attention_reference  # noqa: PLC0415
    from te_cudnn.sink_grad import sink_grad  # noqa: PLC0415

    g = torch.Generator().manual_seed(3)
    b, h, hg, s, d = 2, 4, 2, 24, 16
    q, k, v = (torch.randn(b, n, s, d, generator=g, dtype=torch.float64) for n in (h, hg, hg))
    alpha = torch.randn(1, h, 1, 1, generator=g, dtype=torch.float64, requires_grad=True)
    lens = torch.tensor([24, 9]) if padding else None
    extra = dict(seqlens_q=lens, seqlens_kv=lens) if padding else {}
    ref = attention_reference(q, k, v, attn_mask_type="padding_causal" if padding else "causal",
                              compute_dtype=torch.float64, softmax_type="learnable", softmax_offset=alpha, **extra)  # fmt: skip
    d_o = torch.randn(ref.out.shape, generator=g, dtype=torch.float64)
    (want,) = torch.autograd.grad(ref.out, alpha, d_o)
    lay = (lambda t: t.permute(2, 0, 1, 3)) if seq_first else (lambda t: t.transpose(1, 2))  # [b,h,s,d] -> format
    stats = ref.lse.detach().clone()
    if padding:  # rows past the end: undefined in cuDNN's stats; they must not matter
        stats[1, :, 9:] = float("nan")
    got = sink_grad(lay(ref.out.detach()), lay(d_o), stats, alpha.detach(), seq_first,
                    None if lens is None else lens.to(torch.int32))  # fmt: skip
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)  # D is summed in fp32, as on the GPU
