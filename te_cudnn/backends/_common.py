"""Graph pieces shared by the sub-backends' builders."""

from __future__ import annotations

from typing import Any

from ..config import AttnConfig
from ..runtime import cudnn_module, torch_dtype_to_cudnn
from .base import Uid
from .operands import Operands


def new_graph(name: str, cfg: AttnConfig, handle: Any) -> tuple[Any, Any]:
    """An empty graph in the call's I/O dtype with fp32 intermediates and compute, and that
    dtype's cuDNN enum. ``handle`` None: a deviceless graph (built and validated on CPU)."""
    cudnn = cudnn_module()
    io = torch_dtype_to_cudnn(cfg.dtype)
    kwargs = {} if handle is None else {"handle": handle}
    f32 = cudnn.data_type.FLOAT
    return cudnn.pygraph(name=name, io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, **kwargs), io


def padding_kwargs(graph: Any, cfg: AttnConfig, operands: Operands) -> dict[str, Any]:
    """``use_padding_mask`` with the per-call sequence-length operands, as declared."""
    if not cfg.mask.is_padding:
        return {}
    return {"use_padding_mask": True, "seq_len_q": operands.tensor(graph, cfg, Uid.SEQ_LEN_Q),
            "seq_len_kv": operands.tensor(graph, cfg, Uid.SEQ_LEN_KV)}  # fmt: skip


def sink_kwargs(graph: Any, cfg: AttnConfig, operands: Operands) -> dict[str, Any]:
    """Attention sinks (TE's ``softmax_offset``): the sink logits as ``sink_token``, and in a
    learnable backward their gradient as ``dSink_token`` where the graph computes it (the
    backward's declarations have it where ``cfg.dsink_in_graph``). Off-by-one passes zeros and
    takes no gradient."""
    if not cfg.has_sink:
        return {}
    kw = {"sink_token": operands.tensor(graph, cfg, Uid.SINK)}
    d_sink = operands.tensor(graph, cfg, Uid.DSINK) if Uid.DSINK in operands else None
    if d_sink is not None:
        kw["dSink_token"] = d_sink
    return kw
