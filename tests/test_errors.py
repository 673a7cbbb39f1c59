"""Malformed input to ``fused_attn_fwd`` / ``fused_attn_bwd`` (CPU tensors only).

Validation runs before any GPU work, so every malformed call raises its own TypeError /
ValueError naming the argument and value; a well-formed call on CPU tensors gets as far as
the device check and raises a ValueError saying it needs a CUDA device.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import te_cudnn
from te_cudnn import FusedAttnBackend, UnsupportedConfigError
from te_cudnn.backends import BY_ENUM, Direction, select
from te_cudnn.config import describe_fwd
from te_cudnn.runtime import HOPPER_CUDNN_919

BF16 = torch.bfloat16
B, S, H, D = 2, 16, 4, 64
KW = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
NEEDS_CUDA = r"q is on cpu; fused attention executes on CUDA devices"


def _t(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def _qkv() -> dict[str, Any]:
    return dict(q=_t(B, S, H, D), k=_t(B, S, H, D), v=_t(B, S, H, D))


def fwd(**over: Any):
    """fused_attn_fwd with the valid bf16 bshd baseline, overridden by ``over``."""
    a: dict[str, Any] = dict(
        is_training=True, max_seqlen_q=S, max_seqlen_kv=S, cu_seqlens_q=None, cu_seqlens_kv=None,
        **_qkv(), qkv_dtype=BF16, **KW,
    )  # fmt: skip
    a.update(over)
    pos = [a.pop(n) for n in ("is_training", "max_seqlen_q", "max_seqlen_kv", "cu_seqlens_q", "cu_seqlens_kv",
                              "q", "k", "v", "qkv_dtype")]  # fmt: skip
    return te_cudnn.fused_attn_fwd(*pos, **a)


def _aux(bias: bool = False) -> list[torch.Tensor]:
    aux = [torch.zeros(B, H, S, 1, dtype=torch.float32), torch.zeros(2, dtype=torch.int64)]
    if bias:
        aux.append(_t(1, H, S, S))
    return aux


def bwd(**over: Any):
    """fused_attn_bwd with the valid bf16 bshd baseline, overridden by ``over``."""
    a: dict[str, Any] = dict(
        max_seqlen_q=S, max_seqlen_kv=S, cu_seqlens_q=None, cu_seqlens_kv=None, **_qkv(),
        o=_t(B, S, H, D), d_o=_t(B, S, H, D), qkv_dtype=BF16, aux_ctx_tensors=_aux(), **KW,
    )  # fmt: skip
    a.update(over)
    pos = [a.pop(n) for n in ("max_seqlen_q", "max_seqlen_kv", "cu_seqlens_q", "cu_seqlens_kv", "q", "k", "v",
                              "o", "d_o", "qkv_dtype", "aux_ctx_tensors")]  # fmt: skip
    return te_cudnn.fused_attn_bwd(*pos, **a)


# ----------------------------------------------------------------------------- valid calls
def test_fwd_valid_call_needs_cuda() -> None:
    with pytest.raises(ValueError, match=NEEDS_CUDA):
        fwd()


@pytest.mark.parametrize(
    "over",
    [
        dict(qkv_dtype=None),
        dict(fused_attention_backend=FusedAttnBackend.F16_arbitrary_seqlen),
        dict(fused_attention_backend="F16_arbitrary_seqlen"),
        dict(attn_mask_type="causal", window_size=(4, 0)),
        dict(qkv_layout="BSHD_BSHD_BSHD", attn_mask_type="CAUSAL"),
        dict(attn_bias_type="post_scale_bias", attn_bias=_t(1, H, S, S)),
        dict(dropout=0.1),
        dict(is_training=False),
    ],
    ids=["qkv_dtype_none", "backend_enum", "backend_str", "causal_window", "upper_case", "bias", "dropout", "inference"],
)
def test_fwd_valid_variants_need_cuda(over: dict) -> None:
    with pytest.raises(ValueError, match=NEEDS_CUDA):
        fwd(**over)


def test_fwd_valid_packed_views_need_cuda() -> None:
    q, k, v = _t(B, S, 3, H, D).unbind(-3)
    with pytest.raises(ValueError, match=NEEDS_CUDA):
        fwd(q=q, k=k, v=v, qkv_layout="bs3hd")
    q = _t(S, B, H, D)
    k, v = _t(S, B, H, 2, D).unbind(-2)
    with pytest.raises(ValueError, match=NEEDS_CUDA):
        fwd(q=q, k=k, v=v, qkv_layout="sbhd_sbh2d")


def test_bwd_valid_call_needs_cuda() -> None:
    with pytest.raises(ValueError, match=NEEDS_CUDA):
        bwd()
    with pytest.raises(ValueError, match=NEEDS_CUDA):
        bwd(attn_bias_type="post_scale_bias", aux_ctx_tensors=_aux(bias=True), deterministic=True)


# ----------------------------------------------------------------------------- forward errors
misaligned = _t(B, S, H, D + 4)[..., :D]  # head stride 68 elements = 136 bytes, not a multiple of 16
FWD_ERRORS = [
    # id, overrides, exception, message fragment (regex)
    ("q_float32", dict(q=_t(B, S, H, D, dtype=torch.float32)), TypeError,
     r"q\.dtype=torch\.float32; fused attention takes float16, bfloat16 or float8"),
    ("k_dtype_differs", dict(k=_t(B, S, H, D, dtype=torch.float16)), TypeError,
     r"k\.dtype=torch\.float16 differs from q\.dtype=torch\.bfloat16"),
    ("v_dtype_differs", dict(v=_t(B, S, H, D, dtype=torch.float16)), TypeError,
     r"v\.dtype=torch\.float16 differs from q\.dtype=torch\.bfloat16"),
    ("qkv_dtype_mismatch", dict(qkv_dtype=torch.float16), TypeError,
     r"qkv_dtype=torch\.float16 does not match q\.dtype=torch\.bfloat16 \(pass q\.dtype or None\)"),
    ("qkv_dtype_string", dict(qkv_dtype="bf16"), TypeError, r"qkv_dtype=str 'bf16' does not match q\.dtype=torch\.bfloat16"),
    ("q_not_tensor", dict(q=[[0.0]]), TypeError, r"q must be a torch\.Tensor, got list \[\[0\.0\]\]"),
    ("k_not_tensor", dict(k="k"), TypeError, r"k must be a torch\.Tensor, got str 'k'"),
    ("q_3d", dict(q=_t(B, S, H * D)), ValueError,
     r"q must be 4-d in format bshd, got shape \[2, 16, 256\] \(qkv_layout=bshd_bshd_bshd\)"),
    ("k_5d", dict(k=_t(B, S, 1, H, D)), ValueError,
     r"k must be 4-d in format bshd, got shape \[2, 16, 1, 4, 64\] \(qkv_layout=bshd_bshd_bshd\)"),
    ("batch_mismatch", dict(k=_t(3, S, H, D)), ValueError, r"batch sizes differ: q has b=2, k has b=3, v has b=2"),
    ("kv_heads_mismatch", dict(v=_t(B, S, 2, D)), ValueError, r"k has 4 heads x 16 keys but v has 2 heads x 16 keys"),
    ("kv_seqlen_mismatch", dict(v=_t(B, 8, H, D)), ValueError, r"k has 4 heads x 16 keys but v has 4 heads x 8 keys"),
    ("h_not_multiple_of_hg", dict(k=_t(B, S, 3, D), v=_t(B, S, 3, D)), ValueError,
     r"k/v have 3 heads, which does not divide q's 4 heads"),
    ("head_dim_mismatch", dict(k=_t(B, S, H, 32)), ValueError, r"q head dim 64 differs from k head dim 32"),
    ("q_last_dim_strided", dict(q=_t(B, S, H, 2 * D)[..., ::2]), ValueError,
     r"q must have a unit-stride last dimension, got shape \(2, 16, 4, 64\) stride \(8192, 512, 128, 2\)"),
    ("v_last_dim_strided", dict(v=_t(B, S, H, 2 * D)[..., ::2]), ValueError, r"v must have a unit-stride last dimension"),
    ("misaligned_strides", dict(q=misaligned), ValueError,
     r"q has shape \(2, 16, 4, 64\) and strides \(4352, 272, 68, 1\) \(2-byte elements\); cuDNN needs every stride but "
     r"the last to be a multiple of 16 bytes \(stride 68 is 136 bytes\): pass q\.contiguous\(\)"),
    ("bad_layout_name", dict(qkv_layout="bshd_bshd"), ValueError,
     r"qkv_layout='bshd_bshd' is not a valid QKVLayout; expected one of 'sb3hd', 'sbh3d', .*'bshd_bshd_bshd'"),
    ("bad_layout_int", dict(qkv_layout=26), ValueError, r"qkv_layout=26 is not a valid QKVLayout value"),
    ("packed_qkv_separate", dict(qkv_layout="bs3hd"), ValueError,
     r"qkv_layout='bs3hd' but q, k, v are laid out as 'bshd_bshd_bshd'"),
    ("packed_kv_separate", dict(qkv_layout="bshd_bsh2d"), ValueError,
     r"qkv_layout='bshd_bsh2d' but q, k, v are laid out as 'bshd_bshd_bshd'"),
    ("packed_qkv_shapes_differ", dict(qkv_layout="bsh3d", k=_t(B, S, 2, D), v=_t(B, S, 2, D)), ValueError,
     r"qkv_layout=bsh3d packs q, k and v in one buffer, so they need one shape"),
    ("max_seqlen_q", dict(max_seqlen_q=32), ValueError,
     r"max_seqlen_q=32 but q holds 16 positions \(qkv_layout=bshd_bshd_bshd\)"),
    ("max_seqlen_kv", dict(max_seqlen_kv=8), ValueError, r"max_seqlen_kv=8 but k holds 16 positions"),
    ("max_seqlen_q_float", dict(max_seqlen_q=16.0), TypeError, r"max_seqlen_q must be an int, got float 16\.0"),
    ("max_seqlen_kv_tensor", dict(max_seqlen_kv=torch.tensor(16)), TypeError,
     r"max_seqlen_kv must be an int, got a int64 tensor of shape \[\] on cpu"),
    ("cu_seqlens_q_dtype", dict(cu_seqlens_q=torch.zeros(B + 1, dtype=torch.int64)), TypeError,
     r"cu_seqlens_q must be int32, got torch\.int64 \(an int32 \[b\+1\] = \[3\] tensor on q's device\)"),
    ("cu_seqlens_kv_list", dict(cu_seqlens_kv=[0, 16, 32]), TypeError,
     r"cu_seqlens_kv must be a torch\.Tensor, got list \[0, 16, 32\]"),
    ("cu_seqlens_q_device", dict(cu_seqlens_q=torch.zeros(B + 1, dtype=torch.int32, device="meta")), ValueError,
     r"cu_seqlens_q is on meta but q is on cpu; all tensors must share one device"),
    ("cu_seqlens_kv_length", dict(cu_seqlens_kv=torch.zeros(B, dtype=torch.int32)), ValueError,
     r"cu_seqlens_kv must have shape \[b\+1\] = \[3\], got \[2\]"),
    ("cu_seqlens_missing_padding", dict(attn_mask_type="padding"), ValueError,
     r"cu_seqlens_q is required for attn_mask_type=padding \(int32 \[b\+1\] = \[3\]\)"),
    ("cu_seqlens_kv_missing_padding_causal",
     dict(attn_mask_type="padding_causal", cu_seqlens_q=torch.zeros(B + 1, dtype=torch.int32)), ValueError,
     r"cu_seqlens_kv is required for attn_mask_type=padding_causal"),
    ("bad_mask_name", dict(attn_mask_type="causal_top_left"), ValueError,
     r"attn_mask_type='causal_top_left' is not a valid AttnMaskType"),
    ("bad_bias_type", dict(attn_bias_type="post_bias"), ValueError, r"attn_bias_type='post_bias' is not a valid AttnBiasType"),
    ("bad_softmax_type", dict(softmax_type="sparse"), ValueError, r"softmax_type='sparse' is not a valid SoftmaxType"),
    ("bad_backend", dict(fused_attention_backend="cudnn"), ValueError,
     r"fused_attention_backend='cudnn' is not a valid FusedAttnBackend"),
    ("bias_missing", dict(attn_bias_type="post_scale_bias"), ValueError,
     r"attn_bias_type=post_scale_bias needs attn_bias, got None"),
    ("bias_dtype", dict(attn_bias_type="post_scale_bias", attn_bias=_t(1, H, S, S, dtype=torch.float32)), TypeError,
     r"attn_bias\.dtype=torch\.float32 must equal q\.dtype=torch\.bfloat16"),
    ("bias_shape_skv", dict(attn_bias_type="post_scale_bias", attn_bias=_t(1, H, S, 8)), ValueError,
     r"attn_bias has shape \[1, 4, 16, 8\]; expected \[1 or b, 1 or h, sq, skv\] = \[1\|2, 1\|4, 16, 16\]"),
    ("bias_shape_heads", dict(attn_bias_type="post_scale_bias", attn_bias=_t(1, 2, S, S)), ValueError,
     r"attn_bias has shape \[1, 2, 16, 16\]"),
    ("bias_shape_3d", dict(attn_bias_type="post_scale_bias", attn_bias=_t(H, S, S)), ValueError,
     r"attn_bias has shape \[4, 16, 16\]"),
    ("bias_not_tensor", dict(attn_bias_type="post_scale_bias", attn_bias=[[0.0]]), TypeError,
     r"attn_bias must be a torch\.Tensor, got list"),
    ("bias_with_no_bias", dict(attn_bias=_t(1, H, S, S)), ValueError,
     r"attn_bias was given but attn_bias_type=no_bias"),
    ("bias_with_alibi", dict(attn_bias=_t(1, H, S, S), attn_bias_type="alibi", attn_mask_type="causal"), ValueError,
     r"attn_bias was given but attn_bias_type=alibi"),
    ("dropout_inference", dict(is_training=False, dropout=0.1), ValueError,
     r"dropout=0\.1 during inference \(is_training=False\)"),
    ("dropout_one", dict(dropout=1.0), ValueError, r"dropout=1\.0 must be in \[0, 1\)"),
    ("dropout_negative", dict(dropout=-0.1), ValueError, r"dropout=-0\.1 must be in \[0, 1\)"),
    ("dropout_str", dict(dropout="0.1"), TypeError, r"dropout must be a number, got str"),
    ("attn_scale_nan", dict(attn_scale=float("nan")), ValueError, r"attn_scale=nan must be finite"),
    ("window_below_minus_one", dict(window_size=(-2, 0)), ValueError,
     r"window_size=\(-2, 0\) entries must be >= -1"),
    ("window_three_entries", dict(window_size=(1, 2, 3)), ValueError,
     r"window_size must be a \(left, right\) pair of ints, got tuple \(1, 2, 3\)"),
    ("window_float_entry", dict(window_size=(1.5, 0)), TypeError,
     r"window_size must hold two ints \(-1 means unbounded\), got \(float 1\.5, int 0\)"),
    ("causal_window_right", dict(attn_mask_type="causal", window_size=(4, 2)), ValueError,
     r"window_size=\(4, 2\) has right=2 but attn_mask_type=causal allows no keys right of the diagonal"),
    ("causal_br_window_right", dict(attn_mask_type="causal_bottom_right", window_size=(-1, 1)), ValueError,
     r"window_size=\(-1, 1\) has right=1 but attn_mask_type=causal_bottom_right"),
    ("is_training_int", dict(is_training=1), TypeError, r"is_training must be a bool, got int 1"),
    ("is_training_none", dict(is_training=None), TypeError, r"is_training must be a bool, got NoneType"),
    ("bottom_right_diagonal_int", dict(bottom_right_diagonal=1), TypeError,
     r"bottom_right_diagonal must be a bool or None, got int"),
    ("fp8_scale_with_bf16", dict(d_scale_qkv=torch.ones(1, dtype=torch.float32)), ValueError,
     r"d_scale_qkv are FP8 scaling arguments, but q is bfloat16"),
    ("fp8_scales_with_bf16", dict(q_scale_o=torch.ones(1), amax_s=torch.ones(1)), ValueError,
     r"q_scale_o, amax_s are FP8 scaling arguments, but q is bfloat16"),
    ("rng_gen_not_generator", dict(rng_gen=1234), TypeError, r"rng_gen must be a torch\.Generator or None, got int"),
]  # fmt: skip


@pytest.mark.parametrize(("over", "exc", "match"), [c[1:] for c in FWD_ERRORS], ids=[c[0] for c in FWD_ERRORS])
def test_fwd_malformed_input(over: dict, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match) as ei:
        fwd(**over)
    assert type(ei.value) is exc  # the plain built-in, not a subclass such as UnsupportedConfigError


def test_fwd_without_is_training_says_so() -> None:
    """Leaving out is_training moves every positional argument up by one: v receives the dtype.
    The message says what v got and the probable cause."""
    q, k, v = _qkv().values()
    with pytest.raises(TypeError) as ei:
        te_cudnn.fused_attn_fwd(S, S, None, None, q, k, v, BF16, None, **KW)
    msg = str(ei.value)
    assert msg.startswith("v must be a torch.Tensor, got the dtype torch.bfloat16 (and is_training=int 16): "
                          "is is_training missing?"), msg  # fmt: skip
    assert "(is_training, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv, q, k, v, qkv_dtype, ...)" in msg
    # a dtype in v's place with is_training given is reported plainly
    with pytest.raises(TypeError, match=r"^v must be a torch\.Tensor, got dtype torch\.bfloat16$"):
        fwd(v=BF16)


def test_fwd_window_not_a_pair() -> None:
    # A scalar window is malformed input: the error must name window_size (not "'int' object is not iterable").
    with pytest.raises((ValueError, TypeError), match=r"window_size"):
        fwd(window_size=5)


def test_fwd_layout_error_lists_every_layout() -> None:
    with pytest.raises(ValueError) as ei:
        fwd(qkv_layout="bshd")
    for layout in te_cudnn.QKVLayout:
        assert repr(layout.name) in str(ei.value)


def test_fwd_errors_are_not_remembered() -> None:
    """A failed call leaves nothing behind: the same malformed call fails the same way again."""
    for _ in range(2):
        with pytest.raises(ValueError, match=r"max_seqlen_q=32"):
            fwd(max_seqlen_q=32)


# ----------------------------------------------------------------------------- THD layouts
def _thd_tensors() -> dict[str, torch.Tensor]:
    t = B * S
    return dict(q=_t(t, H, D), k=_t(t, H, D), v=_t(t, H, D))


def _check_all_backends_named(err: UnsupportedConfigError, fragment: str, dtype: torch.dtype = BF16) -> None:
    """A valid configuration nothing serves: every sub-backend is listed with its reasons, and
    each one that takes ``dtype`` gives ``fragment`` (the root cause) among them."""
    msg = str(err)
    assert isinstance(err, NotImplementedError)
    assert set(err.reasons) == {FusedAttnBackend.F16_arbitrary_seqlen, FusedAttnBackend.F16_max512_seqlen, FusedAttnBackend.FP8}
    for backend, why in err.reasons.items():
        assert re.search(rf"^  {backend.name} declined because:$", msg, re.M), msg
        if dtype in BY_ENUM[backend].caps.dtypes:
            assert any(fragment in r for r in why), (backend.name, why)


def _describe_select(**over: Any):
    """What fused_attn_fwd does before it needs a GPU: describe the call, then select a
    sub-backend for the measured Hopper machine (on the CPU, fused_attn_fwd itself stops at
    the device check first)."""
    a: dict[str, Any] = dict(is_training=True, max_seqlen_q=S, max_seqlen_kv=S, cu_seqlens_q=None, cu_seqlens_kv=None,
                             **_qkv(), qkv_dtype=None, attn_bias=None, attn_scale=None, dropout=0.0,
                             qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias", attn_mask_type="causal",
                             softmax_type="vanilla", window_size=(-1, -1), bottom_right_diagonal=None)  # fmt: skip
    a.update(over)
    return select(describe_fwd(**a), HOPPER_CUDNN_919, None, Direction.FWD)


@pytest.mark.parametrize(("d_qk", "d_v", "dtype", "fragment"), [
    (7, 7, BF16, "head dims d_qk=7, d_v=7 must be multiples of 8"),
    (60, 60, torch.float16, "head dims d_qk=60, d_v=60 must be multiples of 8"),
    (64, 12, BF16, "head dims d_qk=64, d_v=12 must be multiples of 8"),
    (8, 8, torch.float8_e4m3fn, "head dims d_qk=8, d_v=8 must be multiples of 16"),  # 1-byte elements: 16 per row
])  # fmt: skip
def test_head_dim_cudnn_cannot_take_is_reported_as_the_head_dim(d_qk, d_v, dtype, fragment) -> None:
    """Rows that are not 16 bytes (d = 7 in bf16) make every stride unaligned, but the cause is
    the head dim: a valid configuration no sub-backend serves as it comes (UnsupportedConfigError
    naming the head dims), not a stride ValueError. The functions serve F16 ones padded."""
    q, k, v = _t(B, S, H, d_qk, dtype=dtype), _t(B, S, H, d_qk, dtype=dtype), _t(B, S, H, d_v, dtype=dtype)
    with pytest.raises(UnsupportedConfigError) as ei:
        _describe_select(q=q, k=k, v=v)
    _check_all_backends_named(ei.value, fragment, dtype)
    assert "stride" not in str(ei.value)
    # on the CPU the public function gets as far as the device check: no stride error first
    fp8_meta = {n: torch.ones(16) for n in ("d_scale_qkv", "d_scale_s", "q_scale_s", "q_scale_o", "amax_s", "amax_o")}
    with pytest.raises(ValueError, match=NEEDS_CUDA):
        fwd(q=q, k=k, v=v, qkv_dtype=dtype, **(fp8_meta if dtype.itemsize == 1 else {}))
    # explain / get_fused_attn_backend say the same from sizes alone
    ex = te_cudnn.explain(True, dtype, dtype, "bshd_bshd_bshd", "no_bias", "causal", "vanilla", 0.0, H, H, S, S, d_qk, d_v,
                          env=HOPPER_CUDNN_919)  # fmt: skip
    if dtype.itemsize == 1:
        assert ex.backend is FusedAttnBackend.No_Backend
        assert any(fragment in r for r in ex.reasons["FP8"]), ex.reasons
    else:  # the functions serve F16 calls with padded head dims (te_cudnn.served); the sub-backend still declines
        assert ex.backend is FusedAttnBackend.F16_arbitrary_seqlen and "head dims padded" in ex.served_as


def test_unaligned_strides_of_an_aligned_head_dim_are_still_a_stride_error() -> None:
    """The head-dim rule does not hide real stride problems: d = 64 in a buffer padded to 68."""
    with pytest.raises(ValueError, match=r"q has shape \(2, 16, 4, 64\) and strides \(4352, 272, 68, 1\)"):
        _describe_select(q=misaligned)
    with pytest.raises(ValueError, match=r"o has shape .* and strides .*: pass o\.contiguous\(\)"):
        bwd(o=_t(B, S, H, D + 4)[..., :D])


def test_unserved_configuration_lists_every_sub_backend() -> None:
    """pre_scale_bias is valid input no sub-backend fuses: UnsupportedConfigError, not ValueError."""
    with pytest.raises(UnsupportedConfigError) as ei:
        _describe_select(attn_bias_type="pre_scale_bias", attn_bias=_t(1, H, S, S))
    _check_all_backends_named(ei.value, "attn_bias_type=pre_scale_bias")


def test_fwd_thd_layout_needs_cuda_after_validation() -> None:
    """THD layouts are served: a valid CPU call validates, then asks for a CUDA device."""
    cu = torch.tensor([0, S, 2 * S], dtype=torch.int32)
    with pytest.raises(ValueError, match="executes on CUDA devices"):
        fwd(**_thd_tensors(), qkv_layout="thd_thd_thd", attn_mask_type="padding", cu_seqlens_q=cu, cu_seqlens_kv=cu)


def test_paged_layout_needs_page_tables() -> None:
    with pytest.raises(ValueError, match=r"paged_kv_bshd_bshd_bshd needs page_table_k"):
        fwd(qkv_layout="paged_kv_bshd_bshd_bshd", attn_mask_type="padding")


def test_thd_without_padding_mask_is_declined_with_reason() -> None:
    from te_cudnn.backends import REGISTRY, Direction
    from te_cudnn.config import describe_shapes
    from te_cudnn.runtime import HOPPER_CUDNN_919

    cfg = describe_shapes(is_training=True, dtype=torch.bfloat16, qkv_layout="thd_thd_thd", attn_bias_type="no_bias",
                          attn_mask_type="causal", softmax_type="vanilla", dropout=0.0, num_attn_heads=H,
                          num_gqa_groups=H, max_seqlen_q=S, max_seqlen_kv=S, head_dim_qk=D, head_dim_v=D,
                          window_size=(-1, -1), batch_size=B)  # fmt: skip
    why = REGISTRY[0].not_supported_reasons(cfg, HOPPER_CUDNN_919, Direction.FWD)
    assert any("needs a padding mask" in r for r in why), why


# ----------------------------------------------------------------------------- backward errors
BWD_ERRORS = [
    ("aux_too_short", dict(aux_ctx_tensors=_aux()[:1]), ValueError,
     r"aux_ctx_tensors must be the list fused_attn_fwd returned \(\[softmax_stats, rng_state, \(bias\)\]\), got a list "
     r"of length 1$"),
    ("aux_empty", dict(aux_ctx_tensors=[]), ValueError, r"aux_ctx_tensors must be the list .*, got a list of length 0$"),
    ("aux_none", dict(aux_ctx_tensors=None), ValueError,
     r"^aux_ctx_tensors must be the list fused_attn_fwd returned \(.*\), got None$"),
    ("aux_tensor", dict(aux_ctx_tensors=torch.zeros(B, H, S, 1)), ValueError, r"aux_ctx_tensors must be the list .*, got a Tensor$"),
    ("aux_without_bias", dict(attn_bias_type="post_scale_bias", aux_ctx_tensors=_aux()), ValueError,
     r"aux_ctx_tensors"),
    ("stats_shape", dict(aux_ctx_tensors=[torch.zeros(B, H, S), _aux()[1]]), ValueError,
     r"aux_ctx_tensors\[0\] \(softmax stats\) must be a contiguous float32 \[2, 4, 16, 1\] tensor .*, got torch\.float32 \[2, 4, 16\]"),
    ("stats_dtype", dict(aux_ctx_tensors=[_t(B, H, S, 1), _aux()[1]]), ValueError,
     r"aux_ctx_tensors\[0\] \(softmax stats\) must be a contiguous float32 \[2, 4, 16, 1\] tensor .*, got torch\.bfloat16"),
    ("stats_not_contiguous", dict(aux_ctx_tensors=[torch.zeros(B, S, H, 1).transpose(1, 2), _aux()[1]]), ValueError,
     r"aux_ctx_tensors\[0\] \(softmax stats\) must be a contiguous float32"),
    ("rng_state_dtype", dict(aux_ctx_tensors=[_aux()[0], torch.zeros(2, dtype=torch.int32)]), ValueError,
     r"aux_ctx_tensors\[1\] \(rng_state\) must be int64 \[2\], got torch\.int32 \[2\]"),
    ("rng_state_shape", dict(aux_ctx_tensors=[_aux()[0], torch.zeros(3, dtype=torch.int64)]), ValueError,
     r"aux_ctx_tensors\[1\] \(rng_state\) must be int64 \[2\], got torch\.int64 \[3\]"),
    ("bias_aux_shape", dict(attn_bias_type="post_scale_bias", aux_ctx_tensors=[*_aux(), _t(1, H, S, 8)]), ValueError,
     r"attn_bias has shape \[1, 4, 16, 8\]"),
    ("d_o_shape", dict(d_o=_t(B, S, H, 32)), ValueError,
     r"d_o must have shape \[2, 16, 4, 64\] \(q's with head dim d_v\), got \[2, 16, 4, 32\]"),
    ("o_shape", dict(o=_t(B, S, 2, D)), ValueError, r"o must have shape \[2, 16, 4, 64\]"),
    ("d_o_dtype", dict(d_o=_t(B, S, H, D, dtype=torch.float16)), TypeError,
     r"d_o\.dtype=torch\.float16 differs from q\.dtype=torch\.bfloat16"),
    ("d_o_last_dim_strided", dict(d_o=_t(B, S, H, 2 * D)[..., ::2]), ValueError,
     r"d_o must have a unit-stride last dimension"),
    ("d_o_not_tensor", dict(d_o=[[0.0]]), TypeError, r"d_o must be a torch\.Tensor, got list"),
    ("deterministic_int", dict(deterministic=1), TypeError, r"deterministic must be a bool, got int"),
    ("deterministic_none", dict(deterministic=None), TypeError, r"deterministic must be a bool, got NoneType"),
    ("q_float32", dict(q=_t(B, S, H, D, dtype=torch.float32)), TypeError, r"q\.dtype=torch\.float32"),
    ("max_seqlen_kv", dict(max_seqlen_kv=32), ValueError, r"max_seqlen_kv=32 but k holds 16 positions"),
    ("dropout_one", dict(dropout=1.0), ValueError, r"dropout=1\.0 must be in \[0, 1\)"),
    ("causal_window_right", dict(attn_mask_type="causal", window_size=(0, 3)), ValueError,
     r"window_size=\(0, 3\) has right=3 but attn_mask_type=causal"),
    ("fp8_scale_with_bf16", dict(d_scale_do=torch.ones(1)), ValueError,
     r"d_scale_do are FP8 scaling arguments, but q is bfloat16"),
    ("bad_layout_name", dict(qkv_layout="bs2hd"), ValueError, r"qkv_layout='bs2hd' is not a valid QKVLayout"),
]  # fmt: skip


@pytest.mark.parametrize(("over", "exc", "match"), [c[1:] for c in BWD_ERRORS], ids=[c[0] for c in BWD_ERRORS])
def test_bwd_malformed_input(over: dict, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match) as ei:
        bwd(**over)
    assert type(ei.value) is exc


def test_bwd_aux_not_a_list() -> None:
    with pytest.raises(ValueError, match=r"aux_ctx_tensors must be the list fused_attn_fwd returned.*, got None$"):
        bwd(aux_ctx_tensors=None)


# ----------------------------------------------------------------------------- first mistakes
def _three(*shape: int) -> dict[str, torch.Tensor]:
    return dict(q=_t(*shape), k=_t(*shape), v=_t(*shape))


def test_te_default_layout_with_bshd_tensors() -> None:
    """qkv_layout left at TransformerEngine's default (sbh3d) with [b, s, h, d] tensors."""
    with pytest.raises(ValueError) as ei:
        fwd(**_three(2, 128, H, D), max_seqlen_q=128, max_seqlen_kv=128, qkv_layout="sbh3d")
    assert str(ei.value) == (
        "max_seqlen_q=128 but q holds 2 positions (qkv_layout=sbh3d); sbh3d is TransformerEngine's default qkv_layout "
        'and reads q as [s, b, h, d], but the sizes fit [b, s, h, d]: pass qkv_layout="bshd_bshd_bshd"'
    )
    packed = dict(zip("qkv", _t(2, 128, H, 3, D).unbind(3)))  # views of one [b, s, h, 3, d] buffer keep their packing
    with pytest.raises(ValueError, match=r'the sizes fit \[b, s, h, d\]: pass qkv_layout="bsh3d"$'):
        fwd(**packed, max_seqlen_q=128, max_seqlen_kv=128, qkv_layout="sbh3d")
    with pytest.raises(ValueError, match=r'sbhd_sbhd_sbhd reads q as \[s, b, h, d\].*pass qkv_layout="bshd_bshd_bshd"$'):
        fwd(**_three(2, 128, H, D), max_seqlen_q=128, max_seqlen_kv=128, qkv_layout="sbhd_sbhd_sbhd")


@pytest.mark.parametrize("layout", ["bshd_bshd_bshd", "sbhd_sbhd_sbhd", "sbh3d"])
def test_bhsd_tensors_get_the_transpose_hint(layout: str) -> None:
    """torch SDPA's [b, h, s, d] tensors passed with a bshd or sbhd layout."""
    with pytest.raises(ValueError) as ei:
        fwd(**_three(2, H, 128, D), max_seqlen_q=128, max_seqlen_kv=128, qkv_layout=layout)
    message = str(ei.value)
    assert message.startswith("max_seqlen_q=128 but q holds "), message
    assert ("q, k and v look like [b, h, s, d] (torch SDPA's order)" in message
            and 'pass q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2) with qkv_layout="bshd_bshd_bshd"' in message)
    assert ("TransformerEngine's default" in message) == (layout == "sbh3d")


def test_bhsd_decode_tensors_get_the_transpose_hint() -> None:
    """One query against 128 keys in [b, h, s, d]: read as bshd the head counts fail first."""
    with pytest.raises(ValueError, match=r"k/v have 128 heads.*look like \[b, h, s, d\].*q\.transpose\(1, 2\)"):
        fwd(q=_t(2, H, 1, D), k=_t(2, H, 128, D), v=_t(2, H, 128, D), max_seqlen_q=1, max_seqlen_kv=128)


def test_no_hint_when_no_reading_fits() -> None:
    with pytest.raises(ValueError) as ei:
        fwd(max_seqlen_q=32)
    assert str(ei.value) == "max_seqlen_q=32 but q holds 16 positions (qkv_layout=bshd_bshd_bshd)"


def test_numpy_array_is_named_not_printed() -> None:
    np = pytest.importorskip("numpy")
    big = np.arange(2 * S * H * D, dtype=np.float32).reshape(B, S, H, D)
    with pytest.raises(TypeError) as ei:
        fwd(q=big)
    assert str(ei.value) == ("q must be a torch.Tensor, got numpy.ndarray of shape [2, 16, 4, 64] and dtype float32; "
                             'convert it with torch.as_tensor(q, device="cuda")')  # fmt: skip
    with pytest.raises(TypeError, match=r"^q must be a torch\.Tensor, got numpy\.ndarray of shape \[2, 16, 4, 64\]"):
        te_cudnn.fused_attention(big, big, big)
    with pytest.raises(TypeError, match=r"cu_seqlens_q must be a torch\.Tensor, got numpy\.ndarray of shape \[3\]"):
        fwd(cu_seqlens_q=np.array([0, S, 2 * S], dtype=np.int32), attn_mask_type="padding")


def test_help_of_fused_attention_lists_every_option() -> None:
    import inspect
    import pydoc

    from te_cudnn.autograd import _OPTION_NAMES

    text = pydoc.render_doc(te_cudnn.fused_attention, renderer=pydoc.plaintext)
    lines = text.splitlines()
    keywords = [n for n, p in inspect.signature(te_cudnn.fused_attention).parameters.items() if p.kind == p.KEYWORD_ONLY]
    assert {"attn_bias", "cu_seqlens_q", "is_training", "lengths"} <= set(keywords)
    for name in (*_OPTION_NAMES, *keywords):
        assert sum(line.strip().startswith((f"- ``{name}``", f"- ``{name}=")) for line in lines) == 1, name


def test_preallocated_out_must_match() -> None:
    with pytest.raises(ValueError, match=r"out must be a contiguous bfloat16 tensor of shape \[2, 16, 4, 64\]"):
        fwd(out=torch.empty(2, 16, 4, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"softmax_lse must be a contiguous float32 tensor of shape \[2, 4, 16, 1\]"):
        fwd(softmax_lse=torch.empty(2, 4, 16, 1, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="out must be a torch.Tensor or None"):
        fwd(out="buffer")
