"""``te_cudnn.DotProductAttention`` without a GPU: constructor validation, TransformerEngine's
defaults, forward validation that fails before any GPU work, what the forward hands the
attention core (layout, masks, cu_seqlens, lengths, options), output shapes through the
custom ops' meta implementations, and the eager path's CUDA-device error."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import te_cudnn
from te_cudnn import DotProductAttention, Fp8AttentionMeta, module, torch_ops
from te_cudnn.autograd import AttnOptions

BF16 = torch.bfloat16




def _t(*shape: int, device: str = "meta", dtype: torch.dtype = BF16, grad: bool = False) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device, requires_grad=grad)


# ================================================================================ constructor


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_attention_heads=0), r"^num_attention_heads must be a positive int, got 0$"),
        (dict(num_attention_heads=-2), r"^num_attention_heads must be a positive int, got -2$"),
        (dict(num_attention_heads=4.0), r"^num_attention_heads must be a positive int, got 4\.0$"),
        (dict(num_attention_heads=True), r"^num_attention_heads must be a positive int, got True$"),
        (dict(num_gqa_groups=0), r"^num_gqa_groups must be a positive int or None, got 0$"),
        (dict(num_gqa_groups=3), r"^num_gqa_groups=3 must divide num_attention_heads=8$"),
        (dict(num_gqa_groups=16), r"^num_gqa_groups=16 must divide num_attention_heads=8$"),
        (dict(kv_channels=0), r"^kv_channels must be a positive int or a \(d_qk, d_v\) pair, got "),
        (dict(kv_channels=(64,)), r"^kv_channels must be .* got \(64,\)$"),
        (dict(kv_channels=(64, 0)), r"^kv_channels must be .* got \(64, 0\)$"),
        (dict(kv_channels="64"), r"^kv_channels must be .* got '64'$"),
        (dict(kv_channels=True), r"^kv_channels must be .* got True$"),
        (dict(qkv_format="bhsd"), r"^qkv_format='bhsd' is not one of 'sbhd', 'bshd', 'thd'$"),
        (dict(qkv_format="BSHD"), r"^qkv_format='BSHD' is not one of 'sbhd', 'bshd', 'thd'$"),
        (dict(attn_mask_type="full"), r"^attn_mask_type='full' is not one of 'no_mask', 'padding', 'causal', "),
        (dict(attention_type="decoder"), r"^attention_type='decoder' is not one of 'self', 'cross'$"),
        (dict(attention_dropout=1.0), r"^attention_dropout must be in \[0, 1\), got 1\.0$"),
        (dict(attention_dropout=-0.1), r"^attention_dropout must be in \[0, 1\), got -0\.1$"),
        (dict(attention_dropout="0.1"), r"^attention_dropout must be in \[0, 1\), got '0\.1'$"),
        (dict(window_size=(128,)), r"^window_size must be None or a \(left, right\) pair of ints >= -1, got \(128,\)$"),
        (dict(window_size=128), r"^window_size must be None or a \(left, right\) pair of ints >= -1, got 128$"),
    ],
    ids=["heads-0", "heads-negative", "heads-float", "heads-bool", "gqa-0", "gqa-not-dividing", "gqa-above-heads",
         "kv_channels-0", "kv_channels-1-tuple", "kv_channels-0-dv", "kv_channels-str", "kv_channels-bool",
         "format-bhsd", "format-uppercase", "mask-unknown", "attention_type", "dropout-1", "dropout-negative",
         "dropout-str", "window-1-tuple", "window-int"],
)  # fmt: skip
def test_constructor_rejects(kwargs: dict, message: str) -> None:
    args = dict(num_attention_heads=8, kv_channels=64)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        DotProductAttention(**args)


def test_te_defaults(monkeypatch) -> None:
    monkeypatch.delenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", raising=False)
    m = DotProductAttention(16, 64)
    assert m.qkv_format == "sbhd" and m.attn_mask_type == "causal" and m.attention_type == "self"
    assert m.num_attention_heads == m.num_gqa_groups == 16
    assert (m.hidden_size_per_attention_head_k, m.hidden_size_per_attention_head_v) == (64, 64)
    assert m.softmax_scale == 1.0 / math.sqrt(64) == 0.125
    assert m.window_size == (-1, 0)  # unbounded, causal
    assert m.attention_dropout == 0.0 and m.fp8_meta is None and m.layer_number is None
    assert m.deterministic is False
    assert "qkv_format='sbhd'" in repr(m) and "attn_mask_type='causal'" in repr(m)
    assert list(m.parameters()) == [] and list(m.buffers()) == []


def test_signature_follows_te() -> None:
    init = list(inspect.signature(DotProductAttention.__init__).parameters)[1:]
    assert init[:7] == ["num_attention_heads", "kv_channels", "num_gqa_groups", "attention_dropout", "qkv_format",
                        "attn_mask_type", "window_size"]  # fmt: skip
    fwd = list(inspect.signature(DotProductAttention.forward).parameters)[1:]
    assert fwd[:7] == ["query_layer", "key_layer", "value_layer", "attention_mask", "qkv_format", "cu_seqlens_q",
                       "cu_seqlens_kv"]  # fmt: skip
    assert {"core_attention_bias_type", "core_attention_bias", "max_seqlen_q", "max_seqlen_kv", "attn_mask_type",
            "window_size", "fast_zero_fill", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"} <= set(fwd)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "scale", "window"),
    [
        (dict(kv_channels=(128, 64)), 1.0 / math.sqrt(128), (-1, 0)),
        (dict(softmax_scale=0.5), 0.5, (-1, 0)),
        (dict(attn_mask_type="no_mask"), 0.125, (-1, -1)),
        (dict(attn_mask_type="padding"), 0.125, (-1, -1)),
        (dict(attn_mask_type="padding_causal"), 0.125, (-1, 0)),
        (dict(attn_mask_type="causal_bottom_right"), 0.125, (-1, 0)),
        (dict(window_size=(128, 0)), 0.125, (128, 0)),
        (dict(attn_mask_type="no_mask", window_size=[32, 16]), 0.125, (32, 16)),
    ],
    ids=["dqk-scale", "explicit-scale", "no_mask-window", "padding-window", "padding_causal-window",
         "bottom_right-window", "explicit-window", "list-window"],
)  # fmt: skip
def test_scale_and_window(kwargs: dict, scale: float, window: tuple) -> None:
    args = dict(num_attention_heads=8, kv_channels=64)
    args.update(kwargs)
    m = DotProductAttention(**args)
    assert m.softmax_scale == pytest.approx(scale, rel=1e-12)
    assert m.window_size == window


@pytest.mark.parametrize(("env", "arg", "expected"),
                         [(None, None, False), ("0", None, True), ("1", None, False), ("0", False, False),
                          ("1", True, True)],
                         ids=["unset", "env-0", "env-1", "arg-over-env-0", "arg-over-env-1"])  # fmt: skip
def test_deterministic_from_te_env(monkeypatch, env, arg, expected) -> None:
    if env is None:
        monkeypatch.delenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", raising=False)
    else:
        monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", env)
    assert DotProductAttention(4, 64, deterministic=arg).deterministic is expected


# ================================================================================ forward validation


@pytest.fixture
def no_core(monkeypatch):
    """The attention core may not be reached: validation must fail first."""

    def reached(*args, **kwargs):
        raise AssertionError("the attention core was called: validation should have failed before it")

    monkeypatch.setattr(module, "attend", reached)
    monkeypatch.setattr(module, "attend_fp8", reached)


H, HG, D, DV = 8, 2, 64, 32


def _gqa(fmt: str = "bshd", **kw) -> DotProductAttention:
    return DotProductAttention(H, (D, DV), num_gqa_groups=HG, qkv_format=fmt, **kw)


def _qkv(fmt: str, b: int = 2, sq: int = 16, skv: int = 16):
    if fmt == "sbhd":
        return _t(sq, b, H, D), _t(skv, b, HG, D), _t(skv, b, HG, DV)
    if fmt == "bshd":
        return _t(b, sq, H, D), _t(b, skv, HG, D), _t(b, skv, HG, DV)
    return _t(b * sq, H, D), _t(b * skv, HG, D), _t(b * skv, HG, DV)


@pytest.mark.parametrize(
    ("fmt", "which", "shape", "message"),
    [
        ("sbhd", "q", (2, H, D), r"^query_layer has shape \[2, 8, 64\]; qkv_format='sbhd' expects \[s, b, h, d\] "
                                 r"with 8 heads of dim 64$"),
        ("bshd", "q", (2, 16, 4, H, D), r"^query_layer has shape \[2, 16, 4, 8, 64\]; qkv_format='bshd' expects "
                                        r"\[b, s, h, d\] with 8 heads of dim 64$"),
        ("thd", "q", (2, 16, H, D), r"^query_layer has shape \[2, 16, 8, 64\]; qkv_format='thd' expects \[t, h, d\]"),
        ("bshd", "q", (2, 16, 4, D), r"^query_layer has shape \[2, 16, 4, 64\].* with 8 heads of dim 64$"),
        ("bshd", "k", (2, 16, H, D), r"^key_layer has shape \[2, 16, 8, 64\].* with 2 heads of dim 64$"),
        ("bshd", "v", (2, 16, HG, D), r"^value_layer has shape \[2, 16, 2, 64\].* with 2 heads of dim 32$"),
        ("bshd", "q", (2, 16, H, 128), r"^query_layer has shape \[2, 16, 8, 128\].* with 8 heads of dim 64$"),
        ("sbhd", "k", (16, 2, HG, DV), r"^key_layer has shape \[16, 2, 2, 32\].* with 2 heads of dim 64$"),
    ],
    ids=["sbhd-3d", "bshd-5d", "thd-4d", "q-heads", "k-heads-not-gqa", "v-head-dim", "q-head-dim", "k-head-dim"],
)  # fmt: skip
def test_forward_rejects_shapes(no_core, fmt: str, which: str, shape: tuple, message: str) -> None:
    m = _gqa(fmt)
    q, k, v = _qkv(fmt)
    args = {"q": q, "k": k, "v": v}
    args[which] = _t(*shape)
    cu = torch.zeros(3, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=message):
        m(args["q"], args["k"], args["v"], cu_seqlens_q=cu, cu_seqlens_kv=cu)


def test_forward_rejects_non_tensors(no_core) -> None:
    q, k, v = _qkv("bshd")
    with pytest.raises(TypeError, match=r"^key_layer must be a torch.Tensor, got list$"):
        _gqa()(q, [1, 2], v)


BSHD = dict(fmt="bshd")


@pytest.mark.parametrize(
    ("make", "call", "message"),
    [
        (dict(), dict(core_attention_bias_type="post_scale_bias"),
         r"^core_attention_bias_type='post_scale_bias' and core_attention_bias=None disagree"),
        (dict(), dict(core_attention_bias="bias"),
         r"^core_attention_bias_type='no_bias' and core_attention_bias=a tensor disagree"),
        (dict(), dict(core_attention_bias_type="pre_scale_bias", core_attention_bias="bias"),
         r"^core_attention_bias_type='pre_scale_bias' is not one of 'no_bias', 'post_scale_bias', 'alibi'$"),
        (dict(attn_mask_type="padding"), dict(),
         r"^attn_mask_type='padding' needs attention_mask or cu_seqlens_q/cu_seqlens_kv$"),
        (dict(), dict(attn_mask_type="padding_causal"),
         r"^attn_mask_type='padding_causal' needs attention_mask or cu_seqlens_q/cu_seqlens_kv$"),
        (dict(fmt="thd", attn_mask_type="padding"), dict(),
         r"^qkv_format='thd' needs cu_seqlens_q and cu_seqlens_kv \(int32 \[b \+ 1\]\)$"),
        (dict(fmt="thd", attn_mask_type="padding", attention_type="cross"), dict(cu_seqlens_q="cu"),
         r"^qkv_format='thd' needs cu_seqlens_q and cu_seqlens_kv"),
        (dict(), dict(attention_mask="mask"),
         r"^attention_mask was given but attn_mask_type='causal' does not use it"),
        (dict(attn_mask_type="no_mask"), dict(attention_mask="mask"),
         r"^attention_mask was given but attn_mask_type='no_mask' does not use it"),
        (dict(attn_mask_type="padding", attention_type="cross"), dict(attention_mask="mask"),
         r"^attention_mask must be a \(q_mask, kv_mask\) pair of bool \[b, 1, 1, s\] tensors \(True = padding\), got Tensor$"),
        (dict(attn_mask_type="padding"), dict(attention_mask="int-mask"),
         r"^attention_mask must be a bool \[b, 1, 1, 16\] padding mask \(True = masked out\), got torch.int32"),
        (dict(attn_mask_type="arbitrary"), dict(),
         r"^attn_mask_type='arbitrary' needs a bool attention_mask of shape \[1\|2, 1\|8, 1\|16, 1\|16\] \(True = masked out\), got NoneType$"),
        (dict(fmt="thd", attn_mask_type="arbitrary"), dict(attention_mask="mask"),
         r"^attn_mask_type='arbitrary' is not supported with qkv_format='thd'$"),
        (dict(attention_dropout=0.1, fp8=True), dict(),
         r"^FP8 attention \(fp8_meta\) takes no dropout, bias or sliding window"),
        (dict(fp8=True), dict(core_attention_bias_type="post_scale_bias", core_attention_bias="bias"),
         r"^FP8 attention \(fp8_meta\) takes no dropout, bias or sliding window"),
        (dict(fp8=True, window_size=(64, 0)), dict(),
         r"^FP8 attention \(fp8_meta\) takes no dropout, bias or sliding window"),
        (dict(), dict(qkv_format="hbsd"), r"^qkv_format='hbsd' is not one of 'sbhd', 'bshd', 'thd'$"),
        (dict(), dict(attn_mask_type="diagonal"), r"^attn_mask_type='diagonal' is not one of "),
        (dict(), dict(window_size=(1, 2, 3)), r"^window_size must be None or a \(left, right\) pair"),
    ],
    ids=["bias-type-without-tensor", "tensor-without-bias-type", "pre_scale_bias", "padding-without-lengths",
         "per-call-padding-without-lengths", "thd-without-cu_seqlens", "thd-cross-without-cu_seqlens_kv",
         "mask-with-causal", "mask-with-no_mask", "cross-single-padding-mask", "int-padding-mask",
         "arbitrary-without-mask", "arbitrary-thd", "fp8-dropout-training", "fp8-bias", "fp8-window",
         "per-call-format", "per-call-mask", "per-call-window"],
)  # fmt: skip
def test_forward_rejects(no_core, make: dict, call: dict, message: str) -> None:
    make = dict(make)
    fmt = make.pop("fmt", "bshd")
    if make.pop("fp8", False):
        make["fp8_meta"] = Fp8AttentionMeta(device="meta")
    m = _gqa(fmt, **make).train()
    q, k, v = _qkv(fmt)
    values = {"bias": _t(1, H, 16, 16), "mask": torch.zeros(2, 1, 1, 16, dtype=torch.bool, device="meta"),
              "int-mask": torch.zeros(2, 1, 1, 16, dtype=torch.int32, device="meta"),
              "cu": torch.zeros(3, dtype=torch.int32, device="meta")}  # fmt: skip
    call = {name: values.get(value, value) if isinstance(value, str) and name not in
            ("core_attention_bias_type", "attn_mask_type", "qkv_format") else value
            for name, value in call.items()}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        m(q, k, v, **call)


def test_fp8_in_eval_is_no_error(no_core) -> None:
    """Dropout only applies in training: an FP8 module with attention_dropout > 0 runs in eval."""
    m = _gqa("bshd", attention_dropout=0.1, fp8_meta=Fp8AttentionMeta(device="meta")).eval()
    with pytest.raises(AssertionError, match="attention core was called"):
        m(*_qkv("bshd"))


# ================================================================================ padding masks


def _lengths_mask(lengths: list, s: int) -> torch.Tensor:
    """TE's padding mask: bool [b, 1, 1, s], True = padding (at the end of each sequence)."""
    return (torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None]).view(len(lengths), 1, 1, s)


@pytest.mark.parametrize("lengths", [[16, 16], [5, 16, 0], [1], [3, 7, 11, 2]], ids=["full", "with-empty", "one",
                                                                                      "four"])  # fmt: skip
def test_cu_seqlens_from_mask(lengths: list) -> None:
    s = 16
    mask = _lengths_mask(lengths, s)
    got = module._cu_seqlens_from_mask(mask, "attention_mask")
    expected = [0]
    for n in lengths:  # by hand: the running total of each row's unmasked positions
        expected.append(expected[-1] + n)
    assert got.dtype == torch.int32 and got.shape == (len(lengths) + 1,)
    assert got.tolist() == expected


def test_cu_seqlens_from_mask_counts_unmasked_positions() -> None:
    mask = torch.tensor([[True, False, False, True], [False] * 4]).view(2, 1, 1, 4)
    assert module._cu_seqlens_from_mask(mask, "m").tolist() == [0, 2, 6]
    expanded = torch.zeros(1, 1, 1, 4, dtype=torch.bool).expand(3, 1, 1, 4)  # stride 0 over b
    assert module._cu_seqlens_from_mask(expanded, "m").tolist() == [0, 4, 8, 12]


@pytest.mark.parametrize(
    "mask",
    [torch.zeros(2, 16, dtype=torch.bool), torch.zeros(2, 1, 16, 16, dtype=torch.bool),
     torch.zeros(2, 1, 1, 16, dtype=torch.uint8), torch.zeros(2, 2, 1, 16, dtype=torch.bool)],
    ids=["2d", "per-query", "uint8", "per-head"],
)  # fmt: skip
def test_cu_seqlens_from_mask_rejects(mask: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"^attention_mask\[1\] must be a bool \[b, 1, 1, s\] padding mask"):
        module._cu_seqlens_from_mask(mask, "attention_mask[1]")


# ================================================================================ what the core receives


class Spy:
    """Stands in for the attention core: records its arguments, returns O's shape."""

    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, q, k, v, bias, cu_q, cu_kv, max_q, max_kv, is_training, rng_gen, opts, cu_qp=None,
                 cu_kvp=None, softmax_offset=None, _prepared=None):  # fmt: skip
        self.calls.append(dict(q=q, k=k, v=v, bias=bias, cu_q=cu_q, cu_kv=cu_kv, max_q=max_q, max_kv=max_kv,
                               is_training=is_training, rng_gen=rng_gen, opts=opts, cu_qp=cu_qp,
                               cu_kvp=cu_kvp, softmax_offset=softmax_offset))  # fmt: skip
        return torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)

    @property
    def last(self) -> dict:
        return self.calls[-1]


@pytest.fixture
def spy(monkeypatch) -> Spy:
    s = Spy()
    monkeypatch.setattr(module, "attend", s)
    return s


def _cpu_qkv(fmt: str, b: int = 2, sq: int = 16, skv: int = 16):
    return tuple(torch.zeros(x.shape, dtype=BF16) for x in _qkv(fmt, b, sq, skv))


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_padding_mask_becomes_cu_seqlens(spy, fmt: str) -> None:
    m = _gqa(fmt, attn_mask_type="padding")
    q, k, v = _cpu_qkv(fmt)
    out = m(q, k, v, attention_mask=_lengths_mask([5, 12], 16))
    c = spy.last
    assert c["cu_q"].tolist() == [0, 5, 17] and c["cu_kv"] is c["cu_q"]  # self attention: one mask
    assert c["cu_q"].dtype == torch.int32
    assert c["opts"].attn_mask_type == "padding" and c["opts"].qkv_layout == f"{fmt}_{fmt}_{fmt}"
    assert (c["max_q"], c["max_kv"]) == (16, 16)
    assert out.shape == (*q.shape[:-2], H * DV)


def test_cross_padding_masks_pair(spy) -> None:
    m = _gqa("bshd", attn_mask_type="padding_causal_bottom_right", attention_type="cross")
    q, k, v = _cpu_qkv("bshd", sq=8, skv=24)
    m(q, k, v, attention_mask=(_lengths_mask([8, 3], 8), _lengths_mask([20, 24], 24)))
    c = spy.last
    assert c["cu_q"].tolist() == [0, 8, 11] and c["cu_kv"].tolist() == [0, 20, 44]
    assert (c["max_q"], c["max_kv"]) == (8, 24)
    assert c["opts"].attn_mask_type == "padding_causal_bottom_right" and c["opts"].window_size == (-1, 0)


def test_given_cu_seqlens_pass_through(spy) -> None:
    m = _gqa("sbhd", attn_mask_type="padding")
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)
    m(*_cpu_qkv("sbhd"), cu_seqlens_q=cu)
    assert spy.last["cu_q"] is cu and spy.last["cu_kv"] is cu  # self attention reuses the q lengths


@pytest.mark.parametrize(("mask", "core_mask", "window"),
                         [("causal", "padding_causal", (-1, 0)), ("no_mask", "padding", (-1, -1)),
                          ("padding", "padding", (-1, -1)),
                          ("causal_bottom_right", "padding_causal_bottom_right", (-1, 0))],
                         ids=["causal", "no_mask", "padding", "causal_bottom_right"])  # fmt: skip
def test_thd_masks_become_padding_masks(spy, mask: str, core_mask: str, window: tuple) -> None:
    m = _gqa("thd", attn_mask_type=mask)
    q, k, v = _cpu_qkv("thd", b=3, sq=8, skv=8)
    cu = torch.tensor([0, 8, 16, 24], dtype=torch.int32)
    out = m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    c = spy.last
    assert c["opts"].attn_mask_type == core_mask and c["opts"].qkv_layout == "thd_thd_thd"
    assert c["opts"].window_size == window
    assert (c["max_q"], c["max_kv"]) == (24, 24)  # the token counts bound the lengths (no host sync)
    assert out.shape == (24, H * DV)
    m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=8, max_seqlen_kv=8)
    assert (spy.last["max_q"], spy.last["max_kv"]) == (8, 8)


def test_thd_packed_views_keep_their_layout(spy) -> None:
    """Eager mode names THD views of one [t, 3, h, d] buffer t3hd (separate tensors otherwise)."""
    m = DotProductAttention(4, 64, qkv_format="thd", attn_mask_type="padding")
    q, k, v = torch.zeros(24, 3, 4, 64, dtype=BF16).unbind(1)
    cu = torch.tensor([0, 8, 24], dtype=torch.int32)
    out = m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert spy.last["opts"].qkv_layout == "t3hd" and out.shape == (24, 256)
    m(q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert spy.last["opts"].qkv_layout == "thd_thd_thd"


def test_options_reach_the_core(spy, monkeypatch) -> None:
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
    m = _gqa("sbhd", attention_dropout=0.25, softmax_scale=0.3, window_size=(64, 0))
    q, k, v = _cpu_qkv("sbhd")
    m.train()
    m(q, k, v)
    o: AttnOptions = spy.last["opts"]
    assert (o.attn_scale, o.dropout, o.window_size, o.deterministic) == (0.3, 0.25, (64, 0), True)
    assert (o.attn_mask_type, o.attn_bias_type, o.qkv_layout) == ("causal", "no_bias", "sbhd_sbhd_sbhd")
    assert spy.last["is_training"] is True and spy.last["rng_gen"] is None
    m.eval()
    m(q, k, v)
    assert spy.last["opts"].dropout == 0.0 and spy.last["is_training"] is True  # grad enabled: a backward may follow
    with torch.no_grad():
        m(q, k, v)
    assert spy.last["is_training"] is False
    # a per-call mask type recomputes the window from it (TE: None = unbounded)
    m(q, k, v, attn_mask_type="no_mask")
    assert spy.last["opts"].window_size == (-1, -1) and spy.last["opts"].attn_mask_type == "no_mask"
    m(q, k, v, window_size=(8, 8))
    assert spy.last["opts"].window_size == (8, 8)


def test_changed_attributes_reach_the_core(spy) -> None:
    m = _gqa("bshd")
    q, k, v = _cpu_qkv("bshd")
    m(q, k, v)
    m.softmax_scale, m.deterministic = 0.5, True
    m(q, k, v)
    assert (spy.last["opts"].attn_scale, spy.last["opts"].deterministic) == (0.5, True)


def test_bias_reaches_the_core(spy) -> None:
    m = _gqa("bshd", attn_mask_type="no_mask")
    q, k, v = _cpu_qkv("bshd")
    bias = torch.zeros(1, H, 16, 16, dtype=BF16)
    m(q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    assert spy.last["bias"] is bias and spy.last["opts"].attn_bias_type == "post_scale_bias"


def test_arbitrary_mask_becomes_a_bias(spy) -> None:
    m = _gqa("bshd", attn_mask_type="arbitrary")
    q, k, v = _cpu_qkv("bshd", sq=4, skv=4)
    mask = torch.tensor([[False, True, True, True], [False, False, True, True], [False] * 4, [True] * 4])
    m(q, k, v, attention_mask=mask.view(1, 1, 4, 4))
    c = spy.last
    assert c["opts"].attn_bias_type == "post_scale_bias" and c["opts"].attn_mask_type == "no_mask"
    assert c["bias"].shape == (1, 1, 4, 4) and c["bias"].dtype == BF16
    lowest = torch.finfo(BF16).min
    assert torch.equal(c["bias"][0, 0] == lowest, mask) and bool((c["bias"][0, 0][~mask] == 0).all())


# ================================================================================ output shapes (meta)


@pytest.fixture
def custom_ops(monkeypatch):
    """The custom-op path in eager mode (as TE_CUDNN_CUSTOM_OPS=1): on meta tensors the ops'
    fake implementations give the results' shapes."""
    monkeypatch.setattr(torch_ops, "_FORCE_OPS", True)
    assert torch_ops.use_custom_ops() is True


@pytest.mark.parametrize(
    ("fmt", "attention_type", "sq", "skv"),
    [("sbhd", "self", 16, 16), ("bshd", "self", 16, 16), ("thd", "self", 16, 16), ("sbhd", "cross", 8, 24),
     ("bshd", "cross", 8, 24), ("thd", "cross", 8, 24)],
    ids=["sbhd", "bshd", "thd", "sbhd-cross", "bshd-cross", "thd-cross"],
)  # fmt: skip
def test_output_shape_on_meta(custom_ops, fmt: str, attention_type: str, sq: int, skv: int) -> None:
    m = _gqa(fmt, attention_type=attention_type, attn_mask_type="no_mask").train()
    b = 3
    q, k, v = (t.detach().requires_grad_() for t in _qkv(fmt, b, sq, skv))
    cu_q = torch.zeros(b + 1, dtype=torch.int32, device="meta")
    cu_kv = torch.zeros(b + 1, dtype=torch.int32, device="meta")
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv) if fmt == "thd" else {}
    out = m(q, k, v, **kw)
    want = {"sbhd": (sq, b, H * DV), "bshd": (b, sq, H * DV), "thd": (b * sq, H * DV)}[fmt]
    assert out.shape == want and out.dtype == BF16 and out.device.type == "meta" and out.is_contiguous()
    out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (q, k, v))


def test_output_shape_with_bias_and_dropout_on_meta(custom_ops) -> None:
    m = DotProductAttention(4, 64, attention_dropout=0.1, qkv_format="bshd").train()
    q = _t(2, 16, 4, 64, grad=True)
    bias = _t(2, 4, 16, 16, grad=True)
    out = m(q, q, q, core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    assert out.shape == (2, 16, 256)
    out.sum().backward()
    assert q.grad.shape == q.shape and bias.grad.shape == bias.shape


def test_fp8_output_shape_on_meta(custom_ops) -> None:
    meta = Fp8AttentionMeta(device="meta")
    m = DotProductAttention(4, 128, qkv_format="sbhd", fp8_meta=meta).eval()
    q = _t(16, 2, 4, 128, grad=True)
    out = m(q, q, q)
    assert out.shape == (16, 2, 512) and out.dtype == BF16
    out.sum().backward()
    assert q.grad.shape == q.shape and q.grad.dtype == BF16
    # a per-call fp8_meta takes precedence over none at construction
    out = DotProductAttention(4, 128, qkv_format="bshd").eval()(q.transpose(0, 1), q.transpose(0, 1),
                                                               q.transpose(0, 1), fp8_meta=meta)  # fmt: skip
    assert out.shape == (2, 16, 512)


# ================================================================================ eager on a CPU tensor


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_cpu_forward_needs_cuda(fmt: str) -> None:
    m = _gqa(fmt)
    q, k, v = _cpu_qkv(fmt)
    with pytest.raises(ValueError, match=r"q is on cpu; fused attention executes on CUDA devices"):
        m(q, k, v)


def test_cpu_forward_reaches_the_eager_core(monkeypatch) -> None:
    """With the capture probe answering (as on CUDA builds), a CPU forward takes the eager path
    (FusedAttnFunc over the plans), which names the device."""
    from te_cudnn import first_call

    monkeypatch.setattr(first_call, "_is_capturing", lambda: False)
    monkeypatch.setattr(torch_ops, "_is_capturing", lambda: False)
    assert torch_ops.use_custom_ops() is torch_ops._FORCE_OPS
    if torch_ops._FORCE_OPS:
        pytest.skip("TE_CUDNN_CUSTOM_OPS=1 forces the custom-op path")
    q, k, v = _cpu_qkv("bshd")
    with pytest.raises(ValueError, match=r"^q is on cpu; fused attention executes on CUDA devices"):
        _gqa("bshd")(q, k, v)
    with pytest.raises(ValueError, match=r"^q is on cpu; fused attention executes on CUDA devices"):
        te_cudnn.fused_attention(q, k, v, qkv_layout="bshd_bshd_bshd")


@pytest.mark.parametrize("softmax_type", ["vanilla", "off_by_one", "learnable"])
def test_softmax_type_reaches_the_core(monkeypatch, softmax_type):
    """The module passes its softmax_type and, for learnable sinks, its [h] parameter as TE's
    fp32 [1, h, 1, 1] offset (a view: gradients flow to the parameter)."""
    spy = Spy()
    monkeypatch.setattr(module, "attend", spy)
    m = te_cudnn.DotProductAttention(4, 64, qkv_format="bshd", softmax_type=softmax_type)
    q = torch.zeros(2, 16, 4, 64, dtype=torch.bfloat16)
    m(q, q, q)
    assert spy.last["opts"].softmax_type == softmax_type
    offset = spy.last["softmax_offset"]
    if softmax_type == "learnable":
        assert offset.shape == (1, 4, 1, 1) and offset.dtype == torch.float32 and offset._base is m.softmax_offset
    else:
        assert offset is None
    if softmax_type == "learnable":  # a model cast to bf16 still hands cuDNN fp32 sink logits
        m.to(torch.bfloat16)
        m(q, q, q)
        assert spy.last["softmax_offset"].dtype == torch.float32


def test_cached_path_key_follows_the_modules_attributes():
    """The cached inference path keys on the module's state; .eval() and edits refresh it."""
    m = te_cudnn.DotProductAttention(8, 64, qkv_format="bshd")
    first = m._state()
    assert first[0] is True and m.__dict__["_lean_state"] == first
    m.eval()
    assert "_lean_state" not in m.__dict__ and m._state()[0] is False
    m.softmax_scale = 0.5
    assert "_lean_state" not in m.__dict__ and 0.5 in m._state()
