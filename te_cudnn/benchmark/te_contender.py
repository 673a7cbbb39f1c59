"""te_cudnn as a contender: ``fused_attn_fwd`` / ``fused_attn_bwd`` forced to one sub-backend
(or choosing, autotuned), on the shared inputs; its reasons for declining are te_cudnn's own
rules (:func:`te_cudnn.explain`; paged layouts described on the meta device)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..backends import REGISTRY
from ..config import describe_fwd
from ..decode import fused_attn_decode
from ..enums import META_O, FusedAttnBackend
from ..ops import fused_attn_bwd, fused_attn_fwd
from ..plans.tune import autotuning
from ..runtime import current_env
from ..selection import explain
from .cases import Case
from .contender import Contender, Run
from .inputs import Inputs

__all__ = ["TeCudnn", "TeCudnnRun", "TeCudnnDecode", "TeCudnnDecodeRun", "autotuning_context", "AUTOTUNE_DEFAULT_CASES"]


def autotuning_context() -> Callable[[], Any]:
    """``te_cudnn.plans.tune.autotuning(True)`` as a context factory (the te_cudnn autotuned
    contenders and the host section's tuned rounds)."""
    return lambda: autotuning(True)


def _explain_reasons(case: Case, dtype: torch.dtype, env: Any) -> dict[str, list[str]]:
    """Every sub-backend's reasons for declining the case (te_cudnn's own rules)."""

    if not case.is_paged:
        ex = explain(case.training, dtype, dtype, case.layout, case.bias, case.mask, "vanilla", 0.0, case.h, case.hg,
                     case.sq, case.skv, case.d, case.d, batch_size=case.b, bias_shape=case.bias_shape, env=env)  # fmt: skip
        return ex.reasons
    # paged layouts need tensors to be described: shapes only, on the meta device

    meta = torch.device("meta")
    pages = case.pages_per_seq
    q = torch.empty(case.b, case.sq, case.h, case.d, dtype=dtype, device=meta)
    pool = torch.empty(case.b * pages, case.page_size, case.hg, case.d, dtype=dtype, device=meta)
    if case.pool_format == "bhsd":
        pool = torch.empty(case.b * pages, case.hg, case.page_size, case.d, dtype=dtype, device=meta).transpose(1, 2)
    table = torch.empty(case.b, pages, dtype=torch.int32, device=meta)
    cu = torch.empty(case.b + 1, dtype=torch.int32, device=meta)
    cfg = describe_fwd(is_training=case.training, max_seqlen_q=case.sq, max_seqlen_kv=case.skv, cu_seqlens_q=cu,
                       cu_seqlens_kv=cu, q=q, k=pool, v=pool, qkv_dtype=dtype, attn_bias=None, attn_scale=None,
                       dropout=0.0, qkv_layout=case.layout, attn_bias_type=case.bias, attn_mask_type=case.mask,
                       softmax_type="vanilla", window_size=(-1, -1), bottom_right_diagonal=None,
                       page_table_k=table, page_table_v=table)  # fmt: skip
    env = env or current_env()
    return {be.enum.name: be.not_supported_reasons(cfg, env) for be in REGISTRY}


#: the cases te_cudnn autotuned runs by default (the first tuning of a plan times every candidate)
AUTOTUNE_DEFAULT_CASES = frozenset({"test_1", "test_3", "llama_h32_s8k", "llama_h64_s16k", "thd_mixed_16k",
                                    "decode_kv8k", "fp8_b2_h32_s8k", "fp8_b1_h64_s8k"})  # fmt: skip


class TeCudnnRun(Run):
    def __init__(self, case: Case, inp: Inputs, backend: Optional[str], fp8: bool, ctx: Optional[Callable[[], Any]]):
        super().__init__()

        self.case, self.inp, self.training, self.ctx = case, inp, case.training, ctx
        self.backend = None if backend is None else FusedAttnBackend[backend]
        self.kw = dict(qkv_layout=case.layout, attn_mask_type=case.mask, attn_bias_type=case.bias)
        self.fwd_kw: dict = dict(attn_bias=inp.bias)
        self.bwd_kw: dict = {}
        if inp.page_table_k is not None:
            self.fwd_kw.update(page_table_k=inp.page_table_k, page_table_v=inp.page_table_v)
        if fp8:
            f = inp.fp8()
            self.q, self.k, self.v, self.d_o = f.q, f.k, f.v, f.d_o
            self.fwd_kw.update(f.meta.fwd_kwargs())
            self.bwd_kw.update(f.meta.bwd_kwargs())
            self.precision = "fp8"
        else:
            self.q, self.k, self.v, self.d_o = inp.q, inp.k, inp.v, inp.d_o
        self.dtype = self.q.dtype

        # everything bound once: the timed call is te_cudnn's call and nothing else
        self._fa_fwd, self._fa_bwd = fused_attn_fwd, fused_attn_bwd
        self.fwd_kw.update(self.kw)
        self.bwd_kw.update(self.kw)
        self.fwd_args = (case.training, case.sq, case.skv, inp.cu_seqlens_q, inp.cu_seqlens_kv, self.q, self.k, self.v,
                         self.dtype, self.backend)  # fmt: skip

    def _fwd(self):
        return self._fa_fwd(*self.fwd_args, **self.fwd_kw)

    def _bwd(self, out, aux):
        c, i = self.case, self.inp
        return self._fa_bwd(c.sq, c.skv, i.cu_seqlens_q, i.cu_seqlens_kv, self.q, self.k, self.v, out, self.d_o,
                            self.dtype, aux, self.backend, **self.bwd_kw)  # fmt: skip

    def first(self):
        """Autotuned: the first call tunes (inside ``autotuning(True)``); the timed calls then run
        the tuned plans from the plan cache outside the context (no per-call context cost)."""
        if self.ctx is None:
            return super().first()
        with self.ctx():
            return super().first()

    def fwd(self):
        return self._fwd()

    def output(self) -> torch.Tensor:
        out, _ = self.fwd()
        if self.precision == "fp8":
            return out.float() * self.inp.fp8().meta.fwd.scale_inv[META_O]
        return out

    def before(self, mode: str):
        return self.fwd() if mode == "bwd" else None

    def bwd(self, state):
        out, aux = state
        return self._bwd(out, aux)

    def fwd_bwd(self):
        out, aux = self._fwd()
        return out, aux, self._bwd(out, aux)


class TeCudnn(Contender):
    """te_cudnn's ``fused_attn_fwd`` / ``fused_attn_bwd``, forced to one sub-backend (``backend``)
    or choosing (None); ``fp8`` runs the FP8 cases' quantized inputs; ``autotune`` runs every
    call inside ``te_cudnn.plans.tune.autotuning(True)``."""

    shares_plan_cache = True

    def __init__(self, name: str, key: str, backend: Optional[str], *, fp8: bool = False, autotune: bool = False,
                 env: Any = None):  # fmt: skip
        self.name, self.key, self.backend, self.fp8, self.autotune, self.env = name, key, backend, fp8, autotune, env
        if autotune:
            # tuning replaces the heuristic plans in te_cudnn's one plan cache: the others run first
            self.runs_last = True
            self.quick, self.quick_why = False, "tuning builds and times every candidate plan of each new key"
            self.default_cases = AUTOTUNE_DEFAULT_CASES
            self.subset_why = "tuning times every engine configuration of each new plan once per GPU model"

    def supports(self, case: Case) -> Optional[str]:
        if self.fp8 and case.dtype != "fp8":
            return "runs the FP8 cases only (group fp8), where its inputs are the bf16 inputs quantized"
        dtype = torch.float8_e4m3fn if self.fp8 else torch.bfloat16
        try:
            reasons = _explain_reasons(case, dtype, self.env)
        except (ValueError, TypeError) as exc:
            return f"te_cudnn cannot describe the case: {exc}"
        if self.backend is not None:
            why = reasons.get(self.backend, [f"unknown sub-backend {self.backend}"])
            return f"{self.backend} declines: " + "; ".join(why) if why else None
        if not any(not why for why in reasons.values()):
            return "no sub-backend serves it: " + " | ".join(f"{b}: {'; '.join(w)}" for b, w in reasons.items())
        return None

    def prepare(self, case: Case, inputs: Inputs) -> Run:
        ctx = autotuning_context() if self.autotune else None
        run = TeCudnnRun(case, inputs, self.backend, self.fp8, ctx)
        run.info["backend"] = self.backend or "auto"
        return run


class TeCudnnDecodeRun(Run):
    """``te_cudnn.fused_attn_decode`` on a decode case: the case's page pools and table, or
    (``dense``) the dense ``[b, hg, s, d]`` cache torch SDPA reads, through its strides. The
    lengths are the cache's, int32 ``[b]``, made once (a decode loop keeps them)."""

    training = False

    def __init__(self, case: Case, inp: Inputs, dense: bool):
        super().__init__()

        self._decode = fused_attn_decode
        self.q = inp.q
        cu = inp.cu_seqlens_kv
        self.lens = cu[1:] - cu[:-1]  # a new int32 [b] tensor (contiguous, 16-byte aligned)
        if dense:
            k, v = inp.dense_kv()
            self.k, self.v, self.table = k.transpose(1, 2), v.transpose(1, 2), None
            self.info["notes"] = "the dense cache torch SDPA reads ([b, hg, s, d], through its strides)"
        else:
            self.k, self.v, self.table = inp.k, inp.v, inp.page_table_k
        self.info["backend"] = "F16_arbitrary_seqlen"

    def fwd(self):
        return self._decode(self.q, self.k, self.v, self.lens, self.table)

    def output(self) -> torch.Tensor:
        return self.fwd()


class TeCudnnDecode(Contender):
    """``te_cudnn.fused_attn_decode`` (cache lengths as given, no per-call kernels) on the
    case's paged cache, or on the dense copy torch SDPA reads (``dense``)."""

    shares_plan_cache = True

    def __init__(self, name: str, key: str, *, dense: bool):
        self.name, self.key, self.dense = name, key, dense

    def supports(self, case: Case) -> Optional[str]:
        if not case.is_paged or case.training:
            return "decode cases only (one query token per sequence against a KV cache)"
        return None

    def prepare(self, case: Case, inputs: Inputs) -> Run:
        return TeCudnnDecodeRun(case, inputs, self.dense)
