"""GPU suite for autotuning (``te_cudnn.plans.tune``).

* Every engine configuration cuDNN offers for a representative key (dense causal bf16 forward
  and backward, GQA, post-scale bias with dBias, dropout, padding with shorter sequences, THD,
  FP8) runs on the same operands, and each one's results pass the accuracy checks the
  heuristic plan passes (``te_cudnn.testing.check_close`` against the fp32 reference with the
  same-precision PyTorch error; FP8: the FP8 suite's RMSE bound against the emulation) and
  lie within the dtype's tolerance of the heuristic plan's results (dropout, THD and the FP8
  backward, which have no cheap reference here: that agreement only; the heuristic plans are
  checked against references by their own suites).
* ``tune_key`` writes the tuning record with the chosen plan into a temporary plan store; a
  fresh cache (and a second process, through ``TE_CUDNN_AUTOTUNE=1``) loads the tuned plan
  without tuning again, and the loaded plan is the chosen engine (``serialize()`` kept it).
* ``te-cudnn plans tune`` tunes a configuration file and ``plans show`` lists the times.
* A tuned plan is captured into a CUDA graph and replayed.

Run with ``-s`` to see every key's candidates and their times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from te_cudnn import timing
from te_cudnn.backends import BY_ENUM, Direction, Uid
from te_cudnn.config import describe_shapes
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.plans import PlanCache, make_key
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans import persist as persist_mod
from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.handles import handle_for
from te_cudnn.plans.store import PlanStore
from te_cudnn.reference import attention_reference, attention_reference_fp8
from te_cudnn.runtime import current_env, frontend_version
from te_cudnn.testing import TOLERANCES, check_close, rel_error

pytestmark = pytest.mark.gpu

F16 = FusedAttnBackend.F16_arbitrary_seqlen
FP8B = FusedAttnBackend.FP8
E4M3 = getattr(torch, "float8_e4m3fn", None)
RMSE_VS_EMULATION = 0.01  # the FP8 suite's bound for O against the emulation (tests/test_fp8_gpu.py)
FAST = dict(warmup=1, reps=3)  # timing settings for the tests (the defaults are 3 and 10)


def _key(backend: FusedAttnBackend, direction: Direction, **over: Any):
    a: dict[str, Any] = dict(
        is_training=True, dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias",
        attn_mask_type="causal", softmax_type="vanilla", dropout=0.0, num_attn_heads=8, num_gqa_groups=8,
        max_seqlen_q=512, max_seqlen_kv=512, head_dim_qk=128, head_dim_v=128, window_size=(-1, -1), batch_size=2,
        device=torch.cuda.current_device(),
    )  # fmt: skip
    a.update(over)
    cfg = describe_shapes(**a)
    env = current_env()
    why = BY_ENUM[backend].not_supported_reasons(cfg, env, direction)
    if why:
        pytest.skip(f"{backend.name} does not serve this here: {'; '.join(why)}")
    return make_key(backend, direction, cfg, env.cudnn_version, frontend_version())


def _make_spec(key):
    device = key.config.device
    return lambda: BY_ENUM[key.backend].build(key.config, key.direction, handle_for(device))


CASES: dict[str, tuple] = {
    "causal_fwd": (F16, Direction.FWD, {}),
    "causal_bwd": (F16, Direction.BWD, {}),
    "gqa_bwd": (F16, Direction.BWD, dict(num_gqa_groups=2, head_dim_qk=64, head_dim_v=64)),
    "bias_bwd": (F16, Direction.BWD, dict(attn_mask_type="no_mask", attn_bias_type="post_scale_bias",
                                          bias_shape=(1, 8, 512, 512))),
    "dropout_fwd": (F16, Direction.FWD, dict(attn_mask_type="no_mask", dropout=0.1)),
    "dropout_bwd": (F16, Direction.BWD, dict(attn_mask_type="no_mask", dropout=0.1)),
    "padding_bwd": (F16, Direction.BWD, dict(attn_mask_type="padding_causal", dtype=torch.float16)),
    "thd_fwd": (F16, Direction.FWD, dict(qkv_layout="thd_thd_thd", attn_mask_type="padding_causal", batch_size=3,
                                         max_seqlen_q=300, max_seqlen_kv=300)),
    "fp8_fwd": (FP8B, Direction.FWD, dict(dtype=E4M3)),
    "fp8_bwd": (FP8B, Direction.BWD, dict(dtype=E4M3)),
}  # fmt: skip


def _fp8_case(case: str) -> bool:
    return case.startswith("fp8")


def _case_params():
    out = []
    for name in CASES:
        marks = [pytest.mark.fp8] if _fp8_case(name) else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


# ----------------------------------------------------------------------------- references
def _valid_rows(ops: dict, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sequence lengths (shorter than full, so padding matters) written into the operands,
    and [b, 1, s, 1] masks of the valid q and kv rows."""
    g = torch.Generator().manual_seed(5)
    lq = torch.randint(cfg.sq // 4, cfg.sq + 1, (cfg.b,), generator=g).to(torch.int32)
    lkv = torch.randint(cfg.skv // 4, cfg.skv + 1, (cfg.b,), generator=g).to(torch.int32)
    lq[0], lkv[-1] = cfg.sq, cfg.skv  # one full sequence on each side
    ops[Uid.SEQ_LEN_Q].copy_(lq.view(-1, 1, 1, 1))
    ops[Uid.SEQ_LEN_KV].copy_(lkv.view(-1, 1, 1, 1))
    dev = ops[Uid.Q].device
    lq, lkv = lq.to(dev), lkv.to(dev)
    rq = (torch.arange(cfg.sq, device=dev).view(1, 1, -1, 1) < lq.view(-1, 1, 1, 1))
    rkv = (torch.arange(cfg.skv, device=dev).view(1, 1, -1, 1) < lkv.view(-1, 1, 1, 1))
    return lq, lkv, rq, rkv


def _f16_reference(ops: dict, cfg, direction: Direction):
    """(checks: name -> (fp32 reference, same-precision reference, row mask or None)) for dense
    F16 keys; the backward's O and stats inputs are written from the fp32 forward."""
    lens: dict[str, Any] = {}
    rq = rkv = None
    if cfg.mask.is_padding:
        lq, lkv, rq, rkv = _valid_rows(ops, cfg)
        lens = dict(seqlens_q=lq, seqlens_kv=lkv)
    kw = dict(attn_scale=cfg.attn_scale, attn_mask_type=cfg.mask, attn_bias_type=cfg.bias_type, **lens)
    names = [Uid.Q, Uid.K, Uid.V] + ([Uid.BIAS] if cfg.bias_type.name == "post_scale_bias" else [])
    refs = {}
    for compute in (torch.float32, cfg.dtype):
        leaves = [ops[u].detach().to(compute, copy=True).requires_grad_() for u in names]
        bias = {"attn_bias": leaves[3]} if len(leaves) > 3 else {}
        refs[compute] = (attention_reference(*leaves[:3], compute_dtype=compute, **kw, **bias), leaves)
    (ref, leaves32), (same, leaves_lo) = refs[torch.float32], refs[cfg.dtype]
    if direction == Direction.FWD:
        return {Uid.O: (ref.out, same.out, rq), Uid.STATS: (ref.lse, same.lse.float(), rq)}
    lse = ref.lse.detach().masked_fill(~torch.isfinite(ref.lse), 0.0)  # rows attending no key: never read
    ops[Uid.O].copy_(ref.out.detach().to(cfg.dtype))
    ops[Uid.STATS].copy_(lse)
    d_o = ops[Uid.DO]
    ref.out.backward(d_o.float())
    same.out.backward(d_o.to(cfg.dtype))
    checks = {Uid.DQ: (leaves32[0].grad, leaves_lo[0].grad, rq), Uid.DK: (leaves32[1].grad, leaves_lo[1].grad, rkv),
              Uid.DV: (leaves32[2].grad, leaves_lo[2].grad, rkv)}  # fmt: skip
    if Uid.DBIAS in ops:
        checks[Uid.DBIAS] = (leaves32[3].grad, leaves_lo[3].grad, None)
    return checks


def _rmse_range(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).pow(2).mean().sqrt() / (b.max() - b.min()).clamp_min(1e-12))


# ----------------------------------------------------------------------------- every candidate
@pytest.mark.parametrize("case", _case_params())
def test_every_candidate_passes_the_checks_the_heuristic_plan_passes(case: str) -> None:
    backend, direction, over = CASES[case]
    key = _key(backend, direction, **over)
    cfg = key.config
    planned = tune_mod.plan_candidates(key, _make_spec(key))
    g, uids = planned.graph, tuple(planned.spec.uids)
    ops = tune_mod.make_operands(g, uids, cfg, "cuda", seed=17)
    outputs = [u for u in uids if u in {t.uid for t in g.get_outputs()}]
    checks: dict = {}
    if backend == F16 and not cfg.has_dropout and not cfg.is_ragged:
        checks = _f16_reference(ops, cfg, direction)
    elif case == "fp8_fwd":
        emu = attention_reference_fp8(ops[Uid.Q], ops[Uid.K], ops[Uid.V], descale_qkv=1.0, scale_s=ops[Uid.SCALE_S],
                                      descale_s=ops[Uid.DESCALE_S], scale_o=1.0, attn_scale=cfg.attn_scale,
                                      attn_mask_type=cfg.mask)  # fmt: skip
    handle = handle_for(cfg.device)
    results, errors = {}, {}
    for c in planned.candidates:
        if c.error is not None:
            errors[c.index] = c.error
            continue
        for u in outputs:
            ops[u].zero_()
        ws = torch.empty(max(c.workspace or 0, 1), dtype=torch.uint8, device="cuda")
        try:
            g.execute_plan_at_index(ops, ws, index=c.index, handle=handle)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a plan that cannot run is never chosen; reported below
            errors[c.index] = f"{type(exc).__name__}: {exc}"
            continue
        results[c.index] = {u: ops[u].clone() for u in outputs}
    print(f"\n{case}: {len(planned.candidates)} candidates ({planned.duplicates} duplicates skipped, modes "
          f"{planned.modes}), heuristic [{planned.heuristic_index}]")  # fmt: skip
    for c in planned.candidates:
        print(f"  [{c.index}] {c.name} ws={c.workspace}" + (f" ERROR {errors[c.index]}" if c.index in errors else ""))
    assert planned.heuristic_index in results, f"the heuristic plan did not run: {errors.get(planned.heuristic_index)}"
    heuristic = results[planned.heuristic_index]
    tol = tune_mod.agreement_tolerance(cfg.dtype)
    for index, out in results.items():
        name = f"[{index}] {next(c.name for c in planned.candidates if c.index == index)}"
        for uid, (ref, same, rows) in checks.items():  # the accuracy checks of the heuristic plan
            actual = out[uid]
            if rows is not None:
                actual, ref, same = (t.masked_fill(~rows, 0) if t.dim() == 4 else t for t in (actual, ref, same))
            check_close(f"{case} {name} {Uid.NAMES[uid]}", actual, ref, same, cfg.dtype)
        if case == "fp8_fwd":
            assert _rmse_range(out[Uid.O].float(), emu.out) < RMSE_VS_EMULATION, name
        for uid in outputs:  # and the heuristic plan's results, within the dtype's tolerance
            why = tune_mod.agreement_error(Uid.NAMES[uid], out[uid], heuristic[uid], tol)
            assert why is None, f"{case} {name}: {why}"
        for uid in outputs:
            assert torch.isfinite(out[uid].float()).any(), f"{case} {name} {Uid.NAMES[uid]}: no finite values"


# ----------------------------------------------------------------------------- tune_key and the store
@pytest.fixture
def store_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    root = tmp_path / "plans"
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(root))
    monkeypatch.delenv("TE_CUDNN_AUTOTUNE", raising=False)
    monkeypatch.setattr(persist_mod, "_stores", {})  # store_for picks up the variable
    return root


def test_tune_key_stores_the_chosen_plan_and_a_fresh_cache_loads_it_without_tuning(store_env, monkeypatch) -> None:
    key = _key(F16, Direction.BWD)
    cache = PlanCache(builder=cache_mod.build_or_load_plan)
    result = tune_mod.tune_key(key, cache=cache, **FAST)
    tuned = cache.find(key)
    assert tuned is not None and tuned.tuning == result.to_record() and tuned.plan_name == result.chosen.name
    assert tuned.graph._plan_index == result.chosen.index  # what PlanLauncher and execute() run
    assert result.chosen.median_ms is not None and result.heuristic is not None
    assert result.chosen.median_ms <= result.heuristic.median_ms
    print("\n" + tune_mod.format_record(result.to_record()))
    # the store holds the record and the chosen plan
    store = cache_mod.store_for(key.config.device)
    header = store.load(key.describe(device=False)).header
    assert header["plan_name"] == result.chosen.name and header["tuning"]["chosen"]["index"] == result.chosen.index
    assert tune_mod.tuning_record(key, cache=PlanCache(builder=cache_mod.build_or_load_plan)) == header["tuning"]

    # a fresh cache with autotuning on: loaded from the store, not tuned again
    def no_tuning(*args, **kwargs):
        raise AssertionError("a stored tuned plan must load without tuning")

    monkeypatch.setattr(tune_mod, "tune_plan", no_tuning)
    fresh = PlanCache(builder=cache_mod.build_or_load_plan)
    with tune_mod.autotuning():
        loaded = fresh.get_or_build(key, _make_spec(key))
    assert loaded.source == "store" and loaded.tuning == header["tuning"] and loaded.info()["tuned"]
    # the stored plan is the chosen engine: same name where the frontend tells it, same bits
    try:
        stored_name = str(loaded.graph.get_plan_name_at_index(0))
    except Exception:  # noqa: BLE001 - a deserialized graph may not name its plan
        stored_name = None
    if stored_name is not None and tuned.graph.selected_engine is None:  # a cuDNN backend plan: names compare
        assert stored_name == result.chosen.name
    ops = tune_mod.make_operands(tuned.graph, tuned.uids, key.config, "cuda", seed=3)
    outs = [Uid.DQ, Uid.DK, Uid.DV]
    got = []
    for plan in (tuned, loaded):
        for u in outs:
            ops[u].zero_()
        ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
        plan.launch([ops[u] for u in plan.uids], ws, handle_for(key.config.device))
        torch.cuda.synchronize()
        got.append([ops[u].clone() for u in outs])
    for a, b in zip(*got):  # the same engine (a non-deterministic one may differ in the last bits)
        assert rel_error(a, b) <= TOLERANCES[key.config.dtype].floor
    assert loaded.workspace_size == tuned.workspace_size


SCRIPT = r"""
import json, logging, sys, torch
import te_cudnn as tc
records = []
class H(logging.Handler):
    def emit(self, r):
        records.append(r.getMessage())
logging.getLogger("te_cudnn").addHandler(H()); logging.getLogger("te_cudnn").setLevel(logging.INFO)
g = torch.Generator(device="cuda").manual_seed(11)
q, k, v, d_o = (torch.randn(2, 512, 8, 128, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4))
cu = torch.arange(0, 3 * 512, 512, dtype=torch.int32, device="cuda")
kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
out, aux = tc.fused_attn_fwd(True, 512, 512, cu, cu, q, k, v, q.dtype, None, **kw)
dq, dk, dv, _, _ = tc.fused_attn_bwd(512, 512, cu, cu, q, k, v, out, d_o, q.dtype, aux, None, **kw)
torch.save({"out": out.cpu(), "lse": aux[0].cpu(), "dq": dq.cpu(), "dk": dk.cpu(), "dv": dv.cpu()}, sys.argv[1])
s = tc.plan_cache.stats()
snap = tc.plan_cache.snapshot()
print(json.dumps({"builds": s.builds, "loads": s.loads, "sources": [p["source"] for p in snap],
                  "tuned": [p["tuned"] for p in snap], "plans": [p["plan_name"] for p in snap],
                  "autotuned_logs": sum(m.startswith("autotuned plan") for m in records)}))
"""


def _run(out_file: Path, **env: str) -> dict:
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(out_file)], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_tuned_plans_without_tuning(tmp_path: Path) -> None:
    import torch

    store = str(tmp_path / "store")
    first = _run(tmp_path / "a.pt", TE_CUDNN_PLAN_STORE=store, TE_CUDNN_AUTOTUNE="1")
    assert (first["builds"], first["loads"], first["tuned"], first["autotuned_logs"]) == (2, 0, [True, True], 2)
    headers = [PlanStore.read(p).header for p in Path(store).glob("*/*.plan")]
    assert len(headers) == 2 and all(tune_mod.valid_record(h.get("tuning")) for h in headers)
    assert sorted(h["plan_name"] for h in headers) == sorted(first["plans"])
    second = _run(tmp_path / "b.pt", TE_CUDNN_PLAN_STORE=store, TE_CUDNN_AUTOTUNE="1")
    assert (second["builds"], second["loads"], second["autotuned_logs"]) == (0, 2, 0)
    assert second["sources"] == ["store", "store"] and second["tuned"] == [True, True]
    off = _run(tmp_path / "c.pt", TE_CUDNN_PLAN_STORE=store, TE_CUDNN_AUTOTUNE="0")  # off: tuned plans still serve
    assert (off["builds"], off["loads"], off["tuned"]) == (0, 2, [True, True])
    heuristic = _run(tmp_path / "d.pt", TE_CUDNN_PLAN_STORE="off", TE_CUDNN_AUTOTUNE="0")  # today's plans
    assert heuristic["tuned"] == [False, False] and heuristic["autotuned_logs"] == 0
    a, b, h = (torch.load(tmp_path / f"{n}.pt") for n in "abd")
    for name in a:
        assert rel_error(b[name], a[name]) <= TOLERANCES[torch.bfloat16].floor, name  # the same engines
        assert rel_error(a[name], h[name]) <= TOLERANCES[torch.bfloat16].ceiling, name  # tuned vs heuristic


def test_cli_tune_and_show(tmp_path: Path) -> None:
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps([{"name": "small gqa", "b": 2, "h": 8, "hg": 2, "sq": 256, "d": 64, "mask": "causal"}]))
    store = str(tmp_path / "store")
    cmd = [sys.executable, "-m", "te_cudnn.cli", "plans"]
    res = subprocess.run([*cmd, "tune", str(configs), "--store", store, "--json"], capture_output=True, text=True,
                         timeout=900)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    (entry,) = report["configs"]
    assert entry["config"] == "config 1 (small gqa)" and report["failures"] == 0
    assert [p["direction"] for p in entry["plans"]] == ["fwd", "bwd"]
    assert all(p["tuned"] and p["status"] == "tuned now" and tune_mod.valid_record(p["tuning"]) for p in entry["plans"])
    res = subprocess.run([*cmd, "tune", str(configs), "--store", store], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("tuned earlier (from the store)") == 2 and "candidates" in res.stdout
    (path, *_) = sorted(Path(store).glob("*/*.plan"))
    res = subprocess.run([*cmd, "show", path.stem, "--store", store], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "chosen [" in res.stdout and " ms " in res.stdout, res.stdout + res.stderr
    res = subprocess.run([*cmd, "list", "--store", store, "--json"], capture_output=True, text=True, timeout=300)
    assert all(r["tuned"] != "-" for r in json.loads(res.stdout)["plans"])


def test_tuned_plan_in_a_cuda_graph(store_env) -> None:
    import te_cudnn as tc

    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(2, 384, 8, 64, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, 3 * 384, 384, dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    with tune_mod.autotuning():
        eager, _ = tc.fused_attn_fwd(False, 384, 384, cu, cu, q, k, v, q.dtype, None, **kw)  # tunes
        plans = [p for p in tc.plan_cache.plans() if p.key.config.sq == 384 and p.key.config.d_qk == 64]
        assert plans and all(p.tuning is not None for p in plans)
        static = torch.empty_like(eager)
        tc.fused_attn_fwd(False, 384, 384, cu, cu, q, k, v, q.dtype, None, out=static, **kw)  # the signature, eagerly
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # never tunes inside a capture; the tuned plan is captured
            out, _ = tc.fused_attn_fwd(False, 384, 384, cu, cu, q, k, v, q.dtype, None, out=static, **kw)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(static, eager) or rel_error(static, eager) <= TOLERANCES[torch.bfloat16].floor


@pytest.mark.fp8
@pytest.mark.parametrize("mask", ["causal", "padding_causal"])
@pytest.mark.parametrize("b,h,hg,split", [(2, 8, 4, ("batch", 2)), (4, 8, 4, ("batch", 4)), (1, 8, 4, ("heads", 2)),
                                          (1, 8, 4, ("heads", 4)), (2, 8, 4, ("batch_heads", 4)),
                                          (2, 8, 4, ("batch_heads", 8))])  # fmt: skip
def test_fp8_backward_in_parts_matches_the_whole_call(monkeypatch, b, h, hg, split, mask) -> None:
    """The split path (as a tuning record chooses it) gives the whole call's gradients and
    amaxes: zero-copy views of the batch or of whole GQA head groups, results in place."""
    import te_cudnn
    import te_cudnn.launchers as launchers

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, 512, h, 128, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(b, 512, hg, 128, device="cuda", generator=g).bfloat16() for _ in range(2))
    d_out = torch.randn(b, 512, h, 128, device="cuda", generator=g).bfloat16()

    def run():
        meta = te_cudnn.Fp8AttentionMeta(device="cuda")
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        lens = torch.tensor([512 - 37 * i * (mask != "causal") for i in range(b)], dtype=torch.int32, device="cuda")
        cu = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))  # given, as TE's callers do
        out = te_cudnn.fp8_attention(*leaves, meta, qkv_layout="bshd_bshd_bshd", attn_mask_type=mask,
                                     cu_seqlens_q=cu, cu_seqlens_kv=cu)
        out.backward(d_out)
        return [x.grad for x in leaves], meta

    whole, meta_whole = run()
    calls = []
    real = launchers._split_bwd
    monkeypatch.setattr(launchers, "chosen_split", lambda record: split)
    monkeypatch.setattr(launchers, "_split_bwd", lambda *a: calls.append(a[1]) or real(*a))
    parts, meta_parts = run()
    assert calls == [split]
    for name, x, y in zip(("dq", "dk", "dv"), parts, whole):
        assert x.shape == y.shape and x.stride() == y.stride(), name
        torch.testing.assert_close(x, y, atol=1e-2, rtol=1e-2, msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(meta_parts.bwd.amax_history, meta_whole.bwd.amax_history, atol=0, rtol=1e-2)


def test_interleaved_timer_times_runs_side_by_side_and_isolates_a_failing_one() -> None:
    """The device's default timer: one list of samples per run, ``reps`` each; a run that raises
    is returned as its exception while the others are still timed; times scale with the work
    (a matmul of twice the size is ~8x the work)."""
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    calls = {"bad": 0}

    def bad() -> None:
        calls["bad"] += 1
        if calls["bad"] > 2:  # fails in the rounds, after its warm-up and estimate
            raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED")

    small, large, failed = tune_mod.interleaved_event_timer([lambda: a @ a, lambda: b @ b, bad], warmup=1, reps=5)
    assert len(small) == 5 and len(large) == 5 and all(x > 0 for x in small + large)
    assert isinstance(failed, RuntimeError)
    ratio = sorted(large)[2] / sorted(small)[2]
    print(f"2048^3 / 1024^3 matmul time ratio: {ratio:.2f}")
    assert 3.0 < ratio < 12.0


def test_timer_hides_the_host_time_of_a_host_bound_run_after_an_idle_spell() -> None:
    """A run whose launches take the host far longer than the GPU (one tiny kernel and ~30 µs
    of host work) is timed at its GPU time: its samples are queued behind a spin. After an
    idle spell the GPU's first spins run at a low clock; a spin rate read there made later spins
    too short, and the tuner then timed host launches (an H100 benchmark run timed every
    candidate of the host problem at ~13 µs, the frontend's host time per launch, instead of
    4.6-6.3 µs)."""
    import time

    x = torch.zeros(256, device="cuda")

    def run() -> None:
        x.add_(1.0)
        t = time.perf_counter() + 30e-6
        while time.perf_counter() < t:
            pass

    t0 = time.perf_counter()
    for _ in range(200):
        run()
    torch.cuda.synchronize()
    host_ms = (time.perf_counter() - t0) / 200 * 1e3
    saved = dict(timing._cycles_per_ms)
    timed = []
    # The host's cores are shared: a preemption longer than the spin ahead of a sample (and its
    # retries) lets host time into that sample. A spin rate read at the idle clock would spoil
    # every attempt; one clean attempt out of three shows it was read right.
    try:
        for _ in range(3):
            timing._cycles_per_ms.clear()  # measured again, after the idle spell
            time.sleep(2.0)  # idle: the GPU lowers its clock
            [samples] = tune_mod.interleaved_event_timer([run], warmup=3, reps=5)
            assert len(samples) == 5
            timed.append(sorted(samples)[len(samples) // 2])
            print(f"host {host_ms * 1e3:.1f} us per run, timed {timed[-1] * 1e3:.1f} us")
            if timed[-1] < 0.5 * host_ms:
                break
    finally:
        timing._cycles_per_ms.clear()
        timing._cycles_per_ms.update(saved)
    assert min(timed) < 0.5 * host_ms, (timed, host_ms)
