"""What the zero-fills of padding-mask calls cost, and what dropping them (``te_cudnn.row_fill``)
saves: te_cudnn's forward and backward of a dense padding batch, timed side by side with the
same calls forced to zero-fill O (forward) and dQ/dK/dV (backward) with the lengths as given
(what te_cudnn did before), and with the causal mask alone (no lengths, no fills) as the floor.

Back-to-back eager calls between CUDA events, interleaved rounds, medians (device ms).

    python tools/probe_fill_cost.py [--rounds 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import te_cudnn as tc
from te_cudnn import ops
from te_cudnn import varlen
from te_cudnn.benchmark.measure import event_ms, interleaved
from te_cudnn.row_fill import Lengths

SHAPES = (  # name, b, s, h, hg, d
    ("bert_b32_s512_h16_d64", 32, 512, 16, 16, 64),
    ("llama_b2_s4k_h32_hg8_d128", 2, 4096, 32, 8, 128),
    ("short_b64_s128_h16_d64", 64, 128, 16, 16, 64),
)


def _as_before(prep: ops._Prepared) -> None:
    """The prepared call as te_cudnn ran it before row_fill: lengths as given, results zero-filled."""
    prep.lengths, prep.fill_out, prep.fill_grads = Lengths.AS_GIVEN, True, True
    prep.runtime_kind = (*varlen.runtime_kind(prep.cfg), Lengths.AS_GIVEN)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    rows = []
    for name, b, s, h, hg, d in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, s, h, d, generator=gen, device="cuda").to(torch.bfloat16)
        k, v = (torch.randn(b, s, hg, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
        lens = torch.randint(s // 2, s + 1, (b,), generator=torch.Generator().manual_seed(1))
        cu = torch.cat((torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32))).cuda()
        d_o = torch.randn_like(q)
        variants = {}
        for variant, mask in (("te_cudnn (row_fill)", "padding_causal"), ("lengths as given + zero-fills (before)",
                                                                           "padding_causal"), ("causal, no lengths", "causal")):
            kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type=mask)
            if variant.endswith("(before)"):  # a separate signature: attn_scale differs by nothing but the key
                kw["attn_scale"] = d**-0.5 * (1 + 2**-20)
            out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
            tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, q.dtype, aux, None, **kw)
            if variant.endswith("(before)"):
                patched = [p for memo in (ops._fwd_memo, ops._bwd_memo) for p in memo.values()
                           if p.cfg.attn_scale == kw["attn_scale"] and p.cfg.b == b and p.cfg.sq == s]  # fmt: skip
                assert len(patched) == 2, patched
                for p in patched:
                    _as_before(p)
                out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)

            def fwd(kw=kw, qkv=(q, k, v), s=s, cu=cu):
                return tc.fused_attn_fwd(True, s, s, cu, cu, *qkv, torch.bfloat16, None, **kw)

            def bwd(kw=kw, qkv=(q, k, v), out=out, aux=aux, d_o=d_o, s=s, cu=cu):
                return tc.fused_attn_bwd(s, s, cu, cu, *qkv, out, d_o, torch.bfloat16, aux, None, **kw)

            variants[variant] = (fwd, bwd)
        torch.cuda.synchronize()
        samplers = {}
        for variant, (fwd, bwd) in variants.items():
            samplers[f"{variant} fwd"] = lambda f=fwd: event_ms(f, 5)
            samplers[f"{variant} bwd"] = lambda g=bwd: event_ms(g, 5)
        for fn in samplers.values():
            fn()
        res = {n: statistics.median(v) for n, v in interleaved(samplers, a.rounds).items()}
        row = {"shape": name, "lengths": lens.tolist(), **res}
        rows.append(row)
        print(name)
        for n, ms in res.items():
            print(f"  {n:48s} {ms:8.4f} ms")
        del q, k, v, d_o, variants, samplers
        ops.forget_prepared()
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
