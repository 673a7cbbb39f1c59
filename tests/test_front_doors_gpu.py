"""GPU: the front doors (module, SDPA drop-in, ``fused_attention``, Hugging Face) beyond one call.

* the cached inference path (te_cudnn.lean) gives the same bits as the first, fully validated
  call, in the door's own output geometry, and a misaligned input later takes the full path;
* gradients come back in the inputs' strides (no copy in autograd's accumulation);
* ``torch.compile(mode="reduce-overhead")`` (CUDA-graph trees): 50 inference and 50 training
  steps per door on fresh inputs, equal to eager;
* Hugging Face: gpt-oss (sinks, alternating sliding-window layers) and a Mistral-style sliding
  window against ``attn_implementation="eager"``; their training step and ``generate``; Llama
  static-cache generation compiled with reduce-overhead gives the eager tokens.
"""

from __future__ import annotations

import pytest
import torch

import te_cudnn as tc
from te_cudnn.testing import rel_error

from _random_cases import seed_from_env

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
BF16 = torch.bfloat16
SEED = seed_from_env()


@pytest.fixture(autouse=True)
def _seeded():
    print(f"seed={SEED}")
    torch.manual_seed(SEED)


def _bhsd(b=2, h=8, s=128, d=64, bshd_memory=False, **kw):
    if bshd_memory:
        return torch.randn(b, s, h, d, device=DEVICE, dtype=BF16, **kw).transpose(1, 2)
    return torch.randn(b, h, s, d, device=DEVICE, dtype=BF16, **kw)


# ------------------------------------------------------------------ cached inference path


@pytest.mark.parametrize("bshd_memory", [False, True])
def test_dropin_repeated_call_equals_first(bshd_memory):
    q, k, v = (_bhsd(bshd_memory=bshd_memory) for _ in range(3))
    with torch.no_grad():
        first = tc.scaled_dot_product_attention(q, k, v, is_causal=True)
        again = tc.scaled_dot_product_attention(q, k, v, is_causal=True)
        q2, k2, v2 = (_bhsd(bshd_memory=bshd_memory) for _ in range(3))
        other = tc.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
        ref = torch.nn.functional.scaled_dot_product_attention(q2.float(), k2.float(), v2.float(), is_causal=True)
    assert torch.equal(first, again) and first.stride() == again.stride() == other.stride()
    assert first.transpose(1, 2).is_contiguous()  # [b, h, s, d] over [b, s, h, d] memory, as torch's fused backends
    assert rel_error(other.float(), ref) < 1e-2


def test_dropin_misaligned_repeat_takes_the_full_path():
    q, k, v = (_bhsd() for _ in range(3))
    with torch.no_grad():
        tc.scaled_dot_product_attention(q, k, v)
        buf = torch.empty(q.numel() + 1, device=DEVICE, dtype=BF16)
        q_off = buf[1:].view(q.shape).copy_(q)  # same shape and strides, start off 16 bytes
        out = tc.scaled_dot_product_attention(q_off, k, v)
    assert torch.equal(out, tc.scaled_dot_product_attention(q, k, v))


def test_module_repeated_call_equals_first():
    m = tc.DotProductAttention(8, 64, qkv_format="bshd", attn_mask_type="causal").to(DEVICE).eval()
    q, k, v = (torch.randn(2, 128, 8, 64, device=DEVICE, dtype=BF16) for _ in range(3))
    with torch.no_grad():
        first, again = m(q, k, v), m(q, k, v)
        direct, _ = tc.fused_attn_fwd(False, 128, 128, None, None, q, k, v, BF16, None, qkv_layout="bshd_bshd_bshd",
                                      attn_mask_type="causal")  # fmt: skip
    assert torch.equal(first, again) and torch.equal(first, direct.view(2, 128, 512))


def test_fused_attention_repeated_call_equals_first():
    q, k, v = (torch.randn(2, 128, 8, 64, device=DEVICE, dtype=BF16) for _ in range(3))
    with torch.no_grad():
        first = tc.fused_attention(q, k, v, attn_mask_type="causal")
        again = tc.fused_attention(q, k, v, attn_mask_type="causal")
        other = tc.fused_attention(q, k, v, attn_mask_type="no_mask")  # another signature: not the causal call's
        direct, _ = tc.fused_attn_fwd(False, 128, 128, None, None, q, k, v, BF16, None, qkv_layout="bshd_bshd_bshd",
                                      attn_mask_type="no_mask")  # fmt: skip
    assert torch.equal(first, again) and first.stride() == again.stride()
    assert torch.equal(other, direct) and not torch.equal(other, first)


@pytest.mark.parametrize("sq,sliding_window", [(1, None), (128, None), (128, 32)])
def test_transformers_repeated_inference_call_equals_first(sq, sliding_window, monkeypatch):
    """The Hugging Face function's inference shortcut (decode steps, no-grad prefill): the same
    bits as the first call, the remembered plan launched again; a query with the same shape and
    strides but a start off 16 bytes goes down the full path, which copies it."""
    from te_cudnn.integrations import transformers as te_hf

    hf = _HFModule().eval()
    b, h, hk, skv, d = 2, 8, 2, 128, 64
    q = torch.randn(b, sq, h, d, device=DEVICE, dtype=BF16).transpose(1, 2)
    k, v = (torch.randn(b, hk, skv, d, device=DEVICE, dtype=BF16) for _ in range(2))
    kw = {"position_ids": torch.arange(sq, device=DEVICE)[None], "use_cache": True, "sliding_window": sliding_window}
    with torch.no_grad():
        first, _ = te_hf.attention_forward(hf, q, k, v, None, scaling=d ** -0.5, **kw)
        with monkeypatch.context() as patched:  # the shortcut validates nothing again
            patched.setattr(te_hf, "_check_qkv", lambda *a: pytest.fail("the repeated call took the full path"))
            again, _ = te_hf.attention_forward(hf, q, k, v, None, scaling=d ** -0.5, **kw)
        buf = torch.empty(q.numel() + 8, device=DEVICE, dtype=BF16)
        q_off = buf[1:1 + q.numel()].view(b, sq, h, d).copy_(q.transpose(1, 2)).transpose(1, 2)
        off, _ = te_hf.attention_forward(hf, q_off, k, v, None, scaling=d ** -0.5, **kw)  # the full path copies it
        window = (sliding_window - 1, 0) if sliding_window and sq > 1 else (-1, -1)
        ref = tc.scaled_dot_product_attention(q, k, v, is_causal=sq > 1, enable_gqa=True) if window == (-1, -1) else \
            tc.fused_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask_type="causal",
                               window_size=window, attn_scale=d ** -0.5)  # fmt: skip
    assert torch.equal(first, again) and first.stride() == again.stride() and first.shape == (b, sq, h, d)
    assert torch.equal(off, first)
    assert rel_error(first.float(), ref.transpose(1, 2).float() if window == (-1, -1) else ref.float()) < 1e-2


@pytest.mark.parametrize("bshd_memory", [False, True])
def test_gradients_in_the_inputs_strides(bshd_memory):
    q, k, v = (_bhsd(bshd_memory=bshd_memory).requires_grad_() for _ in range(3))
    out = tc.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(torch.randn_like(out))
    for t in (q, k, v):
        assert t.grad.stride() == t.stride()


# ------------------------------------------------------------------ cached training path


class _HFModule(torch.nn.Module):
    is_causal = True


def _training_doors():
    """door -> (call, input shape, where the inputs live): each door's training call without
    mask or dropout, remembered after its first call (te_cudnn.lean.LeanTraining)."""
    from te_cudnn.integrations import transformers as te_hf

    m_bshd = tc.DotProductAttention(8, 64, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal").to(DEVICE)
    m_sbhd = tc.DotProductAttention(8, 64, qkv_format="sbhd", attn_mask_type="no_mask").to(DEVICE)
    hf = _HFModule().train()
    return {
        "dropin": (lambda q, k, v: tc.scaled_dot_product_attention(q, k, v, is_causal=True), "bhsd"),
        "dropin gqa": (lambda q, k, v: tc.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                       "bhsd gqa"),
        "dropin qkv split": (lambda q, k, v: tc.scaled_dot_product_attention(q, k, v), "bhsd split"),
        "module bshd gqa": (lambda q, k, v: m_bshd(q, k, v), "bshd gqa"),
        "module sbhd": (lambda q, k, v: m_sbhd(q, k, v), "sbhd"),
        "transformers": (lambda q, k, v: te_hf.attention_forward(hf, q, k, v, None, is_causal=True)[0], "bhsd gqa"),
        "fused_attention bshd gqa": (lambda q, k, v: tc.fused_attention(q, k, v, attn_mask_type="causal"), "bshd gqa"),
        "fused_attention sbhd": (lambda q, k, v: tc.fused_attention(q, k, v, qkv_layout="sbhd_sbhd_sbhd"), "sbhd"),
    }


def _training_inputs(where: str):
    b, h, hg, s, d = 2, 8, 8, 128, 64
    if "gqa" in where:
        hg = 2
    if "split" in where:  # q, k, v as views of one projection's output, as a fused QKV linear gives them
        qkv = torch.randn(b, s, 3 * h * d, device=DEVICE, dtype=BF16, requires_grad=True)
        return [t.unflatten(-1, (h, d)).transpose(1, 2) for t in qkv.split(h * d, dim=-1)], qkv
    shapes = {"bhsd": [(b, h, s, d), (b, hg, s, d)], "bshd": [(b, s, h, d), (b, s, hg, d)],
              "sbhd": [(s, b, h, d), (s, b, hg, d)]}[where.split()[0]]  # fmt: skip
    leaves = [torch.randn(shapes[i > 0], device=DEVICE, dtype=BF16, requires_grad=True) for i in range(3)]
    return leaves, None


@pytest.mark.parametrize("door", list(_training_doors()))
def test_remembered_training_call_equals_the_full_path(door):
    """The second and later training calls of a signature run one lean autograd node; their
    output and gradients (for each kind of output gradient autograd hands over: dense, the
    expanded one of ``sum()``, a transposed one) equal the first call's full path."""
    fn, where = _training_doors()[door]
    runs = []
    for _call in range(4):  # the first call learns; each gradient kind's first backward learns its plan
        for kind in ("dense", "sum", "transposed"):
            torch.manual_seed(SEED)
            (q, k, v), root = _training_inputs(where)
            out = fn(q, k, v)
            if kind == "dense":
                out.backward(torch.randn_like(out))
            elif kind == "sum":
                out.float().sum().backward()
            else:
                out.backward(torch.randn(out.shape[::-1], device=DEVICE, dtype=BF16).permute(*range(out.dim() - 1, -1, -1)))
            leaves = (root,) if root is not None else (q, k, v)
            runs.append((kind, out.grad_fn.name(), out.detach(), [t.grad for t in leaves]))
    first = {kind: (out, grads) for kind, _, out, grads in runs[:3]}
    for kind, node, out, grads in runs[3:]:
        assert "LeanAttnFunc" in node, f"seed={SEED} {door}: a repeated training call took {node}"
        assert torch.equal(out, first[kind][0]), f"seed={SEED} {door} {kind}: output"
        for g, g0 in zip(grads, first[kind][1]):
            assert g.stride() == g0.stride(), f"seed={SEED} {door} {kind}"
            assert rel_error(g.float(), g0.float()) < 1e-2, f"seed={SEED} {door} {kind}: gradient"


# ------------------------------------------------------------------ torch.compile(mode="reduce-overhead")


def _doors():
    m = tc.DotProductAttention(8, 64, qkv_format="bshd", attn_mask_type="causal").to(DEVICE)
    return {
        "module": (lambda q, k, v: m(q, k, v), "bshd"),
        "dropin": (lambda q, k, v: tc.scaled_dot_product_attention(q, k, v, is_causal=True), "bhsd"),
        "fused_attention": (lambda q, k, v: tc.fused_attention(q, k, v, attn_mask_type="causal"), "bshd"),
    }


@pytest.mark.parametrize("door", ["module", "dropin", "fused_attention"])
@pytest.mark.parametrize("training", [False, True])
def test_reduce_overhead_50_steps_equal_eager(door, training):
    fn, fmt = _doors()[door]
    torch._dynamo.reset()
    compiled = torch.compile(fn, mode="reduce-overhead")
    shape = (2, 8, 128, 64) if fmt == "bhsd" else (2, 128, 8, 64)
    for step in range(50):
        q, k, v = (torch.randn(shape, device=DEVICE, dtype=BF16, requires_grad=training) for _ in range(3))
        go = torch.randn(shape, device=DEVICE, dtype=BF16)
        torch.compiler.cudagraph_mark_step_begin()
        if training:
            out = compiled(q, k, v)
            out.backward(go.view(out.shape))
            got = (out.detach().clone(), *(t.grad.clone() for t in (q, k, v)))
            for t in (q, k, v):
                t.grad = None
            ref_out = fn(q, k, v)
            ref_out.backward(go.view(ref_out.shape))
            ref = (ref_out.detach(), q.grad, k.grad, v.grad)
        else:
            with torch.no_grad():
                got, ref = (compiled(q, k, v).clone(),), (fn(q, k, v),)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
            assert rel_error(a.float(), b.float()) < 1e-2, f"seed={SEED} {door} step {step} {name}"


# ------------------------------------------------------------------ Hugging Face beyond Llama

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from te_cudnn.integrations import transformers as te_hf  # noqa: E402


def _pair(make_config, impls=("eager", "te_cudnn"), dtype=BF16):
    """Models of each implementation from one seeded set of weights, each from its own config
    (transformers' ``_from_config`` keeps the config object: two models from one config would
    both run the last implementation set)."""
    te_hf.register()
    torch.manual_seed(SEED)
    state = AutoModelForCausalLM.from_config(make_config(), attn_implementation="eager").state_dict()
    models = []
    for impl in impls:
        m = AutoModelForCausalLM.from_config(make_config(), attn_implementation=impl)
        m.load_state_dict(state)
        models.append(m.to(device=DEVICE, dtype=dtype).eval())
    return models


def _gpt_oss():
    """Every token goes to both experts: no top-k routing, whose ties would turn rounding
    differences into different experts and hide what the attention does."""
    from transformers import GptOssConfig  # noqa: PLC0415

    return GptOssConfig(hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
                        num_key_value_heads=2, head_dim=64, vocab_size=1000, sliding_window=16,
                        num_local_experts=2, num_experts_per_tok=2, max_position_embeddings=512,
                        layer_types=["sliding_attention", "full_attention"] * 2, attention_dropout=0.0)  # fmt: skip


def _mistral():
    from transformers import MistralConfig  # noqa: PLC0415

    return MistralConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=1000, sliding_window=16, max_position_embeddings=512)  # fmt: skip


@pytest.mark.parametrize("make_config", [_gpt_oss, _mistral], ids=["gpt-oss", "mistral"])
def test_hf_sliding_and_sinks_match_eager(make_config):
    eager, te, ref = _pair(make_config, ("eager", "te_cudnn", "eager"))
    ref.float()
    ids = torch.randint(0, 1000, (2, 64), device=DEVICE)
    with torch.no_grad():
        want = ref(ids).logits.float()
        err_eager = rel_error(eager(ids).logits.float(), want)
        err_te = rel_error(te(ids).logits.float(), want)
    assert err_te <= 2.0 * err_eager + 2e-3, f"seed={SEED} te {err_te:.3e} eager {err_eager:.3e}"
    te.train()
    out = te(ids, labels=ids)
    out.loss.backward()
    grads = [p.grad for p in te.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    if make_config is _gpt_oss:  # the sinks are trained
        assert any(n.endswith("sinks") and p.grad is not None and p.grad.abs().sum() > 0 for n, p in te.named_parameters())
    te.eval()
    with torch.no_grad():
        got = te.generate(ids[:, :24], max_new_tokens=12, do_sample=False)
        exp = eager.generate(ids[:, :24], max_new_tokens=12, do_sample=False)
    assert got.shape == exp.shape == (2, 36)
    assert (got[:, 24:] == exp[:, 24:]).float().mean() >= 0.5, f"seed={SEED} greedy tokens differ too much"


def _llama():
    from transformers import LlamaConfig  # noqa: PLC0415

    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=8,
                       num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512)  # fmt: skip


def test_hf_static_cache_generate_compiled():
    """Static-cache generation compiled with reduce-overhead (CUDA-graph trees) runs through
    te_cudnn, and its first new token is eager's wherever eager's choice is clear: the compiled
    model's other kernels round differently, and random weights leave near-ties between logits."""
    (te,) = _pair(_llama, ("te_cudnn",))
    ids = torch.randint(0, 1000, (2, 32), device=DEVICE)
    with torch.no_grad():
        eager = te.generate(ids, max_new_tokens=16, do_sample=False, output_scores=True, return_dict_in_generate=True)
        torch._dynamo.reset()
        compiled = te.generate(ids, max_new_tokens=16, do_sample=False, cache_implementation="static",
                               compile_config=transformers.CompileConfig(mode="reduce-overhead", fullgraph=False))  # fmt: skip
    assert compiled.shape == eager.sequences.shape and torch.equal(compiled[:, :32], ids)
    top2 = eager.scores[0].float().topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05
    assert torch.equal(compiled[clear, 32], eager.sequences[clear, 32]), f"seed={SEED}"
