"""Random-configuration GPU acceptance test.

A seeded generator (tests/_random_cases.py) draws configurations from the sub-backends'
declared capabilities: dense layouts (packed, cross, GQA, head dims 16..256, d_qk != d_v, alibi,
sliding windows),
post-scale biases of every shape, mostly with a last dim that is not a multiple of 8 (rows te_cudnn
copies into an aligned buffer; dBias must come back in the caller's strides), padding masks
with empty sequences inside the batch, THD and mixed THD layouts with and without gaps between
sequences, paged KV caches, FP8 (Hopper or newer), max512, zero-size calls (b = 0, s = 0, an
all-empty THD batch, max_seqlen 0) and configurations no sub-backend serves. Each must either

* be declined with ``UnsupportedConfigError`` before any GPU work (no plan looked up or built,
  no result allocated), counted as declined with its first reason, or
* run, forward and (when training) backward, and match te_cudnn's fp32 reference within
  ``te_cudnn.testing``'s tolerances (FP8: the RMSE bounds of tests/test_fp8_gpu.py), with
  positions past each sequence's end exactly zero; zero-size calls give correctly shaped
  results, zeros where a row has no keys, and zero gradients.

The seed comes from ``TE_CUDNN_TEST_SEED`` (else a random one); it is printed and is in every
failure message. Replay a failure with ``TE_CUDNN_TEST_SEED=<seed> pytest tests/test_random_gpu.py``;
``TE_CUDNN_TEST_CASES=3,17`` runs only those configurations of the seed's list. (FP8 cases are
drawn only on GPUs that run FP8 attention, so replay on the same kind of GPU.) The summary line
``random GPU acceptance: seed=S configs=N ok=A declined=D`` is printed with ``-s``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Callable, Optional

import pytest
import torch

import te_cudnn as tc
from te_cudnn.enums import META_DO, META_DQKV, META_O, META_QKV, META_S, QKVFormat, QKVLayoutGroup
from te_cudnn.fp8 import Fp8AttentionMeta
from te_cudnn.layouts import layout_info, packed_qkv_views
from te_cudnn.reference import attention_reference, attention_reference_fp8
from te_cudnn.testing import TOLERANCES, check_close, to_bhsd

from _random_cases import E4M3, GENERATORS, MAX512, SEED_ENV, Case, make_cases
from _random_cases import fp8_available as _fp8_available
from _random_cases import seed_from_env as _seed
from test_fp8_gpu import rmse_range  # the FP8 tests' metric: RMSE over the reference's range

pytestmark = pytest.mark.gpu

CASES_ENV = "TE_CUDNN_TEST_CASES"
N_CONFIGS = 104  # at least 100 configurations a run; ~55-95 s on an H100 (more on a cold machine)
RMSE_VS_EMULATION, RMSE_VS_FP32, RMSE_GRAD_VS_FP32 = 0.01, 0.05, 0.10  # as tests/test_fp8_gpu.py


# ------------------------------------------------------------------ tensors
def _cu(lengths) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


class Side:
    """The q side or the kv side of a call: format, per-sequence lengths, where sequences start."""

    def __init__(self, fmt: QKVFormat, b: int, s_max: int, lengths: Optional[list[int]], gaps: Optional[list[int]] = None):
        self.fmt, self.b, self.s_max = fmt, b, s_max
        self.lengths = list(lengths) if lengths is not None else [s_max] * b
        self.cu = _cu(self.lengths)
        self.cu_padded = _cu([n + g for n, g in zip(self.lengths, gaps)]) if gaps else None
        self.starts, pos = [], 0
        for n, g in zip(self.lengths, gaps or [0] * b):
            self.starts.append(pos)
            pos += n + g
        self.tokens = pos + (2 if gaps else 0)  # spare capacity past the last sequence

    def lead(self) -> tuple[int, ...]:
        if self.fmt == QKVFormat.thd:
            return (self.tokens,)
        return (self.b, self.s_max) if self.fmt == QKVFormat.bshd else (self.s_max, self.b)

    def to_dense(self, t: torch.Tensor) -> torch.Tensor:
        """[b, h, s_max, d] float32, zero past each sequence's end."""
        if self.fmt == QKVFormat.thd:
            dense = torch.zeros(self.b, t.shape[1], self.s_max, t.shape[2], device=t.device)
            for i, (start, n) in enumerate(zip(self.starts, self.lengths)):
                dense[i, :, :n] = t[start:start + n].float().transpose(0, 1)
            return dense
        dense = (t.float().permute(0, 2, 1, 3) if self.fmt == QKVFormat.bshd else t.float().permute(1, 2, 0, 3)).clone()
        for i, n in enumerate(self.lengths):
            dense[i, :, n:] = 0
        return dense

    def padding_values(self, t: torch.Tensor) -> torch.Tensor:
        """The values of ``t`` at positions no sequence owns (they must be exactly zero)."""
        if self.fmt == QKVFormat.thd:
            owned = torch.zeros(t.shape[0], dtype=torch.bool, device=t.device)
            for start, n in zip(self.starts, self.lengths):
                owned[start:start + n] = True
            return t[~owned]
        dense = t.permute(0, 2, 1, 3) if self.fmt == QKVFormat.bshd else t.permute(1, 2, 0, 3)
        return torch.cat([dense[i, :, n:].reshape(-1) for i, n in enumerate(self.lengths)] + [t.new_zeros(0)])

    def stats_to_dense(self, stats: torch.Tensor) -> torch.Tensor:
        """Softmax stats as [b, h, s_max] (THD stats are token-major [t, h, 1])."""
        if self.fmt != QKVFormat.thd:
            return stats[..., 0]
        dense = torch.full((self.b, stats.shape[1], self.s_max), float("nan"), device=stats.device)
        for i, (start, n) in enumerate(zip(self.starts, self.lengths)):
            dense[i, :, :n] = stats[start:start + n, :, 0].T
        return dense

    def rows(self) -> torch.Tensor:
        """[b, 1, s_max] True at each sequence's valid positions."""
        i = torch.arange(self.s_max, device="cuda").view(1, 1, -1)
        return i < torch.tensor(self.lengths, device="cuda").view(-1, 1, 1)


def _sides(case: Case) -> tuple[Side, Side]:
    info = layout_info(case.layout)
    padded = case.lengths_q is not None
    q = Side(info.q_format, case.b, case.sq, case.lengths_q if padded else None,
             case.gaps if info.q_format == QKVFormat.thd else None)  # fmt: skip
    if info.packs_qkv:
        return q, q
    kv = Side(info.kv_format, case.b, case.skv, case.lengths_kv if padded else None,
              case.gaps if info.kv_format == QKVFormat.thd else None)  # fmt: skip
    return q, kv


def _qkv(case: Case, qs: Side, kvs: Side, rand) -> tuple[list[torch.Tensor], Callable]:
    """The buffers of q, k, v as the layout packs them, and the function that views q, k, v in them."""
    g = layout_info(case.layout).group
    if g == QKVLayoutGroup.L_3HD:
        return [rand(*qs.lead(), 3, case.h, case.d_qk)], lambda bufs: packed_qkv_views(bufs[0], g)
    if g == QKVLayoutGroup.L_H3D:
        return [rand(*qs.lead(), case.h, 3, case.d_qk)], lambda bufs: packed_qkv_views(bufs[0], g)
    q = rand(*qs.lead(), case.h, case.d_qk)
    if g == QKVLayoutGroup.L_HD_2HD:
        return [q, rand(*kvs.lead(), 2, case.hg, case.d_qk)], lambda bufs: (bufs[0], *packed_qkv_views(bufs[1], g))
    if g == QKVLayoutGroup.L_HD_H2D:
        return [q, rand(*kvs.lead(), case.hg, 2, case.d_qk)], lambda bufs: (bufs[0], *packed_qkv_views(bufs[1], g))
    return [q, rand(*kvs.lead(), case.hg, case.d_qk), rand(*kvs.lead(), case.hg, case.d_v)], lambda bufs: tuple(bufs)


# ------------------------------------------------------------------ running one configuration
class Declined(Exception):
    """The configuration was declined before any GPU work; ``str()`` is its first reason."""


def _allocations() -> int:
    """How many GPU allocations the caching allocator has served so far (a count that only grows:
    frees during the call, e.g. a garbage collection, do not hide an allocation)."""
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0)


def _forward(case: Case, call: Callable):
    """``call()`` (the forward), turning a clean decline into :class:`Declined`; a decline that
    comes after a plan lookup or an allocation fails the configuration."""
    before, allocations = tc.plan_cache.stats(), _allocations()
    try:
        return call()
    except tc.UnsupportedConfigError as exc:
        after = tc.plan_cache.stats()
        counts = lambda s: (s.builds, s.loads, s.misses, s.hits, s.build_failures)  # noqa: E731
        assert counts(after) == counts(before), f"declined after plan work: {before} -> {after}"
        assert _allocations() == allocations, "declined after allocating GPU memory"
        first = next((f"{getattr(b, 'name', b)}: {why[0]}" for b, why in exc.reasons.items() if why), str(exc))
        raise Declined(first) from None


def _lens(lengths_q: list[int], lengths_kv: list[int]) -> dict[str, torch.Tensor]:
    """The reference's per-sequence lengths (padding masks)."""
    return dict(seqlens_q=torch.tensor(lengths_q, device="cuda"), seqlens_kv=torch.tensor(lengths_kv, device="cuda"))


def _compare(name: str, actual: torch.Tensor, ref32: torch.Tensor, reflp: torch.Tensor, dtype: torch.dtype,
             scale: float = 0.0) -> None:  # fmt: skip
    """check_close, or, where the reference is exactly zero (a relative error is undefined), an
    absolute bound: the tolerance floor times ``scale``, the norm of a sibling result of the
    same call (e.g. dQ is 0 when every row has one key; cuDNN leaves rounding residue there)."""
    if ref32.numel() == 0 or not bool(ref32.abs().amax() > 0):
        norm = float(actual.double().norm()) if actual.numel() else 0.0
        bound = TOLERANCES[dtype].floor * scale
        assert norm <= bound, f"{name}: the reference is exactly zero, the result has norm {norm:.3e} > {bound:.3e}"
        return
    check_close(name, actual, ref32, reflp, dtype)


def _grads(out: torch.Tensor, leaves: list, grad_out: torch.Tensor) -> list:
    got = torch.autograd.grad(out, leaves, grad_out, allow_unused=True)
    return [torch.zeros_like(l) if g is None else g for g, l in zip(got, leaves)]


def run_f16(case: Case) -> None:
    """Dense, varlen, THD, max512, zero-size and most unsupported configurations."""
    info = layout_info(case.layout)
    gen = torch.Generator(device="cuda").manual_seed(case.seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(case.dtype)

    qs, kvs = _sides(case)
    bufs, split = _qkv(case, qs, kvs, rand)
    q, k, v = split(bufs)
    bias = rand(*case.bias_shape) if case.bias_shape is not None else None
    kw = dict(qkv_layout=case.layout.name, attn_mask_type=case.mask, attn_bias_type=case.bias_type,
              window_size=case.window, cu_seqlens_q_padded=qs.cu_padded, cu_seqlens_kv_padded=kvs.cu_padded)  # fmt: skip
    out, aux = _forward(case, lambda: tc.fused_attn_fwd(case.training, case.sq, case.skv, qs.cu, kvs.cu, q, k, v,
                                                        case.dtype, case.backend, attn_bias=bias, **kw))  # fmt: skip
    assert out.shape == (*q.shape[:-1], case.d_v) and out.dtype == case.dtype, f"O is {out.dtype} {list(out.shape)}"
    if case.backend == MAX512:
        stats_shape = (case.b, case.h, case.sq, case.skv)
    else:
        stats_shape = (q.shape[0], case.h, 1) if info.q_format == QKVFormat.thd else (case.b, case.h, case.sq, 1)
    assert tuple(aux[0].shape) == stats_shape, f"aux[0] has shape {list(aux[0].shape)}, expected {list(stats_shape)}"
    grads = None
    if case.training:
        d_o = rand(*out.shape)
        grads = tc.fused_attn_bwd(case.sq, case.skv, qs.cu, kvs.cu, q, k, v, out, d_o, case.dtype, aux, case.backend, **kw)
        for name, g, t in zip(("dQ", "dK", "dV"), grads, (q, k, v)):
            assert g.shape == t.shape and g.dtype == t.dtype, f"{name} is {g.dtype} {list(g.shape)}, not {list(t.shape)}"
    if case.family == "empty" or out.numel() == 0:
        assert bool((out == 0).all()), "a call with nothing to attend must give zeros"
        if grads is not None:
            assert all(bool((g == 0).all()) for g in grads[:3]), "a call with nothing to attend has zero gradients"
        return

    for name, t, side in (("O", out, qs), ("dQ", grads and grads[0], qs), ("dK", grads and grads[1], kvs),
                          ("dV", grads and grads[2], kvs)):  # fmt: skip
        if t is not None:
            pad = side.padding_values(t)
            assert bool(torch.isfinite(t).all()), f"{name} has non-finite values"
            assert bool((pad == 0).all()), f"{name} is not zero past each sequence's end"
    padding = "padding" in case.mask
    lens = _lens(qs.lengths, kvs.lengths) if padding else {}
    dense = [qs.to_dense(q), kvs.to_dense(k), kvs.to_dense(v)]
    results = {}
    for compute in (torch.float32, case.dtype):
        leaves = [t.to(compute).requires_grad_() for t in dense + ([bias] if bias is not None else [])]
        ref = attention_reference(*leaves[:3], attn_bias=leaves[3] if bias is not None else None, attn_mask_type=case.mask,
                                  attn_bias_type=case.bias_type, window_size=case.window, compute_dtype=compute, **lens)  # fmt: skip
        results[compute] = (ref, _grads(ref.out, leaves, qs.to_dense(d_o).to(compute)) if case.training else None)
    (r32, g32), (rlp, glp) = results[torch.float32], results[case.dtype]
    _compare("O", qs.to_dense(out), r32.out, rlp.out, case.dtype)
    if case.backend != MAX512:  # max512's aux[0] is the softmax S in cuDNN's tile order
        got, want = qs.stats_to_dense(aux[0]), r32.lse[..., 0]
        valid = torch.isfinite(want) & qs.rows()
        torch.testing.assert_close(got[valid], want[valid], rtol=2e-4, atol=2e-4, msg=lambda m: f"softmax stats: {m}")
    if not case.training:
        return
    scale = max(float(g.double().norm()) for g in g32[:3])
    for name, got, side, i in (("dQ", grads[0], qs, 0), ("dK", grads[1], kvs, 1), ("dV", grads[2], kvs, 2)):
        _compare(name, side.to_dense(got), g32[i], glp[i], case.dtype, scale)
    dbias = grads[3]
    if bias is not None and case.bias_shape[:3] != (1, 1, 1):
        assert dbias is not None, "a post_scale_bias that does not broadcast over b, h and sq has a dBias"
        assert dbias.shape == bias.shape and dbias.stride() == bias.stride(), (
            f"dBias has shape {list(dbias.shape)} stride {dbias.stride()}, the bias {list(bias.shape)} {bias.stride()}"
        )
        _compare("dBias", dbias, g32[3], glp[3], case.dtype, scale)  # skv = 1: dBias is 0 up to rounding
    else:
        assert dbias is None, "dBias only for a post_scale_bias that does not broadcast over b, h and sq"


def run_paged(case: Case) -> None:
    info = layout_info(case.layout)
    gen = torch.Generator(device="cuda").manual_seed(case.seed)
    cpu_gen = torch.Generator().manual_seed(case.seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(case.dtype)

    b, hg, d, page, pages = case.b, case.hg, case.d_qk, case.page, case.pages
    num_pages = b * pages + 3  # a few pages no sequence uses
    pool_shape = (num_pages, page, hg, d) if info.kv_format == QKVFormat.bshd else (page, num_pages, hg, d)
    k_pool, v_pool = rand(*pool_shape), rand(*pool_shape)
    tables = [torch.randperm(num_pages, generator=cpu_gen)[: b * pages].view(b, pages).to(torch.int32).cuda()
              for _ in range(2)]  # fmt: skip
    qs = Side(info.q_format, b, case.sq, case.lengths_q)
    q = rand(*qs.lead(), case.h, d)
    cu_kv = _cu(case.lengths_kv)
    out, _ = _forward(case, lambda: tc.fused_attn_fwd(case.training, case.sq, case.skv, qs.cu, cu_kv, q, k_pool, v_pool,
                                                      case.dtype, None, page_table_k=tables[0], page_table_v=tables[1],
                                                      qkv_layout=case.layout.name, attn_mask_type=case.mask))  # fmt: skip
    assert out.shape == (*q.shape[:-1], d)
    assert bool((qs.padding_values(out) == 0).all()), "O is not zero past each sequence's end"

    def gather(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        by_page = pool if info.kv_format == QKVFormat.bshd else pool.transpose(0, 1)
        return by_page[table.long()].reshape(b, page * pages, hg, d).permute(0, 2, 1, 3)

    lens = _lens(case.lengths_q, case.lengths_kv)
    dense = [qs.to_dense(q), gather(k_pool, tables[0]).float(), gather(v_pool, tables[1]).float()]
    r32 = attention_reference(*dense, attn_mask_type=case.mask, **lens)
    rlp = attention_reference(*(t.to(case.dtype) for t in dense), attn_mask_type=case.mask, compute_dtype=case.dtype,
                              **lens)  # fmt: skip
    _compare("O (paged)", qs.to_dense(out), r32.out, rlp.out, case.dtype)


def run_fp8(case: Case) -> None:
    """FP8 forward against the FP8 emulation and the fp32 reference; backward against fp32."""
    layout = case.layout
    gen = torch.Generator(device="cuda").manual_seed(case.seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)

    qs, kvs = _sides(case)
    bufs, split = _qkv(case, qs, kvs, rand)
    meta = Fp8AttentionMeta(device="cuda")
    for buf in bufs:  # one calibration step so the scales fit the data (delayed scaling)
        meta.quantize(buf, "qkv")
    meta.fwd.amax_history[0, META_S] = 1.0  # softmax values are at most 1
    meta.fwd.amax_history[0, META_O] = split(bufs)[2].abs().max()  # |O| is at most max |v|
    meta.bwd.amax_history[0, :] = 1.0
    meta.update()
    q8, k8, v8 = split([meta.quantize(buf, "qkv") for buf in bufs])
    kw = dict(qkv_layout=layout.name, attn_mask_type=case.mask)
    out8, aux = _forward(case, lambda: tc.fused_attn_fwd(case.training, case.sq, case.skv, qs.cu, kvs.cu, q8, k8, v8, E4M3,
                                                         None, **kw, **meta.fwd_kwargs()))  # fmt: skip
    assert out8.dtype == E4M3 and out8.shape == q8.shape[:-1] + (case.d_v,)
    f = meta.fwd
    lens = _lens(qs.lengths, kvs.lengths) if "padding" in case.mask else {}
    qb, kb, vb = (to_bhsd(t, layout) for t in (q8, k8, v8))
    emu = attention_reference_fp8(qb, kb, vb, descale_qkv=f.scale_inv[META_QKV], scale_s=f.scale[META_S],
                                  descale_s=f.scale_inv[META_S], scale_o=f.scale[META_O], attn_mask_type=case.mask, **lens)  # fmt: skip
    out = to_bhsd(out8, layout).float() * f.scale_inv[META_O]
    err = rmse_range(out, emu.out)
    assert err < RMSE_VS_EMULATION, f"FP8 O vs emulation: RMSE/range {err:.4f} >= {RMSE_VS_EMULATION}"
    leaves = [(t.float() * f.scale_inv[META_QKV]).requires_grad_() for t in (qb, kb, vb)]
    ref = attention_reference(*leaves, attn_mask_type=case.mask, **lens)
    err = rmse_range(out, ref.out)
    assert err < RMSE_VS_FP32, f"FP8 O vs fp32: RMSE/range {err:.4f} >= {RMSE_VS_FP32}"
    if not case.training:
        return
    d_o8 = meta.quantize(torch.randn(out8.shape, generator=gen, device="cuda") * 0.1, "do")
    grads = tc.fused_attn_bwd(case.sq, case.skv, qs.cu, kvs.cu, q8, k8, v8, out8, d_o8, E4M3, aux, None, **kw,
                              **meta.bwd_kwargs())  # fmt: skip
    bw = meta.bwd
    want = torch.autograd.grad(ref.out, leaves, to_bhsd(d_o8, layout).float() * bw.scale_inv[META_DO])
    for name, got, w in zip(("dQ", "dK", "dV"), grads[:3], want):
        err = rmse_range(to_bhsd(got, layout).float() * bw.scale_inv[META_DQKV], w)
        assert err < RMSE_GRAD_VS_FP32, f"FP8 {name} vs fp32: RMSE/range {err:.4f} >= {RMSE_GRAD_VS_FP32}"


def run_case(case: Case) -> None:
    if case.family == "fp8":
        run_fp8(case)
    elif case.page:
        run_paged(case)
    else:
        run_f16(case)


# ------------------------------------------------------------------ the test
def test_random_configurations_match_the_reference_or_are_declined():
    seed = _seed()
    fp8 = _fp8_available()
    cases = make_cases(seed, N_CONFIGS, fp8)
    only = os.environ.get(CASES_ENV)
    if only:
        wanted = {int(i) for i in only.split(",") if i.strip()}
        cases = [c for c in cases if c.index in wanted]
    replay = f"{SEED_ENV}={seed} pytest tests/test_random_gpu.py"
    fp8_note = "FP8 cases drawn" if fp8 else "FP8 cases not drawn (no FP8 GPU)"
    print(f"\nrandom GPU acceptance: seed {seed} (replay: {replay}); {fp8_note}")
    ok, declined, failures = 0, 0, []
    reasons: Counter = Counter()
    families: Counter = Counter()
    seconds: Counter = Counter()
    start = time.perf_counter()
    for case in cases:
        t0 = time.perf_counter()
        try:
            run_case(case)
        except Declined as why:
            declined += 1
            reasons[str(why)] += 1
            families[case.family, "declined"] += 1
            continue
        except Exception as exc:  # every failure is collected and reported with the seed
            failures.append(f"seed={seed} {case.describe()}: {type(exc).__name__}: {exc}")
            families[case.family, "failed"] += 1
            continue
        finally:
            seconds[case.family] += time.perf_counter() - t0
        ok += 1
        families[case.family, "ok"] += 1
    elapsed = time.perf_counter() - start
    print(f"random GPU acceptance: seed={seed} configs={len(cases)} ok={ok} declined={declined}")
    print(f"  failed={len(failures)} in {elapsed:.1f} s; by family: "
          + ", ".join(f"{fam} {what} {n}" for (fam, what), n in sorted(families.items())))  # fmt: skip
    print("  seconds by family: " + ", ".join(f"{fam} {sec:.1f}" for fam, sec in seconds.most_common()))
    for why, n in reasons.most_common(12):
        print(f"  declined x{n}: {why[:160]}")
    assert not failures, (
        f"random GPU acceptance, seed={seed}: {len(failures)} of {len(cases)} configurations failed "
        f"(replay: {replay}):\n" + "\n".join(failures)
    )
    assert ok + declined == len(cases) and (only or len(cases) >= 100)
    assert ok >= len(cases) // 2 or only, (
        f"seed={seed}: only {ok} of {len(cases)} configurations ran; the generator drifted from the declarations"
    )


def test_the_configuration_list_is_a_function_of_the_seed():
    """Replaying a seed replays the configurations (CPU-side; needs the GPU marker only for
    the FP8 decision)."""
    a, b = make_cases(1234, N_CONFIGS, True), make_cases(1234, N_CONFIGS, True)
    assert [c.describe() for c in a] == [c.describe() for c in b] and [c.seed for c in a] == [c.seed for c in b]
    assert {c.family for c in a} == set(GENERATORS)
    assert len(a) == N_CONFIGS >= 100
