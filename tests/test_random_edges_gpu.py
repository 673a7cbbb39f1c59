"""Seeded random GPU test at the runtime edges, with ``te_cudnn.explain`` as the oracle.

Configurations (bf16) over ``bshd_bshd_bshd``, ``sbhd_sbhd_sbhd``, ``thd_thd_thd`` and the paged
KV caches ``paged_kv_bshd_bshd_bshd`` / ``paged_kv_thd_bshd_bshd`` (inference only, pages of 16
to 512 tokens, ``max_seqlen_kv`` up to the page tables' capacity), every mask (THD and paged:
the padding ones), sliding windows, GQA, head dims that are not multiples of 8 (40, 59, 111),
``sq != skv`` including ``sq > skv`` under bottom-right masks, per-sequence lengths of 0, and
training (forward and backward) for about half of the non-paged configurations.

For each configuration ``te_cudnn.explain`` (on the current GPU) is asked first:

* it names a backend: ``fused_attn_fwd`` (and ``fused_attn_bwd`` when training) must run
  with no exception (never a ``GraphBuildError``) and match the fp32 reference within
  ``te_cudnn.testing``'s tolerances; rows past a sequence's end are exactly zero in O, dQ,
  dK and dV; a query row inside a sequence that sees no key is exactly zero in O and has
  ``-inf`` softmax stats; the other rows' stats match the reference's logsumexp;
* it declines: the call must raise ``UnsupportedConfigError`` (nothing else).

``explain`` describes a call from sizes alone and covers the 15 core layouts; where it cannot
describe a paged layout (it raises ``ValueError``), the oracle is the same question asked of
the call's own description (``describe_fwd`` on the tensors, then every sub-backend's declared
reasons under the policy in force), and the summary line counts those configurations.

The seed comes from ``TE_CUDNN_TEST_SEED`` (else a random one); it is printed and is in every
failure message, and every failing configuration is listed. Replay with
``TE_CUDNN_TEST_SEED=<seed> pytest tests/test_random_edges_gpu.py``; ``TE_CUDNN_TEST_CASES=3,17``
runs only those configurations of the seed's list.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
import pytest
import torch

import te_cudnn as tc
from te_cudnn.backends import Direction
from te_cudnn.config import describe_fwd
from te_cudnn.enums import FusedAttnBackend, QKVFormat, QKVLayout
from te_cudnn.layouts import layout_info
from te_cudnn.policy import explain_config
from te_cudnn.reference import attention_reference
from te_cudnn.runtime import current_env

from _random_cases import SEED_ENV, Case, _divisor
from _random_cases import seed_from_env as _seed
from test_random_gpu import CASES_ENV, Side, _compare, _cu, _grads, _lens

pytestmark = pytest.mark.gpu

N_CONFIGS = 40
DTYPE = torch.bfloat16
LAYOUTS = {  # layout -> weight
    "bshd_bshd_bshd": 3, "sbhd_sbhd_sbhd": 2, "thd_thd_thd": 3, "paged_kv_bshd_bshd_bshd": 2,
    "paged_kv_thd_bshd_bshd": 2,
}  # fmt: skip
MASKS = ("no_mask", "causal", "causal_bottom_right", "padding", "padding_causal", "padding_causal_bottom_right")
PADDING_MASKS = MASKS[3:]
HEADS = (1, 2, 3, 4, 6, 8, 12, 16)
DIMS = (40, 59, 64, 96, 111, 128)  # 59 and 111: served by padding the head dim (separate q, k, v only)
SEQ = (1, 2, 17, 64, 100, 128, 255, 256, 384, 512)
PAGE_SIZES = (16, 32, 64, 128, 256, 512)


# ------------------------------------------------------------------ configurations
def _length(rng: random.Random, cap: int) -> int:
    """A per-sequence length in [0, cap], often 0, 1 or cap."""
    return rng.choice((0, 1, cap, rng.randint(0, cap), rng.randint(1, cap)))


def _lengths(rng: random.Random, b: int, cap: int, nonempty: bool = False) -> list[int]:
    out = [_length(rng, cap) for _ in range(b)]
    if nonempty and cap > 0 and not any(out):  # a THD buffer with no token at all is an empty call (tested elsewhere)
        out[rng.randrange(b)] = rng.randint(1, cap)
    return out


def _window(rng: random.Random, mask: str, paged: bool) -> tuple[int, int]:
    if rng.random() >= 0.25:
        return (-1, -1)
    left = rng.choice((0, 3, 16, 64, 200))
    if paged or "causal" in mask or rng.random() < 0.5:
        return (left, 0)
    return (left, rng.choice((8, 50, -1)))


def gen_edge(rng: random.Random, layout_name: str) -> Case:
    layout = QKVLayout[layout_name]
    info = layout_info(layout)
    paged = info.is_paged
    h = rng.choice(HEADS)
    hg = _divisor(rng, h)
    d_qk = rng.choice(DIMS + (64, 128) if paged else DIMS)  # paged caches decline 59 and 111 (no padded form)
    d_v = d_qk if paged or rng.random() < 0.8 else rng.choice(DIMS)
    b = rng.randint(1, 4)
    ragged = info.q_format == QKVFormat.thd or paged
    training = not paged and rng.random() < 0.5
    if paged:
        page = rng.choice(PAGE_SIZES)
        pages = rng.randint(1, min(16, 512 // page))
        cap = page * pages
        skv = cap if rng.random() < 0.7 else rng.randint(1, cap)  # max_seqlen_kv: at most the capacity
        sq = rng.choice((1, 1, 2, 4, 16, 64, 128))
        window = _window(rng, "", paged=True)
        mask = "padding_causal_bottom_right" if window != (-1, -1) and rng.random() < 0.7 else rng.choice(PADDING_MASKS)
        lq = _lengths(rng, b, sq, nonempty=info.q_format == QKVFormat.thd)
        lkv = _lengths(rng, b, skv)
        return Case("paged", layout, mask, DTYPE, b, h, hg, sq, skv, d_qk, d_v, False, window=window,
                    lengths_q=lq, lengths_kv=lkv, page=page, pages=pages)  # fmt: skip
    mask = rng.choice(PADDING_MASKS if ragged else MASKS)
    sq, skv = rng.choice(SEQ), rng.choice(SEQ)
    if "bottom_right" in mask and sq < skv and rng.random() < 0.5:  # more queries than keys: rows that see no key
        sq, skv = skv, sq
    window = _window(rng, mask, paged=False)
    lq = lkv = None
    if ragged:
        lq, lkv = _lengths(rng, b, sq, nonempty=True), _lengths(rng, b, skv, nonempty=True)
        if rng.random() < 0.5:  # max_seqlen exact rather than generous
            sq, skv = max(lq), max(lkv)
    elif "padding" in mask:
        lq, lkv = _lengths(rng, b, sq), _lengths(rng, b, skv)
    family = "thd" if info.q_format == QKVFormat.thd else "dense"
    return Case(family, layout, mask, DTYPE, b, h, hg, sq, skv, d_qk, d_v, training, window=window,
                lengths_q=lq, lengths_kv=lkv)  # fmt: skip


def make_edge_cases(seed: int, n: int) -> list[Case]:
    """``n`` configurations drawn from ``seed``: each layout once first, then by weight."""
    rng = random.Random(seed)
    names, weights = list(LAYOUTS), list(LAYOUTS.values())
    cases = []
    for i in range(n):
        case = gen_edge(rng, names[i] if i < len(names) else rng.choices(names, weights)[0])
        case.index, case.seed = i, rng.randrange(1 << 31)
        cases.append(case)
    return cases


# ------------------------------------------------------------------ the oracle
def _explain(case: Case) -> tuple[FusedAttnBackend, str, bool]:
    """``(backend, what explain says, answered by explain)`` for a non-paged configuration, or
    for a paged one where explain describes it."""
    wl, wr = case.window
    e = tc.explain(case.training, case.dtype, case.dtype, case.layout.name, "no_bias", case.mask, "vanilla", 0.0, case.h,
                   case.hg, case.sq, case.skv, case.d_qk, case.d_v, wl, wr, batch_size=case.b)  # fmt: skip
    declined = "; ".join(f"{name}: {why[0]}" for name, why in e.reasons.items() if why)
    text = f"explain -> {e.backend.name}" + (f" (served {e.served_as})" if e.served_as else "")
    if e.backend == FusedAttnBackend.No_Backend:
        text += f" [{declined}]"
    return e.backend, text, True


def _paged_oracle(case: Case, call_kw: dict) -> tuple[FusedAttnBackend, str, bool]:
    """explain, else (a paged layout explain cannot describe from sizes) the declared reasons
    for the call's own description."""
    try:
        return _explain(case)
    except ValueError as exc:
        if "core layouts" not in str(exc):
            raise
    cfg = describe_fwd(**call_kw)
    per_backend = explain_config(cfg, current_env(), Direction.FWD)
    serving = [b for b, why in per_backend.items() if not why]
    backend = serving[0] if serving else FusedAttnBackend.No_Backend
    declined = "; ".join(f"{b.name}: {why[0]}" for b, why in per_backend.items() if why)
    return backend, f"declared reasons -> {backend.name}" + ("" if serving else f" [{declined}]"), False


class Declined(Exception):
    """Declined with UnsupportedConfigError, as the oracle said."""


def _expect_decline(what: str, call) -> None:
    """The oracle declined: the call must raise UnsupportedConfigError and nothing else."""
    try:
        call()
    except tc.UnsupportedConfigError:
        raise Declined() from None
    except Exception as exc:
        raise AssertionError(f"{what}, but the call raised {type(exc).__name__} instead of UnsupportedConfigError: "
                             f"{exc}") from exc  # fmt: skip
    raise AssertionError(f"{what}, but the call ran")


def _must_run(what: str, call):
    """The oracle named a backend: the call must run (a decline is reported with both sides)."""
    try:
        return call()
    except tc.UnsupportedConfigError as exc:
        raise AssertionError(f"{what}, but the call was declined: {exc}") from exc


# ------------------------------------------------------------------ checks
def _check_forward(case: Case, qs: Side, out: torch.Tensor, stats: torch.Tensor, r32, rlp) -> None:
    """O against the reference, exact zeros past each sequence's end and in rows that see no key,
    softmax stats: -inf where a row inside a sequence sees no key, else the reference's lse."""
    assert bool(torch.isfinite(out).all()), "O has non-finite values"
    assert bool((qs.padding_values(out) == 0).all()), "O is not zero past each sequence's end"
    dense_out = qs.to_dense(out)
    _compare("O", dense_out, r32.out, rlp.out, case.dtype)
    want = r32.lse[..., 0].detach()  # [b, h, sq]
    inside = qs.rows().expand_as(want)
    no_key = inside & torch.isinf(want)
    if bool(no_key.any()):
        rows = dense_out[no_key]
        assert bool((rows == 0).all()), f"O is not zero in the {int(no_key.sum())} query rows that see no key"
    want_shape = (out.shape[0], case.h, 1) if qs.fmt == QKVFormat.thd else (case.b, case.h, qs.s_max, 1)
    assert tuple(stats.shape) == want_shape and stats.dtype == torch.float32, (
        f"softmax stats are {stats.dtype} {list(stats.shape)}, expected float32 {list(want_shape)}"
    )
    got = qs.stats_to_dense(stats)
    if bool(no_key.any()):
        bad = got[no_key]
        assert bool((bad == float("-inf")).all()), (
            f"softmax stats of query rows that see no key must be -inf; {int((bad != float('-inf')).sum())} of "
            f"{bad.numel()} are not (e.g. {bad[bad != float('-inf')][:4].tolist()})"
        )
    valid = inside & torch.isfinite(want)
    torch.testing.assert_close(got[valid], want[valid], rtol=2e-4, atol=2e-4, msg=lambda m: f"softmax stats: {m}")


def run_dense(case: Case, notes: list) -> str:
    """bshd / sbhd / thd: q, k, v separate tensors; forward (and backward when training)."""
    backend, said, _ = _explain(case)
    notes.append(said)
    info = layout_info(case.layout)
    gen = torch.Generator(device="cuda").manual_seed(case.seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(case.dtype)

    padding = "padding" in case.mask
    qs = Side(info.q_format, case.b, case.sq, case.lengths_q if padding else None)
    kvs = Side(info.kv_format, case.b, case.skv, case.lengths_kv if padding else None)
    q = rand(*qs.lead(), case.h, case.d_qk)
    k, v = rand(*kvs.lead(), case.hg, case.d_qk), rand(*kvs.lead(), case.hg, case.d_v)
    kw = dict(qkv_layout=case.layout.name, attn_mask_type=case.mask, window_size=case.window)

    def fwd():
        return tc.fused_attn_fwd(case.training, case.sq, case.skv, qs.cu, kvs.cu, q, k, v, case.dtype, None, **kw)

    if backend == FusedAttnBackend.No_Backend:
        _expect_decline(said, fwd)
    out, aux = _must_run(said, fwd)
    assert out.shape == (*q.shape[:-1], case.d_v) and out.dtype == case.dtype, f"O is {out.dtype} {list(out.shape)}"
    grads = d_o = None
    if case.training:
        d_o = rand(*out.shape)
        grads = _must_run(said + " (backward)", lambda: tc.fused_attn_bwd(
            case.sq, case.skv, qs.cu, kvs.cu, q, k, v, out, d_o, case.dtype, aux, None, **kw))  # fmt: skip
        for name, g, t in zip(("dQ", "dK", "dV"), grads, (q, k, v)):
            assert g.shape == t.shape and g.dtype == t.dtype, f"{name} is {g.dtype} {list(g.shape)}, not {list(t.shape)}"
            assert bool(torch.isfinite(g).all()), f"{name} has non-finite values"
            side = qs if name == "dQ" else kvs
            assert bool((side.padding_values(g) == 0).all()), f"{name} is not zero past each sequence's end"

    lens = _lens(qs.lengths, kvs.lengths) if padding else {}
    dense = [qs.to_dense(q), kvs.to_dense(k), kvs.to_dense(v)]
    results = {}
    for compute in (torch.float32, case.dtype):
        leaves = [t.to(compute).requires_grad_(case.training) for t in dense]
        ref = attention_reference(*leaves, attn_mask_type=case.mask, window_size=case.window, compute_dtype=compute,
                                  **lens)  # fmt: skip
        results[compute] = (ref, _grads(ref.out, leaves, qs.to_dense(d_o).to(compute)) if case.training else None)
    (r32, g32), (rlp, glp) = results[torch.float32], results[case.dtype]
    _check_forward(case, qs, out, aux[0], r32, rlp)
    if case.training:
        scale = max(float(g.double().norm()) for g in g32)
        for name, got, side, i in (("dQ", grads[0], qs, 0), ("dK", grads[1], kvs, 1), ("dV", grads[2], kvs, 2)):
            _compare(name, side.to_dense(got), g32[i], glp[i], case.dtype, scale)
    return "ok"


def run_paged(case: Case, notes: list) -> str:
    """A paged KV cache (pools [num_pages, page, hg, d], shuffled int32 tables), inference."""
    info = layout_info(case.layout)
    gen = torch.Generator(device="cuda").manual_seed(case.seed)
    cpu_gen = torch.Generator().manual_seed(case.seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(case.dtype)

    b, hg, page, pages = case.b, case.hg, case.page, case.pages
    num_pages = b * pages + 3  # a few pages no sequence uses
    k_pool, v_pool = rand(num_pages, page, hg, case.d_qk), rand(num_pages, page, hg, case.d_v)
    tables = [torch.randperm(num_pages, generator=cpu_gen)[: b * pages].view(b, pages).to(torch.int32).cuda()
              for _ in range(2)]  # fmt: skip
    qs = Side(info.q_format, b, case.sq, case.lengths_q)
    q = rand(*qs.lead(), case.h, case.d_qk)
    cu_kv = _cu(case.lengths_kv)
    call_kw = dict(is_training=False, max_seqlen_q=case.sq, max_seqlen_kv=case.skv, cu_seqlens_q=qs.cu,
                   cu_seqlens_kv=cu_kv, q=q, k=k_pool, v=v_pool, qkv_dtype=case.dtype, page_table_k=tables[0],
                   page_table_v=tables[1], attn_bias=None, attn_scale=None, dropout=0.0, qkv_layout=case.layout.name,
                   attn_bias_type="no_bias", attn_mask_type=case.mask, softmax_type="vanilla",
                   window_size=case.window, bottom_right_diagonal=None)  # fmt: skip
    backend, said, by_explain = _paged_oracle(case, call_kw)
    notes.append(said)

    def fwd():
        return tc.fused_attn_fwd(False, case.sq, case.skv, qs.cu, cu_kv, q, k_pool, v_pool, case.dtype, None,
                                 page_table_k=tables[0], page_table_v=tables[1], qkv_layout=case.layout.name,
                                 attn_mask_type=case.mask, window_size=case.window)  # fmt: skip

    if backend == FusedAttnBackend.No_Backend:
        _expect_decline(said, fwd)
    out, aux = _must_run(said, fwd)
    assert out.shape == (*q.shape[:-1], case.d_v) and out.dtype == case.dtype, f"O is {out.dtype} {list(out.shape)}"

    def gather(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:  # [b, hg, capacity, d]
        return pool[table.long()].reshape(b, page * pages, hg, pool.shape[-1]).permute(0, 2, 1, 3)

    lens = _lens(case.lengths_q, case.lengths_kv)
    dense = [qs.to_dense(q), gather(k_pool, tables[0]).float(), gather(v_pool, tables[1]).float()]
    kw = dict(attn_mask_type=case.mask, window_size=case.window, **lens)
    r32 = attention_reference(*dense, **kw)
    rlp = attention_reference(*(t.to(case.dtype) for t in dense), compute_dtype=case.dtype, **kw)
    _check_forward(case, qs, out, aux[0], r32, rlp)
    return "ok" if by_explain else "ok (declared reasons)"


def run_edge(case: Case, notes: list) -> str:
    """Runs one configuration; appends what the oracle said to ``notes``; returns the outcome
    ("declined" comes as :class:`Declined`)."""
    return run_paged(case, notes) if case.page else run_dense(case, notes)


# ------------------------------------------------------------------ the test
def test_edge_configurations_run_or_are_declined_as_explain_says():
    seed = _seed()
    cases = make_edge_cases(seed, N_CONFIGS)
    only = os.environ.get(CASES_ENV)
    if only:
        wanted = {int(i) for i in only.split(",") if i.strip()}
        cases = [c for c in cases if c.index in wanted]
    replay = f"{SEED_ENV}={seed} pytest tests/test_random_edges_gpu.py"
    print(f"\nrandom edge configurations: seed {seed} (replay: {replay})")
    outcomes: Counter = Counter()
    failures: list[str] = []
    start = time.perf_counter()
    for case in cases:
        notes: list[str] = []
        try:
            outcome = run_edge(case, notes)
        except Declined:
            outcome = "declined" if "declared reasons" not in "".join(notes) else "declined (declared reasons)"
        except Exception as exc:  # every failure is collected and reported with its configuration and the seed
            said = f" [{notes[0]}]" if notes and notes[0] not in str(exc) else ""
            failures.append(f"seed={seed} {case.describe()}{said}: {type(exc).__name__}: {exc}")
            outcome = "failed"
        outcomes[case.family, outcome] += 1
    elapsed = time.perf_counter() - start
    print(f"random edge configurations: seed={seed} configs={len(cases)} failed={len(failures)} in {elapsed:.1f} s; "
          + ", ".join(f"{fam} {what} {n}" for (fam, what), n in sorted(outcomes.items())))  # fmt: skip
    assert not failures, (
        f"random edge configurations, seed={seed}: {len(failures)} of {len(cases)} configurations failed "
        f"(replay: {replay}):\n" + "\n".join(failures)
    )


def test_the_edge_configurations_are_a_function_of_the_seed():
    a, b = make_edge_cases(1234, N_CONFIGS), make_edge_cases(1234, N_CONFIGS)
    assert [c.describe() for c in a] == [c.describe() for c in b] and [c.seed for c in a] == [c.seed for c in b]
    assert {c.layout.name for c in a} == set(LAYOUTS)
    for c in a:
        assert c.h <= 16 and c.h % c.hg == 0 and c.b <= 4 and max(c.sq, c.skv) <= 512, c.describe()
        if c.page:
            assert not c.training and "padding" in c.mask and c.skv <= c.page * c.pages, c.describe()
        if c.lengths_q is not None:
            assert max(c.lengths_q) <= c.sq and max(c.lengths_kv) <= c.skv, c.describe()
