"""The tensors of one case, made once and shared by every contender (the SAME inputs).

Dense cases hold q, k, v and dO in bshd (``[b, s, h, d]``); contenders that want BHSD take
views (:meth:`Inputs.bhsd`), never copies. THD cases hold token-major ``[t, h, d]`` tensors
with int32 ``cu_seqlens``; decode cases hold the query ``[b, 1, h, d]``, K and V page pools
``[num_pages, page_size, hg, d]`` and int32 page tables (pages in a random order, as a cache
that has seen traffic has them). Contenders without paged KV read the same values gathered
once into a dense ``[b, hg, s, d]`` cache (:meth:`Inputs.dense_kv`, outside any timing).
FP8 contenders read the bf16 values quantized with delayed-scaling metadata (:meth:`Inputs.fp8`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..enums import META_O, META_S
from ..fp8 import Fp8AttentionMeta
from .cases import Case

__all__ = ["Inputs", "Fp8Inputs", "make_inputs", "tensor_bytes"]


def tensor_bytes(obj: Any) -> int:
    """Bytes of the distinct tensors in a (nested) result: lists, tuples, dicts and tensors."""
    seen: dict[int, int] = {}

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            if x.numel():
                seen.setdefault(x.untyped_storage().data_ptr(), x.untyped_storage().nbytes())
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(obj)
    return sum(seen.values())


@dataclass
class Fp8Inputs:
    meta: Any  # te_cudnn.Fp8AttentionMeta, calibrated on these inputs
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    d_o: torch.Tensor


@dataclass
class Inputs:
    case: Case
    q: torch.Tensor
    k: torch.Tensor  # a page pool for decode cases
    v: torch.Tensor
    d_o: Optional[torch.Tensor]  # None for inference cases
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    bias: Optional[torch.Tensor] = None
    page_table_k: Optional[torch.Tensor] = None
    page_table_v: Optional[torch.Tensor] = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def device(self) -> torch.device:
        return self.q.device

    def nbytes(self) -> int:
        """Bytes of what the forward and backward read: q, k, v, dO, bias (and page tables)."""
        return tensor_bytes([self.q, self.k, self.v, self.d_o, self.bias, self.cu_seqlens_q, self.cu_seqlens_kv,
                             self.page_table_k, self.page_table_v])  # fmt: skip

    @staticmethod
    def bhsd(t: torch.Tensor) -> torch.Tensor:
        """A ``[b, s, h, d]`` tensor as a ``[b, h, s, d]`` view (same storage, no copy)."""
        return t.permute(0, 2, 1, 3)

    def thd_as_bhsd(self, t: torch.Tensor) -> torch.Tensor:
        """A token-major ``[t, h, d]`` tensor as a one-sequence ``[1, h, t, d]`` view."""
        return t.permute(1, 0, 2).unsqueeze(0)

    def dense_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode: the paged K and V gathered into dense ``[b, hg, s, d]`` caches (made once)."""
        if "dense_kv" not in self._cache:
            c = self.case
            out = []
            for pool, table in ((self.k, self.page_table_k), (self.v, self.page_table_v)):
                by_seq = pool[table.long()].reshape(c.b, c.pages_per_seq * c.page_size, c.hg, c.d)[:, : c.skv]
                out.append(by_seq.permute(0, 2, 1, 3).contiguous())
            self._cache["dense_kv"] = tuple(out)
        return self._cache["dense_kv"]

    def doc_ids(self) -> torch.Tensor:
        """THD: the sequence index of every token (int32 ``[t]``), for document masks."""
        if "doc_ids" not in self._cache:
            lengths = torch.tensor(self.case.lengths, device=self.device)
            self._cache["doc_ids"] = torch.repeat_interleave(torch.arange(len(self.case.lengths), device=self.device),
                                                             lengths).to(torch.int32)  # fmt: skip
        return self._cache["doc_ids"]

    def fp8(self) -> Fp8Inputs:
        """q, k, v (E4M3) and dO (E5M2) quantized from the bf16 inputs, with delayed-scaling
        metadata calibrated on them (one step, as a training loop's second step would have)."""
        if "fp8" not in self._cache:
            meta = Fp8AttentionMeta(device=self.device)
            for t in (self.q, self.k, self.v):
                meta.quantize(t, "qkv")
            meta.fwd.amax_history[0, META_O] = self.v.abs().max()  # |O| <= max |v|
            meta.fwd.amax_history[0, META_S] = 1.0  # softmax values are at most 1
            meta.bwd.amax_history[0, :] = 1.0
            meta.update()
            q8, k8, v8 = (meta.quantize(t, "qkv") for t in (self.q, self.k, self.v))
            d_o8 = meta.quantize(self.d_o, "do")
            self._cache["fp8"] = Fp8Inputs(meta, q8, k8, v8, d_o8)
        return self._cache["fp8"]

    def release(self) -> None:
        self._cache.clear()


def _cu(lengths: list[int], device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def make_inputs(case: Case, *, device: str | torch.device = "cuda", seed: int = 0) -> Inputs:
    """Random inputs for ``case`` (normal values, bf16; never zeros: zeros can time faster)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = torch.bfloat16

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    c = case
    if c.is_paged:
        pages = c.pages_per_seq
        num_pages = c.b * pages
        if c.pool_format == "bhsd":  # head-major pages, seen as [pages, page_size, hg, d] through strides
            k, v = (rand(num_pages, c.hg, c.page_size, c.d).transpose(1, 2) for _ in range(2))
        else:
            k, v = rand(num_pages, c.page_size, c.hg, c.d), rand(num_pages, c.page_size, c.hg, c.d)
        cpu_gen = torch.Generator().manual_seed(seed)
        table = torch.randperm(num_pages, generator=cpu_gen).view(c.b, pages).to(torch.int32).to(device)
        return Inputs(c, rand(c.b, c.sq, c.h, c.d), k, v, None, _cu([c.sq] * c.b, device), _cu([c.skv] * c.b, device),
                      page_table_k=table, page_table_v=table)  # fmt: skip
    if c.is_thd:
        t = c.tokens
        return Inputs(c, rand(t, c.h, c.d), rand(t, c.hg, c.d), rand(t, c.hg, c.d), rand(t, c.h, c.d),
                      _cu(list(c.lengths), device), _cu(list(c.lengths), device))  # fmt: skip
    q, k, v = rand(c.b, c.sq, c.h, c.d), rand(c.b, c.skv, c.hg, c.d), rand(c.b, c.skv, c.hg, c.d)
    d_o = rand(c.b, c.sq, c.h, c.d) if c.training else None
    bias = rand(*c.bias_shape) if c.bias_shape else None
    lq = [lq for lq, _ in c.seq_lengths]
    lkv = [lkv for _, lkv in c.seq_lengths]
    return Inputs(c, q, k, v, d_o, _cu(lq, device), _cu(lkv, device), bias=bias)
