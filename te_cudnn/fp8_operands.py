"""The FP8 scaling operands of a call: what its signature keeps of TransformerEngine's metadata
tables, and the graph operands taken from them in each graph's order, each a one-element view
of its table slot (nothing is copied). A split backward shares the scales across its parts."""

from __future__ import annotations

import torch


def _fp8_sig(tensors: tuple, offsets: tuple) -> tuple:
    """What a call signature keeps of the FP8 scaling tensors (their values are read per call)
    and of their offsets."""
    return tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.get_device()) for t in tensors) + offsets


def fp8_fwd_operands(d_scale_qkv, qkv_off, d_scale_s, ds_off, q_scale_s, qs_off, q_scale_o, qo_off, amax_s, as_off,
                     amax_o, ao_off) -> list[torch.Tensor]:  # fmt: skip
    """FP8 forward operands in the graph's order (``backends.fp8.FWD_SCALARS`` + amax_s, amax_o):
    descale_q = descale_k = descale_v = d_scale_qkv[META_QKV]; descale_s = d_scale_s[META_S];
    scale_s = q_scale_s[META_S]; scale_o = q_scale_o[META_O]; amaxes written to
    amax_s[META_S] and amax_o[META_O] (offsets as given)."""
    qkv = _slot(d_scale_qkv, qkv_off)
    return [qkv, qkv, qkv, _slot(d_scale_s, ds_off), _slot(q_scale_s, qs_off), _slot(q_scale_o, qo_off),
            _slot(amax_s, as_off), _slot(amax_o, ao_off)]  # fmt: skip


def fp8_bwd_operands(amax3, d_scale_qkv, qkv_off, d_scale_o, do_off, d_scale_do, ddo_off, d_scale_s, ds_off, d_scale_dp,
                     ddp_off, q_scale_s, qs_off, q_scale_dqkv, qdqkv_off, q_scale_dp, qdp_off, amax_dp, adp_off):  # fmt: skip
    """FP8 backward operands in the graph's order (``backends.fp8.BWD_SCALARS`` + the four
    amaxes): dQ/dK/dV amaxes land in ``amax3`` and are reduced into ``amax_dqkv[META_DQKV]``."""
    scales = fp8_bwd_scales(d_scale_qkv, qkv_off, d_scale_o, do_off, d_scale_do, ddo_off, d_scale_s, ds_off, d_scale_dp,
                            ddp_off, q_scale_s, qs_off, q_scale_dqkv, qdqkv_off, q_scale_dp, qdp_off)  # fmt: skip
    return scales + _fp8_bwd_amaxes(amax3, _slot(amax_dp, adp_off))


def fp8_bwd_scales(d_scale_qkv, qkv_off, d_scale_o, do_off, d_scale_do, ddo_off, d_scale_s, ds_off, d_scale_dp, ddp_off,
                   q_scale_s, qs_off, q_scale_dqkv, qdqkv_off, q_scale_dp, qdp_off) -> list[torch.Tensor]:  # fmt: skip
    """The twelve scaling operands of the FP8 backward (``backends.fp8.BWD_SCALARS``), each a
    [1, 1, 1, 1] view of its metadata slot: what every part of a split backward shares."""
    qkv, dqkv = _slot(d_scale_qkv, qkv_off), _slot(q_scale_dqkv, qdqkv_off)
    return [
        qkv, qkv, qkv, _slot(d_scale_o, do_off), _slot(d_scale_do, ddo_off), _slot(d_scale_s, ds_off),
        _slot(d_scale_dp, ddp_off), _slot(q_scale_s, qs_off), dqkv, dqkv, dqkv, _slot(q_scale_dp, qdp_off),
    ]  # fmt: skip


def _fp8_bwd_amaxes(amax3: torch.Tensor, amax_dp: torch.Tensor) -> list[torch.Tensor]:
    """The backward's amax outputs after its scales: dQ, dK, dV (rows of ``amax3``), then dP."""
    return [amax3[0:1], amax3[1:2], amax3[2:3], amax_dp]


def _slot(table: torch.Tensor, offset: int) -> torch.Tensor:
    """Slot ``offset`` of a 1-d metadata table as the [1, 1, 1, 1] operand a graph declares."""
    return table.as_strided((1, 1, 1, 1), (1, 1, 1, 1), table.storage_offset() + offset * table.stride(0))
