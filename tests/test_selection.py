"""Sub-backend selection and its reasons (``explain`` / ``get_fused_attn_backend`` / ``select``); CPU only."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

import te_cudnn
from te_cudnn import FusedAttnBackend, UnsupportedConfigError
from te_cudnn.backends import REGISTRY, Direction, explain_config, select
from te_cudnn.config import describe_fwd, describe_shapes
from te_cudnn.enums import AttnBiasType, AttnMaskType, QKVFormat, QKVLayout
from te_cudnn.layouts import CORE_LAYOUTS, layout_info
from te_cudnn.runtime import HOPPER_CUDNN_919, RuntimeEnv

from _rules import documented_reasons, is_ragged

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
ARB, M512, F8 = "F16_arbitrary_seqlen", "F16_max512_seqlen", "FP8"
SM80 = RuntimeEnv(sm=80, cudnn_version=90100)
UNKNOWN = RuntimeEnv(sm=None, cudnn_version=None)
ENVS = [pytest.param(HOPPER_CUDNN_919, id="sm90-cudnn91900"), pytest.param(SM80, id="sm80-cudnn90100"),
        pytest.param(UNKNOWN, id="unknown")]  # fmt: skip


def explain(
    *,
    dtype: torch.dtype = BF16,
    layout: str = "bshd_bshd_bshd",
    bias: str = "no_bias",
    mask: str = "no_mask",
    softmax: str = "vanilla",
    dropout: float = 0.0,
    h: int = 16,
    hg: int | None = None,
    sq: int = 512,
    skv: int | None = None,
    d: int = 64,
    d_v: int | None = None,
    window: tuple[int, int] = (-1, -1),
    training: bool = True,
    deterministic: bool = False,
    b: int = 2,
    env: RuntimeEnv = HOPPER_CUDNN_919,
    **kw,
) -> te_cudnn.Explanation:
    """te_cudnn.explain with TE's positional argument order."""
    return te_cudnn.explain(
        training, dtype, dtype, layout, bias, mask, softmax, dropout, h, h if hg is None else hg, sq,
        sq if skv is None else skv, d, d if d_v is None else d_v, window[0], window[1], False, False, deterministic,
        batch_size=b, env=env, **kw,
    )  # fmt: skip


def _has(reasons: list[str], fragment: str) -> bool:
    return any(fragment in r for r in reasons)


# ----------------------------------------------------------------------------- TE benchmark configs
# benchmarks/attention/benchmark_attention.py: (b, h, hg, d, sq, skv, mask, bias), bf16, bshd_bshd_bshd, training
BENCH = {
    "test_0": (2, 16, 16, 64, 512, 512, "no_mask", "no_bias"),
    "test_1": (2, 16, 16, 128, 2048, 2048, "causal", "no_bias"),
    "test_2": (2, 16, 16, 128, 2048, 2048, "causal", "post_scale_bias"),
    "test_3": (2, 32, 4, 128, 8192, 8192, "causal", "no_bias"),
}


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("name", list(BENCH))
def test_benchmark_configs_choose_arbitrary(name: str, env: RuntimeEnv) -> None:
    b, h, hg, d, sq, skv, mask, bias = BENCH[name]
    args = (True, BF16, BF16, "bshd_bshd_bshd", bias, mask, "vanilla", 0.0, h, hg, sq, skv, d, d)
    ex = te_cudnn.explain(*args, batch_size=b, env=env)
    assert ex.backend is FusedAttnBackend.F16_arbitrary_seqlen
    assert ex.reasons[ARB] == []
    assert list(ex.reasons) == [ARB, M512, F8]  # priority order
    assert (ex.config.b, ex.config.h, ex.config.hg, ex.config.sq, ex.config.skv, ex.config.d_qk) == (b, h, hg, sq, skv, d)
    assert ex.env is env
    got = te_cudnn.get_fused_attn_backend(*args, batch_size=b, env=env)
    assert got is FusedAttnBackend.F16_arbitrary_seqlen and got == 1
    # and the actual select() agrees, forward and backward
    assert select(ex.config, env).enum is FusedAttnBackend.F16_arbitrary_seqlen
    assert select(ex.config, env, direction=Direction.BWD).enum is FusedAttnBackend.F16_arbitrary_seqlen


def test_explanation_str() -> None:
    text = str(explain())
    assert "-> F16_arbitrary_seqlen" in text
    assert "F16_arbitrary_seqlen: supported" in text
    assert "F16_max512_seqlen: supported" in text  # it serves, but the flash path is measured faster


# ----------------------------------------------------------------------------- declined configurations
DECLINED = [
    # id, explain overrides, fragment of F16_arbitrary_seqlen's reason
    ("pre_scale_bias", dict(bias="pre_scale_bias"), "attn_bias_type=pre_scale_bias (supported: no_bias, post_scale_bias, alibi)"),
    ("alibi_no_mask", dict(bias="alibi", mask="no_mask"),
     "alibi needs attn_mask_type causal or causal_bottom_right (cuDNN requires right bound 0; TransformerEngine does "
     "not fuse it with padding), got no_mask"),
    ("alibi_padding_causal", dict(bias="alibi", mask="padding_causal"),
     "alibi needs attn_mask_type causal or causal_bottom_right (cuDNN requires right bound 0; TransformerEngine does "
     "not fuse it with padding), got padding_causal"),
    ("alibi_sm80", dict(bias="alibi", mask="causal", env=SM80), "alibi needs sm90 or newer, got sm80"),
    ("causal_br_cross_bias", dict(mask="causal_bottom_right", sq=512, skv=1024, bias="post_scale_bias"),
     "causal_bottom_right with sq != skv cannot take attn_bias_type=post_scale_bias"),
    ("causal_br_cross_dropout", dict(mask="causal_bottom_right", sq=512, skv=1024, dropout=0.1),
     "causal_bottom_right with sq != skv cannot take dropout"),
    ("window_bias", dict(mask="causal", window=(128, 0), bias="post_scale_bias"),
     "sliding window (128, 0) cannot take attn_bias_type=post_scale_bias"),
    ("window_dropout", dict(mask="no_mask", window=(64, 64), dropout=0.1), "sliding window (64, 64) cannot take dropout"),
    ("window_sq_gt_skv", dict(mask="no_mask", window=(64, 64), sq=1024, skv=512),
     "sliding window (64, 64) needs sq <= skv, got sq=1024, skv=512"),
    ("head_dim_264", dict(d=264), "head dims d_qk=264, d_v=264 exceed 256"),
    ("head_dim_not_multiple_of_8_packed", dict(d=60, layout="bs3hd"), "head dims d_qk=60, d_v=60 must be multiples of 8"),
    ("causal_br_sq_gt_skv_with_bias", dict(mask="causal_bottom_right", sq=1024, skv=512, bias="post_scale_bias"),
     "padding_causal_bottom_right with post_scale_bias is not fused"),
    ("head_dim_256_sm80", dict(d=256, env=SM80), "head dims above 128 (d_qk=256, d_v=256) need sm90, got sm80"),
    ("head_dim_256_training_cudnn91", dict(d=256, env=RuntimeEnv(sm=90, cudnn_version=90100)),
     "head dims above 128 need cuDNN 90500 or newer for training"),
    ("head_dim_256_128_training", dict(d=256, d_v=128), "training with d_qk=256 != d_v=128 (both >= 128) is not supported"),
    ("sink_cudnn_9_12", dict(softmax="learnable", env=RuntimeEnv(sm=90, cudnn_version=91200)),
     "softmax_type=learnable (attention sinks) needs cuDNN 9.13 or newer, got 9.12.0"),
    ("sink_decode", dict(softmax="off_by_one", sq=1, skv=512, training=False),
     "softmax_type=off_by_one: cuDNN's SDPA takes no sink with sq = 1 (decode)"),
    ("sink_thd_training", dict(softmax="learnable", layout="thd_thd_thd", mask="padding_causal"),
     "softmax_type=learnable with THD tensors in training: cuDNN's ragged backward with a sink needs 9.26"),
    ("padding_bias", dict(mask="padding", bias="post_scale_bias"),
     "attn_mask_type=padding with post_scale_bias is not fused (TransformerEngine's rule)"),
    ("padding_causal_br_bias", dict(mask="padding_causal_bottom_right", bias="post_scale_bias"),
     "attn_mask_type=padding_causal_bottom_right with post_scale_bias is not fused"),
    ("thd_no_mask", dict(layout="thd_thd_thd", mask="no_mask"),
     "qkv_layout=thd_thd_thd (THD) needs a padding mask (padding, padding_causal or padding_causal_bottom_right), "
     "got attn_mask_type=no_mask"),
    ("t3hd_causal", dict(layout="t3hd", mask="causal"), "qkv_layout=t3hd (THD) needs a padding mask"),
    ("thd_sm80", dict(layout="thd_t2hd", mask="padding", env=SM80), "THD layouts need sm90 or newer, got sm80"),
    ("thd_cudnn95", dict(layout="thd_th2d", mask="padding_causal", h=16, hg=4,
                         env=RuntimeEnv(sm=90, cudnn_version=90500)),
     "THD layouts need cuDNN 9.6 or newer here, got 90500"),
    ("fp8_dtype_d64", dict(dtype=FP8, d=64), "dtype=float8_e4m3fn (supported: bfloat16, float16)"),
    ("fp8_e5m2_dtype_d64", dict(dtype=torch.float8_e5m2, d=64), "dtype=float8_e5m2 (supported: bfloat16, float16)"),
    ("sq_skv_1_training", dict(sq=1, skv=1), "cuDNN's SDPA backward does not support sq = skv = 1"),
    ("deterministic_sm80", dict(deterministic=True, env=SM80), "a deterministic backward needs sm90 or newer, got sm80"),
    ("cudnn_9_10_0", dict(env=RuntimeEnv(sm=90, cudnn_version=91000)), "cuDNN 91000 has known bugs for this sub-backend"),
    ("cudnn_8", dict(env=RuntimeEnv(sm=90, cudnn_version=80906)), "cuDNN 80906 is older than 90000"),
    ("sm75", dict(env=RuntimeEnv(sm=75, cudnn_version=91900)), "GPU sm75 (needs sm80 or newer)"),
    ("blackwell_old_cudnn", dict(env=RuntimeEnv(sm=100, cudnn_version=90600)), "sm100 needs cuDNN 9.7 or newer"),
    ("return_max_logit", dict(return_max_logit=True),
     "return_max_logit needs cuDNN 9.21 or newer (before it cuDNN's SDPA cannot output the softmax stats and the "
     "maximum logit together), found cuDNN 9.19.0"),
]  # fmt: skip


@pytest.mark.parametrize(("over", "fragment"), [c[1:] for c in DECLINED], ids=[c[0] for c in DECLINED])
def test_declined_with_reason(over: dict, fragment: str) -> None:
    if "return_max_logit" in over:
        ex = te_cudnn.explain(True, BF16, BF16, "bshd_bshd_bshd", "no_bias", "no_mask", "vanilla", 0.0, 16, 16, 512,
                              512, 64, 64, -1, -1, True, env=HOPPER_CUDNN_919)  # fmt: skip
    else:
        ex = explain(**over)
    assert _has(ex.reasons[ARB], fragment), ex.reasons[ARB]
    if not ex.reasons[M512]:  # TE's policy: max512 serves where the flash path cannot (d=64, s <= 512, ...)
        assert ex.backend is FusedAttnBackend.F16_max512_seqlen
        return
    assert ex.backend is FusedAttnBackend.No_Backend
    assert all(ex.reasons[n] for n in (ARB, M512, F8))


@pytest.mark.parametrize(
    "over",
    [dict(mask="causal_bottom_right", sq=512, skv=512, bias="post_scale_bias"),  # demoted to top-left when sq == skv
     dict(mask="causal_bottom_right", sq=512, skv=1024),
     dict(mask="causal", window=(128, 0)),
     dict(mask="no_mask", window=(64, 64), sq=512, skv=1024),
     dict(d=256), dict(d=192, d_v=128), dict(d=256, training=False, env=RuntimeEnv(sm=90, cudnn_version=90100)),
     dict(sq=1, skv=1, training=False), dict(deterministic=True), dict(dropout=0.1), dict(h=32, hg=1),
     dict(bias="alibi", mask="causal_bottom_right", sq=1024, skv=1024),
     # padding masks: per-sequence lengths decide, so the max-length rules sq <= skv do not apply
     dict(mask="padding_causal_bottom_right", sq=1024, skv=512), dict(mask="padding", window=(64, 64), sq=1024, skv=512),
     dict(mask="padding_causal", dropout=0.1), dict(layout="thd_thd_thd", mask="padding_causal", h=16, hg=4),
     dict(layout="t3hd", mask="padding_causal_bottom_right"), dict(layout="thd_th2d", mask="padding", sq=128, skv=1024)],
    ids=["causal_br_self_bias", "causal_br_cross", "causal_window", "window_cross", "d256_sm90", "d192_128",
         "d256_inference_cudnn91", "sq1_inference", "deterministic_sm90", "dropout", "mqa", "alibi_causal_br_self",
         "padding_causal_br_sq_gt_skv", "padding_window_sq_gt_skv", "padding_causal_dropout", "thd_gqa_cudnn919",
         "t3hd_padding_causal_br", "thd_th2d_cross"],
)  # fmt: skip
def test_accepted_edge_cases(over: dict) -> None:
    ex = explain(**over)
    assert ex.reasons[ARB] == [], ex.reasons[ARB]
    assert ex.backend is FusedAttnBackend.F16_arbitrary_seqlen


def test_fp8_inputs_select_fp8_and_only_fp8() -> None:
    ex = explain(dtype=FP8, d=128, mask="causal")
    assert ex.backend is FusedAttnBackend.FP8 and ex.reasons[F8] == []
    for name in (ARB, M512):
        assert _has(ex.reasons[name], "dtype=float8_e4m3fn (supported: bfloat16, float16)"), ex.reasons[name]
    # Hopper's FP8 backward needs d = 128: training at d = 64 is declined, inference is served
    ex = explain(dtype=FP8, d=64, mask="causal")
    assert ex.backend is FusedAttnBackend.No_Backend
    assert _has(ex.reasons[F8], "cuDNN's FP8 backward on Hopper needs d_qk = d_v = 128, got 64/64")
    # F16 inputs never select FP8
    assert explain(d=128, mask="causal").backend is FusedAttnBackend.F16_arbitrary_seqlen


def test_max512_serves_where_te_served_it_but_flash_is_chosen() -> None:
    ex = explain(layout="bs3hd", mask="causal", sq=512, d=64)
    assert ex.reasons[M512] == [] and ex.backend is FusedAttnBackend.F16_arbitrary_seqlen
    assert ex.reasons[ARB] == []
    ex = explain(layout="bshd_bsh2d", sq=1024, d=128, h=16, hg=4)
    why = ex.reasons[M512]
    for fragment in ("qkv_layout=bshd_bsh2d", "exceed 512", "(supported: [64])", "grouped-query attention (h=16, hg=4)"):
        assert _has(why, fragment), why


def test_explain_dtype_mismatch() -> None:
    with pytest.raises(TypeError, match=r"q_dtype=torch\.bfloat16 differs from kv_dtype=torch\.float16"):
        te_cudnn.explain(True, BF16, torch.float16, "bshd_bshd_bshd", "no_bias", "no_mask", "vanilla", 0.0,
                         16, 16, 512, 512, 64, 64, env=HOPPER_CUDNN_919)  # fmt: skip


# ----------------------------------------------------------------------------- select()
def _cfg(**over):
    a = dict(is_training=True, dtype=BF16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias",
             attn_mask_type="causal", softmax_type="vanilla", dropout=0.0, num_attn_heads=16, num_gqa_groups=16,
             max_seqlen_q=512, max_seqlen_kv=512, head_dim_qk=64, head_dim_v=64, window_size=(-1, -1), batch_size=2)  # fmt: skip
    a.update(over)
    return describe_shapes(**a)


def test_select_raises_listing_all_sub_backends() -> None:
    cfg = _cfg(attn_bias_type="pre_scale_bias")
    with pytest.raises(UnsupportedConfigError) as ei:
        select(cfg, HOPPER_CUDNN_919)
    err = ei.value
    assert isinstance(err, NotImplementedError)
    assert list(err.reasons) == [FusedAttnBackend.F16_arbitrary_seqlen, FusedAttnBackend.F16_max512_seqlen, FusedAttnBackend.FP8]
    msg = str(err)
    assert msg.startswith(f"No cuDNN fused-attention sub-backend supports {cfg.summary()}")
    for name in (ARB, M512, F8):
        assert re.search(rf"^  {name} declined because:$", msg, re.M), msg
    assert "    - attn_bias_type=pre_scale_bias (supported: no_bias, post_scale_bias, alibi)" in msg
    assert "    - attn_bias_type=pre_scale_bias (supported: no_bias, post_scale_bias)" in msg  # max512's own list
    assert "FP8 declined because" in msg


def test_select_forced_max512_serves_or_says_why() -> None:
    ok = _cfg(attn_mask_type="causal", num_attn_heads=8, num_gqa_groups=8, head_dim_qk=64, head_dim_v=64,
              max_seqlen_q=256, max_seqlen_kv=256)  # fmt: skip
    assert select(ok, HOPPER_CUDNN_919, forced=FusedAttnBackend.F16_max512_seqlen).enum is FusedAttnBackend.F16_max512_seqlen
    # automatic selection keeps the flash path where both serve (measured faster)
    assert select(ok, HOPPER_CUDNN_919).enum is FusedAttnBackend.F16_arbitrary_seqlen
    bad = _cfg(attn_mask_type="padding", max_seqlen_q=1024, max_seqlen_kv=1024)
    with pytest.raises(UnsupportedConfigError, match=r"with the requested F16_max512_seqlen") as ei:
        select(bad, HOPPER_CUDNN_919, forced=FusedAttnBackend.F16_max512_seqlen)
    assert list(ei.value.reasons) == [FusedAttnBackend.F16_max512_seqlen]
    why = " ".join(ei.value.reasons[FusedAttnBackend.F16_max512_seqlen])
    assert "exceed 512" in why and "padding masks" in why and "matmul overrides" in why


def test_select_forced_fp8_on_bf16_raises() -> None:
    with pytest.raises(UnsupportedConfigError, match=r"requested FP8") as ei:
        select(_cfg(), HOPPER_CUDNN_919, forced=FusedAttnBackend.FP8)
    assert _has(ei.value.reasons[FusedAttnBackend.FP8], "dtype=bfloat16 (supported: float8_e4m3fn, float8_e5m2)")


def test_select_forced_arbitrary_never_falls_back() -> None:
    assert select(_cfg(), HOPPER_CUDNN_919, forced=FusedAttnBackend.F16_arbitrary_seqlen) is REGISTRY[0]
    assert select(_cfg(), HOPPER_CUDNN_919, forced=FusedAttnBackend.No_Backend) is REGISTRY[0]
    with pytest.raises(UnsupportedConfigError, match=r"requested F16_arbitrary_seqlen"):
        select(_cfg(head_dim_qk=264, head_dim_v=264), HOPPER_CUDNN_919, forced=FusedAttnBackend.F16_arbitrary_seqlen)


def test_training_forward_checks_backward_rules() -> None:
    # sq = skv = 1: forward-only is fine, a training forward is declined up front.
    inference = _cfg(is_training=False, max_seqlen_q=1, max_seqlen_kv=1)
    assert select(inference, HOPPER_CUDNN_919).enum is FusedAttnBackend.F16_arbitrary_seqlen
    with pytest.raises(UnsupportedConfigError, match=r"does not support sq = skv = 1"):
        select(_cfg(max_seqlen_q=1, max_seqlen_kv=1), HOPPER_CUDNN_919)


# ----------------------------------------------------------------------------- generated from the declaration
CAPS = REGISTRY[0].caps
assert REGISTRY[0].enum is FusedAttnBackend.F16_arbitrary_seqlen
#: Layouts a sizes-only description (describe_shapes, hence explain) covers; the mixed
#: q/kv-format layouts (15-18) are described from tensors instead (test_declared_mixed_combination).
SHAPES_ONLY = frozenset(CORE_LAYOUTS)
# Paged-KV layouts take page pools and page tables; they have their own tests (test_paged_cpu.py).
PAGED = frozenset(l for l in QKVLayout if layout_info(l).is_paged)


def _generated_cases(layouts):
    """Declared layout x mask x bias, self- and (where q is not packed with k/v) cross-attention."""
    for layout, mask, bias in itertools.product(sorted(layouts), sorted(CAPS.masks), sorted(CAPS.bias_types)):
        shapes = [("self", 256, 256)]
        if not layout_info(layout).packs_qkv:
            shapes.append(("cross", 128, 256))
        for kind, sq, skv in shapes:
            yield pytest.param(layout, mask, bias, sq, skv, id=f"{layout.name}-{mask.name}-{bias.name}-{kind}")


@pytest.mark.parametrize(("layout", "mask", "bias", "sq", "skv"), list(_generated_cases(CAPS.layouts & SHAPES_ONLY)))
def test_declared_combination(layout, mask, bias, sq, skv) -> None:
    ex = te_cudnn.explain(True, BF16, BF16, layout, bias, mask, "vanilla", 0.0, 8, 8, sq, skv, 64, 64,
                          batch_size=2, env=HOPPER_CUDNN_919)  # fmt: skip
    expected = documented_reasons(layout, mask, bias, sq, skv)
    assert ex.reasons[ARB] == expected
    assert ex.backend is (FusedAttnBackend.No_Backend if expected else FusedAttnBackend.F16_arbitrary_seqlen)


def _side(fmt: QKVFormat, b: int, s: int, h: int, d: int) -> torch.Tensor:
    shape = {QKVFormat.thd: (b * s, h, d), QKVFormat.bshd: (b, s, h, d), QKVFormat.sbhd: (s, b, h, d)}[fmt]
    return torch.empty(shape, dtype=BF16)


def _describe_from_tensors(layout: QKVLayout, mask: AttnMaskType, bias: AttnBiasType, sq: int, skv: int, b: int = 2, h: int = 8):
    """describe_fwd on CPU tensors of a non-packed layout (b sequences of full length)."""
    info = layout_info(layout)
    q, k, v = _side(info.q_format, b, sq, h, 64), _side(info.kv_format, b, skv, h, 64), _side(info.kv_format, b, skv, h, 64)
    need_cu = mask.is_padding or is_ragged(layout)
    cu_q = torch.arange(b + 1, dtype=torch.int32) * sq if need_cu else None
    cu_kv = torch.arange(b + 1, dtype=torch.int32) * skv if need_cu else None
    attn_bias = torch.zeros(1, h, sq, skv, dtype=BF16) if bias == AttnBiasType.post_scale_bias else None
    return describe_fwd(is_training=True, max_seqlen_q=sq, max_seqlen_kv=skv, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                        q=q, k=k, v=v, qkv_dtype=BF16, attn_bias=attn_bias, attn_scale=None, dropout=0.0,
                        qkv_layout=layout, attn_bias_type=bias, attn_mask_type=mask, softmax_type="vanilla",
                        window_size=(-1, -1), bottom_right_diagonal=None)  # fmt: skip


@pytest.mark.parametrize(("layout", "mask", "bias", "sq", "skv"), list(_generated_cases(CAPS.layouts - SHAPES_ONLY - PAGED)))
def test_declared_mixed_combination(layout, mask, bias, sq, skv) -> None:
    """Mixed q/kv-format layouts, described from tensors (describe_shapes covers only the core 15)."""
    cfg = _describe_from_tensors(layout, mask, bias, sq, skv)
    info = layout_info(layout)
    assert (cfg.ragged_q, cfg.ragged_kv) == (info.q_format == QKVFormat.thd, False)
    assert cfg.b == 2  # a dense k/v side fixes the batch: it is not bucketed
    explained = explain_config(cfg, HOPPER_CUDNN_919)
    expected = documented_reasons(layout, mask, bias, sq, skv)
    assert explained[FusedAttnBackend.F16_arbitrary_seqlen] == expected
    assert explained[FusedAttnBackend.F16_max512_seqlen] and explained[FusedAttnBackend.FP8]
    if not expected:
        assert select(cfg, HOPPER_CUDNN_919).enum is FusedAttnBackend.F16_arbitrary_seqlen


def test_generated_cases_cover_the_declaration() -> None:
    core = {p.id for p in _generated_cases(CAPS.layouts & SHAPES_ONLY)}
    mixed = {p.id for p in _generated_cases(CAPS.layouts - SHAPES_ONLY - PAGED)}
    assert "bshd_bshd_bshd-causal-alibi-self" in core and "thd_thd_thd-padding_causal_bottom_right-no_bias-cross" in core
    assert "thd_sbhd_sbhd-padding-no_bias-cross" in mixed and not core & mixed
    # the declaration: every layout but bhsd; every mask but arbitrary
    assert CAPS.layouts == frozenset(l for l in QKVLayout if l != QKVLayout.bhsd_bhsd_bhsd)
    assert len(CAPS.layouts) == 10 + 5 + 4 + 6 and len(CAPS.masks) == 6 and len(CAPS.bias_types) == 3
    assert CAPS.layouts - SHAPES_ONLY - PAGED == {QKVLayout.sbhd_bshd_bshd, QKVLayout.bshd_sbhd_sbhd,
                                         QKVLayout.thd_bshd_bshd, QKVLayout.thd_sbhd_sbhd}  # fmt: skip
    # 15 core layouts, 9 of them not packing q with k/v (cross case); 4 mixed layouts, none packing
    assert len(core) == 15 * 6 * 3 + 9 * 6 * 3
    assert len(mixed) == 4 * 6 * 3 * 2
    served = [p for p in _generated_cases(CAPS.layouts & SHAPES_ONLY) if not documented_reasons(*p.values)]
    assert any(is_ragged(p.values[0]) for p in served)  # THD layouts are actually served


# ----------------------------------------------------------------------------- head dims and rows of 16 bytes
def test_every_sub_backend_declines_head_dims_that_are_not_16_byte_rows() -> None:
    """config.describe_fwd leaves tensors whose head dim cannot make 16-byte rows (d = 7 in
    bf16) to the sub-backends' head-dim rule, so that the head dim is reported and not the
    strides it implies. That is safe only while every sub-backend's declared multiple covers
    cuDNN's 16-byte rule for every dtype it takes."""
    for backend in REGISTRY:
        for dtype in backend.caps.dtypes:
            row = backend.caps.head_dim_multiple * torch.empty((), dtype=dtype).element_size()
            assert row % 16 == 0, (backend.name, dtype, backend.caps.head_dim_multiple)


@pytest.mark.parametrize(("over", "served_as"), [
    (dict(d=7, mask="causal"), "head dims padded with zero columns to d_qk=8, d_v=8"),
    (dict(d=100, dtype=torch.float16, mask="causal"), "head dims padded with zero columns to d_qk=104, d_v=104"),
    (dict(d=59, hg=4, mask="causal_bottom_right", sq=512, skv=509), "head dims padded with zero columns to d_qk=64"),
    (dict(mask="causal_bottom_right", sq=1024, skv=512), "as padding_causal_bottom_right with full lengths"),
    (dict(mask="causal_bottom_right", sq=1024, skv=512, d=111),
     "d_qk=112, d_v=112 (q, k, v copied per call); as padding_causal_bottom_right with full lengths"),
])  # fmt: skip
def test_served_in_another_form(over: dict, served_as: str) -> None:
    """What a peer serves and cuDNN declines in the form it comes in: te_cudnn runs it in another
    form (te_cudnn.served) and explain() says which."""
    ex = explain(**over)
    assert ex.backend is FusedAttnBackend.F16_arbitrary_seqlen, ex
    assert served_as in (ex.served_as or ""), ex.served_as
    assert f"(served {ex.served_as})" in str(ex)


@pytest.mark.parametrize(("dtype", "d", "backend", "fragment"), [
    (FP8, 8, F8, "head dims d_qk=8, d_v=8 must be multiples of 16"),
    (FP8, 120, F8, "head dims d_qk=120, d_v=120 must be multiples of 16"),
])  # fmt: skip
def test_unaligned_head_dims_are_declined_as_head_dims(dtype, d, backend, fragment) -> None:
    ex = explain(dtype=dtype, d=d, mask="causal")
    assert ex.backend is FusedAttnBackend.No_Backend
    assert _has(ex.reasons[backend], fragment), ex.reasons[backend]


# ----------------------------------------------------------------------------- FP8, sq = skv = 1
def test_fp8_training_with_sq_skv_1_is_declined_as_the_frontend_does() -> None:
    """Found by the property test: the FP8 declaration accepted a training call with
    sq = skv = 1, whose backward graph the frontend's validator refuses."""
    from te_cudnn.backends import BY_ENUM

    cfg = _cfg(dtype=FP8, max_seqlen_q=1, max_seqlen_kv=1, head_dim_qk=128, head_dim_v=128, attn_mask_type="no_mask")
    fp8 = BY_ENUM[FusedAttnBackend.FP8]
    with pytest.raises(Exception, match=r"s_q = s_kv = 1 is not supported"):
        fp8.build(cfg.for_backward(cfg.o_stride, False), Direction.BWD).graph.validate()
    assert _has(fp8.not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD) + fp8.not_supported_reasons(
        cfg, HOPPER_CUDNN_919, Direction.BWD), "sq = skv = 1")  # fmt: skip
    with pytest.raises(UnsupportedConfigError, match=r"sq = skv = 1"):
        select(cfg, HOPPER_CUDNN_919)
    # inference with a single query and key stays served, and its forward graph validates
    inference = _cfg(dtype=FP8, is_training=False, max_seqlen_q=1, max_seqlen_kv=1, head_dim_qk=128, head_dim_v=128)
    assert select(inference, HOPPER_CUDNN_919) is fp8
    fp8.build(inference, Direction.FWD).graph.validate()


# ----------------------------------------------------------------------------- malformed explain arguments
@pytest.mark.parametrize(("over", "exc", "match"), [
    (dict(training=torch.tensor([1, 0])), TypeError, r"is_training must be a bool, got a int64 tensor of shape \[2\] on cpu"),
    (dict(deterministic=1), TypeError, r"deterministic must be a bool, got int 1"),
    (dict(dtype=torch.float32), TypeError, r"q_dtype=torch\.float32: fused attention takes torch\.float16, torch\.bfloat16"),
    (dict(dtype="bf16"), TypeError, r"q_dtype.*str 'bf16'"),
    (dict(bias="post_scale_bias", bias_shape=7), TypeError, r"bias_shape must be a sequence of 4 ints, got int 7"),
    (dict(bias="post_scale_bias", bias_shape=(16, 512, 512)), ValueError,
     r"bias_shape=\[16, 512, 512\]; expected \[1 or b, 1 or h, 1 or sq, skv\] = \[1\|2, 1\|16, 1\|512, 512\]"),
    (dict(layout="bs3hd", sq=512, skv=256), ValueError,
     r"qkv_layout=bs3hd packs q, k and v, so it needs max_seqlen_q == max_seqlen_kv .* got 512, 256 and 16, 16"),
    (dict(window=(1.5, 0)), TypeError, r"window_size must hold two ints \(-1 means unbounded\), got \(float 1\.5, int 0\)"),
])  # fmt: skip
def test_explain_names_malformed_arguments(over: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match) as ei:
        explain(**over)
    assert type(ei.value) is exc
