"""d_softmax_offset of learnable attention sinks, computed after cuDNN's backward graph.

For a learnable sink ``α_h`` the sink's probability in row ``i`` is ``p_i = exp(α_h - lse_i)``
(cuDNN's softmax stats include the sink term) and

    dL/dα_h = -Σ_{b, i} p_{b,h,i} · D_{b,h,i},   D = rowsum(dO ∘ O),

the same ``D`` cuDNN's backward uses for dS (it holds with dropout too). cuDNN 9.19 can produce
this itself (``dSink_token``), but its accumulation slows a gpt-oss-shaped backward well below
vanilla's and is not bit-reproducible under ``deterministic=True``. Here it is one pass over O and dO: a Triton kernel writes one partial sum per
(row block, head), and a plain reduction adds them (bit-reproducible). Without Triton the same
formula runs as torch ops. Rows past a sequence's end (padding masks) are left out: their
stats are not defined.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["sink_grad", "sink_grad_torch"]

try:  # Triton ships with CUDA builds of torch; the torch path below serves everything else
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only environments
    triton = None

_BLOCK_S = 128

if triton is not None:

    @triton.jit
    def _sink_grad_kernel(o_ptr, do_ptr, stats_ptr, sink_ptr, lens_ptr, part_ptr, S, H, D, n_blocks,
                          o_sb, o_ss, o_sh, do_sb, do_ss, do_sh,
                          HAS_LENS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
        pid = tl.program_id(0)  # b * n_blocks + row block
        h = tl.program_id(1)
        b = pid // n_blocks
        rows = (pid % n_blocks) * BLOCK_S + tl.arange(0, BLOCK_S)
        cols = tl.arange(0, BLOCK_D)
        valid = rows < S
        if HAS_LENS:
            valid = valid & (rows < tl.load(lens_ptr + b))
        m2 = valid[:, None] & (cols[None, :] < D)
        o = tl.load(o_ptr + b * o_sb + rows[:, None] * o_ss + h * o_sh + cols[None, :], mask=m2, other=0.0)
        g = tl.load(do_ptr + b * do_sb + rows[:, None] * do_ss + h * do_sh + cols[None, :], mask=m2, other=0.0)
        d = tl.sum(o.to(tl.float32) * g.to(tl.float32), axis=1)
        lse = tl.load(stats_ptr + (b * H + h) * S + rows, mask=valid, other=0.0)
        p = tl.exp(tl.load(sink_ptr + h) - lse)
        tl.store(part_ptr + h * tl.num_programs(0) + pid, -tl.sum(tl.where(valid, p * d, 0.0), axis=0))


def _bsh_strides(t: torch.Tensor, seq_first: bool) -> tuple[int, int, int]:
    """Element strides of the batch, sequence and head dims of a [b, s, h, d] / [s, b, h, d] tensor."""
    st = t.stride()
    return (st[1], st[0], st[2]) if seq_first else (st[0], st[1], st[2])


def sink_grad(o: torch.Tensor, d_o: torch.Tensor, stats: torch.Tensor, sink: torch.Tensor, seq_first: bool,
              lens: Optional[torch.Tensor] = None) -> torch.Tensor:  # fmt: skip
    """``d_softmax_offset`` (fp32 ``[1, h, 1, 1]``) from O and dO (``[b, s, h, d]``, or
    ``[s, b, h, d]`` when ``seq_first``; unit-stride last dim), the fp32 stats ``[b, h, s, 1]``
    (contiguous), the sink logits ``[1, h, 1, 1]`` and optional int32 per-sequence lengths ``[b]``."""
    if triton is None or o.device.type != "cuda":
        return sink_grad_torch(o, d_o, stats, sink, seq_first, lens)
    b, h, s = stats.shape[0], stats.shape[1], stats.shape[2]
    d = o.shape[-1]
    n_blocks = triton.cdiv(s, _BLOCK_S)
    part = torch.empty((h, b * n_blocks), dtype=torch.float32, device=o.device)
    _sink_grad_kernel[(b * n_blocks, h)](
        o, d_o, stats, sink, lens if lens is not None else stats, part, s, h, d, n_blocks,
        *_bsh_strides(o, seq_first), *_bsh_strides(d_o, seq_first),
        HAS_LENS=lens is not None, BLOCK_S=_BLOCK_S, BLOCK_D=triton.next_power_of_2(d),
    )  # fmt: skip
    return part.sum(dim=1).view(1, h, 1, 1)


def sink_grad_torch(o: torch.Tensor, d_o: torch.Tensor, stats: torch.Tensor, sink: torch.Tensor, seq_first: bool,
                    lens: Optional[torch.Tensor] = None) -> torch.Tensor:  # fmt: skip
    """The same formula as torch ops (a few passes instead of one; products in fp32 like the kernel)."""
    b, h, s = stats.shape[0], stats.shape[1], stats.shape[2]
    wide = torch.promote_types(o.dtype, torch.float32)
    d = torch.linalg.vecdot(o.to(wide), d_o.to(wide))  # [b, s, h] or [s, b, h]
    d = d.permute(1, 2, 0) if seq_first else d.permute(0, 2, 1)  # [b, h, s]
    contrib = torch.exp(sink.view(1, h, 1) - stats.view(b, h, s)) * d
    if lens is not None:
        contrib = torch.where(torch.arange(s, device=o.device).view(1, 1, -1) < lens.view(b, 1, 1), contrib, 0.0)
    return contrib.sum(dim=(0, 2)).neg_().view(1, h, 1, 1)
