"""GPU: Hugging Face transformers models on te_cudnn attention.

A randomly initialised small Llama (hidden 256, 3 layers, 8 heads over 2 KV heads: GQA, head
dim 32; vocab 1000; built from a config, nothing downloaded) in bf16 on CUDA, with
``attn_implementation="te_cudnn"``, against the same weights with ``attn_implementation="sdpa"``:

* logits without a mask, with right padding and with left padding (compared on the positions
  that are not padding): te_cudnn's error against an fp32 model with the same (bf16-rounded)
  weights is at most ``factor`` times sdpa's plus ``floor`` (``TOL``);
* decoding with a KV cache (s_q = 1, s_kv > 1, with and without padding) reproduces the full
  forward's last logits as sdpa does;
* training: the step-0 loss and gradients match sdpa's within the same rule, gradients are
  finite, and a few AdamW steps lower the loss;
* ``model.set_attn_implementation("te_cudnn")`` gives the same logits as building with it.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from te_cudnn.integrations import transformers as te_hf  # noqa: E402
from te_cudnn.testing import rel_error  # noqa: E402

from _random_cases import seed_from_env  # noqa: E402

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
SEED = seed_from_env()
BF16 = torch.bfloat16
#: te_cudnn's error against the fp32 model <= factor * sdpa's error + floor (relative Frobenius norms)
TOL = {"logits": (2.0, 2e-3), "loss": (2.0, 1e-3), "grads": (2.0, 5e-3)}
B, S, VOCAB = 3, 64, 1000


def _config() -> LlamaConfig:
    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=8,
                       num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, attention_dropout=0.0)  # fmt: skip


def _models(*kinds: tuple[str, torch.dtype]):
    """Models of the given (attn_implementation, dtype) with one set of weights: a seeded random
    init rounded to bf16 (so the fp32 model differs from the bf16 ones only in compute precision)."""
    te_hf.register()
    torch.manual_seed(SEED)
    state = {k: v.to(BF16) for k, v in AutoModelForCausalLM.from_config(_config(), attn_implementation="sdpa").state_dict().items()}
    models = []
    for impl, dtype in kinds:
        m = AutoModelForCausalLM.from_config(_config(), attn_implementation=impl)
        m.load_state_dict(state)
        models.append(m.to(device=DEVICE, dtype=dtype).eval())
        assert m.config._attn_implementation == impl
    return models


def _inputs(padding: str):
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    ids = torch.randint(0, VOCAB, (B, S), generator=gen, device=DEVICE)
    if padding == "none":
        return ids, None
    mask = torch.ones(B, S, dtype=torch.long, device=DEVICE)
    for row, n in enumerate((S, S - 14, S - 27)):
        if padding == "right":
            mask[row, n:] = 0
        else:
            mask[row, : S - n] = 0
    return ids, mask


def _kernel(model):
    """The fp32 reference runs torch's math backend (rows that attend nothing are zeros there)."""
    return sdpa_kernel(SDPBackend.MATH) if next(model.parameters()).dtype == torch.float32 else contextlib.nullcontext()


def _logits(model, ids, mask):
    with torch.no_grad(), _kernel(model):
        return model(ids, attention_mask=mask).logits.float()


def _within(name: str, err_te: float, err_sdpa: float) -> None:
    factor, floor = TOL[name]
    assert err_te <= factor * err_sdpa + floor, (
        f"seed={SEED} {name}: te_cudnn error {err_te:.3e} vs sdpa {err_sdpa:.3e} (allowed {factor} x + {floor})"
    )


@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_logits_match_sdpa(padding):
    print(f"seed={SEED}")
    fp32, sdpa, te = _models(("sdpa", torch.float32), ("sdpa", BF16), ("te_cudnn", BF16))
    ids, mask = _inputs(padding)
    ref, a, b = (_logits(m, ids, mask) for m in (fp32, sdpa, te))
    valid = torch.ones(B, S, dtype=torch.bool, device=DEVICE) if mask is None else mask.bool()
    assert torch.isfinite(b[valid]).all()
    _within("logits", rel_error(b[valid], ref[valid]), rel_error(a[valid], ref[valid]))


@pytest.mark.parametrize("padding", ["none", "left"])
def test_kv_cache_decoding(padding):
    """Prefill S-1 tokens, decode the last one (s_q = 1 against s_kv = S): the last logits are
    the full forward's, for te_cudnn as for sdpa."""
    sdpa, te = _models(("sdpa", BF16), ("te_cudnn", BF16))
    ids, mask = _inputs(padding)
    errs = []
    for m in (sdpa, te):
        with torch.no_grad():
            full = m(ids, attention_mask=mask).logits[:, -1].float()
            pre = m(ids[:, :-1], attention_mask=None if mask is None else mask[:, :-1], use_cache=True)
            step = m(ids[:, -1:], attention_mask=mask, past_key_values=pre.past_key_values, use_cache=True)
        errs.append(rel_error(step.logits[:, -1].float(), full))
    _within("logits", errs[1], errs[0])


def test_set_attn_implementation_switches_to_te_cudnn():
    sdpa, te = _models(("sdpa", BF16), ("te_cudnn", BF16))
    ids, mask = _inputs("left")
    sdpa.set_attn_implementation("te_cudnn")
    assert sdpa.config._attn_implementation == "te_cudnn"
    with torch.no_grad():
        a, b = sdpa(ids, attention_mask=mask).logits, te(ids, attention_mask=mask).logits
    assert torch.equal(a, b)


@pytest.mark.parametrize("padding", ["none", "right"])
def test_training(padding):
    print(f"seed={SEED}")
    fp32, sdpa, te = _models(("sdpa", torch.float32), ("sdpa", BF16), ("te_cudnn", BF16))
    ids, mask = _inputs(padding)
    labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
    losses, grads = [], []
    for m in (fp32, sdpa, te):
        m.train()
        with _kernel(m):
            out = m(ids, attention_mask=mask, labels=labels)
            out.loss.backward()
        losses.append(out.loss.item())
        grads.append(torch.cat([p.grad.float().flatten() for p in m.parameters()]))
    assert all(torch.isfinite(g).all() for g in grads), f"seed={SEED}: non-finite gradients"
    _within("loss", abs(losses[2] - losses[0]) / losses[0], abs(losses[1] - losses[0]) / losses[0])
    _within("grads", rel_error(grads[2], grads[0]), rel_error(grads[1], grads[0]))

    opt = torch.optim.AdamW(te.parameters(), lr=1e-3)
    trace = []
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        loss = te(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in te.parameters()), f"seed={SEED}: non-finite gradients"
        opt.step()
        trace.append(loss.item())
    assert trace[-1] < trace[0] - 0.1, f"seed={SEED}: loss did not decrease: {trace}"
