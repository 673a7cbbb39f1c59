"""F16 max512 sub-backend: cuDNN's non-flash fused-attention engine for sequences <= 512.

TransformerEngine served it from ``fused_attn_f16_max512_seqlen.cu`` until v2.16. cuDNN 9.19
still runs its engine for a generic matmul/softmax graph (see ``gpu_findings.md``); the
graph builders arrive with issue #6. Its limits are declared here already, so the selector
and ``explain()`` give real reasons today.
"""

from __future__ import annotations

import torch

from ..enums import AttnBiasType, AttnMaskType, FusedAttnBackend, QKVLayout
from .base import Capabilities, SubBackend

__all__ = ["F16Max512Seqlen"]


class F16Max512Seqlen(SubBackend):
    enum = FusedAttnBackend.F16_max512_seqlen
    caps = Capabilities(
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        layouts=frozenset(
            {QKVLayout.sb3hd, QKVLayout.sbhd_sb2hd, QKVLayout.bs3hd, QKVLayout.bshd_bs2hd, QKVLayout.bshd_bshd_bshd}
        ),
        masks=frozenset({AttnMaskType.no_mask, AttnMaskType.causal, AttnMaskType.padding, AttnMaskType.padding_causal}),
        bias_types=frozenset({AttnBiasType.no_bias, AttnBiasType.post_scale_bias}),
        max_seqlen=512,
        seqlen_multiple=64,
        head_dims=frozenset({64}),
        supports_gqa=False,
        supports_window=False,
        min_sm=80,
        max_sm=100,  # TE: sm80 and sm90 only
        implemented=False,
        tracking_issue="issue #6",
    )
