"""Sliding windows and attention sinks on the p2p ring, on the CPU.

The fused kernels are the fp64 stand-ins of ``tests/_cp_standin.py``. Checked: the calls each
ring step makes under a window (only the (query chunk, key chunk) pairs the window reaches,
trimmed and masked by the shifted top-left window; counted), the log-sum-exp merge of rows
that steps do not reach, dK/dV routed back along the ring, and the sink folded in once per
row after the ring with the learnable sink's gradient summed over the ranks, against the fp64
reference on the full sequence for cp = 1..4 (and 8). The real kernels run in
``tests/test_cp_gpu.py`` and ``tests/cp_two_gpu.py``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import te_cudnn.parallel.ring as ring_mod
from _cp_cpu import bf16 as _bf16
from _cp_cpu import close as _close
from _cp_cpu import HEADS, declines_before, dense_case, sink_checked_before, gather_results, math_kernels, simulate, spawn_gloo  # noqa: F401
from _cp_cpu import reference as _reference
from _cp_standin import CALLS, install, install_in_process
from te_cudnn.parallel import cp_decline_reasons, shard
from te_cudnn.parallel.api import _options
from te_cudnn.parallel.schedule import ring_window, single_key_tiles, window_calls
from te_cudnn.reference import allowed_mask


def _case(cp, fmt, heads, c=4, b=2, seed=0):
    return dense_case(cp, fmt, HEADS[heads], c, b, seed)


def _run(cp, fmt, q, k, v, d_out, **options):
    return simulate("p2p", cp, fmt, q, k, v, d_out, **options)


def _full(mask, window):
    return (-1, 0 if mask == "causal" else -1) if window is None else (window[0], 0 if mask == "causal" else window[1])


# chunks of 4 tokens: windows inside a chunk (0, 2, 3), across chunks (6, 8), beyond the sequence (1000)
WINDOWS = {"causal": [(0, 0), (2, 0), (3, -1), (6, 0), (8, 0), (1000, 0)],
           "no_mask": [(0, 0), (2, 2), (3, 0), (-1, 2), (6, -1), (4, 7), (1000, 1000)]}  # fmt: skip
_CASES = [(cp, fmt, mask, w, heads) for cp, fmt, mask, heads in itertools.product(
    (1, 2, 3, 4), ("bshd", "sbhd"), ("causal", "no_mask"), HEADS) for w in WINDOWS[mask]]  # fmt: skip


@pytest.mark.parametrize("cp,fmt,mask,window,heads", _CASES, ids=[f"cp{c}-{f}-{m}-{w}-{h}" for c, f, m, w, h in _CASES])
def test_windowed_ring_matches_full_attention(math_kernels, cp, fmt, mask, window, heads):
    q, k, v, d_out = _case(cp, fmt, heads, seed=cp * 100 + len(heads) + sum(window))
    got = _run(cp, fmt, q, k, v, d_out, attn_mask_type=mask, window_size=window)
    ref, _ = _reference(q, k, v, d_out, mask, fmt, _full(mask, window))
    _close(got, ref, f"cp={cp} {fmt} {mask} window={window}")


@pytest.mark.parametrize("fmt,mask,window", [("bshd", "causal", (5, 0)), ("sbhd", "no_mask", (3, 2)),
                                             ("bshd", "no_mask", (-1, 0))])  # fmt: skip
def test_windowed_ring_cp8(math_kernels, fmt, mask, window):
    q, k, v, d_out = _case(8, fmt, "gqa", c=3, b=1, seed=8)
    got = _run(8, fmt, q, k, v, d_out, attn_mask_type=mask, window_size=window)
    ref, _ = _reference(q, k, v, d_out, mask, fmt, _full(mask, window))
    _close(got, ref, f"cp=8 {fmt} {mask} {window}")


_SINKS = [(1, "bshd", "causal", None), (2, "sbhd", "causal", None), (3, "bshd", "no_mask", None),
          (4, "sbhd", "no_mask", None), (2, "bshd", "causal", (3, 0)), (3, "sbhd", "no_mask", (2, 2)),
          (4, "bshd", "causal", (6, 0)), (8, "bshd", "causal", None)]  # fmt: skip


@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
@pytest.mark.parametrize("cp,fmt,mask,window", _SINKS)
def test_ring_sinks(math_kernels, softmax_type, cp, fmt, mask, window):
    """The sink enters each row's normaliser once (after the ring); the learnable sink's
    gradient -sum exp(s_h - L) (dO . O) is summed over the ranks."""
    q, k, v, d_out = _case(cp, fmt, "gqa", c=2 if cp == 8 else 4, seed=40 + cp)
    offset = None
    if softmax_type == "learnable":
        offset = torch.randn(1, 4, 1, 1, generator=torch.Generator().manual_seed(cp)).requires_grad_()
    got = _run(cp, fmt, q, k, v, d_out, attn_mask_type=mask, window_size=window, softmax_type=softmax_type,
               softmax_offset=offset)  # fmt: skip
    ref, d_offset = _reference(q, k, v, d_out, mask, fmt, _full(mask, window), softmax_type, offset)
    _close(got, ref, f"{softmax_type} cp={cp}")
    assert all(c[2] in ("causal", "no_mask") for c in CALLS), "the kernels run vanilla softmax"
    if offset is not None:
        torch.testing.assert_close(offset.grad.double(), d_offset, atol=2e-2, rtol=2e-2)


def test_off_by_one_takes_given_logits(math_kernels):
    q, k, v, d_out = _case(2, "bshd", "mha", seed=3)
    offset = torch.full((1, 4, 1, 1), 1.5)
    got = _run(2, "bshd", q, k, v, d_out, attn_mask_type="causal", softmax_type="off_by_one", softmax_offset=offset)
    ref, _ = _reference(q, k, v, d_out, "causal", "bshd", (-1, 0), "off_by_one", offset)
    _close(got, ref, "off_by_one with logits")


def test_out_of_window_tiles_are_not_computed(math_kernels):
    """cp=4, chunks of 4 tokens, causal window (2, 0): every query chunk attends its own chunk
    (4 x 4, window (2, 0)) and the 2 x 2 corner of the chunk before it (window (0, -1)), nothing
    else: 7 corners (chunk 0 has none) and 8 diagonal calls over the 16 ring steps, instead of
    one call per step."""
    q, k, v, d_out = _case(4, "bshd", "mha", seed=1)
    _run(4, "bshd", q, k, v, d_out, attn_mask_type="causal", window_size=(2, 0))
    assert sorted(CALLS) == sorted([(2, 2, "no_mask", (0, -1))] * 7 + [(4, 4, "causal", (2, 0))] * 8)
    CALLS.clear()
    _run(4, "bshd", q, k, v, d_out, attn_mask_type="causal")  # no window: one call per step, as before
    assert len(CALLS) == 16
    CALLS.clear()
    _run(4, "bshd", q, k, v, d_out, attn_mask_type="causal", window_size=(0, 0))  # the diagonal only
    assert CALLS == [(4, 4, "causal", (0, 0))] * 8


def test_full_chunk_pairs_merge_into_one_call():
    # no_mask (8, 8) over chunks of 4 with cp=2 (16 tokens): rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    calls = window_calls(2, 1, 1, 4, (8, 8))  # rank 1's own block: every pair within reach
    assert [(c.q_start, c.q_len, c.kv_start, c.kv_len, c.window) for c in calls] == [(0, 8, 0, 8, (-1, -1))]
    assert ring_window((15, 15), False, 16) is None and ring_window((14, 0), True, 16) == (14, 0)
    assert ring_window((3, 5), True, 16) == (3, 0) and ring_window((-1, 0), False, 16) == (-1, 0)


@pytest.mark.parametrize("cp,c", [(1, 3), (2, 2), (3, 4), (4, 3)])
def test_window_calls_cover_the_window_exactly(cp, c):
    """Every allowed (query, key) pair of every rank is in exactly one call, under that call's
    mask; no call has a row or key it does not reach."""
    s = 2 * cp * c
    chunks = lambda r: [*range(r * c, (r + 1) * c), *range((2 * cp - 1 - r) * c, (2 * cp - r) * c)]  # noqa: E731
    for causal, left, right in itertools.product((True, False), (-1, 0, 2, 3, 5, 9), (-1, 0, 2, 4)):
        window = ring_window((left, right), causal, s)
        if window is None or single_key_tiles(cp, c, window):
            continue
        full = allowed_mask(s, s, attn_mask_type="no_mask", window_size=window)[0, 0]
        for r in range(cp):
            seen = torch.zeros(2 * c, s, dtype=torch.int64)
            for j in range(cp):
                for call in window_calls(cp, r, j, c, window):
                    m = allowed_mask(call.q_len, call.kv_len, attn_mask_type="no_mask", window_size=call.window,
                                     bottom_right_diagonal=False)[0, 0]  # fmt: skip
                    assert m.any(1).all() and m.any(0).all() and call.q_len <= call.kv_len
                    rows, keys = chunks(r)[call.q_start : call.q_start + call.q_len], chunks(j)[call.kv_start :]
                    assert torch.equal(m, full[rows][:, keys[: call.kv_len]]), (window, r, j, call)
                    seen[call.q_start : call.q_start + call.q_len, keys[: call.kv_len]] += m.long()
            assert torch.equal(seen, full[chunks(r)].long()), (window, r)


@pytest.mark.parametrize("kwargs,q_shape,k_len,match", [
    (dict(window_size=(2, 0), dropout=0.1), (2, 8, 4, 16), 8, "no dropout with a sliding window"),
    (dict(attn_mask_type="no_mask", window_size=(2, 2)), (2, 8, 4, 16), 16, "as many queries as keys"),
    (dict(window_size=(2, 3)), (2, 8, 4, 16), 8, "right=3"),
    (dict(window_size=(1, 0)), (2, 8, 4, 16), 8, "sq = skv = 1"),
    (dict(window_size=(2, 0)), (2, 2, 4, 16), 2, "sq = skv = 1"),  # one token per chunk
    (dict(softmax_type="off_by_one", dropout=0.1), (2, 8, 4, 16), 8, "attention sinks"),
])  # fmt: skip
def test_declines_with_reasons_before_communication(monkeypatch, kwargs, q_shape, k_len, match):
    declines_before(monkeypatch, "run_simulated", "p2p", kwargs, q_shape, k_len, match)


def test_declines_thd_windows_and_sinks_naming_a2a():
    q = _bf16(16, 4, 16)
    for window, sink in (((4, 0), "vanilla"), (None, "off_by_one"), (None, "learnable")):
        opts = _options("p2p", "thd", "padding_causal", None, 0.0, False, window, None, None, sink, None, True)
        why = " ".join(cp_decline_reasons(opts, 2, q, q, q))
        assert "qkv_format='thd'" in why and "'a2a'" in why, (window, sink)


def test_decline_reasons_empty_when_supported():
    q = _bf16(2, 8, 4, 16)
    for mask, window, sink in (("causal", (2, 0), "vanilla"), ("causal", (6, 0), "learnable"),
                               ("no_mask", (2, 2), "off_by_one"), ("no_mask", None, "learnable"),
                               ("causal", (100, 0), "vanilla")):  # fmt: skip
        opts = _options("p2p", "bshd", mask, None, 0.0, False, window, None, None, sink, None, True)
        assert cp_decline_reasons(opts, 2, q, q, q) == [], (mask, window, sink)
    opts = _options("p2p", "bshd", "causal", None, 0.1, False, (100, 0), None, None, "vanilla", None, True)
    assert cp_decline_reasons(opts, 2, q, q, q) == [], "a window wider than the sequence is no window (dropout runs)"


def test_sink_arguments_checked_before_communication(monkeypatch):
    sink_checked_before(monkeypatch, "run_simulated", "p2p")


def _gloo_worker(rank: int, world: int, port: int, fmt: str, mask: str, window, report: str) -> None:
    """One rank of a CPU process group (gloo): the ring's isend/irecv between real ranks under a
    window, and the learnable sink's gradient all-reduced over the group."""
    import os

    import torch.distributed as dist

    from te_cudnn.parallel import context_parallel_attention

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    install_in_process(ring_mod)
    q, k, v, d_out = _case(world, fmt, "gqa", c=4, seed=5)
    offset = torch.randn(1, 4, 1, 1, generator=torch.Generator().manual_seed(2)).requires_grad_()
    local = [shard(t, world, rank, fmt).requires_grad_() for t in (q, k, v)]
    out = context_parallel_attention(*local, dist.group.WORLD, "p2p", qkv_format=fmt, attn_mask_type=mask,
                                     window_size=window, softmax_type="learnable", softmax_offset=offset)  # fmt: skip
    out.backward(shard(d_out, world, rank, fmt))
    gathered = gather_results(out, local, world, fmt)
    if rank == 0:
        ref, d_offset = _reference(q, k, v, d_out, mask, fmt, _full(mask, window), "learnable", offset)
        errs = [((x.double() - y).abs().max() / y.abs().max()).item() for x, y in zip(gathered, ref)]
        errs.append(((offset.grad.double() - d_offset).abs().max() / d_offset.abs().max()).item())
        with open(report, "w") as f:
            f.write(" ".join(f"{e:.6f}" for e in errs))
    dist.destroy_process_group()


@pytest.mark.parametrize("fmt,mask,window,world", [("bshd", "causal", (6, 0), 2), ("sbhd", "no_mask", (3, 2), 3),
                                                 ("bshd", "causal", (3, 0), 3)])  # fmt: skip
@pytest.mark.slow
def test_over_a_real_process_group_on_cpu(tmp_path, fmt, mask, window, world):
    """p2p with a window and a learnable sink over torch.distributed (gloo on CPU processes)."""
    errs = spawn_gloo(_gloo_worker, tmp_path, world, fmt, mask, window)
    assert len(errs) == 5 and max(errs) < 2e-2, dict(zip(("out", "dq", "dk", "dv", "d_sink"), errs))



@pytest.mark.parametrize("cp", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("c", [1, 3, 8])
def test_short_causal_windows_reach_only_the_neighbours_tails(cp, c):
    """What te_cudnn.parallel.halo relies on: for a causal window of 1 <= left <= c, a rank's
    window calls against any block other than its own and its neighbours' are empty, and
    against a neighbour's block they read only the tail it is sent."""
    from te_cudnn.parallel.halo import HaloTiles
    from te_cudnn.parallel.ring import RingSpec

    for left in range(1, c + 1):
        for r in range(cp):
            tiles = HaloTiles(RingSpec(cp, r, "bshd", True), 2 * c, (left, 0))
            for origin in range(cp):
                calls = window_calls(cp, r, origin, c, (left, 0))
                if origin in (r, r - 1, r + 1):
                    if origin != r:
                        assert all(0 <= x.kv_start and x.kv_start + x.kv_len <= left for x in tiles.calls(origin))
                        if (origin == r - 1) or r <= cp - 2:
                            assert calls, (cp, c, left, r, origin)
                else:
                    assert not calls, (cp, c, left, r, origin)


def test_short_causal_windows_exchange_tails_once(monkeypatch):
    """A causal window of left <= c tokens per chunk: two messages of the tails per rank and
    direction (forward: the key/value tails; backward: their gradients), not a block per
    ring step; longer windows keep the ring."""
    import te_cudnn.parallel.api as api_mod
    from te_cudnn.parallel.transport import Post, run_simulated

    install(monkeypatch, ring_mod)
    sizes = []

    def recording(programs):
        def watch(program):
            reply = None
            while True:
                try:
                    msg = program.send(reply)
                except StopIteration as done:
                    return done.value
                if isinstance(msg, Post):
                    sizes.append(sum(t.numel() for t in msg.sends))
                reply = yield msg

        return run_simulated([watch(p) for p in programs])

    monkeypatch.setattr(api_mod, "run_simulated", recording)
    cp, c, left = 4, 4, 3
    q, k, v, d_out = _case(cp, "bshd", "gqa", c=c, seed=2)
    got = _run(cp, "bshd", q, k, v, d_out, attn_mask_type="causal", window_size=(left, 0))
    _close(got, _reference(q, k, v, d_out, "causal", "bshd", (left, 0))[0], "halo")
    b, hg, d_qk, d_v = 2, 2, 16, 8
    tail = b * left * hg * (d_qk + d_v)
    assert sorted(sizes) == [tail] * (2 * cp) * 2, sizes  # forward tails, then backward gradients
    sizes.clear()
    _run(cp, "bshd", q, k, v, d_out, attn_mask_type="causal", window_size=(c + 2, 0))
    assert len(sizes) > 4 * cp and min(sizes) == b * 2 * c * hg * (d_qk + d_v)  # the ring: whole blocks


@pytest.mark.parametrize("softmax_type", ["vanilla", "off_by_one", "learnable"])
@pytest.mark.parametrize("cp,fmt,left", [(2, "bshd", 4), (3, "sbhd", 2), (4, "bshd", 3), (4, "sbhd", 4)])
def test_halo_equals_the_ring_bit_for_bit(math_kernels, monkeypatch, softmax_type, cp, fmt, left):
    """The halo writes rows one call reaches directly and rounds merged rows once: the outputs
    and the q/k/v gradients equal the ring's fp32 accumulators bit for bit (same kernel calls,
    the same fp32 arithmetic per row); the sink's fp32 gradient to rounding (the last rank
    merges its second chunk's two calls in the other order)."""
    import te_cudnn.parallel.api as api_mod

    q, k, v, d_out = _case(cp, fmt, "gqa", c=4, seed=60 + cp + left)
    results = []
    for halo in (True, False):
        monkeypatch.setattr(api_mod, "halo_applies", (lambda *a: True) if halo else (lambda *a: False))
        offset = None
        if softmax_type == "learnable":
            offset = torch.randn(1, 4, 1, 1, generator=torch.Generator().manual_seed(cp)).requires_grad_()
        got = _run(cp, fmt, q, k, v, d_out, attn_mask_type="causal", window_size=(left, 0),
                   softmax_type=softmax_type, softmax_offset=offset)  # fmt: skip
        results.append(got + ([] if offset is None else [offset.grad]))
    for name, x, y in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(x, y), f"{name}: max difference {(x.double() - y.double()).abs().max().item()}"
    if softmax_type == "learnable":
        torch.testing.assert_close(results[0][4], results[1][4], rtol=1e-6, atol=1e-6)
