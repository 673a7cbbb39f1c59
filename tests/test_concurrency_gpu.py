"""GPU suite: threads, CUDA streams, workspaces and host synchronisation.

* Many threads share the plan cache: 8 threads x 200 mixed fwd+bwd calls from a cold cache
  give results bit-identical to a single-threaded run (deterministic backward), build each
  plan exactly once, and raise nothing.
* 8 threads launch one and the same plan at the same moment (a barrier per iteration), in
  every launch mode the plan's launcher has.
* Calls under ``torch.cuda.stream(s)`` run in ``s``'s order: on each of two streams a long
  GPU sleep and then a write of new inputs precede the call, and only that stream is
  synchronised before the check. A call that ran on any other stream would have read the
  inputs before the write.
* Two streams never share a workspace: every launch's workspace is recorded, and the two
  streams' backward runs overlap in time and stay bit-identical.
* Cached calls never wait for the GPU: with a long sleep queued on the stream, repeated
  calls return long before it ends (torch's sync-debug mode only sees torch's own syncs;
  the timing sees every kind).
* cuDNN handles of finished threads are reused, not leaked (te_cudnn.plans.handles).
"""

from __future__ import annotations

import contextlib
import functools
import random
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

import te_cudnn as tc
from te_cudnn.enums import QKVFormat, QKVLayout
from te_cudnn.layouts import layout_info
from te_cudnn.plans import handles
from te_cudnn.testing import make_qkv

pytestmark = pytest.mark.gpu

N_THREADS = 8
CALLS_PER_THREAD = 200
SHARED_PLAN_ITERS = 50


# ------------------------------------------------------------------ helpers
def _cu(lengths) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


@functools.lru_cache(maxsize=None)
def _cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep``, measured once."""
    torch.cuda._sleep(1000)  # load the kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def _sleep(ms: float) -> None:
    """Queue a GPU busy-wait of about ``ms`` milliseconds on the current stream."""
    torch.cuda._sleep(int(ms * _cycles_per_ms()))


def _differs(got: list, want: list) -> torch.Tensor:
    """A 0-d bool device tensor: True where any result differs bit-wise (no host sync)."""
    assert len(got) == len(want), (len(got), len(want))
    bad = torch.zeros((), dtype=torch.bool, device="cuda")
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        bad |= (g != w).any()
    return bad


def _run_threads(n: int, target: Callable[[int], None]) -> list[str]:
    """Run ``target(i)`` in ``n`` threads; the formatted tracebacks of those that raised."""
    errors: list[str] = []

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException:  # reported by the caller
            errors.append(f"thread {i}:\n{traceback.format_exc()}")

    threads = [threading.Thread(target=run, args=(i,), name=f"te_cudnn-test-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _plans(direction: str, layout: str, **fields) -> list:
    """The cached plans of one direction and layout whose configuration has these field values."""
    want = QKVLayout[layout]
    return [
        p for p in tc.plan_cache.plans()
        if p.key.direction.value == direction and p.key.config.layout == want
        and all(getattr(p.key.config, name) == value for name, value in fields.items())
    ]  # fmt: skip


class _Recorder:
    """Stands in for a plan's launcher: notes the thread, stream, workspace and handle of every
    launch, then launches. Its mode is not "raw", so ops hands every call to ``__call__``."""

    mode = "recording"
    direct = False

    def __init__(self, inner, device: int):
        self.inner, self.device, self.calls = inner, device, []

    def __call__(self, buffers, workspace, handle) -> None:
        self.calls.append((threading.get_ident(), handles.current_raw_stream(self.device), workspace.data_ptr(),
                           workspace.numel(), handle))  # fmt: skip
        self.inner(buffers, workspace, handle)


@contextlib.contextmanager
def _recording(plans: list):
    recorders = [_Recorder(p.launch, p.key.config.device) for p in plans]
    for p, r in zip(plans, recorders):
        p.launch = r
    try:
        yield recorders
    finally:
        for p, r in zip(plans, recorders):
            p.launch = r.inner


# ------------------------------------------------------------------ 8 threads x 200 mixed calls
@dataclass(frozen=True)
class Mix:
    name: str
    layout: str
    mask: str
    dtype: torch.dtype
    b: int
    h: int
    hg: int
    s: int  # max_seqlen_q (the dense extent)
    d: int
    skv: Optional[int] = None  # cross attention (dense); default s
    lengths: Optional[tuple[int, ...]] = None  # per-sequence lengths (padding masks, THD)
    bias: Optional[tuple[int, int, int, int]] = None  # post_scale_bias shape

    @property
    def kv_len(self) -> int:
        return self.skv or self.s

    @property
    def varlen(self) -> bool:
        return "padding" in self.mask


BF16, FP16 = torch.bfloat16, torch.float16
MIXED = (
    Mix("bshd-causal", "bshd_bshd_bshd", "causal", BF16, 2, 4, 4, 128, 64),
    Mix("sbhd-cross-fp16", "sbhd_sbhd_sbhd", "no_mask", FP16, 2, 4, 4, 64, 64, skv=192),
    Mix("bs3hd-causal-d128", "bs3hd", "causal", BF16, 3, 2, 2, 96, 128),
    Mix("gqa-8-2", "bshd_bshd_bshd", "causal", BF16, 2, 8, 2, 128, 64),
    Mix("bias-1hss", "bshd_bshd_bshd", "no_mask", BF16, 2, 4, 4, 128, 64, bias=(1, 4, 128, 128)),
    Mix("padding-causal", "bshd_bshd_bshd", "padding_causal", BF16, 3, 4, 4, 128, 64, lengths=(128, 77, 1)),
    Mix("thd-gqa", "thd_thd_thd", "padding_causal", BF16, 4, 4, 2, 128, 64, lengths=(100, 0, 37, 64)),
)
INPUT_SETS = 2  # distinct input tensors per configuration


def _mix_inputs(case: Mix, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(case.dtype)

    layout = QKVLayout[case.layout]
    if layout_info(layout).q_format == QKVFormat.thd:
        tokens = sum(case.lengths)
        q, k, v = rand(tokens, case.h, case.d), rand(tokens, case.hg, case.d), rand(tokens, case.hg, case.d)
    else:
        q, k, v = make_qkv(layout, case.b, case.h, case.hg, case.s, case.kv_len, case.d, dtype=case.dtype, generator=gen)
    cu_q = _cu(case.lengths if case.lengths else [case.s] * case.b)
    cu_kv = _cu(case.lengths if case.lengths else [case.kv_len] * case.b)
    return dict(q=q, k=k, v=v, cu_q=cu_q, cu_kv=cu_kv, bias=rand(*case.bias) if case.bias else None,
                d_o=rand(*q.shape[:-1], case.d))  # fmt: skip


def _mix_call(case: Mix, x: dict) -> list[torch.Tensor]:
    """Forward + deterministic backward; the results that must be bit-reproducible (the softmax
    stats of padded rows are undefined, so varlen cases leave them out)."""
    kw = dict(qkv_layout=case.layout, attn_mask_type=case.mask,
              attn_bias_type="post_scale_bias" if case.bias else "no_bias")  # fmt: skip
    out, aux = tc.fused_attn_fwd(True, case.s, case.kv_len, x["cu_q"], x["cu_kv"], x["q"], x["k"], x["v"], case.dtype,
                                 None, attn_bias=x["bias"], **kw)  # fmt: skip
    dq, dk, dv, dbias, _ = tc.fused_attn_bwd(case.s, case.kv_len, x["cu_q"], x["cu_kv"], x["q"], x["k"], x["v"], out,
                                          x["d_o"], case.dtype, aux, None, deterministic=True, **kw)  # fmt: skip
    results = [out, dq, dk, dv]
    if not case.varlen:
        results.append(aux[0])
    if case.bias:
        assert dbias is not None, f"{case.name}: a [1, h, s, s] bias has a dBias"
        results.append(dbias)
    return results


def test_threads_share_the_plan_cache_with_bit_identical_results():
    """8 threads x 200 calls of mixed configurations (dense, cross, packed, GQA, bias, padding,
    THD with an empty sequence), forward + deterministic backward, each thread on its own
    stream, all starting together on a cold plan cache. Fails if any result differs bit-wise
    from the single-threaded run of the same call, if any call raises, or if a plan is built
    more than once (concurrent misses of one key must wait for one build)."""
    inputs = [[_mix_inputs(case, 100 * i + j) for j in range(INPUT_SETS)] for i, case in enumerate(MIXED)]
    n_plans = 2 * len(MIXED)  # a forward and a backward plan per configuration

    tc.plan_cache.clear()
    expected = [[_mix_call(case, x) for x in xs] for case, xs in zip(MIXED, inputs)]
    again = [[_mix_call(case, x) for x in xs] for case, xs in zip(MIXED, inputs)]
    torch.cuda.synchronize()
    single = tc.plan_cache.stats()
    assert single.builds + single.loads == n_plans and single.build_failures == 0, single
    for case, want, got in zip(MIXED, expected, again):
        for j in range(INPUT_SETS):
            assert not bool(_differs(got[j], want[j])), (
                f"{case.name}: two single-threaded runs differ bit-wise; the deterministic backward is not "
                "reproducible here (a cuDNN determinism problem, not a threading one)"
            )

    tc.plan_cache.clear()  # the threads start from a cold cache and race to build
    start = threading.Barrier(N_THREADS)
    results: dict[int, tuple[list, list]] = {}

    def worker(t: int) -> None:
        rng = random.Random(1000 + t)
        picks, flags = [], []
        stream = torch.cuda.Stream()
        start.wait(timeout=60)
        with torch.cuda.stream(stream):
            for _ in range(CALLS_PER_THREAD):
                i, j = rng.randrange(len(MIXED)), rng.randrange(INPUT_SETS)
                flags.append(_differs(_mix_call(MIXED[i], inputs[i][j]), expected[i][j]))
                picks.append((i, j))
            flagged = torch.stack(flags)
        stream.synchronize()
        results[t] = (picks, flagged.nonzero().flatten().tolist())

    errors = _run_threads(N_THREADS, worker)
    total = sum(len(picks) for picks, _ in results.values())
    stats = tc.plan_cache.stats()
    print(f"\nthread test: {N_THREADS} threads x {CALLS_PER_THREAD} = {total} fwd+bwd calls over {len(MIXED)} "
          f"configurations; plans built {stats.builds}, loaded {stats.loads}, misses {stats.misses}, hits {stats.hits}")  # fmt: skip
    assert not errors, "\n".join(errors)
    assert total == N_THREADS * CALLS_PER_THREAD
    mismatches = [(t, MIXED[picks[k][0]].name, picks[k][1]) for t, (picks, bad) in results.items() for k in bad]
    assert not mismatches, (
        f"{len(mismatches)} of {total} threaded calls differ bit-wise from the single-threaded run "
        f"(thread, configuration, input set): {mismatches[:20]}"
    )
    assert stats.builds + stats.loads == n_plans, f"expected {n_plans} plans (fwd + bwd of {len(MIXED)}), got {stats}"
    assert stats.misses == n_plans and stats.build_failures == 0, f"each plan must be missed and built once: {stats}"


# ------------------------------------------------------------------ one plan, 8 threads at once
@pytest.mark.parametrize("streams", ["own_streams", "one_stream"])
@pytest.mark.parametrize("mode", ["as_built", "ordered", "public"])
def test_threads_launch_one_plan_at_the_same_moment(mode, streams):
    """8 threads launch the same forward and backward plans together (a barrier before every
    iteration), each on its own stream or all on the default stream. Fails if any launch gives
    a result that differs bit-wise from the single-threaded one or raises: then sharing a built
    plan across threads is unsafe in this launch mode, and te_cudnn must give each thread its own
    plan object or serialise launches with a lock."""
    b, h, s, d = 2, 3, 320, 64  # a shape no other test uses: its plans are this test's own
    layout = "bshd_bshd_bshd"
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = make_qkv(QKVLayout[layout], b, h, h, s, s, d, generator=gen)
    d_o = torch.randn(q.shape, generator=gen, device="cuda").to(q.dtype)
    cu = _cu([s] * b)
    kw = dict(qkv_layout=layout, attn_mask_type="causal")

    def call() -> list[torch.Tensor]:
        out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
        dq, dk, dv, _, _ = tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, q.dtype, aux, None, deterministic=True, **kw)
        return [out, aux[0], dq, dk, dv]

    want = call()
    torch.cuda.synchronize()
    shape = dict(b=b, h=h, sq=s, d_qk=d)
    plans = _plans("fwd", layout, is_training=True, **shape) + _plans("bwd", layout, deterministic=True, **shape)
    assert len(plans) == 2, [str(p.key) for p in plans]
    saved = [p.launch.mode for p in plans]
    if mode != "as_built":
        needs = {"ordered": "_schema", "public": "graph"}[mode]
        if not all(hasattr(p.launch, needs) for p in plans):
            pytest.skip(f"these plans' launchers have no {mode} path (modes {saved})")
    barrier = threading.Barrier(N_THREADS)
    bad: dict[int, list] = {}

    def worker(t: int) -> None:
        try:
            stream = torch.cuda.Stream() if streams == "own_streams" else torch.cuda.current_stream()
            flags = []
            with torch.cuda.stream(stream):
                for _ in range(SHARED_PLAN_ITERS):
                    barrier.wait(timeout=60)
                    flags.append(_differs(call(), want))
                flagged = torch.stack(flags)
            stream.synchronize()
            bad[t] = flagged.nonzero().flatten().tolist()
        except BaseException:
            barrier.abort()  # the other threads stop waiting for this one
            raise

    try:
        if mode != "as_built":
            for p in plans:
                p.launch.mode = mode
        errors = _run_threads(N_THREADS, worker)
    finally:
        for p, m in zip(plans, saved):
            p.launch.mode = m
    assert not errors, "\n".join(errors)
    n_bad = sum(len(v_) for v_ in bad.values())
    assert len(bad) == N_THREADS and n_bad == 0, (
        f"{n_bad} of {N_THREADS * SHARED_PLAN_ITERS} concurrent launches of one shared plan (launch mode "
        f"{mode if mode != 'as_built' else saved}) differ from the single-threaded result (iterations per thread: "
        f"{bad}): sharing a built plan across threads is not safe here; use per-thread plan objects or a launch lock"
    )


# ------------------------------------------------------------------ streams
SLEEP_MS = 300


def test_calls_on_two_streams_run_in_each_streams_order_without_host_sync():
    """On each of two streams: a 300 ms GPU sleep, then a write of new q values, then forward and
    deterministic backward; only that stream is synchronised before its results are checked
    against the same calls made beforehand on the new values. A call that ran on another stream
    (or the default one) would have read q before the write and differ. The host must have
    queued all of it before either sleep ended (no host sync)."""
    b, h, s, d = 2, 4, 256, 64
    layout = "bshd_bshd_bshd"
    gen = torch.Generator(device="cuda").manual_seed(21)
    q_old, k, v = make_qkv(QKVLayout[layout], b, h, h, s, s, d, generator=gen)
    new = [torch.randn(q_old.shape, generator=gen, device="cuda").to(q_old.dtype) for _ in range(2)]
    d_o = torch.randn(q_old.shape, generator=gen, device="cuda").to(q_old.dtype)
    cu = _cu([s] * b)
    kw = dict(qkv_layout=layout, attn_mask_type="causal")

    def call(q: torch.Tensor) -> list[torch.Tensor]:
        out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)
        dq, dk, dv, _, _ = tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, q.dtype, aux, None, deterministic=True, **kw)
        return [out, aux[0], dq, dk, dv]

    expected = [call(n) for n in new]
    stale = call(q_old)
    buffers = [q_old.clone() for _ in new]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    _cycles_per_ms()
    torch.cuda.synchronize()
    assert not torch.equal(stale[0], expected[0][0]) and not torch.equal(expected[0][0], expected[1][0])

    got = []
    t0 = time.perf_counter()
    for stream, buf, n in zip(streams, buffers, new):
        with torch.cuda.stream(stream):
            _sleep(SLEEP_MS)
            buf.copy_(n)
            got.append(call(buf))
    host_ms = (time.perf_counter() - t0) * 1e3
    still_busy = [not stream.query() for stream in streams]
    for i, (stream, results, want) in enumerate(zip(streams, got, expected)):
        stream.synchronize()  # this stream only
        for name, a, w in zip(("O", "stats", "dQ", "dK", "dV"), results, want):
            assert torch.equal(a, w), (
                f"stream {i}: {name} differs from the result on the new inputs; the call did not run in the "
                f"current stream's order (it read q before the stream wrote it)"
            )
    assert all(still_busy) and host_ms < SLEEP_MS / 2, (
        f"queuing took {host_ms:.1f} ms (streams still busy: {still_busy}); a call waited for the GPU"
    )


def test_two_streams_never_share_a_workspace():
    """Backward plans with a workspace (deterministic, long sequence) run interleaved on two
    streams; the grid is small (b=1, h=2), so the two streams' kernels run concurrently. Every
    launch's workspace is recorded: the two streams' workspaces must never overlap in memory,
    and every result must equal the single-stream one bit for bit."""
    b, h, s, d = 1, 2, 4096, 64
    layout = "bshd_bshd_bshd"
    gen = torch.Generator(device="cuda").manual_seed(31)
    q, k, v = make_qkv(QKVLayout[layout], b, h, h, s, s, d, generator=gen)
    d_o = torch.randn(q.shape, generator=gen, device="cuda").to(q.dtype)
    cu = _cu([s] * b)
    kw = dict(qkv_layout=layout, attn_mask_type="no_mask")
    out, aux = tc.fused_attn_fwd(True, s, s, cu, cu, q, k, v, q.dtype, None, **kw)

    def bwd() -> list[torch.Tensor]:
        return tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, q.dtype, aux, None, deterministic=True, **kw)[:3]

    want = bwd()
    torch.cuda.synchronize()
    plans = _plans("bwd", layout, b=b, h=h, sq=s, d_qk=d, deterministic=True)
    assert len(plans) == 1 and plans[0].workspace_size > 0, [(str(p.key), p.workspace_size) for p in plans]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    marks = {(i, what): torch.cuda.Event(enable_timing=True) for i in range(2) for what in ("start", "end")}
    base = torch.cuda.Event(enable_timing=True)
    _cycles_per_ms()
    got: list[list] = [[], []]
    with _recording(plans) as (rec,):
        base.record()
        for stream in streams:  # both streams start their backward runs at the same moment
            with torch.cuda.stream(stream):
                _sleep(50)
        for it in range(20):
            for i, stream in enumerate(streams):
                with torch.cuda.stream(stream):
                    if it == 0:
                        marks[i, "start"].record()
                    got[i].append(bwd())
        for i, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                marks[i, "end"].record()
    torch.cuda.synchronize()
    raw = [s_.cuda_stream for s_ in streams]
    spans = {i: {(ptr, ptr + n) for _, st, ptr, n, _ in rec.calls if st == raw[i]} for i in range(2)}
    assert spans[0] and spans[1], f"launches not seen on both streams: {rec.calls[:4]}"
    shared = [(a, b_) for a in spans[0] for b_ in spans[1] if a[0] < b_[1] and b_[0] < a[1]]
    assert not shared, f"the two streams' workspaces overlap in memory: {shared}"
    t = {key: base.elapsed_time(ev) for key, ev in marks.items()}
    overlap = min(t[0, "end"], t[1, "end"]) - max(t[0, "start"], t[1, "start"])
    assert overlap > 0, f"precondition: the two streams' backward runs did not overlap in time ({t})"
    for i in range(2):
        for it, grads in enumerate(got[i]):
            for name, a, w in zip(("dQ", "dK", "dV"), grads, want):
                assert torch.equal(a, w), f"stream {i}, iteration {it}: {name} differs (overlap {overlap:.2f} ms)"


# ------------------------------------------------------------------ no host sync
def _no_sync_case(name: str) -> Callable[[], object]:
    """A forward + backward (or forward-only) call of one kind, on fixed inputs."""
    gen = torch.Generator(device="cuda").manual_seed(41)
    b, h, s, d = 3, 4, 256, 64

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)

    layout, mask, training, backend, bias, lengths, extra = "bshd_bshd_bshd", "causal", True, None, None, None, {}
    if name == "bias":
        mask, bias = "no_mask", rand(1, h, s, s)
    elif name == "bias-unaligned":  # skv = 100: rows of 200 bytes; te_cudnn copies it into an aligned buffer
        s, mask = 100, "no_mask"
        bias = rand(1, h, s, s)
    elif name == "padding":
        mask, lengths = "padding_causal", [256, 100, 0]
    elif name == "thd":
        layout, mask, lengths = "thd_thd_thd", "padding_causal", [100, 72, 128]
    elif name == "dropout":
        extra = dict(dropout=0.1)
    elif name == "max512":
        backend, s = tc.FusedAttnBackend.F16_max512_seqlen, 128
    elif name == "inference":
        training = False
    if layout == "thd_thd_thd":
        q, k, v = (rand(sum(lengths), h, d) for _ in range(3))
    else:
        q, k, v = (rand(b, s, h, d) for _ in range(3))
    cu = _cu(lengths if lengths else [s] * b)
    d_o = rand(*q.shape)
    bias_type = "no_bias" if bias is None else "post_scale_bias"
    kw = dict(qkv_layout=layout, attn_mask_type=mask, attn_bias_type=bias_type, **extra)
    rng = torch.Generator(device="cuda").manual_seed(5)

    def call():
        fwd_kw = dict(kw, rng_gen=rng) if "dropout" in kw else kw
        out, aux = tc.fused_attn_fwd(training, s, s, cu, cu, q, k, v, q.dtype, backend, attn_bias=bias, **fwd_kw)
        if not training:
            return out
        return tc.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, q.dtype, aux, backend, **kw)

    return call


@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature")
@pytest.mark.parametrize("name", ["dense", "inference", "bias", "bias-unaligned", "padding", "thd", "dropout", "max512"])
def test_cached_calls_never_wait_for_the_gpu(name):
    """With a 300 ms GPU sleep queued on the current stream, 10 cached forward + backward calls
    must be queued behind it without the host ever waiting: the sleep is still running when
    the last call returns and the host time is far below the sleep. torch's sync-debug mode
    ("error") additionally turns torch's own synchronising calls into errors. The building
    calls happen before the measured region."""
    call = _no_sync_case(name)
    for _ in range(2):  # build the plans, size the workspaces, warm the caching allocator
        call()
    _cycles_per_ms()
    torch.cuda.synchronize()
    _sleep(SLEEP_MS)
    asleep = torch.cuda.Event()
    asleep.record()
    torch.cuda.set_sync_debug_mode("error")
    try:
        t0 = time.perf_counter()
        for _ in range(10):
            result = call()
        host_ms = (time.perf_counter() - t0) * 1e3
    finally:
        torch.cuda.set_sync_debug_mode("default")
    sleep_still_running = not asleep.query()
    torch.cuda.synchronize()
    assert result is not None
    assert sleep_still_running and host_ms < SLEEP_MS / 2, (
        f"{name}: 10 cached calls took {host_ms:.1f} ms of host time behind a {SLEEP_MS} ms GPU sleep "
        f"(sleep still running afterwards: {sleep_still_running}); a call synchronised with the GPU"
    )


# ------------------------------------------------------------------ handles of finished threads
def _small_call_factory():
    b, h, s, d = 2, 5, 144, 64  # a shape no other test uses
    q, k, v = make_qkv(QKVLayout.bshd_bshd_bshd, b, h, h, s, s, d, generator=torch.Generator(device="cuda").manual_seed(51))
    cu = _cu([s] * b)

    def call() -> torch.Tensor:
        return tc.fused_attn_fwd(False, s, s, cu, cu, q, k, v, q.dtype, None, qkv_layout="bshd_bshd_bshd",
                                 attn_mask_type="causal")[0]  # fmt: skip

    return call, (b, h, s, d)


def _in_thread(fn):
    out = {}

    def run():
        with torch.cuda.stream(torch.cuda.Stream()):
            out["value"] = fn()
            torch.cuda.current_stream().synchronize()

    errors = _run_threads(1, lambda _: run())
    assert not errors, "\n".join(errors)
    return out["value"]


def test_finished_threads_hand_their_cudnn_handle_to_the_next_thread():
    """20 short-lived threads one after another each make a call: they all reuse the handle the
    first one gave back when it ended (no handle per thread left behind), and their results are
    right."""
    call, _ = _small_call_factory()
    device = torch.cuda.current_device()
    expected = call()
    _in_thread(call)  # a finished thread: its handle is now in the pool
    before = handles.handle_stats()[device]
    outs = [_in_thread(call) for _ in range(20)]
    after = handles.handle_stats()[device]
    assert after == before, f"handles before {before}, after 20 short-lived threads {after}: finished threads' handles leak"
    assert before["idle"] >= 1
    assert all(torch.equal(o, expected) for o in outs)


def test_release_workspaces_hands_this_threads_handle_back_and_drops_it():
    """After te_cudnn.release_workspaces() the calling thread's handle is back in the pool and the
    launch path no longer uses it: a worker thread that takes it from the pool and the calling
    thread's next call must launch with different handles (two threads never share one)."""
    call, (b, h, s, d) = _small_call_factory()
    device = torch.cuda.current_device()
    expected = call()
    torch.cuda.synchronize()
    plans = _plans("fwd", "bshd_bshd_bshd", b=b, h=h, sq=s, d_qk=d, is_training=False)
    assert len(plans) == 1
    mine = handles.handle_for(device)
    idle_before = handles.handle_stats()[device]["idle"]
    tc.release_workspaces()
    idle = handles.handle_stats()[device]["idle"]
    assert idle == idle_before + 1, f"release_workspaces() must release this thread's handle (idle {idle_before} -> {idle})"
    taken, go_on = threading.Event(), threading.Event()
    worker_handle = {}

    def worker(_):
        # on the calling thread's stream (the default one): a launch path that kept the released
        # handle would find it still bound to that stream and use it
        with _recording(plans) as (rec,):
            o = call()
        torch.cuda.current_stream().synchronize()
        worker_handle["h"], worker_handle["ok"] = rec.calls[-1][4], torch.equal(o, expected)
        taken.set()
        go_on.wait(timeout=60)  # keep holding the handle while the main thread calls

    t = threading.Thread(target=lambda: worker(0))
    t.start()
    try:
        assert taken.wait(timeout=60), "worker did not finish its call"
        with _recording(plans) as (rec,):
            again = call()
        torch.cuda.synchronize()
    finally:
        go_on.set()
        t.join()
    assert worker_handle["ok"] and torch.equal(again, expected)
    assert worker_handle["h"] is mine, "precondition: the worker took the released handle from the pool (LIFO)"
    assert rec.calls[-1][4] is not mine, "the calling thread still launches with the handle it released"
