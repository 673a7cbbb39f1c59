"""The benchmark cases: frozen, named descriptions of one attention problem each.

A case says what is computed (shapes, layout, mask, precision, training or decode), never how:
the contenders (:mod:`.contenders`) decide whether and how they run it. Groups:

* ``te``: TransformerEngine's benchmark configurations test_0..test_3 (bf16, bshd, training).
* ``llama``: Llama-style training shapes (bf16, bshd, causal, d=128, hg=8; h=32 as in the
  8B model, h=64 as in the 70B model), s = 4K..32K, the batch chosen for 16K-32K tokens.
* ``thd``: one packed batch of mixed-length sequences (THD, padding_causal), and the same
  sequences padded to a dense bshd batch.
* ``decode``: one new token per sequence (s_q = 1, b = 8) against a paged KV cache of
  4K..32K tokens per sequence (inference; measured as KV-cache read bandwidth); the page pools
  token-major as TransformerEngine keeps them (``[pages, page_size, hg, d]``) and, at 8K and
  32K, head-major (``_hnd``: each page ``[hg, page_size, d]`` in memory, FlashInfer's HND
  order; te_cudnn reads the same logical ``[pages, page_size, hg, d]`` view through its strides).
* ``fp8``: training shapes where te_cudnn's FP8 sub-backend runs E4M3/E5M2 and every other
  contender runs bf16 on the same values.
* ``memory``: a 64K-token causal sequence, for peak memory against what must be held.
* ``max512``: te_cudnn's max512 sub-backend against the flash path (b=32, h=16, d=64,
  s <= 512); not in the default run (``--cases max512``).

Nothing here touches CUDA (``--help`` and the CPU tests need no GPU).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Iterable, Optional

from ..testing import BENCHMARK_CONFIGS

__all__ = ["Case", "all_cases", "case_by_name", "GROUPS", "DEFAULT_GROUPS", "QUICK", "select_cases", "causal_pairs",
           "thd_lengths"]


def causal_pairs(lq: int, lkv: int, bottom_right: bool = False) -> int:
    """Unmasked (query, key) pairs of one sequence under a causal mask: query ``i`` sees keys
    ``0..i`` (top-left) or ``0..i + lkv - lq`` (bottom-right), at most ``lkv`` of them."""
    shift = lkv - lq if bottom_right else 0
    total = 0
    # rows where the visible count i + 1 + shift lies in [1, lkv]: an arithmetic series
    first = max(0, -shift)  # first row that sees at least one key
    full = max(first, min(lq, lkv - shift))  # rows from here on see all lkv keys
    if full > first:  # rows first..full-1 see i + 1 + shift keys
        a, b = first + 1 + shift, full + shift
        total += (a + b) * (full - first) // 2
    total += (lq - full) * lkv
    return total


@dataclass(frozen=True)
class Case:
    """One attention problem. ``sq``/``skv`` are the (maximum) lengths; THD cases list their
    sequences in ``lengths`` (q and kv alike); decode cases read a paged KV cache of
    ``page_size``-token pages. ``dtype`` is ``"bf16"`` or ``"fp8"`` (FP8-capable contenders run
    FP8, the others bf16 on the same values). ``only`` restricts the contenders that run it
    (the others record why not)."""

    name: str
    group: str
    b: int
    h: int
    hg: int
    d: int
    sq: int
    skv: int
    mask: str
    layout: str = "bshd_bshd_bshd"
    bias: str = "no_bias"
    dtype: str = "bf16"
    training: bool = True
    lengths: tuple[int, ...] = ()
    page_size: int = 0
    pool_format: str = "bshd"  # paged: memory order of the page pools, "bshd" (token-major) or "bhsd" (head-major)
    only: tuple[str, ...] = ()
    note: str = ""

    # ------------------------------------------------------------------ shape facts
    @property
    def is_thd(self) -> bool:
        return self.layout.startswith("thd")

    @property
    def is_paged(self) -> bool:
        return self.layout.startswith("paged")

    @property
    def is_padded(self) -> bool:
        """Variable lengths held in a dense (bshd) batch, padded to ``sq``."""
        return bool(self.lengths) and not self.is_thd

    @property
    def causal(self) -> bool:
        return "causal" in self.mask

    @property
    def gqa(self) -> bool:
        return self.h != self.hg

    @property
    def bias_shape(self) -> Optional[tuple[int, int, int, int]]:
        return (1, self.h, self.sq, self.skv) if self.bias == "post_scale_bias" else None

    @property
    def seq_lengths(self) -> list[tuple[int, int]]:
        """(query length, key length) of every sequence of the batch."""
        if self.lengths:
            return [(n, n) for n in self.lengths]
        return [(self.sq, self.skv)] * self.b

    @property
    def tokens(self) -> int:
        """Query tokens that carry data (decode: one per sequence)."""
        return sum(lq for lq, _ in self.seq_lengths)

    @property
    def pages_per_seq(self) -> int:
        return -(-self.skv // self.page_size) if self.page_size else 0

    def unmasked_pairs(self) -> int:
        """(query, key) pairs the mask lets through, summed over the batch (one head)."""
        br = "bottom_right" in self.mask
        if self.causal:
            return sum(causal_pairs(lq, lkv, br) for lq, lkv in self.seq_lengths)
        return sum(lq * lkv for lq, lkv in self.seq_lengths)

    def flops(self) -> tuple[float, float]:
        """Matmul FLOPs of the forward and of the backward, counting unmasked pairs only:
        4·h·d per pair forward (Q·Kᵀ and P·V), 2.5x that backward (five matmuls of two)."""
        fwd = 4.0 * self.h * self.d * self.unmasked_pairs()
        return fwd, 2.5 * fwd

    def kv_bytes(self, elem_size: int = 2) -> int:
        """Bytes of K and V the forward must read (each key read once): the decode roofline."""
        return 2 * sum(lkv for _, lkv in self.seq_lengths) * self.hg * self.d * elem_size

    @property
    def modes(self) -> tuple[str, ...]:
        """What is timed: forward, backward (after a forward) and both; decode: forward only."""
        return ("fwd", "bwd", "fwd_bwd") if self.training else ("fwd",)

    def describe(self) -> str:
        """``b=2 h=32/4 d=128 s=8192 causal bf16`` (heads as h/hg)."""
        if self.is_paged:
            order = "" if self.pool_format == "bshd" else f", {self.pool_format} in memory"
            shape = f"b={self.b} h={self.h}/{self.hg} d={self.d} sq={self.sq} kv={self.skv} (pages of {self.page_size}{order})"
        elif self.lengths:
            shape = f"{len(self.lengths)} seqs, {self.tokens} tokens (max {self.sq}) h={self.h}/{self.hg} d={self.d}"
        else:
            s = f"s={self.sq}" if self.sq == self.skv else f"sq={self.sq} skv={self.skv}"
            shape = f"b={self.b} h={self.h}/{self.hg} d={self.d} {s}"
        extra = "" if self.bias == "no_bias" else f" {self.bias}"
        kind = "" if self.training else " inference"
        return f"{shape} {self.layout} {self.mask}{extra} {self.dtype}{kind}"

    def as_dict(self) -> dict:
        """JSON-friendly fields, with the derived counts the report needs."""
        d = asdict(self)
        d["lengths"] = list(self.lengths)
        d["only"] = list(self.only)
        fwd, bwd = self.flops()
        d.update(description=self.describe(), flops_fwd=fwd, flops_bwd=bwd, kv_bytes=self.kv_bytes(),
                 tokens=self.tokens, modes=list(self.modes))  # fmt: skip
        return d


# ---------------------------------------------------------------------------- the cases
def _te_cases() -> list[Case]:
    return [
        Case(c.name, "te", c.b, c.h, c.hg, c.d, c.sq, c.skv, c.mask, bias=c.bias,
             note="TransformerEngine benchmark_attention.py")  # fmt: skip
        for c in BENCHMARK_CONFIGS.values()
    ]


def _llama_cases() -> list[Case]:
    out = []
    for h, model in ((32, "Llama-3-8B heads"), (64, "Llama-3-70B heads")):
        for s in (4096, 8192, 16384, 32768):
            b = max(1, 16384 // s)  # 16K tokens (32K at s=32K, one sequence)
            out.append(Case(f"llama_h{h}_s{s // 1024}k", "llama", b, h, 8, 128, s, s, "causal", note=model))
    return out


def thd_lengths(total: int = 16384, lo: int = 256, hi: int = 4096, seed: int = 2026) -> tuple[int, ...]:
    """Sequence lengths drawn with a fixed seed, summing to exactly ``total``."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(lo, hi), total - sum(lengths)))
    return tuple(lengths)


def _thd_cases() -> list[Case]:
    lengths = thd_lengths()
    s_max = max(lengths)
    common = dict(b=len(lengths), h=32, hg=8, d=128, sq=s_max, skv=s_max, mask="padding_causal", lengths=lengths)
    return [
        Case("thd_mixed_16k", "thd", layout="thd_thd_thd", note="packed sequences, cu_seqlens int32", **common),
        Case("thd_mixed_16k_padded", "thd", layout="bshd_bshd_bshd", note="the same sequences padded to the longest",
             only=("te_cudnn", "te_cudnn autotuned"), **common),  # fmt: skip
    ]


def _decode_cases() -> list[Case]:
    return [
        Case(f"decode_kv{s // 1024}k", "decode", 8, 32, 8, 128, 1, s, "padding", layout="paged_kv_bshd_bshd_bshd",
             training=False, page_size=64, note="one token per sequence, paged KV cache")  # fmt: skip
        for s in (4096, 8192, 16384, 32768)
    ] + [
        Case(f"decode_kv{s // 1024}k_hnd", "decode", 8, 32, 8, 128, 1, s, "padding", layout="paged_kv_bshd_bshd_bshd",
             training=False, page_size=64, pool_format="bhsd",
             note="the same pages head-major in memory (each page [hg, page_size, d])")  # fmt: skip
        for s in (8192, 32768)
    ]


def _fp8_cases() -> list[Case]:
    return [
        Case("fp8_b2_h32_s8k", "fp8", 2, 32, 32, 128, 8192, 8192, "causal", dtype="fp8",
             note="te_cudnn fp8: E4M3 forward, E5M2 backward; the others bf16"),  # fmt: skip
        Case("fp8_b1_h64_s8k", "fp8", 1, 64, 64, 128, 8192, 8192, "causal", dtype="fp8",
             note="te_cudnn fp8: E4M3 forward, E5M2 backward; the others bf16"),  # fmt: skip
    ]


def _memory_cases() -> list[Case]:
    return [Case("mem_h32_s64k", "memory", 1, 32, 8, 128, 65536, 65536, "causal",
                 only=("te_cudnn", "torch SDPA cuDNN"),
                 note="peak memory vs inputs + outputs + gradients + workspace (target <= 1.1)")]  # fmt: skip


def _max512_cases() -> list[Case]:
    return [
        Case(f"max512_s{s}_{m}", "max512", 32, 16, 16, 64, s, s, m, note="F16_max512_seqlen vs the flash path")
        for s in (128, 256, 512)
        for m in ("no_mask", "causal")
    ]


@lru_cache(maxsize=None)
def all_cases() -> tuple[Case, ...]:
    """Every case, in run order."""
    cases = (*_te_cases(), *_llama_cases(), *_thd_cases(), *_decode_cases(), *_fp8_cases(), *_memory_cases(),
             *_max512_cases())  # fmt: skip
    names = [c.name for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise AssertionError(f"duplicate case names: {sorted(dup)}")
    return cases


#: Group names, in run order.
GROUPS = ("te", "llama", "thd", "decode", "fp8", "memory", "max512")
#: What a run without ``--cases`` measures.
DEFAULT_GROUPS = ("te", "llama", "thd", "decode", "fp8", "memory")
#: ``--quick``: one of each kind.
QUICK = ("test_0", "test_3", "llama_h32_s8k", "thd_mixed_16k", "decode_kv8k", "decode_kv32k", "fp8_b2_h32_s8k",
         "mem_h32_s64k")  # fmt: skip


def select_cases(spec: Optional[Iterable[str] | str] = None, *, quick: bool = False) -> list[Case]:
    """Cases by name or group (a comma-separated string or a list), in run order; ``"all"``
    is every group, ``"none"`` no case; none given: the quick subset or the default groups. Unknown names raise
    ``ValueError`` listing what exists."""
    cases = all_cases()
    if spec is None or spec == "" or spec == []:
        wanted = set(QUICK) if quick else {c.name for c in cases if c.group in DEFAULT_GROUPS}
        return [c for c in cases if c.name in wanted]
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    by_name = {c.name: c for c in cases}
    wanted: set[str] = set()
    for item in items:
        if item == "none":  # no case: the ceilings and the host-time section only
            continue
        if item == "all":
            wanted |= set(by_name)
        elif item == "quick":
            wanted |= set(QUICK)
        elif item in GROUPS:
            wanted |= {c.name for c in cases if c.group == item}
        elif item in by_name:
            wanted.add(item)
        else:
            raise ValueError(f"unknown case or group {item!r}; groups: {', '.join(GROUPS)}, quick, all, none; "
                             f"cases: {', '.join(by_name)}")  # fmt: skip
    return [c for c in cases if c.name in wanted]


def case_by_name(name: str) -> Case:
    for c in all_cases():
        if c.name == name:
            return c
    raise KeyError(name)

