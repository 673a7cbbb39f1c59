"""The benchmark contenders: their reasons for declining a case, the runner's reasons for skipping
one, selection by key, and the hand-built graphs and te_cudnn calls passing validation without a
GPU; CPU only."""

from __future__ import annotations

import pytest
import torch

from te_cudnn.benchmark import cli
from te_cudnn.benchmark.cases import case_by_name
from te_cudnn.benchmark.contenders import select_contenders
from te_cudnn.benchmark.inputs import make_inputs
from te_cudnn.benchmark.runner import Settings, _skip_reason
from te_cudnn.benchmark.torch_contenders import FLEX_DEFAULT_CASES
from te_cudnn.runtime import HOPPER_CUDNN_919


# ----------------------------------------------------------------------------- contenders
def _by_key(key: str):
    return select_contenders(key, env=HOPPER_CUDNN_919)[0]


def test_max512_declines_long_sequences_with_a_reason() -> None:
    max512 = _by_key("te_cudnn_max512")
    why = max512.supports(case_by_name("test_3"))
    assert why and "F16_max512_seqlen" in why and "exceed 512" in why
    assert max512.supports(case_by_name("test_0")) is None  # s=512, d=64, MHA
    assert _by_key("te_cudnn").supports(case_by_name("test_3")) is None


def test_contender_reasons() -> None:
    assert "FP8 cases only" in _by_key("te_cudnn_fp8").supports(case_by_name("test_1"))
    assert _by_key("te_cudnn_fp8").supports(case_by_name("fp8_b2_h32_s8k")) is None
    assert "THD" in _by_key("sdpa_cudnn").supports(case_by_name("thd_mixed_16k"))
    assert "no attn_mask" in _by_key("sdpa_flash").supports(case_by_name("test_2"))
    assert "dense training" in _by_key("hand_built").supports(case_by_name("decode_kv8k"))
    assert _by_key("te_cudnn").supports(case_by_name("decode_kv8k")) is None  # paged, described on the meta device
    for key in ("te_cudnn_decode", "te_cudnn_decode_dense"):  # fused_attn_decode: decode cases only
        assert _by_key(key).supports(case_by_name("decode_kv8k")) is None
        assert "decode cases only" in _by_key(key).supports(case_by_name("test_1"))
    assert {"te_cudnn_decode", "te_cudnn_decode_dense"} <= {c.key for c in select_contenders("te")}
    assert _by_key("te_cudnn").supports(case_by_name("thd_mixed_16k")) is None
    assert _by_key("te_cudnn_autotuned").supports(case_by_name("test_1")) is None


def test_runner_skip_reasons() -> None:
    full, quick = Settings.for_run(False), Settings.for_run(True)
    flex, te = _by_key("flex"), _by_key("te_cudnn")
    assert "--quick" in _skip_reason(flex, case_by_name("test_3"), quick)
    assert "test_3" in FLEX_DEFAULT_CASES and _skip_reason(flex, case_by_name("test_3"), full) is None
    assert "--every-case" in _skip_reason(flex, case_by_name("test_0"), full)
    assert _skip_reason(flex, case_by_name("test_0"), Settings.for_run(False, every_case=True)) is None
    tuned = _by_key("te_cudnn_autotuned")
    assert tuned.runs_last and not te.runs_last  # tuning replaces the plans the others use: it runs last
    assert "--quick" in _skip_reason(tuned, case_by_name("test_3"), quick)
    assert "--every-case" in _skip_reason(tuned, case_by_name("llama_h64_s32k"), full)
    assert "runs te_cudnn, torch SDPA cuDNN only" in _skip_reason(_by_key("sdpa_flash"), case_by_name("mem_h32_s64k"), full)
    assert _skip_reason(te, case_by_name("mem_h32_s64k"), full) is None


@pytest.mark.parametrize("name", ["test_2", "test_3", "decode_kv4k"])
def test_hand_built_graphs_validate(name: str) -> None:
    """The hand-built yardstick graphs (forward, and backward for training) pass the frontend's
    validation for the case's shapes and strides (defined without a handle: no GPU)."""
    from te_cudnn.benchmark.handbuilt import HandGraphs
    from te_cudnn.benchmark.inputs import Inputs

    c = case_by_name(name)
    q = torch.empty(c.b, c.sq, c.h, c.d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(c.b, c.skv, c.hg, c.d, dtype=torch.bfloat16, device="meta")
    bias = torch.empty(*c.bias_shape, dtype=torch.bfloat16, device="meta") if c.bias_shape else None
    g = HandGraphs(Inputs.bhsd(q), Inputs.bhsd(k), Inputs.bhsd(k), training=c.training, causal=c.causal, bias=bias,
                   d_o=Inputs.bhsd(q), build=False)  # fmt: skip
    g.gf.validate()
    assert (g.gb is not None) == c.training
    if g.gb is not None:
        g.gb.validate()
    assert g.o.shape == (c.b, c.h, c.sq, c.d) and g.o.permute(0, 2, 1, 3).is_contiguous()  # O in bshd memory


@pytest.mark.parametrize("name,backend,fp8", [("test_2", "F16_arbitrary_seqlen", False), ("thd_mixed_16k", None, False),
                                              ("fp8_b2_h32_s8k", "FP8", True), ("decode_kv8k", "F16_arbitrary_seqlen", False),
                                              ("test_0", "F16_max512_seqlen", False)])  # fmt: skip
def test_te_cudnn_calls_pass_validation(name: str, backend, fp8: bool) -> None:
    """The contender's fused_attn_fwd / fused_attn_bwd arguments (layouts, lengths, page tables,
    bias, FP8 scales) pass te_cudnn's checks: on the CPU the calls get as far as the device check."""
    import dataclasses

    from te_cudnn.benchmark.te_contender import TeCudnnRun

    c = case_by_name(name)
    if not c.lengths and not c.is_paged:  # smaller, same kind
        c = dataclasses.replace(c, sq=min(c.sq, 256), skv=min(c.skv, 256))
    inp = make_inputs(c, device="cpu")
    run = TeCudnnRun(c, inp, backend, fp8, None)
    with pytest.raises(ValueError, match="executes on CUDA devices"):
        run.fwd()
    if c.training:
        stats = torch.zeros(c.tokens, c.h, 1) if c.is_thd else torch.zeros(c.b, c.h, c.sq, 1)
        aux = [stats, torch.zeros(2, dtype=torch.int64)] + ([inp.bias] if inp.bias is not None else [])
        with pytest.raises(ValueError, match="executes on CUDA devices"):
            run.bwd((run.q, aux))


def test_select_contenders() -> None:
    assert [c.key for c in select_contenders("sdpa")] == ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient"]
    targets = {c.key for c in select_contenders("targets")}  # every contender a target line reads, no other
    assert targets == {"te_cudnn", "te_cudnn_autotuned", "te_cudnn_fp8", "te_cudnn_fp8_autotuned", "te_cudnn_decode",
                       "te_cudnn_decode_dense", "hand_built", "hand_built_alloc", "sdpa_cudnn"}  # fmt: skip
    assert [c.key for c in select_contenders("flex,te_cudnn")] == ["te_cudnn", "flex"]  # column order kept
    assert [c.name for c in select_contenders("torch SDPA cuDNN")] == ["torch SDPA cuDNN"]
    with pytest.raises(ValueError, match="unknown contender 'nope'"):
        select_contenders("nope")


def test_allocating_hand_built_contender_is_listed():
    (c,) = select_contenders("hand_built_alloc")
    assert c.allocating and c.name == "cuDNN graph (hand-built, allocating)"
    assert c.supports(case_by_name("test_1")) is None and "dense training" in c.supports(case_by_name("decode_kv8k"))
    assert "hand_built_alloc" in cli._epilog()
