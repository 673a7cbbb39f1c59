"""GPU suite for ``te_cudnn.plans.padded_rows``: every engine the autotuner may pick, for a
padding-mask key (bshd) and a THD key, forward and backward, on batches with an empty
sequence, sequences shorter than the maximum on the query and the key side, and (THD) gaps
between sequences and spare tokens after the last.

* Through the public API: each engine (``plan_candidates``: every heuristic mode, every plan
  built, as the tuner enumerates them) is pinned and put into the plan cache in turn;
  ``te_cudnn.fused_attn_fwd`` writes into an ``out=`` prefilled with NaN, ``fused_attn_bwd``
  allocates its gradients from NaN-poisoned memory. Rows past each sequence's end must be
  exactly zero, rows inside finite and within the dtype's tolerance of the heuristic engine's.
* Through the probe: ``rows_verified`` runs each engine on partial lengths into NaN-prefilled
  results, and a record per (GPU architecture, cuDNN version, engine) lands beside the plan
  in a temporary plan store; a later process (memory forgotten) reads the verdicts without
  probing again.
* The autotuner on the same keys never chooses an engine that fails its check; where
  te_cudnn may leave the padded rows to cuDNN, the chosen engine passes the probe.
* Inside a CUDA-graph capture ``rows_verified`` launches nothing and answers False.

Run with ``-s`` to see each engine's verdict.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import torch

import te_cudnn as tc
from te_cudnn.plans import padded_rows as pr
from te_cudnn.backends import BY_ENUM, Direction
from te_cudnn.plans import CompiledPlan, PlanCache
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans import persist as persist_mod
from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.handles import handle_for
from te_cudnn.row_fill import skips_grads_fill, skips_out_fill
from te_cudnn.runtime import current_env
from te_cudnn.testing import TOLERANCES, rel_error

pytestmark = pytest.mark.gpu

DTYPE = torch.bfloat16
H, HG, D = 8, 2, 64
CASES: dict[str, dict[str, Any]] = {
    # (0, 0) empty; (0, 50) keys without queries; shorter on both sides; full; one row
    "padding": dict(layout="bshd_bshd_bshd", mask="padding_causal", sq=128, skv=192,
                    lens_q=[64, 0, 128, 0, 7, 1], lens_kv=[100, 0, 192, 50, 7, 1], gaps=None),
    # self-attention THD with gaps between sequences (cu_seqlens_*_padded) and spare tokens after the last
    "thd": dict(layout="thd_thd_thd", mask="padding_causal", sq=128, skv=128,
                lens_q=[50, 0, 128, 9, 1], lens_kv=[50, 0, 128, 9, 1], gaps=[3, 0, 2, 1, 0]),
}  # fmt: skip
SPARE_TOKENS = 2


def _cu(lengths: list[int], gaps: Optional[list[int]] = None) -> torch.Tensor:
    out = [0]
    for n, gap in zip(lengths, gaps or [0] * len(lengths)):
        out.append(out[-1] + n + gap)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def _poison(*tensors: torch.Tensor) -> None:
    """Leave NaN in the caching allocator's free blocks of these tensors' sizes, so results of
    the same sizes allocated next show a row cuDNN does not write as NaN."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.full_like(t, float("nan")) for t in tensors for _ in range(2)]
    del blocks


class Batch:
    """One case's tensors and cu_seqlens, and which rows of a result lie inside a sequence."""

    def __init__(self, name: str):
        c = CASES[name]
        self.name, self.layout, self.mask, self.sq, self.skv = name, c["layout"], c["mask"], c["sq"], c["skv"]
        self.lens_q, self.lens_kv, gaps = c["lens_q"], c["lens_kv"], c["gaps"]
        self.thd = self.layout.startswith("thd")
        self.seed = zlib.crc32(f"padded-rows-{name}".encode())
        print(f"\n{name}: seed {self.seed}, lengths q {self.lens_q} kv {self.lens_kv}, gaps {gaps}")
        gen = torch.Generator(device="cuda").manual_seed(self.seed)
        b = len(self.lens_q)
        self.cu_q, self.cu_kv = _cu(self.lens_q), _cu(self.lens_kv)
        if self.thd:
            self.cu_q_padded, self.cu_kv_padded = _cu(self.lens_q, gaps), _cu(self.lens_kv, gaps)
            tq = int(self.cu_q_padded[-1]) + SPARE_TOKENS
            tkv = int(self.cu_kv_padded[-1]) + SPARE_TOKENS
            shape_q, shape_kv = (tq,), (tkv,)
        else:
            self.cu_q_padded = self.cu_kv_padded = None
            shape_q, shape_kv = (b, self.sq), (b, self.skv)
        self.q = torch.randn(*shape_q, H, D, generator=gen, device="cuda").to(DTYPE)
        self.k, self.v = (torch.randn(*shape_kv, HG, D, generator=gen, device="cuda").to(DTYPE) for _ in range(2))
        self.d_o = torch.randn(*shape_q, H, D, generator=gen, device="cuda").to(DTYPE)
        self.kw = dict(qkv_layout=self.layout, attn_mask_type=self.mask, cu_seqlens_q_padded=self.cu_q_padded,
                       cu_seqlens_kv_padded=self.cu_kv_padded)  # fmt: skip

    def valid(self, t: torch.Tensor, side: str) -> torch.Tensor:
        """A bool mask over ``t``'s leading dims ([b, s] dense, [tokens] THD): rows inside a sequence."""
        lens = self.lens_q if side == "q" else self.lens_kv
        if self.thd:
            starts = (self.cu_q_padded if side == "q" else self.cu_kv_padded).tolist()
            mask = torch.zeros(t.shape[0], dtype=torch.bool, device=t.device)
            for start, n in zip(starts, lens):
                mask[start : start + n] = True
            return mask
        rows = torch.arange(t.shape[1], device=t.device).view(1, -1)
        return rows < torch.tensor(lens, device=t.device).view(-1, 1)

    def check(self, name: str, t: torch.Tensor, side: str) -> torch.Tensor:
        """Rows past each sequence's end exactly zero, rows inside finite; the rows inside."""
        mask = self.valid(t, side)
        inside, past = t[mask].float(), t[~mask].float()
        assert past.numel() > 0, f"{self.name} {name}: the batch must have rows past a sequence's end"
        bad = int((past != 0).flatten(1).any(-1).sum())
        assert bad == 0, f"{self.name} {name}: {bad} rows past a sequence's end are not exactly zero"
        assert torch.isfinite(inside).all(), f"{self.name} {name}: rows inside a sequence are not finite"
        return inside

    def forward(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        out = torch.full((*self.q.shape[:-1], D), float("nan"), dtype=DTYPE, device="cuda")
        got, aux = tc.fused_attn_fwd(True, self.sq, self.skv, self.cu_q, self.cu_kv, self.q, self.k, self.v, DTYPE,
                                     None, out=out, **self.kw)  # fmt: skip
        assert got is out
        torch.cuda.synchronize()
        return got, aux

    def backward(self, o: torch.Tensor, aux: list[torch.Tensor]) -> list[torch.Tensor]:
        _poison(self.q, self.k, self.v)
        dq, dk, dv, *_ = tc.fused_attn_bwd(self.sq, self.skv, self.cu_q, self.cu_kv, self.q, self.k, self.v, o,
                                           self.d_o, DTYPE, aux, None, **self.kw)  # fmt: skip
        torch.cuda.synchronize()
        return [dq, dk, dv]


@pytest.fixture
def store_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A plan store of the test's own, no autotuning, an empty plan cache, no verdicts."""
    root = tmp_path / "plans"
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(root))
    monkeypatch.delenv("TE_CUDNN_AUTOTUNE", raising=False)
    monkeypatch.setattr(persist_mod, "_stores", {})
    tc.plan_cache.clear()
    pr.forget()
    yield root
    tc.plan_cache.clear()
    pr.forget()


def _only_key(direction: Direction) -> Any:
    keys = [p.key for p in tc.plan_cache.plans() if p.key.direction == direction]
    assert len(keys) == 1, keys
    return keys[0]


def _engines(key: Any) -> Iterator[tuple[Any, CompiledPlan]]:
    """Every engine the tuner may pick for ``key``, each pinned in turn as a plan: the
    candidates ``plan_candidates`` lists that built, within the tuner's workspace limit."""
    device = key.config.device
    planned = tune_mod.plan_candidates(key, lambda: BY_ENUM[key.backend].build(key.config, key.direction,
                                                                               handle_for(device)))  # fmt: skip
    heur = next(c for c in planned.candidates if c.index == planned.heuristic_index)
    limit = max(tune_mod.DEFAULT_MAX_WORKSPACE, heur.workspace or 0)
    g = planned.graph
    print(f"{key}: {len(planned.candidates)} candidates, heuristic [{planned.heuristic_index}] {heur.name}")
    for c in planned.candidates:
        if c.error is not None or (c.workspace or 0) > limit:
            print(f"  [{c.index}] {c.name}: not a candidate ({c.error or 'workspace over the limit'})")
            continue
        g.build_plan_at_index(c.index)  # selects it: the plan made next launches this engine
        yield c, CompiledPlan(key, g, tuple(planned.spec.uids), int(c.workspace or 0), c.name, 0.0)


def _static_skip(key: Any) -> bool:
    backend = BY_ENUM[key.backend]
    return (skips_out_fill if key.direction == Direction.FWD else skips_grads_fill)(key.config, backend)


# ----------------------------------------------------------------------------- the public API, every engine
@pytest.mark.parametrize("case", list(CASES))
def test_every_engine_leaves_zeros_past_each_sequence_forward(store_env, case: str) -> None:
    batch = Batch(case)
    first, _ = batch.forward()
    heuristic = batch.check("O", first, "q")
    key = _only_key(Direction.FWD)
    tol = TOLERANCES[DTYPE].ceiling
    for c, plan in _engines(key):
        tc.plan_cache.put(plan)  # the prepared call looks the key up again at its next launch
        o, _ = batch.forward()
        inside = batch.check(f"[{c.index}] {c.name} O", o, "q")
        err = rel_error(inside, heuristic)
        rec = pr.record_for(plan)
        print(f"  [{c.index}] {c.name}: O exactly zero past each sequence; vs heuristic {err:.2e}; "
              f"fill {'skipped (engine verified)' if rec and rec['ok'] else 'kept'}")
        assert err <= tol, f"[{c.index}] {c.name}: O differs from the heuristic engine's by {err:.3e}"


@pytest.mark.parametrize("case", list(CASES))
def test_every_engine_leaves_zeros_past_each_sequence_backward(store_env, case: str) -> None:
    batch = Batch(case)
    o, aux = batch.forward()
    batch.check("O", o, "q")
    first = batch.backward(o, aux)
    sides = ("q", "kv", "kv")
    names = ("dQ", "dK", "dV")
    heuristic = [batch.check(n, t, s) for n, t, s in zip(names, first, sides)]
    key = _only_key(Direction.BWD)
    tol = TOLERANCES[DTYPE].ceiling
    for c, plan in _engines(key):
        tc.plan_cache.put(plan)
        grads = batch.backward(o, aux)
        errs = []
        for n, t, s, ref in zip(names, grads, sides, heuristic):
            inside = batch.check(f"[{c.index}] {c.name} {n}", t, s)
            errs.append(rel_error(inside, ref) if ref.abs().sum() else float(inside.abs().max()))
        rec = pr.record_for(plan)
        fill = "skipped (engine verified)" if rec and rec["ok"] else "kept"
        print(f"  [{c.index}] {c.name}: dQ, dK, dV exactly zero past each sequence; vs heuristic "
              f"{', '.join(f'{e:.2e}' for e in errs)}; fill {fill}")
        assert max(errs) <= tol, f"[{c.index}] {c.name}: gradients differ from the heuristic engine's ({errs})"


# ----------------------------------------------------------------------------- the probe and its records
@pytest.mark.parametrize("direction", [Direction.FWD, Direction.BWD], ids=["fwd", "bwd"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_engine_is_probed_once_and_recorded_per_arch_cudnn_engine(store_env, monkeypatch: pytest.MonkeyPatch,
                                                                         case: str, direction: Direction) -> None:
    batch = Batch(case)
    o, aux = batch.forward()
    if direction == Direction.BWD:
        batch.backward(o, aux)
    key = _only_key(direction)
    backend = BY_ENUM[key.backend]
    env = current_env(key.config.device)
    verdicts: dict[str, bool] = {}
    plans = []
    for c, plan in _engines(key):
        verdicts[c.name] = pr.rows_verified(plan, key.config, backend, direction)
        rec = pr.record_for(plan)
        assert pr.valid_record(rec, engine=c.name, direction=direction, sm=env.sm, cudnn=env.cudnn_version), rec
        assert rec["ok"] is verdicts[c.name] and rec["gpu"] == env.device_name
        print(f"  [{c.index}] {c.name}: {'verified' if rec['ok'] else 'not verified: ' + str(rec['why'])}")
        plans.append(plan)
    store = cache_mod.store_for(key.config.device)
    assert store is not None and store.root == store_env
    records = store.load_records(key.describe(device=False), pr.KIND)
    assert set(records) == set(verdicts), "one record per engine, beside the plan"
    assert all(records[n]["ok"] is v and records[n]["sm"] == env.sm and records[n]["cudnn"] == env.cudnn_version
               for n, v in verdicts.items())  # fmt: skip
    if batch.thd:  # the tokens between and after the sequences belong to none: te_cudnn fills whatever the verdict
        assert not _static_skip(key)

    # a later process on this machine: the verdicts come from the store, nothing is launched
    pr.forget()

    def no_probe(*args: Any, **kwargs: Any) -> dict:
        raise AssertionError("a recorded engine must not be probed again")

    monkeypatch.setattr(pr, "probe", no_probe)
    for plan in plans:
        assert pr.rows_verified(plan, key.config, backend, direction) is verdicts[plan.plan_name]


# ----------------------------------------------------------------------------- the tuner
@pytest.mark.parametrize("direction", [Direction.FWD, Direction.BWD], ids=["fwd", "bwd"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_tuner_never_chooses_an_engine_that_fails_the_check(store_env, case: str, direction: Direction) -> None:
    batch = Batch(case)
    o, aux = batch.forward()
    if direction == Direction.BWD:
        batch.backward(o, aux)
    key = _only_key(direction)
    cache = PlanCache(builder=cache_mod.build_or_load_plan)
    result = tune_mod.tune_key(key, cache=cache, store=False, warmup=1, reps=3)
    print(tune_mod.format_record(result.to_record(), indent="  "))
    rejected = {t.index for t in result.candidates if t.error is not None and "padded rows" in t.error}
    assert result.chosen.error is None and result.chosen.median_ms is not None
    assert result.chosen.index not in rejected
    if _static_skip(key):  # te_cudnn may leave the rows to the chosen engine: it passes the probe
        tuned = cache.find(key)
        assert tuned is not None and tuned.plan_name == result.chosen.name
        assert pr.rows_verified(tuned, key.config, BY_ENUM[key.backend], direction), pr.record_for(tuned)


# ----------------------------------------------------------------------------- CUDA-graph capture
def test_no_probe_inside_a_capture(store_env, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = Batch("padding")
    batch.forward()
    key = _only_key(Direction.FWD)
    plan = tc.plan_cache.find(key)
    pr.forget()
    monkeypatch.setattr(persist_mod, "_stores", {})  # a store without records (the launch may have made one)
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(store_env.parent / "empty-store"))
    assert pr.record_for(plan) is None  # the device's store is set up here, outside the capture
    calls = []
    real = pr.probe
    monkeypatch.setattr(pr, "probe", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    static = torch.zeros(16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            static.add_(1)
            inside = pr.rows_verified(plan, key.config, BY_ENUM[key.backend], Direction.FWD)
    torch.cuda.current_stream().wait_stream(side)
    graph.replay()
    torch.cuda.synchronize()
    assert inside is False and calls == [] and pr.record_for(plan) is None
    eager = pr.rows_verified(plan, key.config, BY_ENUM[key.backend], Direction.FWD)  # outside: it probes
    assert len(calls) == 1 and pr.record_for(plan)["ok"] is eager
