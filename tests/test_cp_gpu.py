"""Context parallelism on one GPU: cp virtual ranks in one process run the real per-rank ring
programs and cuDNN kernels (exchanges become copies), against the fp64 reference of the full
attention and te_cudnn's single-GPU result. Block-wise forward with the log-sum-exp merge and
block-wise backward are exactly what the simulated ring runs."""

from __future__ import annotations

import pytest
import torch

from _cp_cases import check, check_sinks, error_words, make_case, reference, single_gpu
from te_cudnn.parallel import shard, simulate_context_parallel, unshard

pytestmark = pytest.mark.gpu

HEADS = {"mha": (8, 8, 64, 64), "gqa": (8, 2, 128, 128), "mla": (8, 8, 128, 64)}


def _run(case, cp: int, comm: str, **options) -> list[torch.Tensor]:
    """Shard, run the simulated CP attention forward and backward, gather: out, dq, dk, dv."""
    pad = case.cu_padded
    parts = [[shard(x, cp, r, case.fmt, pad).requires_grad_() for r in range(cp)] for x in (case.q, case.k, case.v)]
    outs = simulate_context_parallel(*parts, comm, **case.options(), **options)
    torch.autograd.backward(outs, [shard(case.d_out, cp, r, case.fmt, pad) for r in range(cp)])
    return [unshard([o.detach() for o in outs], case.fmt, pad)] + [unshard([p.grad for p in ps], case.fmt, pad)
                                                                    for ps in parts]  # fmt: skip


def _sink_run(label: str, case, cp: int, comm: str, softmax_type: str, window, **options) -> None:
    """``comm`` over ``cp`` ranks with an attention sink (a fresh learnable logit per head, or
    off_by_one) and ``window``, checked by :func:`check_sinks` against the reference and one GPU."""
    h = case.q.shape[-2]
    gen = torch.Generator(device="cuda").manual_seed(7)  # not the global generator: the same logits whatever ran before
    shared = (torch.randn(1, h, 1, 1, device="cuda", generator=gen).requires_grad_() if softmax_type == "learnable"
              else None)  # fmt: skip
    extra = dict(softmax_type=softmax_type, softmax_offset=shared)
    if window is not None:
        extra["window_size"] = window
    got = _run(case, cp, comm, **options, **extra)
    grad_cp = None if shared is None else shared.grad.clone()
    print(f"{label}: {error_words(check_sinks(label, case, got, grad_cp, shared, extra))}")



_RING = [(cp, "bshd", "causal", "gqa") for cp in (2, 3, 4, 8)] + [
    (2, "sbhd", "causal", "mha"), (4, "sbhd", "no_mask", "gqa"), (2, "bshd", "no_mask", "mla"),
    (3, "bshd", "causal", "mla"), (8, "sbhd", "causal", "mha"), (4, "bshd", "causal", "mha"),
]  # fmt: skip


@pytest.mark.parametrize("cp,fmt,mask,heads", _RING, ids=[f"cp{c}-{f}-{m}-{h}" for c, f, m, h in _RING])
def test_ring_dense(cp, fmt, mask, heads):
    h, hg, d_qk, d_v = HEADS[heads]
    case = make_case(fmt, mask, cp, 2, 128 * cp, h, hg, d_qk, d_v, seed=cp * 10 + len(heads))
    errors = check(f"p2p cp={cp}", _run(case, cp, "p2p"), single_gpu(case), reference(case), case)
    print(f"p2p cp={cp} {fmt} {mask} {heads}: " + error_words(errors))


_THD = [(cp, mask, heads) for cp in (2, 3, 4, 8) for mask, heads in (("padding_causal", "gqa"), ("padding", "mha"))]


@pytest.mark.parametrize("cp,mask,heads", _THD, ids=[f"cp{c}-{m}-{h}" for c, m, h in _THD])
@pytest.mark.parametrize("comm", ["p2p", "a2a"])
def test_thd(cp, mask, heads, comm):
    h, hg, d_qk, d_v = HEADS[heads]
    if comm == "a2a" and (h % cp or hg % cp):
        pytest.skip(f"a2a needs heads divisible by cp (h={h}, hg={hg}, cp={cp})")
    case = make_case("thd", mask, cp, 6, 160, h, hg, d_qk, d_v, seed=100 + cp)
    errors = check(f"{comm} thd cp={cp}", _run(case, cp, comm), single_gpu(case), reference(case), case)
    print(f"{comm} thd cp={cp} {mask}: " + error_words(errors))


@pytest.mark.parametrize("cp,fmt,mask", [(2, "bshd", "causal"), (4, "sbhd", "causal"), (2, "sbhd", "no_mask")])
def test_a2a_dense(cp, fmt, mask):
    case = make_case(fmt, mask, cp, 2, 256, 8, 4, 64, 64, seed=7)
    check(f"a2a cp={cp}", _run(case, cp, "a2a"), single_gpu(case), reference(case), case)


@pytest.mark.parametrize("fmt,mask,cp", [("bshd", "causal", 2), ("sbhd", "no_mask", 2), ("thd", "padding_causal", 2),
                                         ("bshd", "causal", 1)])  # fmt: skip
def test_a2a_head_groups(fmt, mask, cp):
    """head_groups=2 (the exchange and attention for half the heads at a time) against the fp64
    reference and the single-GPU result, as one group is."""
    case = make_case(fmt, mask, cp, 2 if fmt != "thd" else 6, 256 if fmt != "thd" else 160, 8, 4, 64, 64, seed=17)
    errors = check(f"a2a head_groups=2 cp={cp}", _run(case, cp, "a2a", head_groups=2), single_gpu(case),
                   reference(case), case)  # fmt: skip
    print(f"a2a head_groups=2 {fmt} {mask} cp={cp}: " + error_words(errors))


@pytest.mark.parametrize("fmt,mask,cp,window", [("bshd", "causal", 2, None), ("sbhd", "causal", 4, (100, 0)),
                                                ("bshd", "no_mask", 3, None)])  # fmt: skip
def test_p2p_head_groups(fmt, mask, cp, window):
    """head_groups=2 (the ring once per half of the heads) against the fp64 reference and the
    single-GPU result."""
    case = make_case(fmt, mask, cp, 2, 128 * cp, 8, 4, 64, 64, seed=23)
    extra = {} if window is None else dict(window_size=window)
    ref = reference(case, window_size=window or (-1, -1))
    errors = check(f"p2p head_groups=2 cp={cp}", _run(case, cp, "p2p", head_groups=2, **extra),
                   single_gpu(case, **extra), ref, case)  # fmt: skip
    print(f"p2p head_groups=2 {fmt} {mask} cp={cp} {window}: " + error_words(errors))


@pytest.mark.parametrize("feature", ["bias", "window", "learnable_sink"])
def test_a2a_features_match_single_gpu(feature):
    """a2a runs te_cudnn's own attention on whole sequences: the same kernels as one GPU."""
    cp, s, h = 2, 256, 8
    case = make_case("bshd", "causal", cp, 2, s, h, h, 64, 64, seed=11)
    shared = None
    if feature == "bias":
        shared = torch.randn(1, h, s, s, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        extra = dict(attn_bias=shared, attn_bias_type="post_scale_bias")
    elif feature == "window":
        extra = dict(window_size=(64, 0))
    else:
        shared = torch.randn(1, h, 1, 1, device="cuda", requires_grad=True)
        extra = dict(softmax_type="learnable", softmax_offset=shared)
    got = _run(case, cp, "a2a", **extra)
    grad_cp = None if shared is None else shared.grad.clone()
    if shared is not None:
        shared.grad = None
    one = single_gpu(case, **extra)
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, one):
        torch.testing.assert_close(x, y, atol=2e-2, rtol=2e-2, msg=lambda m: f"{feature} {name}: {m}")
    if shared is not None:
        torch.testing.assert_close(grad_cp, shared.grad, atol=5e-2, rtol=2e-2)


_RING_WINDOWS = [(2, "bshd", "causal", "gqa", (64, 0)), (4, "sbhd", "causal", "mha", (100, 0)),
                 (2, "bshd", "no_mask", "gqa", (64, 64)), (4, "sbhd", "no_mask", "mha", (-1, 32)),
                 (3, "bshd", "causal", "mla", (200, 0)), (8, "bshd", "causal", "gqa", (48, 0)),
                 (4, "bshd", "no_mask", "gqa", (17, 90))]  # fmt: skip


@pytest.mark.parametrize("cp,fmt,mask,heads,window", _RING_WINDOWS,
                         ids=[f"cp{c}-{f}-{m}-{h}-{w}" for c, f, m, h, w in _RING_WINDOWS])  # fmt: skip
def test_ring_windows(cp, fmt, mask, heads, window):
    """p2p with a sliding window: each step attends only the chunk pairs the window reaches
    (square rectangles, top-left windows shifted to them); against the fp64 reference and the
    single-GPU result."""
    h, hg, d_qk, d_v = HEADS[heads]
    case = make_case(fmt, mask, cp, 2, 128 * cp, h, hg, d_qk, d_v, seed=cp * 10 + len(heads) + 3)
    extra = dict(window_size=window)
    errors = check(f"p2p cp={cp} window={window}", _run(case, cp, "p2p", **extra), single_gpu(case, **extra),
                   reference(case, window_size=window), case)  # fmt: skip
    print(f"p2p cp={cp} {fmt} {mask} {heads} {window}: "
          + error_words(errors))  # fmt: skip


@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
@pytest.mark.parametrize("cp,fmt,mask,window", [(2, "bshd", "causal", None), (4, "sbhd", "causal", (64, 0)),
                                                (2, "bshd", "no_mask", None), (3, "bshd", "no_mask", (40, 40))])  # fmt: skip
def test_ring_sinks_match_single_gpu(softmax_type, cp, fmt, mask, window):
    """p2p with an attention sink (vanilla kernels, the sink folded in after the ring): output
    and gradients, and the learnable sink's gradient summed over the ranks, equal te_cudnn's
    single-GPU sink attention."""
    case = make_case(fmt, mask, cp, 2, 128 * cp, 8, 2, 64, 64, seed=31 + cp)
    _sink_run(f"p2p cp={cp} {fmt} {mask} {softmax_type} {window}", case, cp, "p2p", softmax_type, window)


def test_ring_dropout_backward_replays_forward_masks():
    """out is linear in v for a fixed dropout mask, so sum(out * d_out) == sum(v * dv) holds
    exactly when every backward step replays its forward step's mask (and fails otherwise)."""
    cp = 4
    case = make_case("bshd", "causal", cp, 2, 512, 8, 2, 64, 64, seed=5)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    out, dq, dk, dv = _run(case, cp, "p2p", dropout=0.2, rng_gen=gen)
    lhs = (out.double() * case.d_out.double()).sum()
    rhs = (case.v.double() * dv.double()).sum()
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all()
    assert abs(lhs - rhs) <= 2e-2 * (out.double() * case.d_out.double()).abs().sum(), (lhs.item(), rhs.item())
    gen.manual_seed(1234)
    again = _run(case, cp, "p2p", dropout=0.2, rng_gen=gen)
    assert all(torch.equal(a, b) for a, b in zip(again, (out, dq, dk, dv))), "same generator state, same result"
    gen.manual_seed(99)
    other = _run(case, cp, "p2p", dropout=0.2, rng_gen=gen)
    assert not torch.equal(other[0], out), "a new generator state draws new masks"


@pytest.mark.parametrize("comm", ["p2p", "a2a", "all_gather"])
def test_deterministic_mode_repeats_bitwise(comm):
    case = make_case("sbhd", "causal", 2, 2, 512, 8, 2, 64, 64, seed=3)
    first = _run(case, 2, comm, deterministic=True)
    second = _run(case, 2, comm, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


_AG = [(cp, "bshd", "causal", "gqa", None) for cp in (2, 3, 4, 8)] + [
    (2, "sbhd", "causal", "mha", None), (4, "sbhd", "no_mask", "gqa", None), (2, "bshd", "no_mask", "mla", None),
    (3, "bshd", "causal", "mla", None), (2, "bshd", "causal", "gqa", (64, 0)), (4, "sbhd", "causal", "mha", (100, 0)),
    (2, "bshd", "no_mask", "gqa", (64, 64)), (4, "sbhd", "no_mask", "mha", (-1, 32)),
    (8, "bshd", "causal", "gqa", (48, 0)),
]  # fmt: skip


@pytest.mark.parametrize("cp,fmt,mask,heads,window", _AG, ids=[f"cp{c}-{f}-{m}-{h}-{w}" for c, f, m, h, w in _AG])
def test_all_gather_dense(cp, fmt, mask, heads, window):
    """all_gather: each query chunk against the gathered keys it reaches (bottom-right, shifted
    window), dK/dV reduce-scattered; against the fp64 reference and the single-GPU result."""
    h, hg, d_qk, d_v = HEADS[heads]
    case = make_case(fmt, mask, cp, 2, 128 * cp, h, hg, d_qk, d_v, seed=cp * 10 + len(heads) + 1)
    extra = {} if window is None else dict(window_size=window)
    ref = reference(case, window_size=window or (-1, -1))
    errors = check(f"all_gather cp={cp}", _run(case, cp, "all_gather", **extra), single_gpu(case, **extra), ref, case)
    print(f"all_gather cp={cp} {fmt} {mask} {heads} {window}: "
          + error_words(errors))  # fmt: skip


@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
@pytest.mark.parametrize("cp,mask,window", [(2, "causal", None), (4, "causal", (64, 0)), (2, "no_mask", None)])
def test_all_gather_sinks_match_single_gpu(softmax_type, cp, mask, window):
    """The sink enters each row once (one call per query chunk); the learnable sink's gradient
    is summed over the chunks and ranks."""
    case = make_case("bshd", mask, cp, 2, 128 * cp, 8, 2, 64, 64, seed=21 + cp)
    _sink_run(f"all_gather cp={cp} {mask} {softmax_type} {window}", case, cp, "all_gather", softmax_type, window)


def test_all_gather_dropout_backward_replays_forward_masks():
    """no_mask (one call per rank): sum(out * d_out) == sum(v * dv) holds exactly when the
    backward replays the forward's dropout mask."""
    cp = 4
    case = make_case("bshd", "no_mask", cp, 2, 512, 8, 2, 64, 64, seed=6)
    gen = torch.Generator(device="cuda").manual_seed(4321)
    out, dq, dk, dv = _run(case, cp, "all_gather", dropout=0.2, rng_gen=gen)
    lhs = (out.double() * case.d_out.double()).sum()
    rhs = (case.v.double() * dv.double()).sum()
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all()
    assert abs(lhs - rhs) <= 2e-2 * (out.double() * case.d_out.double()).abs().sum(), (lhs.item(), rhs.item())


@pytest.mark.fp8
def test_a2a_fp8_follows_bf16():
    """FP8 under a2a (each rank's head group through te_cudnn's FP8 attention): cosine similarity
    with the bf16 single-GPU result above 0.99 for the output and every gradient."""
    import te_cudnn

    case = make_case("bshd", "causal", 2, 2, 512, 8, 8, 128, 128, seed=13)
    one = single_gpu(case)
    meta = te_cudnn.Fp8AttentionMeta(device="cuda")
    for _ in range(2):  # delayed scaling: the second call uses amaxes the first one recorded
        got = _run(case, 2, "a2a", fp8_meta=meta)
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, one):
        cos = torch.nn.functional.cosine_similarity(x.double().flatten(), y.double().flatten(), dim=0).item()
        assert torch.isfinite(x).all() and cos > 0.99, f"{name}: cosine {cos:.4f}"


_GRID = [((2, 2), "bshd", "causal", "gqa"), ((2, 2), "sbhd", "no_mask", "mha"), ((2, 1), "bshd", "causal", "mla"),
         ((1, 2), "sbhd", "causal", "gqa"), ((2, 4), "bshd", "causal", "gqa"), ((4, 2), "sbhd", "causal", "mha")]  # fmt: skip


@pytest.mark.parametrize("layout,fmt,mask,heads", _GRID, ids=[f"{a}x{p}-{f}-{m}-{h}" for (a, p), f, m, h in _GRID])
def test_a2a_p2p_dense(layout, fmt, mask, heads):
    """Hierarchical a2a+p2p on simulated (a2a, p2p) grids: the all-to-all inside each a2a group,
    the real ring kernels across it; against the fp64 reference and the single-GPU result."""
    cp = layout[0] * layout[1]
    h, hg, d_qk, d_v = HEADS[heads]
    case = make_case(fmt, mask, cp, 2, 128 * cp, h, hg, d_qk, d_v, seed=300 + cp + layout[0])
    errors = check(f"a2a+p2p {layout}", _run(case, cp, "a2a+p2p", cp_layout=layout), single_gpu(case), reference(case),
                   case)  # fmt: skip
    print(f"a2a+p2p {layout} {fmt} {mask} {heads}: "
          + error_words(errors))  # fmt: skip


@pytest.mark.parametrize("layout,mask", [((2, 2), "padding_causal"), ((2, 2), "padding"), ((2, 3), "padding_causal")])
def test_a2a_p2p_thd(layout, mask):
    """THD through both levels: the a2a reorders with the group's padded offsets (cu_seqlens_padded
    // P), the ring's THD sections over the p2p group (its first check on real kernels; the CPU
    tests check the layout the a2a hands the ring)."""
    cp = layout[0] * layout[1]
    case = make_case("thd", mask, cp, 6, 160, 8, 2, 128, 128, seed=400 + cp)
    errors = check(f"a2a+p2p thd {layout}", _run(case, cp, "a2a+p2p", cp_layout=layout), single_gpu(case),
                   reference(case), case)  # fmt: skip
    print(f"a2a+p2p thd {layout} {mask}: " + error_words(errors))


@pytest.mark.parametrize("softmax_type,window", [("learnable", None), ("off_by_one", (64, 0)), ("learnable", (64, 0))])
def test_a2a_p2p_window_and_sinks_match_single_gpu(softmax_type, window):
    """a2a+p2p (2 x 2) with the ring's windows and sinks: each ring folds in its heads' sink
    logits; the learnable sink's gradient summed over the grid equals the single-GPU one."""
    case = make_case("bshd", "causal", 4, 2, 128 * 4, 8, 2, 64, 64, seed=51)
    _sink_run(f"a2a+p2p 2x2 {softmax_type} {window}", case, 4, "a2a+p2p", softmax_type, window, cp_layout=(2, 2))
