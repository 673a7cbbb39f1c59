"""First use on a machine without a GPU: the README's snippet, messages for
plausible mistakes, versions, and no warnings the user did not cause; CPU only."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import te_cudnn as tc
from te_cudnn.runtime import HOPPER_CUDNN_919, RuntimeEnv, format_versions, frontend_version, versions

ROOT = Path(__file__).resolve().parents[1]
HAS_NUMPY = importlib.util.find_spec("numpy") is not None


def readme_block(marker: str) -> str:
    """The ```python block of README.md whose first line is ``marker``."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if b.startswith(marker + "\n")]
    return block


# ----------------------------------------------------------------------------- README "Using it"
def test_readme_cpu_snippet_runs_here() -> None:
    """The part of "Using it" that says it runs anywhere does, with no warning, and prints what it claims."""
    code = readme_block("# runs anywhere: no GPU needed")
    assert "cuda" not in code
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter("error")
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own code
    lines = out.getvalue().splitlines()
    assert lines[0] == format_versions()
    assert lines[1] == "F16_arbitrary_seqlen"
    assert lines[2].startswith("bshd_bshd_bshd bfloat16, b=2 h=16 hg=16 sq=2048 skv=2048 d_qk=128 d_v=128, mask=causal")
    assert "-> F16_arbitrary_seqlen" in lines and "  F16_max512_seqlen: declined" in lines
    assert lines[-1] == "bshd_bshd_bshd"


def test_readme_gpu_snippet_is_marked_and_uses_keywords_for_explain() -> None:
    gpu = readme_block("# needs a GPU")
    assert 'device="cuda"' in gpu and "explain(" not in gpu
    cpu = readme_block("# runs anywhere: no GPU needed")
    call = cpu[cpu.index("tc.explain(") : cpu.index(")", cpu.index("batch_size"))]
    # every argument by keyword: no positional arguments after the opening parenthesis
    args = [a.strip() for a in call.removeprefix("tc.explain(").split(",") if a.strip()]
    assert args and all("=" in a for a in args), args


# ----------------------------------------------------------------------------- fused_attention's options
Q = torch.zeros(2, 16, 4, 64, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [({"mask": "causal"}, "(did you mean attn_mask_type?)"),
     ({"is_causal": True}, "(did you mean attn_mask_type='causal'?)"),
     ({"attn_mask_typ": "causal"}, "(did you mean attn_mask_type?)"),
     ({"softmax_scale": 0.1}, "(did you mean attn_scale?)"),
     ({"layout": "bshd_bshd_bshd"}, "(did you mean qkv_layout?)")],
    ids=["mask", "is_causal", "typo", "softmax_scale", "layout"],
)  # fmt: skip
def test_fused_attention_unknown_keyword(kwargs: dict, hint: str) -> None:
    (name,) = kwargs
    with pytest.raises(TypeError) as exc:
        tc.fused_attention(Q, Q, Q, **kwargs)
    message = str(exc.value)
    assert message.startswith(f"fused_attention() got an unexpected keyword argument {name!r} {hint}; ")
    assert message.endswith(
        "accepted keyword arguments: attn_bias, cu_seqlens_q, cu_seqlens_kv, rng_gen, is_training, softmax_offset, lengths, "
        "qkv_layout, attn_mask_type, attn_bias_type, attn_scale, dropout, window_size, bottom_right_diagonal, deterministic, "
        "fused_attention_backend, softmax_type"
    )
    assert "AttnOptions" not in message


def test_fused_attention_valid_options_reach_the_call() -> None:
    """Valid options pass the check: the error is then about the CPU tensors, not the options."""
    with pytest.raises(ValueError, match="q is on cpu"):
        tc.fused_attention(Q, Q, Q, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal", attn_scale=0.125,
                           dropout=0.0, window_size=(-1, -1), deterministic=True, is_training=True)  # fmt: skip


def test_fp8_attention_refuses_options_it_would_ignore() -> None:
    with pytest.raises(TypeError, match=r"^fp8_attention\(\) does not take dropout=0.1 \(it has no such option, and "
                                        r"ignoring it would change the result silently\); accepted options: qkv_layout, "
                                        r"attn_mask_type, attn_scale, deterministic, fused_attention_backend$"):  # fmt: skip
        tc.fp8_attention(Q, Q, Q, None, dropout=0.1)
    for name, value in (("window_size", (4, 0)), ("attn_bias_type", "post_scale_bias"), ("softmax_type", "off_by_one")):
        with pytest.raises(TypeError, match=f"does not take {name}="):
            tc.fp8_attention(Q, Q, Q, None, **{name: value})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'mask' \(did you mean attn_mask_type\?\)"):
        tc.fp8_attention(Q, Q, Q, None, mask="causal")


# ----------------------------------------------------------------------------- versions
def test_versions() -> None:
    v = versions()
    assert list(v) == ["te_cudnn", "torch", "cuda", "cudnn", "frontend", "gpu"]
    assert v["te_cudnn"] == tc.__version__ and v["torch"] == torch.__version__
    assert v["cuda"] == (torch.version.cuda or "none") and v["frontend"] == frontend_version()
    if not torch.cuda.is_available():
        assert v["gpu"] == "no GPU"
        assert format_versions().endswith(f"frontend {v['frontend']}, no GPU")
    line = format_versions()
    assert "\n" not in line and line.startswith(f"te_cudnn {tc.__version__}, torch {torch.__version__}, CUDA ")
    fake = {"te_cudnn": "1", "torch": "2", "cuda": "12.8", "cudnn": "9.19.0", "frontend": "1.32.0",
            "gpu": "NVIDIA H100 80GB HBM3 (sm90)"}  # fmt: skip
    assert format_versions(fake) == ("te_cudnn 1, torch 2, CUDA 12.8, cuDNN 9.19.0, frontend 1.32.0, "
                                     "GPU NVIDIA H100 80GB HBM3 (sm90)")  # fmt: skip


def test_runtime_env_describe_wording() -> None:
    fe = frontend_version()
    assert RuntimeEnv(sm=None, cudnn_version=None).describe() == f"no GPU, cuDNN unavailable, frontend {fe}"
    assert RuntimeEnv(sm=90, cudnn_version=91900, device_name="NVIDIA H100").describe() == (
        f"NVIDIA H100 (sm90), cuDNN 9.19.0, frontend {fe}"
    )
    assert RuntimeEnv(sm=90, cudnn_version=91900).describe() == f"sm90, cuDNN 9.19.0, frontend {fe}"
    assert HOPPER_CUDNN_919.describe().startswith("Hopper (assumed) (sm90), cuDNN 9.19.0")
    assert "(no GPU)" not in RuntimeEnv(sm=None, cudnn_version=None).describe()


# ----------------------------------------------------------------------------- quiet by default
@pytest.fixture
def warn_always():
    """torch warns about a requires_grad scalar once per process; see every occurrence."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


def test_rel_error_of_a_tensor_that_requires_grad_is_quiet(warn_always) -> None:
    from te_cudnn.testing import rel_error

    a = torch.randn(8, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch: "Converting a tensor with requires_grad=True to a scalar ..."
        assert rel_error(a * 2, a) == pytest.approx(1.0)
        assert rel_error(a, a * 2) == pytest.approx(0.5)


def test_demo_reference_errors_are_quiet(warn_always) -> None:
    """The demo's GPU check against the fp32 reference, run on CPU tensors: no warning (it used to
    warn about a requires_grad scalar), and the errors are what the reference says."""
    from te_cudnn.demo import LAYOUT, _reference_errors
    from te_cudnn.reference import attention_reference
    from te_cudnn.testing import BenchConfig, make_qkv, to_bhsd

    cfg = BenchConfig("tiny", 1, 4, 2, 16, 32, 32, "causal")
    gen = torch.Generator().manual_seed(0)
    q, k, v = make_qkv(LAYOUT, cfg.b, cfg.h, cfg.hg, cfg.sq, cfg.skv, cfg.d, device="cpu", generator=gen,
                       dtype=torch.float32)  # fmt: skip
    leaves = [to_bhsd(t, LAYOUT).requires_grad_() for t in (q.clone(), k.clone(), v.clone())]
    ref = attention_reference(*leaves, attn_mask_type="causal")
    d_o = torch.randn(ref.out.shape, generator=gen)
    (dq_ref,) = torch.autograd.grad(ref.out, leaves[:1], d_o)
    out = ref.out.detach().permute(0, 2, 1, 3)  # back to bshd
    dq = dq_ref.permute(0, 2, 1, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        err_o, err_dq = _reference_errors(cfg, q, k, v, None, out, d_o.permute(0, 2, 1, 3), dq, None, None)
    assert err_o < 1e-6 and err_dq < 1e-6  # the same computation, on the first group of heads


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the demo's CPU path (tests/test_first_use_gpu.py covers the GPU one)")
def test_demo_on_cpu_prints_versions_and_no_warnings() -> None:
    proc = subprocess.run([sys.executable, "-m", "te_cudnn.demo", "--configs", "test_0"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"te_cudnn demo: {format_versions()}"
    assert "fwd+bwd graphs built and validated by the cuDNN frontend" in proc.stdout
    if HAS_NUMPY:  # without numpy torch itself warns at import; numpy is a dependency now
        assert proc.stderr == ""


def test_pyproject_dependencies() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = project["project"]["dependencies"]
    assert any(d.startswith("numpy") for d in deps)  # torch warns "Failed to initialize NumPy" without it
    assert any(d.startswith("hypothesis") for d in project["project"]["optional-dependencies"]["test"])
    filters = project["tool"]["pytest"]["ini_options"].get("filterwarnings", [])
    assert not [f for f in filters if "NumPy" in f]


# ----------------------------------------------------------------------------- make_qkv
def test_make_qkv_thd_and_refusals() -> None:
    from te_cudnn.enums import QKVLayout
    from te_cudnn.testing import make_qkv

    q, k, v = make_qkv(QKVLayout.thd_thd_thd, 3, 8, 2, 16, 24, 64, 32, device="cpu")
    assert (q.shape, k.shape, v.shape) == ((48, 8, 64), (72, 2, 64), (72, 2, 32))
    q, k, v = make_qkv(QKVLayout.t3hd, 2, 4, 4, 8, 8, 16, device="cpu")
    assert q.shape == (16, 4, 16) and q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    for name in ("thd_bshd_bshd", "paged_kv_bshd_bshd_bshd", "bhsd_bhsd_bhsd"):
        with pytest.raises(ValueError, match=f"make_qkv makes sbhd, bshd and thd layouts, not {name}"):
            make_qkv(QKVLayout[name], 1, 4, 4, 8, 8, 16, device="cpu")


def test_check_close_never_asks_for_less_than_the_results_own_rounding() -> None:
    """A two-element bf16 result two roundings off the exact one passes when the caller says it
    was rounded twice, even beside a lucky same-precision yardstick; without, it fails."""
    from te_cudnn.testing import check_close, unit_roundoff

    assert unit_roundoff(torch.bfloat16) == 2.0**-8 and unit_roundoff(torch.float16) == 2.0**-11
    exact = torch.tensor([1.0, 1.0], dtype=torch.float64)
    lucky = exact.clone()  # the yardstick happened to round onto the exact values
    actual = exact * (1 + 1.9 * unit_roundoff(torch.bfloat16))
    with pytest.raises(AssertionError, match="relative error"):
        check_close("d_mask", actual, exact, lucky, torch.bfloat16)
    assert check_close("d_mask", actual, exact, lucky, torch.bfloat16, roundings=2) == pytest.approx(1.9 * 2.0**-8)
    with pytest.raises(AssertionError):  # three roundings' worth is still too far
        check_close("d_mask", exact * (1 + 3 * 2.0**-8), exact, lucky, torch.bfloat16, roundings=2)


def test_check_close_allows_factor_times_the_unavoidable_error() -> None:
    """A result whose inputs were already rounded (a sink's gradient reads the bf16 O) is held to
    ``factor`` × the error those rounded inputs alone bring, and no further."""
    from te_cudnn.testing import TOLERANCES, check_close

    factor = TOLERANCES[torch.bfloat16].factor
    exact = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    actual = exact * (1 + 0.03)  # beyond the bf16 ceiling of 2e-2
    with pytest.raises(AssertionError, match="unavoidable: 0.000e"):
        check_close("d_sink", actual, exact, exact, torch.bfloat16)
    assert check_close("d_sink", actual, exact, exact, torch.bfloat16, unavoidable=0.02) == pytest.approx(0.03)
    with pytest.raises(AssertionError, match="unavoidable: 1.450e-02"):  # factor × 0.0145 = 0.029 < 0.03
        check_close("d_sink", actual, exact, exact, torch.bfloat16, unavoidable=0.029 / factor)


def test_check_close_holds_ill_conditioned_results_to_factor_times_pytorch() -> None:
    """Where PyTorch's own same-precision result misses the ceiling (a tiny, ill-conditioned
    problem), te_cudnn's may be up to ``factor`` times PyTorch's error, and no further; where it
    does not, the ceiling holds."""
    from te_cudnn.testing import TOLERANCES, check_close

    tol = TOLERANCES[torch.bfloat16]
    exact = torch.tensor([1.0, -1.0], dtype=torch.float64)
    torch_err = 1.5 * tol.ceiling
    same = exact * (1 + torch_err)
    assert check_close("dq", exact * (1 + 1.9 * torch_err), exact, same, torch.bfloat16) == pytest.approx(1.9 * torch_err)
    with pytest.raises(AssertionError, match="relative error"):
        check_close("dq", exact * (1 + 2.1 * torch_err), exact, same, torch.bfloat16)
    well = exact * (1 + 0.5 * tol.ceiling)  # PyTorch under the ceiling: the ceiling caps the slack
    with pytest.raises(AssertionError, match="relative error"):
        check_close("dq", exact * (1 + 1.1 * tol.ceiling), exact, well, torch.bfloat16)
