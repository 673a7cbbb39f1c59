"""The F16 arbitrary sub-backend's documented cross-rules, written out independently of its code:
the exact reasons a declared layout x mask x bias must be declined with (spec section 6). Shared
by the selection and graph tests."""

from __future__ import annotations

from te_cudnn.enums import AttnBiasType, AttnMaskType, QKVFormat, QKVLayout
from te_cudnn.layouts import layout_info


def is_ragged(layout: QKVLayout) -> bool:
    info = layout_info(layout)
    return QKVFormat.thd in (info.q_format, info.kv_format)


def documented_reasons(layout: QKVLayout, mask: AttnMaskType, bias: AttnBiasType, sq: int, skv: int) -> list[str]:
    """The F16 arbitrary cross-rules (spec §6) that apply to a declared layout x mask x bias
    (sm90, cuDNN 9.19, MHA, d=64, training without dropout or window), in the order given."""
    why = []
    if is_ragged(layout) and not mask.is_padding:
        why.append(f"qkv_layout={layout.name} (THD) needs a padding mask (padding, padding_causal or "
                   f"padding_causal_bottom_right), got attn_mask_type={mask.name}")  # fmt: skip
    if mask.is_padding and bias == AttnBiasType.post_scale_bias:
        why.append(f"attn_mask_type={mask.name} with post_scale_bias is not fused (TransformerEngine's rule)")
    if bias == AttnBiasType.alibi and (not mask.is_causal or mask.is_padding):
        why.append(f"alibi needs attn_mask_type causal or causal_bottom_right (cuDNN requires right bound 0; "
                   f"TransformerEngine does not fuse it with padding), got {mask.name}")  # fmt: skip
    # bottom-right is demoted to top-left only when sq == skv and no padding mask is used
    if mask.is_bottom_right and (sq != skv or mask.is_padding) and bias != AttnBiasType.no_bias:
        where = mask.name + ("" if mask.is_padding else " with sq != skv")
        why.append(f"{where} cannot take attn_bias_type={bias.name}")
    return why
