"""Packed one-row decode against the dense path: what a dynamic-cache decode step costs.

The front-door benchmark's Llama (random weights, 16 layers, hidden 2048, 32 heads over 8 KV
heads, bf16). For the attention call of a decode step (b=4, 600 cached keys, d=64) it prints

* host µs per call: te_cudnn's Hugging Face attention function on a remembered dense
  signature, the same call run packed (``te_cudnn.packed_rows``) at a repeated key length and
  at a new length every call (every step of a real ``generate``), and transformers' ``sdpa``;
* GPU µs per call, back to back behind a spin: dense, packed and torch's SDPA;

and for whole ``generate`` calls (b=4, a 333-token prompt no earlier call used, 128 new tokens,
greedy, plan store off): the first call's seconds and the next calls' tokens/s, ``sdpa``,
te_cudnn dense and te_cudnn packed taking turns, with their tokens compared.

    TE_CUDNN_PLAN_STORE=off python tools/probe_packed_decode.py [--turns 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from te_cudnn.benchmark.front_doors import _llama_config, _transformers
from te_cudnn.integrations import transformers as te_hf
from te_cudnn.packed_rows import attend_one_row, packed_one_row
from te_cudnn.timing import host_medians, queued_ms, spin_rate


class _Module(torch.nn.Module):
    is_causal = True


def _call_costs(b: int = 4, h: int = 32, hg: int = 8, skv: int = 600, d: int = 64) -> None:
    transformers = _transformers()
    sdpa = transformers.integrations.sdpa_attention.sdpa_attention_forward
    module = _Module().eval()
    module.num_key_value_groups = h // hg  # transformers' sdpa reads it (GQA)
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, hg, skv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    # a new length every call: the keys of 64 lengths (one bucket), cycled
    ks = [torch.randn(b, hg, n, d, device="cuda", dtype=torch.bfloat16) for n in range(600, 664)]
    turn = [0]

    def dense():
        packed_one_row(False)
        te_hf.attention_forward(module, q, k, v, None)

    def packed():
        packed_one_row(True)
        te_hf.attention_forward(module, q, k, v, None)

    def packed_new_length():
        packed_one_row(True)
        kk = ks[turn[0] % len(ks)]
        turn[0] += 1
        te_hf.attention_forward(module, q, kk, kk, None)

    def transformers_sdpa():
        sdpa(module, q, k, v, None, is_causal=False)

    with torch.no_grad():
        for f in (dense, packed, packed_new_length):
            f()
        packed_one_row(False)
        expected = te_hf.attention_forward(module, q, k, v, None)[0]
        packed_one_row(True)
        torch.testing.assert_close(attend_one_row(q, k, v, None), expected, rtol=2e-2, atol=2e-2)
        fns = {"dense (remembered signature)": dense, "packed, repeated length": packed,
               "packed, new length every call": packed_new_length, "transformers sdpa": transformers_sdpa}
        host = host_medians(fns, rounds=7, calls=200)
        rate = spin_rate(0)
        gpu = {}
        for name in ("dense (remembered signature)", "packed, repeated length", "transformers sdpa"):
            gpu[name] = statistics.median(queued_ms(fns[name], 200, lead=5, ahead_ms=50, rate=rate)[0] for _ in range(5))
    print(f"attention call of a decode step, b={b} h={h} hg={hg} skv={skv} d={d} (packing switched per call):")
    for name in fns:
        extra = f"  GPU {gpu[name] * 1e3:6.1f} µs" if name in gpu else ""
        print(f"  {name:32s} host {host[name]:6.1f} µs{extra}")


def llama_models() -> dict:
    """The front-door benchmark's Llama as ``"sdpa"`` and ``"te_cudnn"`` models with the same
    random weights, each built from its own config, on the GPU in bf16, in eval mode."""
    transformers = _transformers()
    te_hf.register()
    torch.manual_seed(0)
    models = {}
    for impl in ("sdpa", "te_cudnn"):
        m = transformers.AutoModelForCausalLM.from_config(_llama_config(), attn_implementation=impl)
        models[impl] = m.to(device="cuda", dtype=torch.bfloat16).eval()
    models["te_cudnn"].load_state_dict(models["sdpa"].state_dict())
    return models


def _generate(turns: int, prompt: int = 333, new_tokens: int = 128, b: int = 4) -> None:
    models = llama_models()
    ids = torch.randint(0, 32000, (b, prompt), device="cuda")
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    runs = {"sdpa": ("sdpa", None), "te_cudnn packed": ("te_cudnn", True), "te_cudnn dense": ("te_cudnn", False)}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    tokens = {}
    with torch.no_grad():
        for turn in range(turns + 1):
            for name, (impl, packed) in (runs.items() if turn % 2 == 0 else reversed(list(runs.items()))):
                if packed is not None:
                    packed_one_row(packed)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = models[impl].generate(ids, **kw)
                torch.cuda.synchronize()
                seconds[name].append(time.perf_counter() - t0)
                tokens[name] = out
    print(f"generate b={b}, prompt {prompt}, {new_tokens} new tokens, dynamic cache:")
    for name, s in seconds.items():
        rate = b * new_tokens / statistics.median(s[1:])
        print(f"  {name:16s} first call {s[0]:7.2f} s   then {rate:7.1f} tokens/s (median of {len(s) - 1})")
    print(f"  tokens packed == dense: {torch.equal(tokens['te_cudnn packed'], tokens['te_cudnn dense'])}; "
          f"packed == sdpa: {torch.equal(tokens['te_cudnn packed'], tokens['sdpa'])}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=5, help="generate calls per contender after the first")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("probe_packed_decode: needs a CUDA device")
        return 2
    was = packed_one_row()
    try:
        _call_costs()
        _generate(a.turns)
    finally:
        packed_one_row(was)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
