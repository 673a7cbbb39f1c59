"""te_cudnn's registered custom operators: their schemas, the one config string that carries their
options (round trip, malformed strings), and the exit hook that drops the cuDNN objects
torch.library keeps alive; CPU only."""

from __future__ import annotations

import pytest
import torch

from te_cudnn import torch_ops


# ================================================================================ schemas


FWD_ARGS = ["q", "k", "v", "attn_bias", "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded",
            "page_table_k", "page_table_v", "rng_state", "softmax_offset", "max_seqlen_q", "max_seqlen_kv", "attn_scale",
            "dropout", "config"]  # fmt: skip
BWD_ARGS = ["q", "k", "v", "o", "d_o", "stats", "rng_state", "attn_bias", "softmax_offset", "cu_seqlens_q",
            "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", *FWD_ARGS[12:]]  # fmt: skip
FP8_OPTS = ["max_seqlen_q", "max_seqlen_kv", "qkv_layout", "attn_mask_type", "attn_scale", "backend", "deterministic"]
FP8_FWD_ARGS = ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_kv", "fwd_scale", "fwd_scale_inv", "fwd_amax_history",
                "fwd_format", "bwd_scale", "bwd_scale_inv", "bwd_amax_history", "bwd_format", *FP8_OPTS]  # fmt: skip
FP8_BWD_ARGS = ["d_out", "q8", "k8", "v8", "o8", "stats", "cu_seqlens_q", "cu_seqlens_kv", "fwd_scale", "fwd_scale_inv",
                "bwd_scale", "bwd_scale_inv", "bwd_amax_history", "bwd_format", "out_dtype", *FP8_OPTS]  # fmt: skip


@pytest.mark.parametrize(("name", "args", "n_out"), [("fwd", FWD_ARGS, 2), ("bwd", BWD_ARGS, 5),
                                                     ("fp8_fwd", FP8_FWD_ARGS, 7), ("fp8_bwd", FP8_BWD_ARGS, 4)],
                         ids=["fwd", "bwd", "fp8_fwd", "fp8_bwd"])  # fmt: skip
def test_op_schema(name: str, args: list, n_out: int) -> None:
    op = getattr(torch.ops.te_cudnn, name).default
    schema = op._schema
    assert schema.name == f"te_cudnn::{name}"
    assert [a.name for a in schema.arguments] == args
    assert len(schema.returns) == n_out and all(str(r.type) == "Tensor" for r in schema.returns)
    assert all(a.alias_info is None for a in schema.arguments)  # functional: nothing mutated or aliased
    types = {a.name: a.real_type for a in schema.arguments}
    for arg in ("max_seqlen_q", "max_seqlen_kv"):  # dynamic sequence lengths trace
        assert isinstance(types[arg], torch.SymIntType), (arg, types[arg])
    if name in ("fwd", "bwd"):
        assert str(types["config"]) == "str"
    else:
        assert str(types["qkv_layout"]) == "str" and str(types["deterministic"]) == "bool"
    if hasattr(torch.Tag, "needs_exact_strides"):
        assert torch.Tag.needs_exact_strides in op.tags
    registered = torch_ops.OPS[name]  # an OpOverload, or a CustomOpDef (torch.library.custom_op)
    assert getattr(registered, "_qualname", None) == f"te_cudnn::{name}" or registered is op


def test_fwd_schema_types() -> None:
    types = {a.name: str(a.type) for a in torch.ops.te_cudnn.fwd.default._schema.arguments}
    for name in FWD_ARGS[3:12]:
        assert types[name] == "Optional[Tensor]", name
    assert types["config"] == "str" and types["attn_scale"] == "Optional[float]" and types["dropout"] == "float"
    fp8 = {a.name: str(a.real_type) for a in torch.ops.te_cudnn.fp8_fwd.default._schema.arguments}
    assert fp8["fwd_format"] == fp8["bwd_format"] == "ScalarType"


OPTION_CASES = {
    "defaults": (True, "bshd_bshd_bshd", "causal", "no_bias", -1, 0, None, None, "vanilla", False),
    "every field set": (False, "thd_thd_thd", "padding_causal", "post_scale_bias", 128, 0, True, 1, "learnable", True),
    "others": (True, "sbhd_sb2hd", "no_mask", "no_bias", -1, -1, False, 2, "off_by_one", False),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_op_config_round_trips_exactly(case: str) -> None:
    values = OPTION_CASES[case]
    config = torch_ops.op_config(*values)
    parsed = torch_ops.parse_op_config(config)
    assert tuple(parsed) == values
    assert parsed is torch_ops.parse_op_config(config)  # decoded once per string


@pytest.mark.parametrize("bad", ["", "train=1", "train=1;layout=x;mask=y;bias=z;window=-1,oops;brd=None;backend=None;"
                                 "softmax=vanilla;det=0"])  # fmt: skip
def test_op_config_rejects_malformed_strings(bad: str) -> None:
    with pytest.raises(ValueError, match="not a te_cudnn op config"):
        torch_ops.parse_op_config(bad)


@pytest.mark.slow
def test_exit_hook_drops_cudnn_objects() -> None:
    """The atexit hook empties what holds cuDNN objects (torch.library keeps te_cudnn's module
    state alive to the end; plans alive when the frontend's native module is finalized are
    reported on stderr as leaked). In a subprocess: the hook clears process-wide caches."""
    import subprocess
    import sys

    code = (
        "import te_cudnn\n"
        "from te_cudnn import ops\n"
        "from te_cudnn.plans import handles, plan_cache\n"
        "ops._fwd_memo[('probe',)] = object(); ops._bwd_memo[('probe',)] = object()\n"
        "handles._idle.setdefault(0, []).append(object())\n"
        "ops._drop_cudnn_objects()\n"
        "print(len(ops._fwd_memo), len(ops._bwd_memo), len(handles._idle), len(plan_cache))\n"
    )  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "0 0 0 0", proc.stdout
