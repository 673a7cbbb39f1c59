"""Graph pieces shared by the sub-backends' builders."""

from __future__ import annotations

from typing import Any

from ..config import AttnConfig
from ..runtime import cudnn_module, torch_dtype_to_cudnn
from .base import Uid


def new_graph(name: str, cfg: AttnConfig, handle: Any) -> tuple[Any, Any]:
    """An empty graph in the call's I/O dtype with fp32 intermediates and compute, and that
    dtype's cuDNN enum. ``handle`` None: a deviceless graph (built and validated on CPU)."""
    cudnn = cudnn_module()
    io = torch_dtype_to_cudnn(cfg.dtype)
    kwargs = {} if handle is None else {"handle": handle}
    f32 = cudnn.data_type.FLOAT
    return cudnn.pygraph(name=name, io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, **kwargs), io


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


def sink_kwargs(graph: Any, cfg: AttnConfig, backward: bool) -> dict[str, Any]:
    """Attention sinks (TE's ``softmax_offset``): the fp32 ``[1, h, 1, 1]`` sink logits as
    ``sink_token``, and in a learnable backward their gradient as ``dSink_token`` (an output the
    caller marks) where the graph computes it (``cfg.dsink_in_graph``). Off-by-one passes zeros
    and takes no gradient."""
    if not cfg.has_sink:
        return {}
    f32 = cudnn_module().data_type.FLOAT
    dims, strides = [1, cfg.h, 1, 1], [cfg.h, 1, 1, 1]
    kw = {"sink_token": graph.tensor(name="softmax_offset", dim=dims, stride=strides, data_type=f32, uid=Uid.SINK)}
    if backward and cfg.dsink_in_graph:
        kw["dSink_token"] = graph.tensor(name="d_softmax_offset", dim=dims, stride=strides, data_type=f32, uid=Uid.DSINK)
    return kw


def sink_uids(cfg: AttnConfig, backward: bool) -> list[int]:
    """The operand uids :func:`sink_kwargs` declares, in binding order."""
    if not cfg.has_sink:
        return []
    return [Uid.SINK, Uid.DSINK] if backward and cfg.dsink_in_graph else [Uid.SINK]
