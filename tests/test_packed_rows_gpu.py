"""GPU: one query row over a contiguous, growing cache run as a packed (THD) call
(``te_cudnn.packed_rows``), as Hugging Face's dynamic-cache decode hands it.

* seeded random decode steps (bf16/fp16; b 1-4; 1-8 KV heads serving 1-4 query heads each;
  key lengths 1..3000 with the buckets' edges; d 64/128, d_v 64/128): the output against
  torch's SDPA in fp32 (math backend), within ``te_cudnn.testing``'s tolerance of the same
  attention in plain torch ops in the inputs' precision, and against te_cudnn's dense path;
  the SDPA drop-in takes the packed path for the same call and returns the same tensor;
* key lengths inside one bucket share their plans (at most two new ones for 40 lengths from
  513 to 1024), and lengths that come back, alternate or run on another stream read their own
  offsets (the key offsets' buffer is rewritten in place), also when it was made under
  ``torch.inference_mode``;
* inside a CUDA-graph capture the packed path declines (the dense path serves the capture);
* a small Llama's greedy ``generate`` with the dynamic cache gives the same tokens packed and
  dense, and its decode logits match ``sdpa``'s.

The seed comes from ``TE_CUDNN_TEST_SEED`` (else a random one); it is printed and in every
failure message.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import te_cudnn as tc
from te_cudnn.packed_rows import attend_one_row, packed_one_row
from te_cudnn.testing import check_close, rel_error

from _random_cases import seed_from_env, seeded_draws

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
SEED = seed_from_env()
N_CASES = 24


@pytest.fixture(autouse=True)
def _packed():
    was = packed_one_row(True)
    yield
    packed_one_row(was)


def _draw(rng: random.Random) -> tuple:
    skv = rng.choice([rng.randint(1, 3000), rng.choice([1, 2, 63, 64, 65, 512, 513, 1024, 1025, 2048])])
    return (rng.choice([torch.bfloat16, torch.float16]), rng.randint(1, 4), rng.choice([1, 2, 8]), rng.choice([1, 2, 4]),
            skv, rng.choice([64, 128]), rng.choice([64, 128]), rng.choice([None, 0.1]))  # fmt: skip


CASES = seeded_draws(_draw, N_CASES, SEED)


def _step(dtype, b, hg, rep, skv, d, dv, gen):
    h = hg * rep
    q = torch.randn(b, 1, h, d, generator=gen, device=DEVICE).to(dtype).transpose(1, 2)  # the projection's view
    k = torch.randn(b, hg, skv, d, generator=gen, device=DEVICE).to(dtype)
    v = torch.randn(b, hg, skv, dv, generator=gen, device=DEVICE).to(dtype)
    return q, k, v


def _lowp(q, k, v, scale):
    rep = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(rep, dim=1) for t in (k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v


@pytest.mark.parametrize("index", range(N_CASES), ids=[f"case{i}" for i in range(N_CASES)])
def test_matches_torch_and_the_dense_path(index):
    dtype, b, hg, rep, skv, d, dv, scale = CASES[index]
    what = f"seed={SEED} case {index}: {dtype} b{b} hg{hg} rep{rep} skv{skv} d{d} dv{dv} scale={scale}"
    print(what)
    gen = torch.Generator(device=DEVICE).manual_seed(SEED * 1000 + index)
    q, k, v = _step(dtype, b, hg, rep, skv, d, dv, gen)
    with torch.no_grad():
        out = attend_one_row(q, k, v, scale)
        assert out is not None, what
        assert out.shape == (b, 1, hg * rep, dv) and out.dtype == dtype and out.is_contiguous(), what
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale, enable_gqa=True)
        drop_in = tc.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)  # packed too
        packed_one_row(False)
        dense = tc.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        packed_one_row(True)
    got = out.transpose(1, 2)
    assert torch.equal(drop_in, got) and drop_in.stride() == got.stride(), what
    try:
        check_close("out", got, ref, _lowp(q, k, v, scale), dtype)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None
    assert rel_error(got, dense) <= 2 * rel_error(dense, ref) + 1e-3, what


def test_lengths_of_one_bucket_share_plans_and_come_back_right():
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    b, hg, rep, d = 4, 8, 4, 64
    steps = {}
    with torch.no_grad():
        attend_one_row(*_step(torch.bfloat16, b, hg, rep, 513, d, d, gen), None)  # the bucket's first plan
        before = tc.plan_cache.stats()
        for skv in range(520, 1025, 13):
            q, k, v = _step(torch.bfloat16, b, hg, rep, skv, d, d, gen)
            steps[skv] = (q, k, v, attend_one_row(q, k, v, None))
        after = tc.plan_cache.stats()
        assert after.builds + after.loads - before.builds - before.loads <= 1, f"seed={SEED}: {after} after {before}"
        # lengths again, alternating, on another stream: each call reads its own key offsets
        side = torch.cuda.Stream()
        order = [1014, 520, 1014, 611, 520]
        for i, skv in enumerate(order):
            q, k, v, first = steps[skv]
            if i % 2:
                with torch.cuda.stream(side):
                    again = attend_one_row(q, k, v, None)
                torch.cuda.current_stream().wait_stream(side)
            else:
                again = attend_one_row(q, k, v, None)
            torch.testing.assert_close(again, first, rtol=0, atol=0, msg=f"seed={SEED} skv={skv}")
            with sdpa_kernel(SDPBackend.MATH):
                ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
            assert rel_error(again.transpose(1, 2), ref) < 2e-2, f"seed={SEED} skv={skv}"


def test_buffers_made_in_inference_mode_serve_outside_it():
    """The first call of a batch size under ``torch.inference_mode`` makes its offset buffers;
    a later call under ``no_grad`` rewrites them (inference tensors could not be)."""
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    b, hg, rep = 3, 5, 1  # 15 sequences: a batch size no other test here uses
    for mode, skv in ((torch.inference_mode, 50), (torch.no_grad, 70), (torch.inference_mode, 90)):
        q, k, v = _step(torch.bfloat16, b, hg, rep, skv, 64, 64, gen)
        with mode():
            out = attend_one_row(q, k, v, None)
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        assert rel_error(out.transpose(1, 2), ref) < 2e-2, f"seed={SEED} {mode.__name__} skv={skv}"


def test_a_scale_that_is_not_a_float_is_the_drop_ins_error():
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    q, k, v = _step(torch.bfloat16, 2, 2, 4, 100, 64, 64, gen)
    with torch.no_grad():
        assert attend_one_row(q, k, v, "0.25") is None
        with pytest.raises(TypeError, match="scale"):
            tc.scaled_dot_product_attention(q, k, v, scale="0.25", enable_gqa=True)


def test_declines_inside_a_capture():
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    q, k, v = _step(torch.bfloat16, 2, 2, 4, 100, 64, 64, gen)
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        with torch.cuda.graph(graph, stream=s):
            assert attend_one_row(q, k, v, None) is None
    torch.cuda.current_stream().wait_stream(s)


def test_generate_tokens_equal_dense_and_logits_match_sdpa():
    transformers = pytest.importorskip("transformers")
    from te_cudnn.integrations import transformers as te_hf

    te_hf.register()
    cfg = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=8,
               num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512, attention_dropout=0.0)  # fmt: skip
    torch.manual_seed(SEED)
    state = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**cfg)).state_dict()
    models = {}
    for impl in ("sdpa", "te_cudnn"):
        m = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**cfg), attn_implementation=impl)
        m.load_state_dict(state)
        models[impl] = m.to(device=DEVICE, dtype=torch.bfloat16).eval()
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    ids = torch.randint(1, 1000, (3, 70), generator=gen, device=DEVICE)  # no pad token (0): no mask
    kw = dict(max_new_tokens=40, do_sample=False, min_new_tokens=40, pad_token_id=0)
    with torch.no_grad():
        before = tc.plan_cache.stats()
        packed = models["te_cudnn"].generate(ids, **kw)
        after = tc.plan_cache.stats()
        packed_one_row(False)
        dense = models["te_cudnn"].generate(ids, **kw)
        packed_one_row(True)
    # 40 key lengths from 70 to 109: the packed decode steps need at most two plans (lengths and tokens
    # buckets), beside the prefill's
    assert after.builds + after.loads - before.builds - before.loads <= 3, f"seed={SEED}: {after} after {before}"
    # Greedy decoding of random weights meets near-ties, where the two kernels' rounding may pick
    # different tokens: the first row and step where they part must be such a tie.
    differ = (packed != dense).nonzero()
    if len(differ):
        row, col = differ[0].tolist()
        with torch.no_grad():
            logits = models["sdpa"].float()(packed[row : row + 1, :col]).logits[0, -1]
            models["sdpa"].to(torch.bfloat16)
        gap = (logits[packed[row, col]] - logits[dense[row, col]]).abs().item()
        assert gap <= 0.02 * logits.std().item(), (
            f"seed={SEED}: packed and dense decoding part at row {row} step {col} where the fp32 logits "
            f"differ by {gap:.3e} (std {logits.std().item():.3e}), no tie"
        )
    # one decode step's logits against sdpa's, both against the fp32 full forward's last position
    errs = []
    with torch.no_grad():
        full = models["sdpa"].float()(packed[:, :80]).logits[:, -1]
        models["sdpa"].to(torch.bfloat16)
        for impl in ("sdpa", "te_cudnn"):
            pre = models[impl](packed[:, :79], use_cache=True)
            step = models[impl](packed[:, 79:80], past_key_values=pre.past_key_values, use_cache=True)
            errs.append(rel_error(step.logits[:, -1].float(), full))
    assert errs[1] <= 2 * errs[0] + 2e-3, f"seed={SEED}: te_cudnn packed {errs[1]:.3e} vs sdpa {errs[0]:.3e}"
