"""CPU tests of the Hugging Face transformers integration.

Registration through transformers' public interfaces, model selection (``from_config`` and
``set_attn_implementation``), that masks reach te_cudnn (the mask interface is registered
too), and the argument handling of ``attention_forward``. te_cudnn executes on CUDA only, so a
CPU forward ends in te_cudnn's "executes on CUDA devices" error raised from our attention
function: that proves the routing. ``te_cudnn.sdpa.attend`` is replaced by a recorder
in some tests only to inspect what reaches it (it computes nothing).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import te_cudnn.sdpa as sdpa_mod  # noqa: E402
from _attend_recorder import AttendRecorder  # noqa: E402
from te_cudnn import UnsupportedConfigError  # noqa: E402
from te_cudnn.integrations import transformers as te_hf  # noqa: E402

from transformers import AttentionInterface, AttentionMaskInterface, AutoModelForCausalLM, LlamaConfig  # noqa: E402
from transformers.masking_utils import sdpa_mask  # noqa: E402

BF16 = torch.bfloat16


def _config(**kw):
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)  # fmt: skip
    base.update(kw)
    return LlamaConfig(**base)


def _cuda_only_from_ours(excinfo) -> None:
    """The error is te_cudnn's CUDA-only ValueError and our attention function is on its path."""
    assert "executes on CUDA devices" in str(excinfo.value)
    frames = [(e.frame.code.name, str(e.path)) for e in excinfo.traceback]
    assert any(name == "attention_forward" and path.endswith("integrations/transformers.py") for name, path in frames), frames


@pytest.fixture
def registered():
    return te_hf.register()


@pytest.fixture
def recorder(monkeypatch):
    rec = AttendRecorder()
    monkeypatch.setattr(sdpa_mod, "attend", rec)
    return rec


class Module(torch.nn.Module):
    def __init__(self, is_causal=True, training=False):
        super().__init__()
        self.is_causal = is_causal
        self.train(training)


def _qkv(b=2, h=4, hk=2, sq=5, skv=None, d=32):
    skv = sq if skv is None else skv
    q = torch.randn(b, sq, h, d, dtype=BF16).transpose(1, 2)  # as a projection's output viewed [b, h, s, d]
    k = torch.randn(b, skv, hk, d, dtype=BF16).transpose(1, 2)
    v = torch.randn(b, skv, hk, d, dtype=BF16).transpose(1, 2)
    return q, k, v


# ------------------------------------------------------------------ registration


def test_register_adds_attention_and_mask_functions(registered):
    assert registered == "te_cudnn"
    assert AttentionInterface._global_mapping["te_cudnn"] is te_hf.attention_forward
    assert AttentionMaskInterface._global_mapping["te_cudnn"] is sdpa_mask
    assert "te_cudnn" in AttentionInterface().valid_keys()


def test_register_is_idempotent():
    te_hf.register()
    before = (dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping))
    assert te_hf.register() == "te_cudnn"
    assert (dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping)) == before


def test_register_under_another_name():
    try:
        assert te_hf.register("te_cudnn_other") == "te_cudnn_other"
        assert AttentionInterface._global_mapping["te_cudnn_other"] is te_hf.attention_forward
        assert AttentionMaskInterface._global_mapping["te_cudnn_other"] is sdpa_mask
    finally:
        AttentionInterface._global_mapping.pop("te_cudnn_other", None)
        AttentionMaskInterface._global_mapping.pop("te_cudnn_other", None)
    with pytest.raises(TypeError, match="name must be a non-empty str"):
        te_hf.register("")


def test_importing_te_cudnn_does_not_import_transformers():
    code = (
        "import sys, te_cudnn, te_cudnn.integrations, te_cudnn.integrations.transformers\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.stdout, run.stderr)


# ------------------------------------------------------------------ model selection


def test_from_config_selects_te_cudnn(registered):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(), attn_implementation="te_cudnn").to(BF16)
    assert model.config._attn_implementation == "te_cudnn"
    ids = torch.randint(0, 128, (2, 6))
    with pytest.raises(ValueError) as excinfo:
        model(ids)
    _cuda_only_from_ours(excinfo)


def test_set_attn_implementation_selects_te_cudnn(registered):
    model = AutoModelForCausalLM.from_config(_config(), attn_implementation="sdpa").to(BF16)
    ids = torch.randint(0, 128, (2, 6))
    model(ids)  # sdpa runs on CPU
    model.set_attn_implementation("te_cudnn")
    assert model.config._attn_implementation == "te_cudnn"
    with pytest.raises(ValueError) as excinfo:
        model(ids)
    _cuda_only_from_ours(excinfo)


def test_padding_mask_reaches_te_cudnn(registered, recorder):
    """With the mask interface registered, transformers builds sdpa's boolean mask for us; the
    bias cuDNN gets masks the padding (without it transformers would pass None)."""
    model = AutoModelForCausalLM.from_config(_config(), attn_implementation="te_cudnn").to(BF16)
    ids = torch.randint(0, 128, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    with torch.no_grad():
        model(ids, attention_mask=mask)
    assert len(recorder.calls) == 2  # one per layer
    biases = [kw["attn_bias"] for _, kw in recorder.calls]
    assert biases[0] is biases[1]  # built once for both layers
    bias = biases[0]
    assert tuple(bias.shape) == (2, 1, 6, 6) and recorder.calls[0][1]["attn_mask_type"] == "no_mask"
    allowed = bias == 0
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(allowed[0, 0], causal)
    assert torch.equal(allowed[1, 0], causal & (mask[1] == 1)[None, :])
    (q, k, _), _ = recorder.calls[0]
    assert k.shape[2] == 2 and q.shape[2] == 4  # GQA without repeating key and value
    with torch.no_grad():
        model(ids)  # no padding: no mask, top-left causal
    assert recorder.calls[-1][1]["attn_mask_type"] == "causal" and recorder.calls[-1][1]["attn_bias"] is None


# ------------------------------------------------------------------ attention_forward


def test_causal_only_without_mask_and_for_more_than_one_query(recorder):
    q, k, v = _qkv()
    out, weights = te_hf.attention_forward(Module(), q, k, v, None)
    assert weights is None and tuple(out.shape) == (2, 5, 4, 32)  # [b, s_q, h, d_v]
    assert recorder.calls[-1][1]["attn_mask_type"] == "causal"
    te_hf.attention_forward(Module(is_causal=False), q, k, v, None)
    assert recorder.calls[-1][1]["attn_mask_type"] == "no_mask"
    te_hf.attention_forward(Module(is_causal=False), q, k, v, None, is_causal=True)  # the kwarg wins
    assert recorder.calls[-1][1]["attn_mask_type"] == "causal"
    qd, kd, vd = _qkv(sq=1, skv=9)  # decoding: one query sees the whole cache
    te_hf.attention_forward(Module(), qd, kd, vd, None)
    assert recorder.calls[-1][1]["attn_mask_type"] == "no_mask"
    te_hf.attention_forward(Module(), q, k, v, torch.ones(2, 1, 5, 5, dtype=torch.bool))
    assert recorder.calls[-1][1]["attn_mask_type"] == "no_mask"
    assert recorder.calls[-1][1]["attn_bias_type"] == "post_scale_bias"


def test_inputs_are_views_and_options_pass_through(recorder):
    q, k, v = _qkv()
    te_hf.attention_forward(Module(training=True), q, k, v, None, dropout=0.1, scaling=0.2)
    (rq, rk, rv), kw = recorder.calls[-1]
    assert rq.data_ptr() == q.data_ptr() and rq.is_contiguous() and rk.data_ptr() == k.data_ptr()
    assert kw["qkv_layout"] == "bshd_bshd_bshd" and kw["attn_scale"] == 0.2 and kw["dropout"] == 0.1
    te_hf.attention_forward(Module(training=False), q, k, v, None, dropout=0.1)
    assert recorder.calls[-1][1]["dropout"] == 0.0  # dropout only in training


def test_static_cache_prefill_crops_keys(recorder):
    q, k, v = _qkv(sq=5, skv=16)  # a StaticCache holds 16 slots, 5 are being filled
    te_hf.attention_forward(Module(), q, k, v, None)
    (_, rk, rv), kw = recorder.calls[-1]
    assert rk.shape[1] == 5 and rv.shape[1] == 5 and kw["attn_mask_type"] == "causal"


def test_mask_is_sliced_to_the_keys(recorder):
    q, k, v = _qkv(sq=3, skv=8)
    mask = torch.ones(2, 1, 3, 12, dtype=torch.bool)
    mask[..., 8:] = False
    mask[0, 0, :, 1] = False
    te_hf.attention_forward(Module(), q, k, v, mask)
    bias = recorder.calls[-1][1]["attn_bias"]
    assert tuple(bias.shape) == (2, 1, 3, 8)
    assert (bias[0, 0, :, 1] < -1e29).all() and (bias[1] == 0).all()


def test_mask_bias_is_rebuilt_when_the_mask_changes(recorder):
    q, k, v = _qkv()
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    te_hf.attention_forward(Module(), q, k, v, mask)
    first = recorder.calls[-1][1]["attn_bias"]
    te_hf.attention_forward(Module(), q, k, v, mask)
    assert recorder.calls[-1][1]["attn_bias"] is first
    mask[0, 0, 0, 1] = False  # in place: a new version of the mask
    te_hf.attention_forward(Module(), q, k, v, mask)
    assert recorder.calls[-1][1]["attn_bias"] is not first and recorder.calls[-1][1]["attn_bias"][0, 0, 0, 1] < 0


def test_fully_masked_rows_are_zero(recorder):
    q, k, v = _qkv()
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[1, 0, :2] = False  # left padding: the first two queries of sequence 1 see no key
    out, _ = te_hf.attention_forward(Module(), q, k, v, mask)
    assert (out[1, :2] == 0).all() and (out[1, 2:] == 1).all() and (out[0] == 1).all()


def test_sliding_window_without_mask_is_applied_natively(recorder):
    q, k, v = _qkv(sq=8)
    te_hf.attention_forward(Module(), q, k, v, None, sliding_window=3)
    assert recorder.calls[-1][1]["window_size"] == (2, 0)  # query i sees keys i-2..i, as transformers' overlay
    te_hf.attention_forward(Module(), q, k, v, None, sliding_window=16)  # wider than the sequence: no window
    assert "window_size" not in recorder.calls[-1][1]


def test_position_bias_is_added_to_the_mask(recorder):
    q, k, v = _qkv(sq=4)
    pb = torch.randn(1, 4, 4, 4, dtype=BF16)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[0, 0, :, 0] = False
    te_hf.attention_forward(Module(), q, k, v, mask, position_bias=pb)
    bias = recorder.calls[-1][1]["attn_bias"]
    want = torch.where(mask, pb, sdpa_mod.masked_value(BF16))
    assert torch.equal(bias.expand(2, 4, 4, 4), want)
    te_hf.attention_forward(Module(), q, k, v, None, position_bias=pb)  # causal + bias: the causal part in the mask
    kw = recorder.calls[-1][1]
    assert kw["attn_mask_type"] == "no_mask" and torch.equal(kw["attn_bias"][0, :, 0, 1:], torch.full((4, 3), sdpa_mod.masked_value(BF16), dtype=BF16))


@pytest.mark.parametrize("name,alternative", [("softcap", "eager"), ("head_mask", "eager"), ("cache", "sdpa")])
def test_unsupported_kwargs_raise_naming_the_alternative(recorder, name, alternative):
    q, k, v = _qkv()
    with pytest.raises(UnsupportedConfigError, match=name) as info:
        te_hf.attention_forward(Module(), q, k, v, None, **{name: torch.zeros(4) if name != "softcap" else 30.0})
    assert isinstance(info.value, NotImplementedError) and not recorder.calls
    assert f"attn_implementation='{alternative}'" in str(info.value)


@pytest.mark.parametrize("sq", [5, 1])
def test_s_aux_runs_as_learnable_sinks(recorder, sq):
    """gpt-oss' sinks: one logit per head in the model's dtype, passed on as fp32 [1, h, 1, 1];
    a single query row (decode) runs twice over, since cuDNN takes no sink with one row."""
    q, k, v = _qkv()
    q = q[:, :, :sq]
    s_aux = torch.randn(q.shape[1], dtype=BF16, requires_grad=True)
    out, _ = te_hf.attention_forward(Module(), q, k, v, None, s_aux=s_aux)
    kw = recorder.calls[-1][1]
    assert kw["softmax_type"] == "learnable" and kw["softmax_offset"].dtype == torch.float32
    assert tuple(kw["softmax_offset"].shape) == (1, q.shape[1], 1, 1)
    assert torch.equal(kw["softmax_offset"].view(-1), s_aux.float())
    assert recorder.calls[-1][0][0].shape[1] == max(sq, 2) and out.shape[1] == sq
    with pytest.raises(ValueError, match="one sink logit per query head"):
        te_hf.attention_forward(Module(), q, k, v, None, s_aux=torch.zeros(3))


def test_ignored_kwargs_are_accepted(recorder):
    q, k, v = _qkv()
    te_hf.attention_forward(Module(), q, k, v, None, position_ids=torch.arange(5)[None], cache_position=torch.arange(5),
                            sliding_window=None, use_cache=False, output_attentions=False)  # fmt: skip
    assert recorder.calls


def test_cpu_forward_raises_cuda_only():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="executes on CUDA devices"):
        te_hf.attention_forward(Module(), q, k, v, None)


# ------------------------------------------------------------------ the inference shortcut


class _LaunchRecorder:
    """Stands in for te_cudnn.launch.launch in the shortcut's routing tests: records the
    pointers a launch would read (no cuDNN call, no result)."""

    def __init__(self):
        self.ptrs: list[tuple[int, ...]] = []

    def __call__(self, plan, ptrs, index):
        self.ptrs.append(tuple(ptrs))


@pytest.fixture
def remembered(monkeypatch):
    """A remembered inference entry for ``_qkv(sq=1, skv=9)`` decode calls (scale 0.125), as the
    first CUDA call of that signature leaves it: the routing tests' stand-in prepared forward
    (a plan launched from pointers, no stats), the output template, a launch recorder."""
    import types

    import te_cudnn.lean as lean_mod
    from te_cudnn.sdpa import _lean_sig

    q, k, v = _qkv(sq=1, skv=9)
    out = torch.empty(2, 1, 4, 32, dtype=BF16)
    plan = types.SimpleNamespace(evicted=False, hits=0, last_used=0, launch=types.SimpleNamespace(mode="raw"))
    prep = types.SimpleNamespace(plan=plan, stats_template=None, index=0)
    launches = _LaunchRecorder()
    monkeypatch.setattr(lean_mod, "_launch", launches)
    te_hf._LEAN.memo.remember(_lean_sig(q, k, v, False, 0.125, None, False), (prep, out), nbytes=0)
    yield (q, k, v), out, plan, launches
    te_hf._LEAN.memo.clear()


def test_inference_shortcut_launches_the_remembered_plan(remembered, recorder):
    (q, k, v), template, plan, launches = remembered
    with torch.no_grad():
        out, weights = te_hf.attention_forward(Module(), q, k, v, None, dropout=0.0, scaling=0.125,
                                               position_ids=torch.arange(1)[None], use_cache=True)  # fmt: skip
    assert weights is None and not recorder.calls and plan.hits == 1 and plan.last_used > 0
    assert out.shape == template.shape and out.stride() == template.stride() and out.data_ptr() != template.data_ptr()
    assert launches.ptrs == [(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())]


@pytest.mark.parametrize("name,alternative", [("softcap", "eager"), ("head_mask", "eager"), ("cache", "sdpa")])
def test_inference_shortcut_keeps_the_unsupported_kwargs_errors(remembered, name, alternative):
    (q, k, v), _, _, launches = remembered
    with torch.no_grad(), pytest.raises(UnsupportedConfigError, match=f"attn_implementation='{alternative}'"):
        te_hf.attention_forward(Module(), q, k, v, None, scaling=0.125, **{name: 30.0})
    assert not launches.ptrs


def test_inference_shortcut_is_not_taken_for_autograd_dropout_or_another_signature(remembered, recorder):
    (q, k, v), _, _, launches = remembered
    te_hf.attention_forward(Module(), q.clone().requires_grad_(), k, v, None, scaling=0.125)  # autograd records it
    with torch.no_grad():
        te_hf.attention_forward(Module(training=True), q, k, v, None, dropout=0.1, scaling=0.125)
        te_hf.attention_forward(Module(), q, k, v, None, scaling=0.25)
        te_hf.attention_forward(Module(), q, k[:, :, :8], v[:, :, :8], None, scaling=0.125)
    assert not launches.ptrs and len(recorder.calls) == 4
    assert recorder.calls[1][1]["dropout"] == 0.1


def test_inference_shortcut_sends_a_misaligned_input_down_the_full_path(remembered, recorder):
    (q, k, v), _, _, launches = remembered
    buf = torch.randn(q.numel() + 8, dtype=BF16)
    q_off = buf[1:1 + q.numel()].view(2, 1, 4, 32).transpose(1, 2)  # q's shape and strides, 2 bytes off
    assert q_off.stride() == q.stride() and q_off.data_ptr() % 16
    with torch.no_grad():
        out, _ = te_hf.attention_forward(Module(), q_off, k, v, None, scaling=0.125)
    assert not launches.ptrs and len(recorder.calls) == 1 and (out == 1).all()  # the full path's answer
    q_read = recorder.calls[0][0][0]  # the full path copies the unaligned start (its [b, s, h, d] view is contiguous)
    assert q_read.data_ptr() % 16 == 0 and torch.equal(q_read, q_off.transpose(1, 2))


def test_training_shortcut_sends_a_remembered_training_signature_to_the_lean_node(remembered, recorder, monkeypatch):
    from te_cudnn.sdpa import _lean_sig

    (q, k, v), _, _, launches = remembered
    entry = object()  # what the lean node receives (te_cudnn.lean.LeanTraining on a GPU)
    te_hf._LEAN.memo.remember(_lean_sig(q, k, v, False, 0.125, None, True), entry, nbytes=0)
    lean_calls = []
    monkeypatch.setattr(te_hf, "lean_attention", lambda *args: lean_calls.append(args) or torch.zeros(1))
    qg = q.clone().requires_grad_()
    out, weights = te_hf.attention_forward(Module(), qg, k, v, None, dropout=0.0, scaling=0.125, position_ids=None)
    assert weights is None and len(lean_calls) == 1 and lean_calls[0][0] is entry and lean_calls[0][1] is qg
    assert not recorder.calls and not launches.ptrs
    te_hf.attention_forward(Module(), q, k, v, None, scaling=0.125)  # grad on, nothing requires it: inference
    assert len(launches.ptrs) == 1 and len(lean_calls) == 1
    monkeypatch.setattr(te_hf, "use_custom_ops", lambda: True)  # compiling or capturing: the custom ops' path
    te_hf.attention_forward(Module(), qg, k, v, None, scaling=0.125)
    assert len(lean_calls) == 1 and len(recorder.calls) == 1


@pytest.mark.parametrize("grad", [False, True])
def test_a_call_of_a_new_signature_computes_it_once(recorder, monkeypatch, grad):
    from te_cudnn.sdpa import _lean_sig

    sigs = []
    monkeypatch.setattr(te_hf, "_lean_sig", lambda *args: sigs.append(args[3:]) or _lean_sig(*args))
    q, k, v = _qkv()
    te_hf.attention_forward(Module(), q.requires_grad_(grad), k, v, None, scaling=0.125, position_ids=None)
    assert sigs == [(True, 0.125, None, grad)] and len(recorder.calls) == 1  # then the full path, once
    sigs.clear()
    te_hf.attention_forward(Module(), q, k, v, None, scaling=0.125, output_attentions=False)  # not inert: below
    assert sigs == [(True, 0.125, None, grad)] and len(recorder.calls) == 2


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_generate_and_training_pass_only_kwargs_the_shortcut_takes_as_inert(model_type):
    """The shortcut of a remembered signature (decode steps, training forwards) is taken only
    when every keyword argument transformers passes is one the mask or the cache already
    encodes (``_INERT_KWARGS``): a keyword a newer transformers adds would send every call
    down the full path without an error. Recorded here with transformers' own sdpa function
    behind a recording implementation, in generate's decode steps and in a training forward."""
    import inspect

    named = set(inspect.signature(te_hf.attention_forward).parameters) - {"kwargs"}
    seen: list[tuple[int, bool, frozenset]] = []
    sdpa = transformers.integrations.sdpa_attention.sdpa_attention_forward

    def record(module, query, key, value, attention_mask, **kwargs):
        seen.append((query.shape[2], attention_mask is None, frozenset(kwargs) - named))
        return sdpa(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("te_cudnn_kwargs_probe", record)
    AttentionMaskInterface.register("te_cudnn_kwargs_probe", sdpa_mask)
    cfg = transformers.AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                            max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="te_cudnn_kwargs_probe")
    ids = torch.randint(1, 128, (1, 6))  # no pad token (0): generate infers no padding mask
    with torch.no_grad():
        model.eval().generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    decode = [s for s in seen if s[0] == 1]
    assert len(decode) == 2 * 2 and all(mask_none for _, mask_none, _ in decode)  # 2 steps x 2 layers, no mask
    seen.clear()
    model.train()(ids, labels=ids).loss.backward()
    assert len(seen) == 2
    extra = {name for _, _, kwargs in seen + decode for name in kwargs} - te_hf._INERT_KWARGS
    assert not extra, f"transformers passes {sorted(extra)}, which the shortcut does not take as inert"
