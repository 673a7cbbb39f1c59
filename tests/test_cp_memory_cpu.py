"""Peak memory of one context-parallel rank on the CPU (tests/_cp_memory.py): live tensor bytes
per local token at the forward's and the backward's peak, one rank measured alone (p2p: the
loopback ring; a2a: the loopback all-to-all), the stand-in kernels opaque (their outputs
counted, their temporaries not; cuDNN's workspace is not modelled).

Each bound is the accounting of the context-parallel guide ("Memory per rank"), computed by
:func:`_cp_memory.p2p_derived` / :func:`_cp_memory.a2a_derived` from h, hg, d and the dtype:
the measurement must match it (to a few bytes per token: rng states, small index tensors), and
where a reduction was made the measurement must be below the accounting before it.
"""

from __future__ import annotations

import pytest

from _cp_memory import a2a_derived, a2a_kept, measure, p2p_derived

H, HG, D, S_LOCAL, E = 8, 4, 16, 32, 2
SLACK = 8  # bytes per local token not in the accounting (rng states, scalars)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_p2p_rank_peak_matches_the_accounting(monkeypatch, cp):
    got = measure("p2p", cp, H, HG, D, S_LOCAL, monkeypatch, rank=cp - 1)["bwd"]
    want = p2p_derived(H, HG, D, E, cp, cp - 1)
    assert want - SLACK <= got <= want + SLACK, (got, want)
    if cp >= 2:  # one step's gradients alive, not two; at cp >= 3 two key/value blocks, not three
        before = p2p_derived(H, HG, D, E, cp, cp - 1, version="before")
        assert want < before and got < before - SLACK, (got, before)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_a2a_rank_peak_matches_the_accounting(monkeypatch, cp):
    got = measure("a2a", cp, H, HG, D, S_LOCAL, monkeypatch)
    want = a2a_derived(H, HG, D, E, cp)
    assert want - SLACK <= got["bwd"] <= want + SLACK, (got, want)
    if cp >= 2:  # the reorder's backward: one permuted copy of dO, not zero-filled partial sums per chunk
        before = a2a_derived(H, HG, D, E, cp, "reorder")
        assert want < before and got["bwd"] < before - SLACK, (got, before)
    # between forward and backward: the sequence-sharded tensors and the stats, no head-sharded copies
    assert a2a_kept(H, HG, D, E) - SLACK <= got["kept"] <= a2a_kept(H, HG, D, E) + SLACK, got
    assert got["kept"] < a2a_kept(H, HG, D, E, "before") - SLACK


@pytest.mark.parametrize("cp,groups", [(1, 2), (2, 2), (1, 4)])
def test_a2a_head_groups_shrink_the_backward_peak(monkeypatch, cp, groups):
    """head_groups=G: the head-sharded tensors, the kernel's gradients (and on a GPU cuDNN's
    workspace) of one group at a time; the gradients of q, k, v are made whole once."""
    got = measure("a2a", cp, H, HG, D, S_LOCAL, monkeypatch, head_groups=groups)["bwd"]
    want = a2a_derived(H, HG, D, E, cp, head_groups=groups)
    assert want - SLACK <= got <= want + SLACK, (got, want)
    assert got < a2a_derived(H, HG, D, E, cp) - SLACK


@pytest.mark.parametrize("cp,groups", [(1, 2), (2, 2), (3, 4), (4, 2)])
def test_p2p_head_groups_shrink_the_backward_peak(monkeypatch, cp, groups):
    """head_groups=G: one group's ring at a time (fp32 accumulators, blocks in flight, a step's
    gradients and, on a GPU, cuDNN's workspace); the gradients of q, k, v are made whole once."""
    got = measure("p2p", cp, H, HG, D, S_LOCAL, monkeypatch, rank=cp - 1, head_groups=groups)["bwd"]
    want = p2p_derived(H, HG, D, E, cp, cp - 1, head_groups=groups)
    assert want - SLACK <= got <= want + SLACK, (got, want)
    if cp > 2:
        assert got < p2p_derived(H, HG, D, E, cp, cp - 1) - SLACK
    elif cp == 2:  # two ranks hold no fp32 accumulators to divide: only cuDNN's workspace (on a GPU) shrinks
        assert got <= p2p_derived(H, HG, D, E, cp, cp - 1) + SLACK


def test_a2a_head_groups_decline_before_any_exchange(monkeypatch):
    """hg = 4 heads cannot be split into 2 groups over 4 ranks: declined with the reason."""
    from te_cudnn import UnsupportedConfigError

    with pytest.raises(UnsupportedConfigError, match=r"head_groups \* cp = 8"):
        measure("a2a", 4, H, HG, D, S_LOCAL, monkeypatch, head_groups=2)


def test_tool_counts_storages_once_and_frees_them():
    import torch

    from _cp_memory import LiveBytes

    with LiveBytes() as mode:
        x = torch.zeros(256)  # 1 KiB
        view = x[10:]
        y = x + 1
        x.add_(1)
        del x
        assert mode.now == 2048
        del view
        assert mode.now == 1024
        del y
        assert mode.now == 0 and mode.peak == 2048


def test_p2p_backward_runs_once(monkeypatch):
    """The ring frees its last forward block during the backward: a second backward is refused
    with a reason (not a wrong result)."""
    import torch

    import te_cudnn.parallel.ring as ring_mod
    from _cp_standin import install
    from te_cudnn.parallel import ring_rank_alone

    install(monkeypatch, ring_mod)
    q, k, v = (torch.randn(1, 8, 2, 16).bfloat16().requires_grad_() for _ in range(3))
    out = ring_rank_alone(q, k, v, 2, 0, qkv_format="bshd", attn_mask_type="causal")
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        out.sum().backward()
