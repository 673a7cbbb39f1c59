"""Inputs, references and checks shared by the context-parallel GPU tests (one GPU, simulated
ring: ``test_cp_gpu.py``; two GPUs over NCCL: ``cp_two_gpu.py``).

A case is a global batch (dense ``[b, S, ...]``/``[S, b, ...]`` or THD padded to multiples of
``2 cp``), an upstream gradient, the fp64 reference of the full attention and te_cudnn's
single-GPU result on the full sequence. A context-parallel result passes when it has no NaN,
its padded rows are zero, and its error against the reference is at most 1.2x the
single-GPU error (the acceptance bar) plus a small absolute floor for errors at rounding level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import te_cudnn
from te_cudnn.parallel import pad_cu_seqlens
from te_cudnn.reference import attention_reference
from te_cudnn.testing import rel_error

NAMES = ("out", "dq", "dk", "dv")
#: allowed CP error = FACTOR x single-GPU error + FLOOR (relative Frobenius errors)
FACTOR, FLOOR = 1.2, 2e-4


@dataclass
class Case:
    fmt: str
    mask: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    d_out: torch.Tensor
    cu: Optional[torch.Tensor] = None  # THD: global valid lengths
    cu_padded: Optional[torch.Tensor] = None  # THD: global padded offsets
    max_seqlen: Optional[int] = None

    def options(self) -> dict:
        if self.fmt != "thd":
            return dict(qkv_format=self.fmt, attn_mask_type=self.mask)
        return dict(qkv_format="thd", attn_mask_type=self.mask, cu_seqlens_q=self.cu, cu_seqlens_q_padded=self.cu_padded,
                    max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen)  # fmt: skip


def make_case(fmt: str, mask: str, cp: int, b: int, s: int, h: int, hg: int, d_qk: int, d_v: int, seed: int,
              dtype: torch.dtype = torch.bfloat16, device: str = "cuda") -> Case:  # fmt: skip
    """Seeded inputs (identical on every rank). THD: ``b`` sequences of random lengths in
    ``[0, s]`` (a 0 and a length not divisible by ``2 cp`` included), padded for ``cp``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rand = lambda *shape: torch.randn(shape, generator=g).clamp_(-2, 2).to(device, dtype)  # noqa: E731
    if fmt != "thd":
        lead = (b, s) if fmt == "bshd" else (s, b)
        return Case(fmt, mask, rand(*lead, h, d_qk), rand(*lead, hg, d_qk), rand(*lead, hg, d_v), rand(*lead, h, d_v))
    lens = torch.randint(0, s + 1, (b,), generator=g)
    lens[0], lens[-1] = 0, 2 * cp * 3 + 1
    cu = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).to(device, torch.int32)
    cu_padded = pad_cu_seqlens(cu, cp)
    t = int(cu_padded[-1])
    case = Case(fmt, mask, rand(t, h, d_qk), rand(t, hg, d_qk), rand(t, hg, d_v), rand(t, h, d_v), cu, cu_padded,
                int(lens.max()))  # fmt: skip
    valid = valid_rows(case)
    for x in (case.q, case.k, case.v, case.d_out):
        x.mul_(valid.view(-1, 1, 1))  # padding rows hold zeros, as padded batches do
    return case


def valid_rows(case: Case) -> torch.Tensor:
    """[t] bool: rows of the THD padded tensor that hold tokens."""
    t = case.q.shape[0]
    rows = torch.arange(t, device=case.q.device)
    seq = torch.searchsorted(case.cu_padded[1:].long(), rows, right=True)
    lens = (case.cu[1:] - case.cu[:-1]).long()
    return rows - case.cu_padded.long()[seq] < lens[seq]


def _bhsd(t: torch.Tensor, fmt: str) -> torch.Tensor:
    return t.transpose(1, 2) if fmt == "bshd" else t.permute(1, 2, 0, 3)


def _back(t: torch.Tensor, fmt: str) -> torch.Tensor:
    return (t.transpose(1, 2) if fmt == "bshd" else t.permute(2, 0, 1, 3)).contiguous()


def reference(case: Case, dtype: torch.dtype = torch.float64, window_size: tuple[int, int] = (-1, -1),
              softmax_type: str = "vanilla", softmax_offset: Optional[torch.Tensor] = None) -> list[torch.Tensor]:  # fmt: skip
    """out, dq, dk, dv of the full attention in ``dtype`` (THD: sequence by sequence, pads zero;
    ``window_size`` and sinks: dense only)."""
    mask = "causal" if "causal" in case.mask else "no_mask"
    if case.fmt != "thd":
        leaves = [_bhsd(x, case.fmt).to(dtype).requires_grad_() for x in (case.q, case.k, case.v)]
        sink = None if softmax_offset is None else softmax_offset.detach().to(dtype)
        out = attention_reference(*leaves, attn_mask_type=mask, compute_dtype=dtype, window_size=window_size,
                                  softmax_type=softmax_type, softmax_offset=sink).out  # fmt: skip
        out.backward(_bhsd(case.d_out, case.fmt).to(dtype))
        return [_back(t, case.fmt) for t in (out.detach(), *(x.grad for x in leaves))]
    results = [torch.zeros_like(x, dtype=dtype) for x in (case.d_out, case.q, case.k, case.v)]
    starts, lens = case.cu_padded[:-1].tolist(), (case.cu[1:] - case.cu[:-1]).tolist()
    for start, n in zip(starts, lens):
        if n == 0:
            continue
        rows = slice(start, start + n)
        leaves = [x[rows].transpose(0, 1).unsqueeze(0).to(dtype).requires_grad_() for x in (case.q, case.k, case.v)]
        out = attention_reference(*leaves, attn_mask_type=mask, compute_dtype=dtype).out
        out.backward(case.d_out[rows].transpose(0, 1).unsqueeze(0).to(dtype))
        for res, t in zip(results, (out.detach(), *(x.grad for x in leaves))):
            res[rows] = t[0].transpose(0, 1)
    return results


def single_gpu(case: Case, **options) -> list[torch.Tensor]:
    """te_cudnn on the whole sequence on one GPU: out, dq, dk, dv."""
    leaves = [x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v)]
    layout = f"{case.fmt}_{case.fmt}_{case.fmt}"
    if case.fmt == "thd":
        mask = {"causal": "padding_causal", "no_mask": "padding"}.get(case.mask, case.mask)
        out = te_cudnn.autograd.attend(*leaves, None, case.cu, case.cu, case.max_seqlen, case.max_seqlen, True, None,
                                       te_cudnn.AttnOptions(qkv_layout=layout, attn_mask_type=mask, **options),
                                       case.cu_padded, case.cu_padded)  # fmt: skip
    else:
        out = te_cudnn.fused_attention(*leaves, qkv_layout=layout, attn_mask_type=case.mask, **options)
    out.backward(case.d_out)
    return [out.detach(), *(x.grad for x in leaves)]


def check(label: str, got: list[torch.Tensor], single: list[torch.Tensor], ref: list[torch.Tensor],
          case: Case) -> dict[str, tuple[float, float]]:  # fmt: skip
    """Assert the CP results against the reference; returns {name: (cp error, single-GPU error)}."""
    errors = {}
    pad = None if case.fmt != "thd" else ~valid_rows(case)
    for name, x, one, want in zip(NAMES, got, single, ref):
        assert x.shape == want.shape and x.dtype == case.q.dtype, f"{label} {name}: {x.dtype} {list(x.shape)}"
        assert torch.isfinite(x).all(), f"{label} {name}: NaN or Inf"
        if pad is not None:
            assert x[pad].eq(0).all(), f"{label} {name}: padded rows are not zero"
        err, err_one = rel_error(x, want), rel_error(one, want)
        assert err <= FACTOR * err_one + FLOOR, (
            f"{label} {name}: error {err:.3e} > {FACTOR} x single-GPU {err_one:.3e} + {FLOOR}")
        errors[name] = (err, err_one)
    return errors


def check_sinks(label: str, case: Case, got: list[torch.Tensor], grad_cp: Optional[torch.Tensor],
                offset: Optional[torch.Tensor], extra: dict) -> dict[str, tuple[float, float]]:  # fmt: skip
    """A sink run (``extra``: softmax_type, softmax_offset, window_size) against the fp64
    reference with the same sink, by :func:`check`'s rule, and the learnable sink's gradient
    summed over the ranks (``grad_cp``) against te_cudnn's single-GPU one (``offset.grad`` is
    cleared first). Returns {name: (cp error, single-GPU error)}."""
    if offset is not None:
        offset.grad = None
    one = single_gpu(case, **extra)
    ref = reference(case, window_size=extra.get("window_size", (-1, -1)), softmax_type=extra["softmax_type"],
                    softmax_offset=offset)  # fmt: skip
    errors = check(label, got, one, ref, case)
    if offset is not None:
        torch.testing.assert_close(grad_cp, offset.grad, atol=5e-2, rtol=2e-2)
    return errors


def error_words(errors: dict[str, tuple[float, float]]) -> str:
    """``check``'s errors as one line: ``out 1.2e-03 (1 GPU 1.1e-03), ...``."""
    return ", ".join(f"{n} {e:.2e} (1 GPU {o:.2e})" for n, (e, o) in errors.items())
