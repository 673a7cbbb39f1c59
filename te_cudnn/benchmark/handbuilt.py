"""The yardstick: the same cuDNN SDPA graphs written directly against the frontend, with no
te_cudnn code (dense bshd training cases; causal top-left; optional post-scale bias), built with
the frontend's heuristics and run with ``graph.execute``. The host-time section uses its
inference forward as the bare ``graph.execute`` te_cudnn is held against."""

from __future__ import annotations

import time
from typing import Optional

import torch

from ..runtime import cudnn_module
from .cases import Case
from .contender import Contender, Run
from .inputs import Inputs

__all__ = ["HandGraphs", "HandBuilt", "HandBuiltRun", "HandBuiltAllocatingRun"]


class HandGraphs:
    """The cuDNN SDPA forward (and backward) graph written directly against the frontend, on
    BHSD views, built with the frontend's heuristics (A, then FALLBACK), run with
    ``graph.execute(variant_pack, workspace, handle)``; outputs are preallocated once.
    ``build=False`` only defines the graphs (no handle, no GPU: ``validate()`` works anywhere)."""

    def __init__(self, q, k, v, *, training: bool, causal: bool, bias=None, d_o=None, build: bool = True):
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

    def fwd_allocating(self) -> tuple:
        """The forward into new O and stats (``torch.empty_like`` of the preallocated ones: the
        same strides), as a training loop must: autograd keeps each layer's O and stats until
        its backward. Returns ``(o, stats)``."""
        o, st = torch.empty_like(self.o), torch.empty_like(self.stats)
        self.bind()
        self.gf.execute({**self.fpack, 4: o, 5: st}, self.workspace, handle=self.handle)
        return o, st

    def bwd_allocating(self, o, st) -> tuple:
        """The backward of the forward that made ``o`` and ``st``, into new dQ, dK, dV."""
        dq, dk, dv = torch.empty_like(self.dq), torch.empty_like(self.dk), torch.empty_like(self.dv)
        self.bind()
        self.gb.execute({**self.bpack, 4: o, 5: st, 12: dq, 13: dk, 14: dv}, self.workspace, handle=self.handle)
        return dq, dk, dv


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


class HandBuiltAllocatingRun(HandBuiltRun):
    """The same graphs, with results allocated per call (see :meth:`HandGraphs.fwd_allocating`):
    what te_cudnn's functions do, as TE's API returns new tensors."""

    def fwd(self):
        return self.g.fwd_allocating()

    def output(self) -> torch.Tensor:
        return self.g.fwd_allocating()[0].permute(0, 2, 1, 3).clone()

    def before(self, mode: str):
        return self.g.fwd_allocating() if mode == "bwd" else None

    def bwd(self, state):
        return self.g.bwd_allocating(*state)

    def fwd_bwd(self):
        o, st = self.g.fwd_allocating()
        return o, st, self.g.bwd_allocating(o, st)


class HandBuilt(Contender):
    """The hand-built graphs; ``allocating``: results allocated per call instead of once."""

    name, key = "cuDNN graph (hand-built)", "hand_built"

    def __init__(self, allocating: bool = False):
        self.allocating = allocating
        if allocating:
            self.name, self.key = "cuDNN graph (hand-built, allocating)", "hand_built_alloc"

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
        return (HandBuiltAllocatingRun if self.allocating else HandBuiltRun)(case, inputs)
