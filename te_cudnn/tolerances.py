"""How far a fused attention result may be from the fp32 reference, per dtype.

Tolerances are data. A fused result passes when its error against the fp32 reference is
at most ``factor`` times the error a same-precision PyTorch computation (the reference run
in fp16/bf16) makes, plus a small ``floor`` (flash-attention's "no worse than 2x PyTorch"
rule); ``ceiling`` is an absolute bound no result may exceed, whatever PyTorch does.

The library reads the table too (the autotuner holds engine candidates to each dtype's
``ceiling``), so it lives in this bottom module, which imports only torch;
:mod:`te_cudnn.testing` re-exports it beside the checks that apply it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Tolerance", "TOLERANCES"]


@dataclass(frozen=True)
class Tolerance:
    factor: float  # allowed multiple of the same-precision PyTorch error
    floor: float  # added slack (relative Frobenius error)
    ceiling: float  # hard bound on the relative Frobenius error


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float16: Tolerance(factor=2.0, floor=2e-4, ceiling=5e-3),
    torch.bfloat16: Tolerance(factor=2.0, floor=1e-3, ceiling=2e-2),
}
