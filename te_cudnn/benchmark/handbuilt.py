"""The yardstick: the same cuDNN SDPA graphs written directly against the frontend, with no
te_cudnn code (dense bshd training cases; causal top-left; optional post-scale bias), built with
the frontend's heuristics and run with ``graph.execute``. The host-time section uses its
inference forward as the bare ``graph.execute`` te_cudnn is held against."""

from __future__ import annotations

import time
from typing import Optional

import torch

from .cases import Case
from .contenders import Contender, Run
from .inputs import Inputs

__all__ = ["HandGraphs", "HandBuilt", "HandBuiltRun"]


class HandGraphs:
    """The cuDNN SDPA forward (and backward) graph written directly against the frontend, on
    BHSD views, built with the frontend's heuristics (A, then FALLBACK), run with
    ``graph.execute(variant_pack, workspace, handle)``; outputs are preallocated once.
    ``build=False`` only defines the graphs (no handle, no GPU: ``validate()`` works anywhere)."""

    def __init__(self, q, k, v, *, training: bool, causal: bool, bias=None, d_o=None, build: bool = True):
        from ..runtime import cudnn_module  # noqa: PLC0415

        cudnn = self.cudnn = cudnn_module()
        self.handle = None
        hkw: dict = {}
        if build:
            self.handle = hkw["handle"] = cudnn.create_handle()
            cudnn.set_stream(self.handle, torch.cuda.current_stream().cuda_stream)
        io = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF}[q.dtype]
        FL = cudnn.data_type.FLOAT
        b, h, sq, d = q.shape
        self.o = torch.empty(b, sq, h, v.shape[-1], dtype=q.dtype, device=q.device).permute(0, 2, 1, 3)  # bshd memory
        self.stats = torch.empty(b, h, sq, 1, dtype=torch.float32, device=q.device) if training else None
        scale = d**-0.5
        mask = dict(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0) if causal else {}

        def T(g, t, uid, dt=io):
            return g.tensor(name=f"t{uid}", dim=list(t.shape), stride=list(t.stride()), data_type=dt, uid=uid)

        t0 = time.perf_counter()
        gf = cudnn.pygraph(io_data_type=io, intermediate_data_type=FL, compute_data_type=FL, **hkw)
        extra = {"bias": T(gf, bias, 6)} if bias is not None else {}
        o, st = gf.sdpa(q=T(gf, q, 1), k=T(gf, k, 2), v=T(gf, v, 3), attn_scale=scale, generate_stats=training,
                        **mask, **extra)  # fmt: skip
        o.set_output(True).set_uid(4).set_dim(list(self.o.shape)).set_stride(list(self.o.stride()))
        if training:
            st.set_output(True).set_uid(5).set_data_type(FL).set_dim(list(self.stats.shape)).set_stride(
                list(self.stats.stride()))
        self.gf, self.gb = gf, None
        self.fpack = {1: q, 2: k, 3: v, 4: self.o}
        if training:
            self.fpack[5] = self.stats
        if bias is not None:
            self.fpack[6] = bias
        if training:
            self.dq, self.dk, self.dv = (torch.empty_like(t.permute(0, 2, 1, 3)).permute(0, 2, 1, 3) for t in (q, k, v))
            gb = cudnn.pygraph(io_data_type=io, intermediate_data_type=FL, compute_data_type=FL, **hkw)
            extra_b = {}
            if bias is not None:
                self.dbias = torch.empty_like(bias)
                extra_b = {"bias": T(gb, bias, 6), "dBias": T(gb, self.dbias, 15)}
            dq, dk, dv = gb.sdpa_backward(q=T(gb, q, 1), k=T(gb, k, 2), v=T(gb, v, 3), o=T(gb, self.o, 4),
                                          dO=T(gb, d_o, 11), stats=T(gb, self.stats, 5, FL), attn_scale=scale,
                                          use_deterministic_algorithm=False, **mask, **extra_b)  # fmt: skip
            for t, ref, uid in ((dq, self.dq, 12), (dk, self.dk, 13), (dv, self.dv, 14)):
                t.set_output(True).set_uid(uid).set_dim(list(ref.shape)).set_stride(list(ref.stride()))
            if bias is not None:
                extra_b["dBias"].set_output(True)
            self.gb = gb
            self.bpack = {1: q, 2: k, 3: v, 4: self.o, 5: self.stats, 11: d_o, 12: self.dq, 13: self.dk, 14: self.dv}
            if bias is not None:
                self.bpack[6], self.bpack[15] = bias, self.dbias
        if not build:
            return
        graphs = [g for g in (self.gf, self.gb) if g is not None]
        for g in graphs:
            g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        self.build_ms = (time.perf_counter() - t0) * 1e3
        self.plan_names = [g.get_plan_name_at_index(0) for g in graphs]
        ws = max(g.get_workspace_size() for g in graphs)
        self.workspace = torch.empty(max(ws, 1), dtype=torch.uint8, device=q.device)

    def bind(self) -> None:
        """Bind the handle to the current stream (capture streams included)."""
        self.cudnn.set_stream(self.handle, torch.cuda.current_stream().cuda_stream)

    def fwd(self) -> None:
        self.bind()
        self.gf.execute(self.fpack, self.workspace, handle=self.handle)

    def bwd(self) -> None:
        self.bind()
        self.gb.execute(self.bpack, self.workspace, handle=self.handle)


class HandBuiltRun(Run):
    def __init__(self, case: Case, inp: Inputs):
        super().__init__()
        q, k, v, d_o = (Inputs.bhsd(t) for t in (inp.q, inp.k, inp.v, inp.d_o))
        self.g = HandGraphs(q, k, v, training=True, causal=case.causal, bias=inp.bias, d_o=d_o)
        self.info.update(build_ms=self.g.build_ms, plans="; ".join(self.g.plan_names),
                         workspace_mib=self.g.workspace.numel() / 2**20)  # fmt: skip

    def fwd(self):
        self.g.fwd()

    def output(self) -> torch.Tensor:
        self.g.fwd()
        return self.g.o.permute(0, 2, 1, 3).clone()

    def before(self, mode: str):
        if mode == "bwd":
            self.g.fwd()  # the stats and O the backward reads

    def bwd(self, state):
        self.g.bwd()

    def fwd_bwd(self):
        self.g.fwd()
        self.g.bwd()


class HandBuilt(Contender):
    name, key = "cuDNN graph (hand-built)", "hand_built"

    def supports(self, case: Case) -> Optional[str]:
        if case.is_paged or not case.training:
            return "the hand-built graph is written for dense training; decode runs te_cudnn's paged graph only"
        if case.is_thd or case.is_padded:
            return "the hand-built graph covers dense bshd batches without padding (no ragged offsets or lengths)"
        if case.mask not in ("no_mask", "causal"):
            return f"the hand-built graph has masks no_mask and causal, not {case.mask}"
        if case.bias not in ("no_bias", "post_scale_bias"):
            return f"the hand-built graph takes no {case.bias}"
        return None

    def prepare(self, case: Case, inputs: Inputs) -> Run:
        return HandBuiltRun(case, inputs)
