"""GPU: one-row inference forwards run plans without a workspace (``te_cudnn.plans.one_row``).

* seeded random decode steps through the SDPA drop-in (bf16/fp16; b 1-4; 1-8 KV heads serving
  1-4 query heads each; key lengths 1..1100 with the edges 1, 1024 and 1025; d 64/128): the
  output against torch's SDPA in fp32 (math backend) within ``te_cudnn.testing``'s tolerance,
  and the same call with the preference off; the plan's key says whether it prefers no
  workspace (up to 1024 keys) and such a plan has none;
* a training forward of one row (softmax stats saved) keeps the heuristics' plan;
* a captured and replayed one-row call gives the eager result.

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
from te_cudnn.plans.one_row import MAX_KEYS, lean_one_row
from te_cudnn.testing import check_close

from _random_cases import seed_from_env, seeded_draws

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
SEED = seed_from_env()
N_CASES = 16


@pytest.fixture(autouse=True)
def _lean():
    was = lean_one_row(True)
    yield
    lean_one_row(was)


def _draw(rng: random.Random) -> tuple:
    skv = rng.choice([rng.randint(1, 1100), rng.choice([1, 64, 600, MAX_KEYS, MAX_KEYS + 1])])
    return rng.choice([torch.bfloat16, torch.float16]), rng.randint(1, 4), rng.choice([1, 2, 8]), rng.choice([1, 2, 4]), \
        skv, rng.choice([64, 128])  # fmt: skip


CASES = seeded_draws(_draw, N_CASES, SEED)


def _one_row_plans() -> list:
    return [p for p in tc.plan_cache.plans() if p.key.config.sq == 1]


def _step(dtype, b, hg, rep, skv, d, gen):
    q = torch.randn(b, 1, hg * rep, d, generator=gen, device=DEVICE).to(dtype).transpose(1, 2)
    k = torch.randn(b, hg, skv, d, generator=gen, device=DEVICE).to(dtype)
    v = torch.randn(b, hg, skv, d, generator=gen, device=DEVICE).to(dtype)
    return q, k, v


def _lowp(q, k, v):
    rep = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(rep, dim=1) for t in (k, v))
    return torch.softmax((q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5, dim=-1) @ v


@pytest.mark.parametrize("index", range(N_CASES), ids=[f"case{i}" for i in range(N_CASES)])
def test_one_row_call_runs_the_preferred_plan_and_matches_torch(index):
    dtype, b, hg, rep, skv, d = CASES[index]
    what = f"seed={SEED} case {index}: {dtype} b{b} hg{hg} rep{rep} skv{skv} d{d}"
    print(what)
    gen = torch.Generator(device=DEVICE).manual_seed(SEED * 1000 + index)
    q, k, v = _step(dtype, b, hg, rep, skv, d, gen)
    tc.plan_cache.clear()
    with torch.no_grad():
        out = tc.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        plans = _one_row_plans()
        lean_one_row(False)
        heuristic = tc.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        plans_off = [p for p in _one_row_plans() if all(p is not x for x in plans)]
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    preferred = skv <= MAX_KEYS
    assert len(plans) == 1 and len(plans_off) == int(preferred), what  # beyond MAX_KEYS: one key, one plan
    assert plans[0].key.no_workspace == preferred, what
    assert not any(p.key.no_workspace for p in plans_off), what
    if plans[0].key.no_workspace:
        assert plans[0].workspace_size == 0, f"{what}: {plans[0].plan_name} needs {plans[0].workspace_size} bytes"
    for name, got in (("preferred", out), ("heuristic", heuristic)):
        try:
            check_close(name, got, ref, _lowp(q, k, v), dtype)
        except AssertionError as e:
            raise AssertionError(f"{what}: {e}") from None


def test_a_training_forward_of_one_row_keeps_the_heuristic_plan():
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    q, k, v = (t.requires_grad_() for t in _step(torch.bfloat16, 2, 8, 4, 600, 64, gen))
    tc.plan_cache.clear()
    tc.scaled_dot_product_attention(q, k, v, enable_gqa=True).sum().backward()
    forwards = [p for p in _one_row_plans() if p.key.direction.value == "fwd"]
    assert forwards and not any(p.key.no_workspace for p in forwards), f"seed={SEED}: {[p.key for p in forwards]}"
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_a_captured_one_row_call_replays_the_eager_result():
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    q, k, v = _step(torch.bfloat16, 4, 8, 4, 640, 64, gen)
    with torch.no_grad():
        eager = tc.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            tc.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tc.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        q.copy_(torch.randn(q.shape, generator=gen, device=DEVICE).to(q.dtype))
        graph.replay()
        torch.cuda.synchronize()
        again = tc.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.equal(captured, again), f"seed={SEED}"
    assert not torch.equal(eager, again), f"seed={SEED}: the replay read the new queries"
