"""te_cudnn.plans.padded_rows without a GPU: the lengths a check binds, the row-by-row check of
results (real frontend graphs, operands on CPU, an "engine" simulated by writing the outputs),
the record and its round trip through a real plan store, when a probe runs and what
``rows_verified`` answers (a fake probe; a capture answers "fill"), the fill decision of
``te_cudnn.row_fill`` with and without a plan, and the autotuner's check that excludes an
engine leaving padded rows unwritten. The GPU side is tests/test_padded_rows_gpu.py."""

from __future__ import annotations

import json
import math
import os
import stat
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch

from te_cudnn.plans import padded_rows as pr
from te_cudnn.backends import BY_ENUM, Direction, Uid
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.plans import make_key
from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.store import RECORDS_FORMAT, PlanStore
from te_cudnn.plans.tune import (Candidate, TuningError, check_error, choose, make_operands, measure, result_checks,
                                 run_checks)
from te_cudnn.plans.padded_rows import fills_grads, fills_out
from te_cudnn.row_fill import Lengths
from te_cudnn.runtime import RuntimeEnv

from _plan_helpers import FACTS, sizes_config

F16 = FusedAttnBackend.F16_arbitrary_seqlen
F16B = BY_ENUM[F16]
ENV = RuntimeEnv(sm=90, cudnn_version=91900, device_name="NVIDIA H100 80GB HBM3")


def _key(direction: Direction = Direction.FWD, backend: FusedAttnBackend = F16, **over: Any):
    return make_key(backend, direction, sizes_config(**over), 91900, "1.32.0")


PADDING = dict(attn_mask_type="padding_causal", batch_size=6, max_seqlen_q=64, max_seqlen_kv=96)
ONE_QUERY = dict(attn_mask_type="padding", batch_size=5, max_seqlen_q=1, max_seqlen_kv=64)
THD = dict(qkv_layout="thd_thd_thd", attn_mask_type="padding_causal", batch_size=5, max_seqlen_q=40, max_seqlen_kv=40)
THD_PACKED = dict(qkv_layout="thd_t2hd", attn_mask_type="padding", batch_size=3, max_seqlen_q=40, max_seqlen_kv=40)


# ----------------------------------------------------------------------------- the lengths a check binds
@pytest.mark.parametrize("b", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("sq,skv,mask", [(64, 96, "padding_causal"), (16, 64, "padding"), (1, 64, "padding"),
                                         (64, 64, "padding_causal_bottom_right"), (32, 1, "padding")])  # fmt: skip
def test_batches_hold_every_kind_of_sequence(b: int, sq: int, skv: int, mask: str) -> None:
    cfg = sizes_config(attn_mask_type=mask, batch_size=b, max_seqlen_q=sq, max_seqlen_kv=skv)
    batches = pr.probe_batches(cfg, F16B)
    assert len(batches) == (1 if b >= 4 else math.ceil(4 / b))
    pairs = [p for batch in batches for p in zip(batch.lens_q, batch.lens_kv)]
    assert all(len(batch.lens_q) == len(batch.lens_kv) == b for batch in batches)
    assert all(0 <= lq <= sq and 0 <= lkv <= skv for lq, lkv in pairs)
    assert all(lq <= lkv for lq, lkv in pairs), "a sequence with queries has as many keys: every row sees one"
    assert (0, 0) in pairs, "an empty sequence"
    assert any(lq == 0 < lkv for lq, lkv in pairs), "keys without queries"
    assert (min(sq, skv), skv) in pairs, "a full sequence"
    if sq > 1:
        assert any(0 < lq < sq for lq, _ in pairs), "queries shorter than the maximum"
    if skv > 1:
        assert any(0 < lkv < skv for _, lkv in pairs), "keys shorter than the maximum"


def test_batches_bind_the_lengths_calls_bind() -> None:
    every_key = pr.probe_batches(sizes_config(**PADDING), F16B)[0]
    assert every_key.lengths is Lengths.EVERY_KEY
    for lq, lkv, bq, bkv in zip(every_key.lens_q, every_key.lens_kv, every_key.bound_q, every_key.bound_kv):
        assert (bq, bkv) == ((lq, lkv) if lkv else (0, 1))
    one = pr.probe_batches(sizes_config(**ONE_QUERY), F16B)[0]
    assert one.lengths is Lengths.ONE_QUERY and set(one.bound_q) == {1}
    assert list(one.bound_kv) == [lkv if lq == 1 else 0 for lq, lkv in zip(one.lens_q, one.lens_kv)]
    for over in (dict(PADDING, attn_mask_type="padding_causal_bottom_right"), dict(PADDING, window_size=(8, 0))):
        kept = pr.probe_batches(sizes_config(**over), F16B)[0]
        assert kept.lengths is Lengths.AS_GIVEN and (kept.bound_q, kept.bound_kv) == (kept.lens_q, kept.lens_kv)
    dense = pr.probe_batches(sizes_config(attn_mask_type="causal", batch_size=3), F16B)
    assert len(dense) == 1 and dense[0].lens_q == (512,) * 3 and dense[0].lens_kv == (512,) * 3


@pytest.mark.parametrize("over", [THD, THD_PACKED, dict(THD, batch_size=40, max_seqlen_q=200, max_seqlen_kv=200)])
def test_thd_batches_fit_the_token_capacity_with_gaps_and_a_tail(over: dict) -> None:
    cfg = sizes_config(**over)
    for batch in pr.probe_batches(cfg, F16B):
        assert batch.lengths is Lengths.AS_GIVEN
        sides = ((batch.lens_q, batch.cu_q, cfg.max_total_q), (batch.lens_kv, batch.cu_kv, cfg.max_total_kv))
        for lens, cu, capacity in sides:
            assert cu is not None and len(cu) == cfg.b + 1 and cu[0] == 0 and cu[-1] <= capacity
            steps = [cu[i + 1] - cu[i] for i in range(cfg.b)]
            assert all(s - n in (0, 1) for s, n in zip(steps, lens))
            assert any(s > n for s, n in zip(steps, lens)), "a gap between sequences"
            assert cu[-1] < capacity, "spare tokens after the last sequence"


# ----------------------------------------------------------------------------- the row-by-row check
def _graph(key):
    spec = BY_ENUM[key.backend].build(key.config, key.direction, None)  # the real frontend; deviceless
    spec.graph.validate()
    return spec


def _checks(key, **kw) -> tuple[Any, dict, list[pr.ResultCheck]]:
    spec = _graph(key)
    ops = make_operands(spec.graph, spec.uids, key.config, "cpu", seed=4)
    batches = pr.probe_batches(key.config, BY_ENUM[key.backend])
    checks = [pr.ResultCheck(spec.graph, spec.uids, key.config, key.direction, ops, b, "cpu", **kw) for b in batches]
    return spec, ops, checks


def _write(view: torch.Tensor, mask: torch.Tensor, value: float) -> None:
    """``view[mask] = value`` through to the buffer (FP8 through its bytes)."""
    if pr._is_fp8(view):
        raw = view.view(torch.uint8)
        raw[mask] = torch.full(raw[mask].shape, value).to(view.dtype).view(torch.uint8)
    else:
        view[mask] = value


def _engine(padded: float | None = 0.0, valid: float = 0.5) -> Callable[[pr.ResultCheck], None]:
    """A simulated engine: writes ``valid`` into every row inside a sequence of the row-shaped
    outputs, and ``padded`` into the promised results' rows past each sequence's end (None:
    leaves them as they are)."""

    def run(check: pr.ResultCheck) -> None:
        for uid, r in check.rows.items():
            view = r.view(check.ops[uid])
            _write(view, r.valid, valid)
            if padded is not None and uid in check.promised:
                _write(view, ~r.valid, padded)

    return run


CHECK_CASES = {
    "padding_fwd": (Direction.FWD, PADDING),
    "padding_bwd": (Direction.BWD, PADDING),
    "one_query_fwd": (Direction.FWD, ONE_QUERY),
    "thd_fwd": (Direction.FWD, THD),
    "thd_packed_bwd": (Direction.BWD, THD_PACKED),
    "causal_fwd": (Direction.FWD, dict(attn_mask_type="causal", batch_size=2, max_seqlen_q=64, max_seqlen_kv=64)),
}


@pytest.mark.parametrize("case", list(CHECK_CASES))
def test_check_finds_unwritten_nonzero_and_nonfinite_rows(case: str) -> None:
    direction, over = CHECK_CASES[case]
    key = _key(direction, **over)
    spec, ops, checks = _checks(key)
    promised = {Direction.FWD: ["o"], Direction.BWD: ["dq", "dk", "dv"]}[direction]
    for check in checks:
        assert [Uid.NAMES[u] for u in check.promised] == promised
        assert all(check.ops[u] is ops[u] for u in check.outputs), "outputs are shared with the timing operands"
        check.prefill()
        for uid in check.promised:  # NaN everywhere: nothing was written yet
            assert torch.isnan(check.rows[uid].view(check.ops[uid]).float()).all()
        padded = any(bool((~check.rows[u].valid).any()) for u in check.promised)
        assert padded == (case != "causal_fwd")
        assert check.problems() is not None

        _engine()(check)
        assert check.problems() is None, "every valid row finite, every padded row zero"
        snap = check.snapshot()
        for uid in check.outputs:
            r = check.rows.get(uid)
            if r is not None:
                assert snap[uid].shape[0] == int(r.valid.sum()), "compared on the rows inside the sequences"

        if padded:
            check.prefill()
            _engine(padded=None)(check)  # padded rows left as they were: NaN
            why = check.problems()
            assert why is not None and "past a sequence's end are not exactly zero" in why and "nan" in why
            assert all(name in why for name in promised)
            check.prefill()
            _engine(padded=0.25)(check)
            assert "past a sequence's end are not exactly zero (first: " in check.problems()
            assert "0.25" in check.problems()
        check.prefill()
        _engine(valid=float("nan"))(check)
        why = check.problems()
        assert why is not None and "inside a sequence are not finite" in why
        assert "past a sequence's end" not in why


def test_check_binds_the_batch_lengths_and_offsets() -> None:
    key = _key(Direction.FWD, **THD)
    spec, ops, checks = _checks(key)
    cfg = key.config
    for check in checks:
        b = check.batch
        assert check.ops[Uid.SEQ_LEN_Q].flatten().tolist() == list(b.bound_q)
        assert check.ops[Uid.SEQ_LEN_KV].flatten().tolist() == list(b.bound_kv)
        assert check.ops[Uid.RAGGED_Q].flatten().tolist() == [c * cfg.q_stride[2] for c in b.cu_q]
        assert check.ops[Uid.RAGGED_O].flatten().tolist() == [c * cfg.h * cfg.d_v for c in b.cu_q]
        assert check.ops[Uid.RAGGED_K].flatten().tolist() == [c * cfg.k_stride[2] for c in b.cu_kv]
        assert check.ops[Uid.Q] is ops[Uid.Q] and ops[Uid.SEQ_LEN_Q] is not check.ops[Uid.SEQ_LEN_Q]
        valid = check.rows[Uid.O].valid
        owned = torch.zeros(cfg.max_total_q, dtype=torch.bool)
        for start, n in zip(b.cu_q, b.lens_q):
            owned[start : start + n] = True
        assert torch.equal(valid, owned)


def test_fill_padded_prefills_what_te_cudnns_fill_leaves() -> None:
    key = _key(Direction.BWD, **THD_PACKED)
    _, _, checks = _checks(key, fill_padded=True)
    for check in checks:
        check.prefill()
        for uid in check.promised:
            r = check.rows[uid]
            v = r.view(check.ops[uid]).float()
            assert torch.isnan(v[r.valid]).all() and (v[~r.valid] == 0).all()
        _engine(padded=None)(check)  # an engine that never touches padded rows: the fill covers them
        assert check.problems() is None


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="needs torch FP8 dtypes")
def test_fp8_results_are_prefilled_and_checked_through_their_bytes() -> None:
    key = _key(Direction.FWD, FusedAttnBackend.FP8, dtype=torch.float8_e4m3fn, head_dim_qk=128, head_dim_v=128,
               attn_mask_type="padding", batch_size=4, max_seqlen_q=64, max_seqlen_kv=64)  # fmt: skip
    _, _, (check,) = _checks(key)
    check.prefill()
    o = check.rows[Uid.O].view(check.ops[Uid.O])
    assert torch.isnan(o.float()).all()
    _engine()(check)
    assert check.problems() is None
    check.prefill()
    _engine(padded=None)(check)
    assert "past a sequence's end are not exactly zero" in check.problems()
    assert check.snapshot()[Uid.O].dtype == torch.float8_e4m3fn


# ----------------------------------------------------------------------------- the autotuner's check
def _tuner(key, engines: dict[str, Callable]) -> tuple[list, dict[str, Any]]:
    """The tuner's agreement check over simulated engines (the first is the heuristic plan):
    ``(timings, {name: why or None})`` with a fake timer under which the engines that fail
    are the fastest."""
    spec = _graph(key)
    ops = make_operands(spec.graph, spec.uids, key.config, "cpu", seed=4)
    checks = result_checks(key, spec.graph, spec.uids, ops, "cpu")
    outputs = [u for u in spec.uids if u in {t.uid for t in spec.graph.get_outputs()}]
    names = list(engines)
    runs = {}
    for name in names:
        runs[name] = run_checks(checks, lambda check_ops, name=name: _apply(engines[name], checks, check_ops))
    reference = runs[names[0]][0]
    verdicts = {n: check_error(*runs[n], reference, outputs, 1e-2) for n in names}
    candidates = [Candidate(i, n, 0) for i, n in enumerate(names)]

    def run_for(c: Candidate) -> Callable[[], None]:
        if verdicts[c.name] is not None:
            raise TuningError(verdicts[c.name])
        return lambda: None

    fake_ms = {n: (0.5 if verdicts[n] else 1.0 + 0.1 * i) for i, n in enumerate(names)}  # labelled fake timings
    timings = measure(candidates, run_for, lambda run, c, **kw: [fake_ms[c.name]] * 3)
    return timings, verdicts


def _apply(engine: Callable, checks: list, check_ops: dict) -> None:
    check = next(c for c in checks if c.ops is check_ops)
    engine(check)


def test_tuner_rejects_an_engine_that_leaves_padded_rows_unwritten_and_never_chooses_it() -> None:
    key = _key(Direction.FWD, **PADDING)
    timings, verdicts = _tuner(key, {"heuristic": _engine(), "lazy": _engine(padded=None),
                                     "garbage": _engine(padded=0.25), "drift": _engine(valid=0.75),
                                     "other": _engine()})  # fmt: skip
    assert verdicts["heuristic"] is None and verdicts["other"] is None
    assert verdicts["lazy"].startswith("padded rows: o: ") and "not exactly zero" in verdicts["lazy"]
    assert verdicts["garbage"].startswith("padded rows: ")
    assert verdicts["drift"].startswith("numerics: o: relative difference")
    chosen, heuristic, rule = choose(timings, 0)
    assert chosen.name in ("heuristic", "other") and chosen.error is None
    by_name = {t.name: t for t in timings}
    assert by_name["lazy"].error.startswith("TuningError: padded rows: o: ")  # the record says why
    assert by_name["lazy"].median_ms is None


def test_tuner_rejects_a_heuristic_plan_that_leaves_padded_rows_unwritten() -> None:
    key = _key(Direction.BWD, **PADDING)
    timings, verdicts = _tuner(key, {"heuristic": _engine(padded=None), "other": _engine()})
    assert verdicts["heuristic"].startswith("padded rows: dq: ")
    assert verdicts["other"] is None, "valid rows are compared, not the heuristic plan's unwritten ones"
    chosen, heuristic, _ = choose(timings, 0)
    assert chosen.name == "other" and heuristic.error is not None


def test_tuner_check_where_te_cudnn_fills_whatever_the_engine() -> None:
    """THD: te_cudnn zero-fills, so an engine that leaves the rows outside the sequences alone
    passes; one that writes garbage there does not."""
    key = _key(Direction.FWD, **THD)
    _, verdicts = _tuner(key, {"heuristic": _engine(), "untouched": _engine(padded=None),
                               "garbage": _engine(padded=0.25)})  # fmt: skip
    assert verdicts["untouched"] is None and verdicts["garbage"].startswith("padded rows: o: ")


@pytest.mark.parametrize("direction,over,filled", [
    (Direction.FWD, PADDING, False), (Direction.BWD, PADDING, False), (Direction.FWD, ONE_QUERY, False),
    (Direction.BWD, ONE_QUERY, True), (Direction.BWD, dict(PADDING, deterministic=True), True),
    (Direction.FWD, THD, True), (Direction.FWD, dict(PADDING, attn_mask_type="padding_causal_bottom_right"), True),
    (Direction.FWD, dict(attn_mask_type="causal"), False),
])  # fmt: skip
def test_tuner_checks_prefill_as_te_cudnn_fills(direction: Direction, over: dict, filled: bool) -> None:
    key = _key(direction, **over)
    spec = _graph(key)
    ops = make_operands(spec.graph, spec.uids, key.config, "cpu")
    checks = result_checks(key, spec.graph, spec.uids, ops, "cpu")
    assert checks and all(c.fill_padded is filled for c in checks)


# ----------------------------------------------------------------------------- records
def _plan(direction: Direction = Direction.FWD, name: str = "eng4_k3=2", device: int = 0, **over: Any):
    over = {**PADDING, **over}
    return SimpleNamespace(key=_key(direction, **over, device=device), plan_name=name, uids=(), workspace_size=0)


def _batches():
    return pr.probe_batches(sizes_config(**PADDING), F16B)


def test_record_format() -> None:
    rec = pr.make_record("eng4_k3=2", Direction.BWD, ENV, _batches(), None, ["dq", "dk", "dv"])
    assert json.loads(json.dumps(rec)) == rec
    assert rec["version"] == pr.RECORD_VERSION and rec["ok"] is True and rec["why"] is None
    assert (rec["engine"], rec["direction"], rec["sm"], rec["cudnn"], rec["gpu"]) == ("eng4_k3=2", "bwd", 90, 91900,
                                                                                      ENV.device_name)  # fmt: skip
    assert rec["results"] == ["dq", "dk", "dv"] and rec["lengths"][0]["remap"] == "EVERY_KEY"
    assert rec["lengths"][0]["q"] == list(_batches()[0].lens_q)
    bad = pr.make_record("eng4_k3=2", Direction.BWD, ENV, _batches(), "dq: 3 of 9 rows ...")
    assert bad["ok"] is False and bad["why"].startswith("dq")
    assert pr.valid_record(rec, engine="eng4_k3=2", direction=Direction.BWD, sm=90, cudnn=91900)
    for wrong in (dict(engine="eng0"), dict(direction=Direction.FWD), dict(sm=100), dict(cudnn=92000)):
        assert not pr.valid_record(rec, **wrong), wrong
    for broken in (None, [], {}, {**rec, "version": pr.RECORD_VERSION + 1}, {**rec, "ok": "yes"},
                   {k: v for k, v in rec.items() if k != "engine"}):  # fmt: skip
        assert not pr.valid_record(broken)


def test_record_round_trip_through_the_store(tmp_path: Path) -> None:
    store = PlanStore(tmp_path / "plans", FACTS)
    plan = _plan()
    desc = plan.key.describe(device=False)
    ok = pr.make_record("eng4_k3=2", Direction.FWD, ENV, _batches(), None, ["o"])
    failed = pr.make_record("eng0_k2=1", Direction.FWD, ENV, _batches(), "o: 1 of 4 rows past ...", ["o"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.load_record(desc, pr.KIND, "eng4_k3=2") is None  # nothing yet, silently
        path = store.save_record(desc, pr.KIND, "eng4_k3=2", ok)
        store.save_record(desc, pr.KIND, "eng0_k2=1", failed)
        store.save_record(desc, "another kind", "eng4_k3=2", {"x": 1})
        assert store.load_record(desc, pr.KIND, "eng4_k3=2") == ok
        assert store.load_records(desc, pr.KIND) == {"eng4_k3=2": ok, "eng0_k2=1": failed}
        assert store.load_record(desc, "another kind", "eng4_k3=2") == {"x": 1}
        # a fresh store object (a later process) reads them; another key has none
        again = PlanStore(tmp_path / "plans", FACTS)
        assert again.load_record(json.loads(json.dumps(desc)), pr.KIND, "eng0_k2=1") == failed
        assert again.load_records(_plan(max_seqlen_q=128).key.describe(device=False), pr.KIND) == {}
    assert path == store.records_path(desc) and path.parent == store.dir and path.name.endswith(".records")
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["format"] == RECORDS_FORMAT and doc["fingerprint"] == store.fingerprint and doc["facts"] == FACTS
    assert list(store.entries()) == [], "records are not plans"
    # another GPU model or cuDNN: another fingerprint, the records are never seen
    for other in ({"gpu": "NVIDIA B200", "sm": 100}, {"cudnn": 92000}):
        foreign = PlanStore(tmp_path / "plans", {**FACTS, **other})
        assert foreign.load_record(desc, pr.KIND, "eng4_k3=2") is None


def test_damaged_foreign_or_untrusted_records_are_skipped_with_one_warning(tmp_path: Path) -> None:
    store = PlanStore(tmp_path / "plans", FACTS)
    desc = _plan().key.describe(device=False)
    path = store.save_record(desc, pr.KIND, "eng4_k3=2", {"ok": True})
    good = path.read_bytes()
    foreign = json.dumps({**json.loads(good), "fingerprint": "x"}).encode()
    for content, cause in ((b"{not json", "unreadable"), (foreign, "another")):
        path.write_bytes(content)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert store.load_record(desc, pr.KIND, "eng4_k3=2") is None
            assert store.load_record(desc, pr.KIND, "eng4_k3=2") is None
        assert len(seen) == 1 and cause in str(seen[0].message) and str(path) in str(seen[0].message)
    path.write_bytes(good)
    os.chmod(path, 0o666)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert store.load_record(desc, pr.KIND, "eng4_k3=2") is None
    assert len(seen) == 1 and "writable by" in str(seen[0].message)
    os.chmod(path, 0o600)
    store.save_record(desc, pr.KIND, "eng0", {"ok": False})  # a damaged file is replaced, not merged
    assert set(store.load_records(desc, pr.KIND)) == {"eng4_k3=2", "eng0"}


# ----------------------------------------------------------------------------- rows_verified
class Probes:
    """A fake probe: the verdict per engine name, and the calls made."""

    def __init__(self, verdicts: dict[str, bool] | None = None):
        self.verdicts = verdicts or {}
        self.calls: list[tuple] = []

    def __call__(self, plan, cfg=None, backend=None, direction=None, **kw):
        self.calls.append((plan.key, plan.plan_name, direction))
        ok = self.verdicts.get(plan.plan_name, True)
        return pr.make_record(plan.plan_name, direction or plan.key.direction, ENV, _batches(),
                              None if ok else "o: 2 of 40 rows past a sequence's end are not exactly zero", ["o"])


@pytest.fixture
def verdicts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """rows_verified over a plan store in tmp_path (``state.store = None``: no store), a fake
    probe, and no capture."""
    state = SimpleNamespace(store=PlanStore(tmp_path / "plans", FACTS), probes=Probes(), capturing=False)
    monkeypatch.setattr(pr, "_store", lambda device: state.store)
    monkeypatch.setattr(pr, "probe", lambda *a, **kw: state.probes(*a, **kw))
    monkeypatch.setattr(pr, "_capturing", lambda device: state.capturing)
    monkeypatch.setattr(pr, "current_env", lambda device=None: ENV)
    monkeypatch.setattr(pr, "_warned", set())
    pr.forget()
    yield state
    pr.forget()


def test_probes_once_then_answers_from_memory_and_the_store(verdicts) -> None:
    plan = _plan()
    assert pr.rows_verified(plan, plan.key.config, F16B, Direction.FWD) is True
    assert pr.rows_verified(plan, plan.key.config, F16B, Direction.FWD) is True
    assert len(verdicts.probes.calls) == 1
    stored = verdicts.store.load_record(plan.key.describe(device=False), pr.KIND, plan.plan_name)
    assert pr.valid_record(stored, engine=plan.plan_name, direction=Direction.FWD, sm=90, cudnn=91900) and stored["ok"]
    pr.forget()  # a later process on the same machine: the store answers, no probe
    assert pr.rows_verified(plan) is True and len(verdicts.probes.calls) == 1
    assert pr.record_for(plan) == stored
    other_device = _plan(device=3)  # the store's key has no GPU ordinal: one record for every rank
    assert pr.rows_verified(other_device) is True and len(verdicts.probes.calls) == 1


def test_each_engine_and_key_is_probed_on_its_own(verdicts) -> None:
    verdicts.probes.verdicts = {"eng0_k2=1": False}
    good, bad = _plan(name="eng4_k3=2"), _plan(name="eng0_k2=1")
    assert pr.rows_verified(good) is True and pr.rows_verified(bad) is False
    assert pr.rows_verified(_plan(name="eng4_k3=2", max_seqlen_q=128)) is True
    assert pr.rows_verified(_plan(Direction.BWD, name="eng4_k3=2")) is True
    assert len(verdicts.probes.calls) == 4
    records = verdicts.store.load_records(bad.key.describe(device=False), pr.KIND)
    assert records["eng4_k3=2"]["ok"] is True and records["eng0_k2=1"]["ok"] is False
    assert "past a sequence's end" in records["eng0_k2=1"]["why"]
    pr.forget()
    assert pr.rows_verified(bad) is False and len(verdicts.probes.calls) == 4  # a failed verdict is kept too


def test_without_a_store_the_verdict_lives_in_memory(verdicts) -> None:
    verdicts.store = None
    plan = _plan()
    assert pr.rows_verified(plan) is True and pr.rows_verified(plan) is True
    assert len(verdicts.probes.calls) == 1 and pr.record_for(plan)["ok"] is True
    pr.forget()
    assert pr.record_for(plan) is None
    assert pr.rows_verified(plan) is True and len(verdicts.probes.calls) == 2


def test_a_record_of_another_architecture_or_cudnn_is_not_used(verdicts) -> None:
    plan = _plan()
    desc = plan.key.describe(device=False)
    for env in (RuntimeEnv(sm=100, cudnn_version=91900, device_name="B200"), RuntimeEnv(sm=90, cudnn_version=92000)):
        verdicts.store.save_record(desc, pr.KIND, plan.plan_name, pr.make_record(plan.plan_name, Direction.FWD, env,
                                                                                 _batches(), None, ["o"]))  # fmt: skip
        pr.forget()
        assert pr.rows_verified(plan) is True
    assert len(verdicts.probes.calls) == 2, "each mismatched record was probed again"
    verdicts.store.save_record(desc, pr.KIND, plan.plan_name, {"version": 0, "ok": True, "engine": plan.plan_name})
    pr.forget()
    pr.rows_verified(plan)
    assert len(verdicts.probes.calls) == 3


def test_during_a_capture_the_answer_is_fill_and_nothing_runs(verdicts) -> None:
    plan = _plan()
    verdicts.capturing = True
    assert pr.rows_verified(plan) is False
    assert fills_out(plan.key.config, F16B, plan) is True
    assert verdicts.probes.calls == [] and pr.record_for(plan) is None, "no probe, no record"
    verdicts.capturing = False  # the next eager call probes
    assert pr.rows_verified(plan) is True and len(verdicts.probes.calls) == 1
    verdicts.capturing = True  # a known verdict is read (no launch) inside a capture too
    assert pr.rows_verified(plan) is True and len(verdicts.probes.calls) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_without_cuda_nothing_is_probed_and_the_answer_is_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(pr, "probe", lambda *a, **kw: calls.append(a))
    monkeypatch.setattr(pr, "_store", lambda device: None)
    pr.forget()
    try:
        assert pr._capturing(0) is True  # cannot be told: treated as a capture
        assert pr.rows_verified(_plan()) is False and calls == []
    finally:
        pr.forget()


def test_a_probe_that_fails_answers_fill_warns_once_and_stores_nothing(verdicts) -> None:
    def broken(*a, **kw):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    verdicts.probes = broken
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert pr.rows_verified(_plan()) is False
        assert pr.rows_verified(_plan(name="eng1")) is False
    assert len(seen) == 1 and "OutOfMemoryError" in str(seen[0].message) and "zero-filled" in str(seen[0].message)
    assert verdicts.store.load_records(_plan().key.describe(device=False), pr.KIND) == {}
    assert pr.record_for(_plan())["ok"] is False


def test_unnamed_plans_and_no_plan_are_never_verified(verdicts) -> None:
    assert pr.rows_verified(None) is False
    assert pr.rows_verified(_plan(name="unknown")) is False
    assert pr.rows_verified(_plan(device=-1)) is False
    assert verdicts.probes.calls == []


def test_concurrent_callers_share_one_probe(verdicts) -> None:
    gate = threading.Event()
    inner = verdicts.probes

    def slow(*a, **kw):
        gate.wait(5)
        return inner(*a, **kw)

    verdicts.probes = slow
    plan = _plan()
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(pr.rows_verified(plan))) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert answers == [True] * 4 and len(inner.calls) == 1


# ----------------------------------------------------------------------------- te_cudnn.row_fill's decision
@pytest.mark.parametrize("verified", [True, False])
def test_fills_follow_the_static_rule_and_the_engine(monkeypatch: pytest.MonkeyPatch, verified: bool) -> None:
    asked = []

    def rows_verified(plan, cfg, backend, direction):
        asked.append(direction)
        return verified

    monkeypatch.setattr(pr, "rows_verified", rows_verified)
    fwd, bwd = _plan(Direction.FWD), _plan(Direction.BWD)
    assert fills_out(fwd.key.config, F16B, fwd) is (not verified)
    assert fills_grads(bwd.key.config, F16B, bwd) is (not verified)
    assert asked == [Direction.FWD, Direction.BWD]
    # no plan (prepare time): filled, nobody asked
    assert fills_out(fwd.key.config, F16B) is True and fills_grads(bwd.key.config, F16B) is True
    # the static rule says fill: the engine is not asked
    for direction, over in ((Direction.FWD, dict(attn_mask_type="padding_causal_bottom_right")),
                            (Direction.FWD, dict(window_size=(8, 0))), (Direction.BWD, dict(deterministic=True)),
                            (Direction.FWD, dict(THD)), (Direction.BWD, dict(ONE_QUERY))):  # fmt: skip
        p = _plan(direction, **over)
        fill = fills_out if direction == Direction.FWD else fills_grads
        assert fill(p.key.config, F16B, p) is True, over
    fp8 = BY_ENUM[FusedAttnBackend.FP8]
    assert fills_out(fwd.key.config, fp8, fwd) is True
    assert asked == [Direction.FWD, Direction.BWD]
    # one query row: the forward may skip, the backward keeps its fill
    one = _plan(Direction.FWD, **ONE_QUERY)
    assert fills_out(one.key.config, F16B, one) is (not verified) and asked[-1] == Direction.FWD
    # no padding mask, no THD: nothing to fill, nobody asked
    dense = _plan(attn_mask_type="causal")
    n = len(asked)
    assert fills_out(dense.key.config, F16B, dense) is False and fills_grads(dense.key.config, F16B, dense) is False
    assert len(asked) == n
