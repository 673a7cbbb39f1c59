"""FP8 metadata for one attention layer, with delayed scaling (TransformerEngine's recipe).

:class:`Fp8AttentionMeta` holds, for the forward and the backward table, a ``scale``, its
inverse ``scale_inv`` and an ``amax_history`` (``[history, slots]``), all fp32 on the GPU.
Slots follow TransformerEngine (``META_QKV=2, META_O=3, META_S=8`` forward;
``META_DQKV=0, META_DO=3, META_DP=5`` backward). The fused kernels write this step's amaxes
of S, O, dP and dQKV into row 0 of the histories; :meth:`quantize` records the amax of what
it casts (q, k, v, dO); :meth:`update` turns the histories into new scales
(``scale = fp8_max / amax / 2**margin``) and rolls them, entirely on the device::

    meta = Fp8AttentionMeta(device="cuda")
    q8, k8, v8 = (meta.quantize(t, "qkv") for t in (q, k, v))
    out8, aux = te_cudnn.fused_attn_fwd(True, s, s, cu, cu, q8, k8, v8, q8.dtype, None,
                                        qkv_layout="bshd_bshd_bshd", attn_mask_type="causal",
                                        **meta.fwd_kwargs())
    ...
    meta.update()  # once per step, after the backward
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from .enums import META_DO, META_DP, META_DQKV, META_O, META_QKV, META_S

__all__ = ["Fp8AttentionMeta", "Fp8Table", "FP8_MAX"]

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}

_SLOTS = {"qkv": ("fwd", META_QKV), "o": ("fwd", META_O), "s": ("fwd", META_S),
          "dqkv": ("bwd", META_DQKV), "do": ("bwd", META_DO), "dp": ("bwd", META_DP)}  # fmt: skip


@dataclass
class Fp8Table:
    """One scaling table (TE's ``fp8_meta["scaling_fwd"]`` or ``["scaling_bwd"]``)."""

    scale: torch.Tensor  # [slots] fp32
    scale_inv: torch.Tensor  # [slots] fp32
    amax_history: torch.Tensor  # [history, slots] fp32; row 0 is the current step

    @classmethod
    def create(cls, slots: int, history: int, device: Union[str, torch.device]) -> "Fp8Table":
        return cls(
            scale=torch.ones(slots, dtype=torch.float32, device=device),
            scale_inv=torch.ones(slots, dtype=torch.float32, device=device),
            amax_history=torch.zeros(history, slots, dtype=torch.float32, device=device),
        )


class Fp8AttentionMeta:
    """Scales, inverse scales and amax histories of one attention layer (delayed scaling).

    ``fwd_format`` / ``bwd_format`` are the FP8 dtypes of the forward tensors (q, k, v, O, S)
    and of the backward ones (dO, dP, dQKV): E4M3 / E5M2 is TE's HYBRID recipe.
    """

    def __init__(
        self,
        device: Union[str, torch.device] = "cuda",
        *,
        history: int = 16,
        margin: int = 0,
        fwd_format: torch.dtype = torch.float8_e4m3fn,
        bwd_format: torch.dtype = torch.float8_e5m2,
    ):
        if history < 1:
            raise ValueError(f"history={history} must be >= 1")
        if fwd_format not in FP8_MAX or bwd_format not in FP8_MAX:
            raise TypeError(f"FP8 formats must be float8_e4m3fn or float8_e5m2, got {fwd_format}, {bwd_format}")
        self.margin = margin
        self.fwd_format, self.bwd_format = fwd_format, bwd_format
        self.fwd = Fp8Table.create(9, history, device)
        self.bwd = Fp8Table.create(6, history, device)

    def _slot(self, name: str) -> tuple[Fp8Table, int, torch.dtype]:
        if name not in _SLOTS:
            raise ValueError(f"slot {name!r} is not one of {sorted(_SLOTS)}")
        table, index = _SLOTS[name]
        return (self.fwd, index, self.fwd_format) if table == "fwd" else (self.bwd, index, self.bwd_format)

    def quantize(self, x: torch.Tensor, slot: str) -> torch.Tensor:
        """Cast ``x`` to FP8 with the slot's scale, recording its amax for the next update."""
        table, index, fmt = self._slot(slot)
        return quantize(x, table, index, fmt)

    def dequantize(self, x8: torch.Tensor, slot: str) -> torch.Tensor:
        table, index, _ = self._slot(slot)
        return dequantize(x8, table, index)

    def fwd_kwargs(self) -> dict:
        """The FP8 arguments of ``fused_attn_fwd`` (TE's explicit-tensor interface)."""
        return fwd_kwargs(self.fwd)

    def bwd_kwargs(self) -> dict:
        """The FP8 arguments of ``fused_attn_bwd``."""
        return bwd_kwargs(self.fwd, self.bwd)

    @torch.no_grad()
    def update(self) -> None:
        """Delayed scaling: new scales from the amax history, then roll it (no host sync).

        Each slot gets ``scale = fp8_max / amax / 2**margin`` with its table's format; slots
        whose amax is zero or not finite keep their scale.
        """
        for table, fmt in ((self.fwd, self.fwd_format), (self.bwd, self.bwd_format)):
            amax = table.amax_history.amax(dim=0)
            fresh = FP8_MAX[fmt] / amax / (2.0**self.margin)
            ok = torch.isfinite(amax) & (amax > 0)
            table.scale.copy_(torch.where(ok, fresh, table.scale))
            table.scale_inv.copy_(1.0 / table.scale)
            table.amax_history.copy_(torch.roll(table.amax_history, -1, dims=0))
            table.amax_history[0].zero_()


# Table-level functions: the methods above and te_cudnn's FP8 custom ops (which receive the
# tables' tensors, not the Python object) share them.


def quantize(x: torch.Tensor, table: Fp8Table, index: int, fmt: torch.dtype) -> torch.Tensor:
    """``x`` cast to ``fmt`` with ``table.scale[index]`` (saturating), in ``x``'s strides; the
    amax of ``x`` is folded into ``table.amax_history[0, index]``."""
    current = table.amax_history[0, index : index + 1]
    if x.numel():  # an empty tensor has no amax (and changes none)
        current.copy_(torch.maximum(current, x.detach().abs().amax().float().view(1)))
    x8 = torch.empty_like(x, dtype=fmt)
    return x8.copy_((x.float() * table.scale[index]).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]))


def dequantize(x8: torch.Tensor, table: Fp8Table, index: int) -> torch.Tensor:
    return x8.float() * table.scale_inv[index]


def fwd_kwargs(f: Fp8Table) -> dict:
    amax = f.amax_history[0]
    return dict(d_scale_qkv=f.scale_inv, d_scale_s=f.scale_inv, q_scale_s=f.scale, q_scale_o=f.scale,
                amax_s=amax, amax_o=amax)  # fmt: skip


def bwd_kwargs(f: Fp8Table, b: Fp8Table) -> dict:
    return dict(d_scale_qkv=f.scale_inv, d_scale_s=f.scale_inv, d_scale_o=f.scale_inv, d_scale_do=b.scale_inv,
                d_scale_dp=b.scale_inv, q_scale_s=f.scale, q_scale_dp=b.scale, q_scale_dqkv=b.scale,
                amax_dp=b.amax_history[0], amax_dqkv=b.amax_history[0])  # fmt: skip
