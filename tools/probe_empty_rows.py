"""Which result rows does cuDNN leave unwritten under a padding mask when some sequences are
empty, and does remapping the lengths make it write every row?

``tools/probe_padded_rows.py`` found (cuDNN 9.19, every engine the heuristics offer) that the rows
past each sequence's end come back as zeros in O, dQ, dK and dV, except the rows of a sequence
whose query length is 0, which stay unwritten. te_cudnn therefore zero-fills every padding-mask
result. This probe asks whether the fill can go:

* ``real``: the lengths as given (some ``len_q = 0``, some ``len_kv = 0``);
* ``remapped``: ``len_q' = max(len_q, 1)`` and ``len_kv' = len_kv if len_q > 0 else 0``, so no
  sequence is empty on the query side and an empty one has one query row that sees no key;
* ``kv>=1``: ``len_kv' = max(len_kv, 1)`` and ``len_q' = len_q if len_kv > 0 else 0``, so every
  sequence has a key and one without keys has no query rows.

For each mask (padding; padding + causal top-left; padding + causal bottom-right), each length
mode and every engine configuration the heuristics offer (modes A, B, FALLBACK; all plans built),
the results are prefilled with NaN and the probe reports whether any element stayed unwritten,
whether every row past a sequence's *real* end is exactly zero, and whether the rows of non-empty
sequences are bit-identical to the ``real`` mode's on the same engine (the remapping must not change
them). The backward reads the forward's O and stats of the same length mode.

    python tools/probe_empty_rows.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from te_cudnn.runtime import cudnn_module

CASES = (  # b, s_q, s_kv, h, hg, d, lens_q, lens_kv
    (6, 256, 256, 8, 8, 64, [256, 0, 100, 0, 37, 256], [256, 200, 0, 0, 37, 255]),
    (6, 512, 512, 8, 2, 128, [512, 0, 300, 0, 1, 511], [512, 512, 0, 0, 1, 500]),
    (4, 2048, 2048, 16, 4, 128, [2048, 0, 1000, 0], [2048, 2048, 0, 0]),
    (8, 1, 4096, 32, 8, 128, [1, 0, 1, 1, 0, 1, 1, 1], [4096, 4096, 0, 2735, 0, 1, 4000, 64]),
    (8, 2, 4096, 32, 8, 128, [2, 0, 1, 2, 0, 1, 2, 2], [4096, 4096, 0, 2735, 0, 1, 4000, 64]),
    (8, 4, 1024, 32, 8, 128, [4, 0, 1, 3, 0, 2, 4, 4], [1024, 512, 0, 700, 0, 1, 1000, 64]),
    (4, 16, 2048, 16, 4, 128, [16, 0, 5, 16], [2048, 100, 0, 16]),
)
MASKS = ("padding", "padding_causal", "padding_causal_bottom_right")


def remap(mode: str, lq: torch.Tensor, lkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if mode == "real":
        return lq, lkv
    if mode == "remapped":  # every sequence has a query row; one without a query has no keys
        return lq.clamp(min=1), torch.where(lq > 0, lkv, torch.zeros_like(lkv))
    # "kv>=1": every sequence has a key; one without keys has no query rows
    return torch.where(lkv > 0, lq, torch.zeros_like(lq)), lkv.clamp(min=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    cudnn = cudnn_module()
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    io, fl, i32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT, cudnn.data_type.INT32
    rows = []
    for b, sq, skv, h, hg, d, lens_q, lens_kv in CASES:
        gen = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(b, sq, h, d, generator=gen, device="cuda").to(torch.bfloat16)
        k = torch.randn(b, skv, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
        v = torch.randn(b, skv, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
        d_o = torch.randn(b, sq, h, d, generator=gen, device="cuda").to(torch.bfloat16)
        lq, lkv = torch.tensor(lens_q, dtype=torch.int32), torch.tensor(lens_kv, dtype=torch.int32)
        bh = lambda t: t.permute(0, 2, 1, 3)  # noqa: E731
        training = sq > 1
        for mask_name in MASKS:
            baseline: dict[str, torch.Tensor] = {}
            for mode in ("real", "remapped", "kv>=1"):
                mq, mkv = remap(mode, lq, lkv)
                seq_q, seq_kv = mq.view(b, 1, 1, 1).cuda(), mkv.view(b, 1, 1, 1).cuda()
                o = torch.empty_like(q)
                st = torch.empty(b, h, sq, 1, dtype=torch.float32, device="cuda")
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

                def T(g, t, uid, dt=io):
                    return g.tensor(name=f"t{uid}", dim=list(t.shape), stride=list(t.stride()), data_type=dt, uid=uid)

                mask = dict(use_padding_mask=True)
                if mask_name == "padding_causal":
                    mask.update(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0)
                elif mask_name == "padding_causal_bottom_right":
                    mask.update(diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, diagonal_band_right_bound=0)
                label = f"b={b} sq={sq} skv={skv} h={h}/{hg} d={d} {mask_name} {mode}"
                for direction in ("fwd", "bwd") if training else ("fwd",):
                    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=fl, compute_data_type=fl, handle=handle)
                    common = dict(seq_len_q=T(g, seq_q, 20, i32), seq_len_kv=T(g, seq_kv, 21, i32), attn_scale=d**-0.5,
                                  **mask)  # fmt: skip
                    pack = {1: bh(q), 2: bh(k), 3: bh(v), 20: seq_q, 21: seq_kv}
                    if direction == "fwd":
                        out, stats = g.sdpa(q=T(g, bh(q), 1), k=T(g, bh(k), 2), v=T(g, bh(v), 3), generate_stats=True,
                                            **common)  # fmt: skip
                        out.set_output(True).set_uid(4).set_dim(list(bh(o).shape)).set_stride(list(bh(o).stride()))
                        stats.set_output(True).set_uid(5).set_data_type(fl).set_dim(list(st.shape)).set_stride(
                            list(st.stride()))
                        pack.update({4: bh(o), 5: st})
                        checks = {"O": (o, lq)}
                    else:
                        gq, gk, gv = g.sdpa_backward(q=T(g, bh(q), 1), k=T(g, bh(k), 2), v=T(g, bh(v), 3),
                                                     o=T(g, bh(o), 4), dO=T(g, bh(d_o), 11), stats=T(g, st, 5, fl),
                                                     **common)  # fmt: skip
                        for t, ref, uid in ((gq, dq, 12), (gk, dk, 13), (gv, dv, 14)):
                            t.set_output(True).set_uid(uid).set_dim(list(bh(ref).shape)).set_stride(list(bh(ref).stride()))
                        pack.update({4: bh(o), 5: st, 11: bh(d_o), 12: bh(dq), 13: bh(dk), 14: bh(dv)})
                        checks = {"dQ": (dq, lq), "dK": (dk, lkv), "dV": (dv, lkv)}
                    try:
                        g.validate()
                        g.build_operation_graph()
                        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
                        g.check_support()
                        g.build_plans(cudnn.build_plan_policy.ALL)
                    except Exception as e:  # noqa: BLE001
                        rows.append(dict(case=label, direction=direction, error=f"{type(e).__name__}: {str(e)[:160]}"))
                        print(f"  {label} {direction}: {rows[-1]['error']}")
                        continue
                    for i in range(int(g.get_execution_plan_count())):
                        name = g.get_plan_name_at_index(i)
                        try:
                            ws = torch.empty(max(int(g.get_workspace_size_plan_at_index(i)), 16), dtype=torch.uint8,
                                             device="cuda")  # fmt: skip
                            for t, _ in checks.values():
                                t.fill_(float("nan"))
                            g.execute_plan_at_index(pack, ws, index=i, handle=handle)
                            torch.cuda.synchronize()
                        except Exception as e:  # noqa: BLE001
                            rows.append(dict(case=label, direction=direction, plan=name,
                                             error=f"{type(e).__name__}: {str(e)[:100]}"))  # fmt: skip
                            continue
                        row = dict(case=label, direction=direction, plan=name)
                        for tname, (t, lens) in checks.items():
                            pad = torch.zeros(t.shape[:2], dtype=torch.bool, device="cuda")
                            for bi, n in enumerate(lens.tolist()):
                                pad[bi, n:] = True
                            nonempty = ((lq > 0) & (lkv > 0)).cuda().view(b, 1).expand(t.shape[:2]) & ~pad
                            row[f"{tname} unwritten"] = int(t.isnan().sum().item())
                            row[f"{tname} past end zero"] = bool(t[pad].eq(0).all().item())
                            key = f"{direction}/{tname}/{name}"
                            if mode == "real" and key not in baseline:
                                baseline[key] = t.clone()
                            elif key in baseline:
                                ref = baseline[key]
                                row[f"{tname} rows of non-empty sequences as real"] = bool(
                                    torch.equal(t[nonempty], ref[nonempty]))
                        rows.append(row)
                        print("  " + " | ".join(f"{k}={v}" for k, v in row.items()))
                    if direction == "fwd" and training:  # the backward reads this mode's O and stats
                        g.execute_plan_at_index(pack, torch.empty(max(int(g.get_workspace_size_plan_at_index(0)), 16),
                                                                  dtype=torch.uint8, device="cuda"), index=0,
                                                handle=handle)  # fmt: skip
                        torch.cuda.synchronize()
                        o.nan_to_num_(0.0)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), cudnn=torch.backends.cudnn.version(), rows=rows), f,
                      indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
