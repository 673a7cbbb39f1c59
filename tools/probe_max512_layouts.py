"""Probe (GPU): the F16 max512 sub-backend's forward for every declared layout over a sweep of
batch sizes and head counts, against the fp32 reference, twice per configuration (a result that
changes between runs reads memory nothing wrote). Prints one line per bad configuration and a
summary per layout.

    python tools/probe_max512_layouts.py [--b 1-8] [--heads 1,4,16] [--s 64,128]
"""

from __future__ import annotations

import argparse

import torch

import te_cudnn as tc
from te_cudnn.backends import BY_ENUM
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.reference import attention_reference
from te_cudnn.testing import make_qkv, rel_error, to_bhsd

MAX512 = FusedAttnBackend.F16_max512_seqlen


def _ints(text: str) -> list[int]:
    if "-" in text:
        lo, hi = map(int, text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--b", default="1-8")
    p.add_argument("--heads", default="1,4,16")
    p.add_argument("--s", default="64,128")
    args = p.parse_args()
    layouts = sorted(BY_ENUM[MAX512].caps.layouts)
    for layout in layouts:
        bad = total = 0
        for b in _ints(args.b):
            for h in _ints(args.heads):
                for s in _ints(args.s):
                    total += 1
                    q, k, v = make_qkv(layout, b, h, h, s, s, 64)
                    outs = [tc.fused_attn_fwd(False, s, s, None, None, q, k, v, q.dtype, MAX512, qkv_layout=layout.name,
                                              attn_mask_type="no_mask")[0].clone() for _ in range(2)]  # fmt: skip
                    ref = attention_reference(*(to_bhsd(t, layout).float() for t in (q, k, v)), attn_mask_type="no_mask")
                    err = rel_error(to_bhsd(outs[0], layout), ref.out)
                    stable = torch.equal(outs[0], outs[1])
                    if err > 2e-2 or not stable:
                        bad += 1
                        print(f"BAD {layout.name} b={b} h={h} s={s}: rel err {err:.2e}, repeatable={stable}")
        print(f"max512 {layout.name}: {total - bad}/{total} configurations right")


if __name__ == "__main__":
    main()
