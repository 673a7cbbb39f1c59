"""Which rows does cuDNN write for a padding mask (bshd, per-sequence lengths shorter than the
padded length)? The results are prefilled with NaN, every engine configuration the heuristics
offer (modes A, B, FALLBACK; every plan built) runs the forward and the backward, and the probe
reports whether the rows past each sequence's end come back as zeros (O, dQ, dK, dV) or are left
unwritten (NaN), and whether the valid rows are finite.

te_cudnn zero-fills O and the gradients of padding-mask calls so that rows past a sequence's end
are exactly zero; this probe says whether that fill is needed.

    python tools/probe_padded_rows.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from te_cudnn.runtime import cudnn_module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    cudnn = cudnn_module()
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    io, fl, i32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT, cudnn.data_type.INT32
    rows = []
    for (b, s, h, hg, d, causal, sq) in ((4, 256, 8, 8, 64, False, 256), (4, 512, 8, 2, 128, True, 512),
                                          (8, 8192, 32, 8, 128, False, 1), (3, 1024, 4, 4, 128, True, 1024)):
        gen = torch.Generator(device="cuda").manual_seed(1)
        lq = torch.tensor([sq, max(sq // 2, 1), max(sq // 3, 1), max(sq - 7, 1)] * 2, dtype=torch.int32)[:b]
        if sq == 1:
            lq = torch.tensor([1, 0, 1, 1, 0, 1, 1, 1], dtype=torch.int32)[:b]
        lkv = torch.tensor([s, s // 2, s // 3 + 5, s - 64] * 2, dtype=torch.int32)[:b]
        if causal:
            lkv = lq.clone()
        q = torch.randn(b, sq, h, d, generator=gen, device="cuda").to(torch.bfloat16)
        k = torch.randn(b, s, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
        v = torch.randn(b, s, hg, d, generator=gen, device="cuda").to(torch.bfloat16)
        d_o = torch.randn(b, sq, h, d, generator=gen, device="cuda").to(torch.bfloat16)
        seq_q = lq.view(b, 1, 1, 1).cuda()
        seq_kv = lkv.view(b, 1, 1, 1).cuda()
        bh = lambda t: t.permute(0, 2, 1, 3)  # noqa: E731
        o = torch.empty_like(q)
        st = torch.empty(b, h, sq, 1, dtype=torch.float32, device="cuda")
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def T(g, t, uid, dt=io):
            return g.tensor(name=f"t{uid}", dim=list(t.shape), stride=list(t.stride()), data_type=dt, uid=uid)

        mask = dict(use_padding_mask=True)
        if causal:
            mask.update(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0)
        training = sq > 1
        label = f"b={b} s={s} sq={sq} h={h}/{hg} d={d}{' causal' if causal else ''} lens_q={lq.tolist()} lens_kv={lkv.tolist()}"
        for direction in ("fwd", "bwd") if training else ("fwd",):
            g = cudnn.pygraph(io_data_type=io, intermediate_data_type=fl, compute_data_type=fl, handle=handle)
            common = dict(seq_len_q=T(g, seq_q, 20, i32), seq_len_kv=T(g, seq_kv, 21, i32), attn_scale=d**-0.5, **mask)
            pack = {1: bh(q), 2: bh(k), 3: bh(v), 20: seq_q, 21: seq_kv}
            if direction == "fwd":
                out, stats = g.sdpa(q=T(g, bh(q), 1), k=T(g, bh(k), 2), v=T(g, bh(v), 3), generate_stats=True, **common)
                out.set_output(True).set_uid(4).set_dim(list(bh(o).shape)).set_stride(list(bh(o).stride()))
                stats.set_output(True).set_uid(5).set_data_type(fl).set_dim(list(st.shape)).set_stride(list(st.stride()))
                pack.update({4: bh(o), 5: st})
                checks = {"O": (o, lq, 1)}
            else:
                gq, gk, gv = g.sdpa_backward(q=T(g, bh(q), 1), k=T(g, bh(k), 2), v=T(g, bh(v), 3), o=T(g, bh(o), 4),
                                             dO=T(g, bh(d_o), 11), stats=T(g, st, 5, fl), **common)  # fmt: skip
                for t, ref, uid in ((gq, dq, 12), (gk, dk, 13), (gv, dv, 14)):
                    t.set_output(True).set_uid(uid).set_dim(list(bh(ref).shape)).set_stride(list(bh(ref).stride()))
                pack.update({4: bh(o), 5: st, 11: bh(d_o), 12: bh(dq), 13: bh(dk), 14: bh(dv)})
                checks = {"dQ": (dq, lq, 1), "dK": (dk, lkv, 1), "dV": (dv, lkv, 1)}
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
            g.check_support()
            try:
                g.build_plans(cudnn.build_plan_policy.ALL)
            except Exception as e:  # noqa: BLE001
                print(f"  {label} {direction}: build_plans(ALL) raised {type(e).__name__}: {str(e)[:120]}")
            for i in range(int(g.get_execution_plan_count())):
                name = g.get_plan_name_at_index(i)
                try:
                    ws = torch.empty(max(int(g.get_workspace_size_plan_at_index(i)), 16), dtype=torch.uint8, device="cuda")
                    for t, _, _ in checks.values():
                        t.fill_(float("nan"))
                    g.execute_plan_at_index(pack, ws, index=i, handle=handle)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(case=label, direction=direction, plan=name, error=f"{type(e).__name__}: {str(e)[:100]}"))
                    continue
                row = dict(case=label, direction=direction, plan=name)
                for tname, (t, lens, _) in checks.items():
                    pad = torch.zeros(t.shape[:2], dtype=torch.bool, device="cuda")
                    for bi, n in enumerate(lens.tolist()):
                        pad[bi, n:] = True
                    past, valid = t[pad], t[~pad]
                    row[tname] = ("zeros" if past.numel() and past.eq(0).all().item() else
                                  "unwritten (NaN)" if past.numel() and past.isnan().all().item() else
                                  "none padded" if not past.numel() else "mixed")  # fmt: skip
                    row[tname + " valid finite"] = bool(valid.isfinite().all().item())
                rows.append(row)
                print("  " + " | ".join(f"{k}={v}" for k, v in row.items()))
            if direction == "fwd" and training:  # give the backward real O and stats
                g.execute_plan_at_index(pack, torch.empty(max(int(g.get_workspace_size_plan_at_index(0)), 16),
                                                          dtype=torch.uint8, device="cuda"), index=0, handle=handle)  # fmt: skip
                o.nan_to_num_(0.0)
                torch.cuda.synchronize()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
