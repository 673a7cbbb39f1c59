"""fp64 stand-ins for the two fused kernels the context-parallel orchestration calls, for the
CPU tests (cuDNN needs a GPU): ``fused_attn_fwd``'s and ``fused_attn_bwd``'s contract for dense
``bshd``/``sbhd`` tensors without dropout: masks ``no_mask`` / ``causal`` /
``causal_bottom_right`` with ``window_size`` and ``bottom_right_diagonal``, sinks
(``softmax_type``/``softmax_offset``), GQA/MQA, ``d_qk != d_v``. The forward returns O and the
log-sum-exp; the backward works from the *given* O and log-sum-exp (and returns the sink's
gradient), as the real kernels do. Used by the context-parallel CPU tests (ring, windows,
all_gather, a2a); the real kernels run in ``test_cp_gpu.py`` and ``cp_two_gpu.py``.

:data:`CALLS` records ``(sq, skv, mask, window)`` of every forward call (tests that count the
calls clear it first).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from te_cudnn.reference import allowed_mask

CALLS: list[tuple] = []


def to_bhsd(t: torch.Tensor, fmt: str) -> torch.Tensor:
    return t.transpose(1, 2) if fmt.startswith("bshd") else t.permute(1, 2, 0, 3)


def from_bhsd(t: torch.Tensor, fmt: str) -> torch.Tensor:
    return (t.transpose(1, 2) if fmt.startswith("bshd") else t.permute(2, 0, 1, 3)).contiguous()


def _scores(q, k, scale, mask, window, bottom_right):
    sq, skv = q.shape[2], k.shape[2]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = scale * q @ k.transpose(-2, -1)
    allowed = allowed_mask(sq, skv, attn_mask_type=mask, window_size=tuple(window), bottom_right_diagonal=bottom_right)
    return s.masked_fill(~allowed, float("-inf")), k


def _sink(softmax_type, offset, h):
    if softmax_type == "vanilla":
        assert offset is None
        return None
    return torch.zeros(1, h, 1, 1) if offset is None else offset.double().reshape(1, h, 1, 1)


def math_fwd(is_training, max_q, max_kv, cu_q, cu_kv, q, k, v, dtype, backend=None, *, attn_scale, dropout,
             qkv_layout, attn_mask_type, softmax_type="vanilla", window_size=(-1, -1), bottom_right_diagonal=None,
             softmax_offset=None, rng_state=None, attn_bias=None, attn_bias_type="no_bias", rng_gen=None,
             lengths=None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None, out=None):  # fmt: skip
    """fused_attn_fwd's contract (dense, no dropout, no bias) in fp64 on the CPU; ``out``
    (contiguous, as the real one requires) is written and returned."""
    out_buf = out
    dim = 1 if qkv_layout.startswith("bshd") else 0
    assert dropout == 0.0 and cu_q is None and max_q == q.shape[dim] and max_kv == k.shape[dim]
    assert attn_bias is None and attn_bias_type == "no_bias" and cu_seqlens_q_padded is None and lengths is None
    CALLS.append((max_q, max_kv, attn_mask_type, tuple(window_size)))
    scale = attn_scale or q.shape[-1] ** -0.5
    qb, kb, vb = (to_bhsd(t, qkv_layout).double() for t in (q, k, v))
    s, _ = _scores(qb, kb, scale, attn_mask_type, window_size, bottom_right_diagonal)
    sink = _sink(softmax_type, softmax_offset, qb.shape[1])
    ext = s if sink is None else torch.cat((s, sink.expand(*s.shape[:-1], 1)), -1)
    lse = torch.logsumexp(ext, -1, keepdim=True)
    p = torch.exp(s - lse).nan_to_num(0.0)
    out = p @ vb.repeat_interleave(qb.shape[1] // vb.shape[1], dim=1)
    aux = [lse.float().contiguous(), torch.zeros(2, dtype=torch.int64) if rng_state is None else rng_state]
    result = from_bhsd(out, qkv_layout).to(dtype)
    if out_buf is not None:
        assert out_buf.is_contiguous() and out_buf.shape == result.shape
        result = out_buf.copy_(result)
    return result, aux + ([] if sink is None else [softmax_offset])


def math_bwd(max_q, max_kv, cu_q, cu_kv, q, k, v, o, d_o, dtype, aux, backend=None, *, attn_scale, dropout,
             qkv_layout, attn_mask_type, deterministic, softmax_type="vanilla", window_size=(-1, -1),
             bottom_right_diagonal=None, attn_bias_type="no_bias", lengths=None, cu_seqlens_q_padded=None,
             cu_seqlens_kv_padded=None):  # fmt: skip
    """fused_attn_bwd's contract from the given O and log-sum-exp (and the sink's gradient)."""
    assert attn_bias_type == "no_bias" and cu_seqlens_q_padded is None and lengths is None
    scale = attn_scale or q.shape[-1] ** -0.5
    qb, kb, vb, ob, dob = (to_bhsd(t, qkv_layout).double() for t in (q, k, v, o, d_o))
    group = qb.shape[1] // kb.shape[1]
    s, k_full = _scores(qb, kb, scale, attn_mask_type, window_size, bottom_right_diagonal)
    if not isinstance(aux[1], torch.Tensor):  # as the real fused_attn_bwd: the forward's rng state is required
        raise TypeError(f"aux_ctx_tensors[1] must be a torch.Tensor, got {aux[1]!r}")
    lse = aux[0].double()
    p = torch.exp(s - lse).nan_to_num(0.0)
    big_d = (dob * ob).sum(-1, keepdim=True)
    ds = p * (dob @ vb.repeat_interleave(group, dim=1).transpose(-2, -1) - big_d)
    dq = scale * ds @ k_full
    dk = (scale * ds.transpose(-2, -1) @ qb).unflatten(1, (-1, group)).sum(2)
    dv = (p.transpose(-2, -1) @ dob).unflatten(1, (-1, group)).sum(2)
    d_sink = None
    if softmax_type == "learnable":
        sink = _sink(softmax_type, aux[2], qb.shape[1])
        d_sink = -(torch.exp(sink - lse) * big_d).sum((0, 2, 3)).view(1, -1, 1, 1).float()
    return [from_bhsd(g, qkv_layout).to(dtype) for g in (dq, dk, dv)] + [None, d_sink]


def _users(modules) -> set:
    """The given modules and the others that call the kernels: a2a's
    (``te_cudnn.parallel.ulysses_groups``), the halo's and the two-rank ring's."""
    import te_cudnn.parallel.halo as halo_mod
    import te_cudnn.parallel.ring_pair as pair_mod
    import te_cudnn.parallel.ulysses_groups as groups_mod

    return {*modules, groups_mod, halo_mod, pair_mod}


def _slots(modules) -> list[tuple[Any, str, Any]]:
    """(module, name, stand-in) for every kernel entry point the users hold."""
    kernels = {"fused_attn_fwd": math_fwd, "fused_attn_bwd": math_bwd}
    return [(m, name, fn) for m in _users(modules) for name, fn in kernels.items() if hasattr(m, name)]


def install(monkeypatch, *modules) -> None:
    """Replace ``fused_attn_fwd``/``fused_attn_bwd`` in the given modules and the other users
    for one test, and clear :data:`CALLS`."""
    for module, name, fn in _slots(modules):
        monkeypatch.setattr(module, name, fn)
    CALLS.clear()


@contextlib.contextmanager
def installed(*modules):
    """:func:`install` for a ``with`` block (where no ``monkeypatch`` fixture reaches, as in
    hypothesis examples)."""
    saved = [(m, name, getattr(m, name)) for m, name, _ in _slots(modules)]
    install_in_process(*modules)
    try:
        yield
    finally:
        for m, name, fn in saved:
            setattr(m, name, fn)


def install_in_process(*modules) -> None:
    """:func:`install` for a spawned rank process (for good: the process ends with the test)."""
    for module, name, fn in _slots(modules):
        setattr(module, name, fn)
