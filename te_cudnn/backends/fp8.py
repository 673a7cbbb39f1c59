"""FP8 sub-backend: cuDNN's ``sdpa_fp8`` / ``sdpa_fp8_backward`` with TE's FP8 metadata.

The graph builders arrive with issue #4; the limits below (Hopper rules of TE's selector and
of cuDNN's FP8 backward, which needs d = 128) are declared now so that the selector and
``explain()`` give real reasons.
"""

from __future__ import annotations

from ..config import FP8_DTYPES
from ..enums import AttnBiasType, AttnMaskType, FusedAttnBackend, QKVLayout
from ..layouts import DENSE_LAYOUTS
from .base import Capabilities, SubBackend

__all__ = ["FP8Backend"]


class FP8Backend(SubBackend):
    enum = FusedAttnBackend.FP8
    caps = Capabilities(
        dtypes=frozenset(FP8_DTYPES),
        layouts=frozenset(DENSE_LAYOUTS),
        masks=frozenset({AttnMaskType.no_mask, AttnMaskType.causal, AttnMaskType.padding, AttnMaskType.padding_causal}),
        bias_types=frozenset({AttnBiasType.no_bias}),
        head_dim_multiple=16,
        max_head_dim=256,
        supports_window=False,
        min_sm=90,
        min_cudnn=90700,
        bad_cudnn=frozenset({91000}),
        implemented=False,
        tracking_issue="issue #4",
    )
