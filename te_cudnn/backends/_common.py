"""Graph pieces shared by the sub-backends' builders."""

from __future__ import annotations

from typing import Any

from ..config import AttnConfig
from ..runtime import cudnn_module
from .base import Uid


def scalar(graph: Any, uid: int) -> Any:
    """An fp32 [1, 1, 1, 1] device operand (scales, descales, amaxes)."""
    f32 = cudnn_module().data_type.FLOAT
    return graph.tensor(name=Uid.NAMES[uid], dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32, uid=uid)


def padding_kwargs(graph: Any, cfg: AttnConfig) -> dict[str, Any]:
    """``use_padding_mask`` with per-call int32 [b, 1, 1, 1] sequence-length operands."""
    if not cfg.mask.is_padding:
        return {}
    i32 = cudnn_module().data_type.INT32
    dims, strides = [cfg.b, 1, 1, 1], [1, 1, 1, 1]
    return {
        "use_padding_mask": True,
        "seq_len_q": graph.tensor(name="seq_len_q", dim=dims, stride=strides, data_type=i32, uid=Uid.SEQ_LEN_Q),
        "seq_len_kv": graph.tensor(name="seq_len_kv", dim=dims, stride=strides, data_type=i32, uid=Uid.SEQ_LEN_KV),
    }
