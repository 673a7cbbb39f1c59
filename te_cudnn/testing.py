"""Tools to check fused attention against the fp32 reference: tolerances, inputs, comparison.

The tolerance table (:class:`Tolerance`, :data:`TOLERANCES`) lives in :mod:`te_cudnn.tolerances`,
which says what its fields mean; it is re-exported here beside :func:`check_close`, which
applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .enums import QKVFormat, QKVLayout, QKVLayoutGroup
from .layouts import TO_BHSD, layout_info
from .tolerances import TOLERANCES, Tolerance

__all__ = ["Tolerance", "TOLERANCES", "BenchConfig", "BENCHMARK_CONFIGS", "rel_error", "check_close", "unit_roundoff", "make_qkv", "to_bhsd"]


@dataclass(frozen=True)
class BenchConfig:
    """A TransformerEngine attention benchmark configuration (benchmark_attention.py)."""

    name: str
    b: int
    h: int
    hg: int
    d: int
    sq: int
    skv: int
    mask: str
    bias: str = "no_bias"

    @property
    def bias_shape(self) -> Optional[tuple[int, int, int, int]]:
        return (1, self.h, self.sq, self.skv) if self.bias == "post_scale_bias" else None

    def flops(self) -> tuple[float, float]:
        """Forward and backward matmul FLOPs, counting only unmasked scores."""
        pairs = self.sq * self.skv / (2 if "causal" in self.mask else 1)
        base = 2 * self.b * self.h * pairs
        return base * 2 * self.d, base * 5 * self.d


#: bf16, layout bshd_bshd_bshd, training (the configurations of TransformerEngine's attention benchmark).
BENCHMARK_CONFIGS: dict[str, BenchConfig] = {
    c.name: c
    for c in (
        BenchConfig("test_0", 2, 16, 16, 64, 512, 512, "no_mask"),
        BenchConfig("test_1", 2, 16, 16, 128, 2048, 2048, "causal"),
        BenchConfig("test_2", 2, 16, 16, 128, 2048, 2048, "causal", "post_scale_bias"),
        BenchConfig("test_3", 2, 32, 4, 128, 8192, 8192, "causal"),
    )
}


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ in fp64 (NaN or Inf in ``actual`` gives inf).

    Detached first: a reference output that requires grad would otherwise make ``float()``
    warn about converting a tensor that requires grad to a scalar."""
    a, e = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


def unit_roundoff(dtype: torch.dtype) -> float:
    """The largest relative error of rounding a real number to ``dtype`` (half its epsilon):
    2^-8 for bfloat16, 2^-11 for float16."""
    return torch.finfo(dtype).eps / 2


def check_close(name: str, actual: torch.Tensor, expected: torch.Tensor, same_precision: torch.Tensor, dtype: torch.dtype,
                roundings: int = 0, unavoidable: float = 0.0) -> float:  # fmt: skip
    """Assert ``actual`` is within tolerance of ``expected``; returns its relative error.

    ``roundings``: how many times ``actual`` was necessarily rounded to ``dtype`` on its way (a
    broadcast mask's gradient: cuDNN's dBias, then its sum over the broadcast dims). The bound
    is never below that many unit roundoffs: a result of a few elements can be that far from
    the exact one however it is computed, while the same-precision yardstick may be lucky.

    ``unavoidable``: the relative error ``actual`` carries whatever the kernel does, computed by
    the caller from an input already rounded to ``dtype`` (a sink's gradient reads the bf16 O
    the forward returned: with cancelling rows that alone costs up to ~1e-2). The bound is
    never below ``tol.factor`` times it."""
    tol = TOLERANCES[dtype]
    err = rel_error(actual, expected)
    torch_err = rel_error(same_precision, expected)
    # the ceiling caps the slack of well-conditioned problems. On tiny, ill-conditioned ones (e.g.
    # sq = skv = 2, where a gradient nearly cancels) PyTorch's own result in this precision misses
    # the ceiling; there the error depends on the order of roundings, and te_cudnn is held to
    # ``factor`` x PyTorch's error
    slack = tol.factor * torch_err if torch_err > tol.ceiling else min(tol.factor * torch_err + tol.floor, tol.ceiling)
    bound = max(slack, roundings * unit_roundoff(dtype), tol.factor * unavoidable)
    assert err <= bound, (
        f"{name}: relative error {err:.3e} exceeds {bound:.3e} "
        f"(same-precision PyTorch: {torch_err:.3e}; unavoidable: {unavoidable:.3e}; tolerance {tol})"
    )
    return err


def to_bhsd(t: torch.Tensor, layout: QKVLayout) -> torch.Tensor:
    """A view of a tensor in the layout's q/kv format as logical [b, h, s, d]."""
    return t.permute(TO_BHSD[layout_info(layout).q_format])


def make_qkv(
    layout: QKVLayout,
    b: int,
    h: int,
    hg: int,
    sq: int,
    skv: int,
    d_qk: int,
    d_v: Optional[int] = None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cuda",
    generator: Optional[torch.Generator] = None,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q, k, v laid out as ``layout`` names them (views of one buffer where it packs).

    THD layouts (``t3hd`` ... ``thd_thd_thd``) give token-major ``[b * s, ...]`` tensors:
    ``b`` sequences of ``s`` tokens each, back to back (``cu_seqlens = arange(0, (b + 1) * s, s)``).
    Mixed-format and paged layouts are not made here."""
    d_v = d_qk if d_v is None else d_v
    info = layout_info(layout)
    if info.is_paged or info.q_format != info.kv_format or info.q_format == QKVFormat.bhsd:
        raise ValueError(f"make_qkv makes sbhd, bshd and thd layouts, not {layout.name}")
    sb, thd = info.q_format == QKVFormat.sbhd, info.q_format == QKVFormat.thd

    def rand(s: int, *rest: int) -> torch.Tensor:
        shape: Sequence[int] = (b * s, *rest) if thd else (s, b, *rest) if sb else (b, s, *rest)
        return (torch.randn(*shape, generator=generator, dtype=torch.float32, device=device) * scale).to(dtype)

    g = info.group
    if g == QKVLayoutGroup.L_3HD:
        return tuple(rand(sq, 3, h, d_qk).unbind(-3))  # type: ignore[return-value]
    if g == QKVLayoutGroup.L_H3D:
        return tuple(rand(sq, h, 3, d_qk).unbind(-2))  # type: ignore[return-value]
    q = rand(sq, h, d_qk)
    if g == QKVLayoutGroup.L_HD_2HD:
        k, v = rand(skv, 2, hg, d_qk).unbind(-3)
    elif g == QKVLayoutGroup.L_HD_H2D:
        k, v = rand(skv, hg, 2, d_qk).unbind(-2)
    else:
        k, v = rand(skv, hg, d_qk), rand(skv, hg, d_v)
    return q, k, v
