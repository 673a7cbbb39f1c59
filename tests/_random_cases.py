"""The configurations of the random GPU acceptance test (tests/test_random_gpu.py): one
generator per family of calls, drawn from the sub-backends' declared capabilities, and the
seeded list of them (:func:`make_cases`)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

import torch

from te_cudnn.backends import BY_ENUM
from te_cudnn.enums import FusedAttnBackend, QKVFormat, QKVLayout
from te_cudnn.layouts import layout_info

SEED_ENV = "TE_CUDNN_TEST_SEED"
T = TypeVar("T")
F16 = BY_ENUM[FusedAttnBackend.F16_arbitrary_seqlen].caps
MAX512 = FusedAttnBackend.F16_max512_seqlen
M512 = BY_ENUM[MAX512].caps
FP8C = BY_ENUM[FusedAttnBackend.FP8].caps
E4M3 = getattr(torch, "float8_e4m3fn", None)
SEQ = (1, 16, 33, 64, 100, 128, 160, 256)  # 33 and 100: bias rows that are not 16-byte multiples
HALF = (torch.float16, torch.bfloat16)


# ------------------------------------------------------------------ configurations
@dataclass
class Case:
    family: str
    layout: QKVLayout
    mask: str
    dtype: torch.dtype
    b: int
    h: int
    hg: int
    sq: int  # max_seqlen_q (dense: q's sequence extent)
    skv: int  # max_seqlen_kv
    d_qk: int
    d_v: int
    training: bool
    bias_type: str = "no_bias"
    bias_shape: Optional[tuple[int, ...]] = None
    window: tuple[int, int] = (-1, -1)
    lengths_q: Optional[list[int]] = None  # per-sequence lengths (padding masks, THD, paged)
    lengths_kv: Optional[list[int]] = None
    gaps: Optional[list[int]] = None  # THD: tokens left free after each sequence (cu_seqlens_*_padded)
    page: int = 0  # paged: tokens per page
    pages: int = 0  # paged: pages per sequence
    backend: Optional[FusedAttnBackend] = None
    index: int = -1
    seed: int = 0

    def describe(self) -> str:
        parts = [f"#{self.index} {self.family}", self.layout.name, str(self.dtype).removeprefix("torch."), self.mask,
                 f"b={self.b} h={self.h} hg={self.hg} sq={self.sq} skv={self.skv} d={self.d_qk}/{self.d_v}",
                 "training" if self.training else "inference"]  # fmt: skip
        if self.bias_type != "no_bias":
            parts.append(self.bias_type + (str(list(self.bias_shape)) if self.bias_shape else ""))
        if self.window != (-1, -1):
            parts.append(f"window={self.window}")
        if self.lengths_q is not None:
            gaps = f" gaps={self.gaps}" if self.gaps else ""
            parts.append(f"lengths_q={self.lengths_q} lengths_kv={self.lengths_kv}{gaps}")
        if self.page:
            parts.append(f"paged {self.pages} x {self.page}")
        if self.backend is not None:
            parts.append(self.backend.name)
        return ", ".join(parts)


def _divisor(rng: random.Random, h: int) -> int:
    return rng.choice([g for g in range(1, h + 1) if h % g == 0])


def _four_d(layout: QKVLayout) -> bool:
    info = layout_info(layout)
    return not info.is_paged and {info.q_format, info.kv_format} <= {QKVFormat.bshd, QKVFormat.sbhd}


def _heads_dims(rng: random.Random, info, dims=(16, 32, 64, 64, 128, 128, 256)) -> tuple[int, int, int, int]:
    h = rng.choice((1, 2, 4, 8))
    hg = h if info.packs_qkv else _divisor(rng, h)
    d_qk = d_v = rng.choice(dims)
    if not (info.packs_qkv or info.packs_kv) and rng.random() < 0.15:
        d_qk, d_v = rng.choice(((192, 128), (128, 64), (64, 32)))
    return h, hg, d_qk, d_v


def _bias(rng: random.Random, b: int, h: int, sq: int, skv: int) -> tuple[str, Optional[tuple[int, ...]]]:
    r = rng.random()
    if r < 0.3:
        kind = rng.choice(("1hss", "11ss", "b1ss", "bhss", "1hss", "111s"))
        shape = {"1hss": (1, h, sq, skv), "11ss": (1, 1, sq, skv), "b1ss": (b, 1, sq, skv), "bhss": (b, h, sq, skv),
                 "111s": (1, 1, 1, skv)}[kind]  # fmt: skip
        return "post_scale_bias", shape
    if r < 0.4:
        return "alibi", None
    return "no_bias", None


def gen_dense(rng: random.Random) -> Case:
    layout = rng.choice(sorted(l for l in F16.layouts if _four_d(l)))
    info = layout_info(layout)
    h, hg, d_qk, d_v = _heads_dims(rng, info)
    b = rng.randint(1, 3)
    sq = rng.choice(SEQ)
    skv = sq if info.packs_qkv else rng.choice(SEQ)
    mask = rng.choice(("no_mask", "causal", "causal_bottom_right"))
    bias_type, bias_shape = _bias(rng, b, h, sq, skv)
    if bias_type == "post_scale_bias" and not info.packs_qkv and rng.random() < 0.5:  # an unaligned bias row
        skv = rng.choice((33, 100))
        bias_shape = (*bias_shape[:3], skv)
    window = (-1, -1)
    if bias_type == "no_bias" and rng.random() < 0.2:  # window + bias is declined (gen_unsupported draws it)
        window = (rng.choice((0, 4, 16, 64)), 0 if "causal" in mask else rng.choice((-1, 0, 8)))
    return Case("dense", layout, mask, rng.choice(HALF), b, h, hg, sq, skv, d_qk, d_v, rng.random() < 0.7,
                bias_type, bias_shape, window)  # fmt: skip


def gen_bias(rng: random.Random) -> Case:
    """A post-scale bias of every shape, mostly with rows that are not a multiple of 16 bytes
    (te_cudnn copies those into an aligned buffer and hands dBias back in the caller's strides)."""
    layout = rng.choice(sorted(l for l in F16.layouts if _four_d(l) and not layout_info(l).packs_qkv))
    info = layout_info(layout)
    h, hg, d_qk, d_v = _heads_dims(rng, info, dims=(32, 64, 128))
    b, sq = rng.randint(1, 3), rng.choice((16, 64, 100, 128))
    skv = rng.choice((17, 33, 50, 100, 100, 128))  # 17, 33, 50, 100: unaligned rows in fp16/bf16
    kind = rng.choice(("1hss", "11ss", "b1ss", "bhss"))
    shape = {"1hss": (1, h, sq, skv), "11ss": (1, 1, sq, skv), "b1ss": (b, 1, sq, skv), "bhss": (b, h, sq, skv)}[kind]
    return Case("bias", layout, rng.choice(("no_mask", "causal")), rng.choice(HALF), b, h, hg, sq, skv, d_qk, d_v,
                rng.random() < 0.8, "post_scale_bias", shape)  # fmt: skip


def _lengths(rng: random.Random, b: int, s_max: int, p_empty: float = 0.15) -> list[int]:
    return [0 if rng.random() < p_empty else rng.randint(1, s_max) for _ in range(b)]


def _kv_lengths(rng: random.Random, lengths_q: list[int], s_max_kv: int, mask: str, same: bool) -> list[int]:
    """Key lengths: a sequence with queries gets keys (a query row with no keys is undefined),
    and bottom-right alignment gets at least as many keys as queries (the same reason)."""
    if same:
        return list(lengths_q)
    out = []
    for n in lengths_q:
        nk = 0 if n == 0 and rng.random() < 0.5 else rng.randint(max(n, 1) if "bottom_right" in mask else 1, s_max_kv)
        out.append(nk)
    return out


def gen_varlen(rng: random.Random) -> Case:
    layout = rng.choice(sorted(l for l in F16.layouts if _four_d(l)))
    info = layout_info(layout)
    h, hg, d_qk, d_v = _heads_dims(rng, info, dims=(32, 64, 128))
    b = rng.randint(1, 4)
    mask = rng.choice(("padding", "padding_causal", "padding_causal_bottom_right"))
    sq = rng.choice(SEQ[1:])
    skv = sq if info.packs_qkv else rng.choice(SEQ[1:])
    if "bottom_right" in mask:
        skv = max(skv, sq)
    lq = _lengths(rng, b, sq)
    return Case("varlen", layout, mask, rng.choice(HALF), b, h, hg, sq, skv, d_qk, d_v, rng.random() < 0.7,
                lengths_q=lq, lengths_kv=_kv_lengths(rng, lq, skv, mask, info.packs_qkv))  # fmt: skip


def gen_thd(rng: random.Random) -> Case:
    thd = [l for l in F16.layouts if layout_info(l).q_format == QKVFormat.thd and not layout_info(l).is_paged]
    layout = rng.choice(sorted(thd))
    info = layout_info(layout)
    h, hg, d_qk, d_v = _heads_dims(rng, info, dims=(32, 64, 128))
    b = rng.randint(1, 6)
    mask = rng.choice(("padding", "padding_causal", "padding_causal_bottom_right"))
    lq = _lengths(rng, b, 160)
    sq = max(max(lq), 1) if rng.random() < 0.5 else 256  # max_seqlen exact or generous
    skv = sq if info.packs_qkv else rng.choice((128, 192, 256))
    lkv = _kv_lengths(rng, [min(n, skv) for n in lq], skv, mask, info.packs_qkv)
    if "bottom_right" in mask:
        lq = [min(n, nk) for n, nk in zip(lq, lkv)]
    gaps = [rng.randint(0, 3) for _ in range(b)] if rng.random() < 0.5 else None
    return Case("thd", layout, mask, rng.choice(HALF), b, h, hg, sq, skv, d_qk, d_v, rng.random() < 0.7,
                lengths_q=lq, lengths_kv=lkv, gaps=gaps)  # fmt: skip


def gen_paged(rng: random.Random, training: bool = False) -> Case:
    layout = rng.choice(sorted(l for l in F16.layouts if layout_info(l).is_paged))
    h = rng.choice((2, 4, 8))
    hg, d = _divisor(rng, h), rng.choice((64, 128))
    b, page, pages = rng.randint(1, 4), rng.choice((16, 32)), rng.randint(2, 4)
    mask = rng.choice(("padding", "padding_causal", "padding_causal_bottom_right"))
    sq = rng.choice((1, 1, 16))
    lq = [rng.randint(1, sq) for _ in range(b)]
    lkv = [rng.randint(max(n, 1) if "bottom_right" in mask else 1, page * pages) for n in lq]
    return Case("paged", layout, mask, rng.choice(HALF), b, h, hg, sq, page * pages, d, d, training,
                lengths_q=lq, lengths_kv=lkv, page=page, pages=pages)  # fmt: skip


def gen_fp8(rng: random.Random) -> Case:
    layout = rng.choice(sorted(FP8C.layouts))
    info = layout_info(layout)
    training = rng.random() < 0.6
    h = rng.choice((1, 2, 4))
    hg = h if info.packs_qkv else _divisor(rng, h)
    d = 128 if training else rng.choice((64, 128))
    b, sq = rng.randint(1, 3), rng.choice((64, 128, 192, 256))
    skv = sq if info.packs_qkv else rng.choice((64, 128, 192, 256))
    mask = rng.choice(sorted(m.name for m in FP8C.masks))
    lq = lkv = None
    if "padding" in mask:
        lq = [rng.randint(1, sq) for _ in range(b)]
        lkv = list(lq) if info.packs_qkv else [rng.randint(1, skv) for _ in range(b)]
    return Case("fp8", layout, mask, E4M3, b, h, hg, sq, skv, d, d, training, lengths_q=lq, lengths_kv=lkv)


def gen_max512(rng: random.Random) -> Case:
    layout = rng.choice(sorted(M512.layouts))
    info = layout_info(layout)
    training = rng.random() < 0.7
    h, b, sq = rng.choice((1, 2, 4)), rng.randint(1, 3), rng.choice((64, 128, 192, 256))
    skv = sq if info.packs_qkv or info.packs_kv else rng.choice((64, 128, 192, 256))
    bias_type, bias_shape = "no_bias", None
    if rng.random() < 0.4 and (not training or skv in (128, 256)):
        bias_type, bias_shape = "post_scale_bias", (1, h, sq, skv)
    return Case("max512", layout, rng.choice(sorted(m.name for m in M512.masks)), rng.choice(HALF), b, h, h, sq, skv,
                64, 64, training, bias_type, bias_shape, backend=MAX512)  # fmt: skip


def gen_empty(rng: random.Random) -> Case:
    """Zero-size calls: no batch, no queries, no keys, an all-empty THD batch, max_seqlen 0."""
    kind = rng.choice(("b0", "s0", "sq0", "skv0", "padding-b0", "thd-empty", "thd-max0", "max512-b0"))
    training = rng.random() < 0.6
    if kind in ("thd-empty", "thd-max0"):
        layout = rng.choice((QKVLayout.thd_thd_thd, QKVLayout.t3hd))
        b = rng.randint(1, 3)
        s = 0 if kind == "thd-max0" else 64
        return Case("empty", layout, rng.choice(("padding", "padding_causal")), rng.choice(HALF), b, 4, 4, s, s, 64, 64,
                    training, lengths_q=[0] * b, lengths_kv=[0] * b)  # fmt: skip
    if kind == "max512-b0":
        return Case("empty", QKVLayout.bshd_bshd_bshd, "causal", rng.choice(HALF), 0, 2, 2, 128, 128, 64, 64, training,
                    backend=MAX512)  # fmt: skip
    packed = kind in ("b0", "s0", "padding-b0") and rng.random() < 0.5
    layout = rng.choice([l for l in sorted(F16.layouts) if _four_d(l) and layout_info(l).packs_qkv == packed])
    b, sq, skv = rng.randint(1, 3), rng.choice((64, 128)), rng.choice((64, 128))
    if packed:
        skv = sq
    if kind in ("b0", "padding-b0"):
        b = 0
    if kind == "s0":
        sq = skv = 0
    if kind == "sq0":
        sq = 0
    if kind == "skv0":
        skv = 0
    mask = "padding" if kind == "padding-b0" else rng.choice(("no_mask", "causal"))
    lengths = dict(lengths_q=[], lengths_kv=[]) if kind == "padding-b0" else {}
    return Case("empty", layout, mask, rng.choice(HALF), b, 4, 4, sq, skv, 64, 64, training, **lengths)


def gen_unsupported(rng: random.Random) -> Case:
    """Valid configurations outside the declarations (each should be declined with its reason)."""
    kind = rng.choice(("alibi-no-mask", "padding-bias", "bottom-right-sq>skv", "window-bias", "paged-training",
                       "max512-padding", "max512-gqa", "max512-d128", "d264", "s1-training"))  # fmt: skip
    bshd = QKVLayout.bshd_bshd_bshd
    dtype = rng.choice(HALF)
    if kind == "alibi-no-mask":
        return Case("unsupported", bshd, "no_mask", dtype, 2, 4, 4, 64, 64, 64, 64, True, "alibi")
    if kind == "padding-bias":
        return Case("unsupported", bshd, "padding", dtype, 2, 4, 4, 64, 64, 64, 64, True, "post_scale_bias", (1, 4, 64, 64),
                    lengths_q=[64, 30], lengths_kv=[64, 30])  # fmt: skip
    if kind == "bottom-right-sq>skv":
        return Case("unsupported", bshd, "causal_bottom_right", dtype, 2, 4, 4, 128, 64, 64, 64, True)
    if kind == "window-bias":
        return Case("unsupported", bshd, "no_mask", dtype, 2, 4, 4, 64, 64, 64, 64, True, "post_scale_bias", (1, 4, 64, 64),
                    window=(8, 8))  # fmt: skip
    if kind == "paged-training":
        case = gen_paged(rng, training=True)
        case.family = "unsupported"
        return case
    if kind == "max512-padding":
        return Case("unsupported", bshd, "padding", dtype, 2, 4, 4, 128, 128, 64, 64, True, lengths_q=[128, 50],
                    lengths_kv=[128, 50], backend=MAX512)  # fmt: skip
    if kind == "max512-gqa":
        return Case("unsupported", bshd, "causal", dtype, 2, 4, 2, 128, 128, 64, 64, True, backend=MAX512)
    if kind == "max512-d128":
        return Case("unsupported", bshd, "causal", dtype, 2, 4, 4, 128, 128, 128, 128, True, backend=MAX512)
    if kind == "d264":
        return Case("unsupported", bshd, "causal", dtype, 2, 2, 2, 64, 64, 264, 264, False)
    return Case("unsupported", bshd, "no_mask", dtype, 2, 4, 4, 1, 1, 64, 64, True)


GENERATORS: dict[str, tuple[Callable[[random.Random], Case], int]] = {
    "dense": (gen_dense, 30), "bias": (gen_bias, 10), "varlen": (gen_varlen, 14), "thd": (gen_thd, 16),
    "paged": (gen_paged, 8), "fp8": (gen_fp8, 10), "max512": (gen_max512, 8), "empty": (gen_empty, 10),
    "unsupported": (gen_unsupported, 8),
}  # fmt: skip


def make_cases(seed: int, n: int, fp8: bool) -> list[Case]:
    """``n`` configurations drawn from ``seed``: one of each family first, then by weight.
    Without FP8 attention on this GPU, FP8 draws become dense ones."""
    rng = random.Random(seed)
    names = list(GENERATORS)
    weights = [w for _, w in GENERATORS.values()]
    cases = []
    for i in range(n):
        family = names[i] if i < len(names) else rng.choices(names, weights)[0]
        if family == "fp8" and not fp8:
            family = "dense"
        case = GENERATORS[family][0](rng)
        case.index, case.seed = i, rng.randrange(1 << 31)
        cases.append(case)
    return cases


def fp8_available() -> bool:
    return E4M3 is not None and torch.cuda.get_device_capability()[0] >= 9


def seed_from_env() -> int:
    """The seed of a run of random GPU tests: ``TE_CUDNN_TEST_SEED`` (which replays a run), else
    a fresh one."""
    raw = os.environ.get(SEED_ENV)
    if raw is None:
        return random.SystemRandom().randrange(1 << 31)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{SEED_ENV}={raw!r} must be an integer seed") from None


def seeded_draws(draw: Callable[[random.Random], T], n: int, seed: int) -> list[T]:
    """``n`` configurations drawn one after another by ``draw`` from one generator seeded with
    ``seed``: the same list for every process of a run that shares the seed."""
    rng = random.Random(seed)
    return [draw(rng) for _ in range(n)]
