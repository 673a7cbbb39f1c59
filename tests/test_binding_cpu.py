"""What ``fused_attn_fwd`` / ``fused_attn_bwd`` bind, operand by operand, checked against the
sub-backend's own graph operands (``operand_uids``) for every kind of call: plain and general
paths, padding masks, THD, paged caches, bias, dropout, sinks, the max logit, FP8 and max512.

CPU tensors, no GPU: the real validation, selection and plan keys run; only the plan (a stand-in
with no engine) and the launch (which records the tensors it is given) are replaced. Each bound
tensor must be the one its uid names: the caller's q/k/v/bias/page tables/FP8 metadata slots
(by identity or address), the returned results, the dropout state's seed and offset, and lengths
and ragged offsets with the values of the call's ``cu_seqlens``."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Optional

import pytest
import torch

from te_cudnn import first_call, launchers, ops
from te_cudnn import varlen
from te_cudnn.backends import Direction, Uid
from te_cudnn.enums import META_DO, META_DP, META_DQKV, META_O, META_QKV, META_S, FusedAttnBackend, QKVLayout
from te_cudnn.runtime import RuntimeEnv
from te_cudnn.testing import make_qkv

#: Hopper with a cuDNN that serves every feature here (the max logit needs >= 9.21)
ENV = RuntimeEnv(sm=90, cudnn_version=92100, device_name="Hopper (assumed)")
B, H, S, D = 2, 4, 64, 64
FP8 = torch.float8_e4m3fn


@dataclass
class Case:
    layout: str = "bshd_bshd_bshd"
    mask: str = "no_mask"
    hg: int = H
    d: int = D
    s: int = S  # sq = skv
    dtype: torch.dtype = torch.bfloat16
    dropout: float = 0.0
    bias: bool = False
    softmax_type: str = "vanilla"
    offset: bool = False  # pass a softmax_offset (else off_by_one binds zeros)
    max_logit: bool = False
    backend: Optional[FusedAttnBackend] = None
    training: bool = True
    plain: bool = False  # the call takes plain_fwd / plain_bwd
    extra: dict = field(default_factory=dict)


CASES = {
    "plain bshd no_mask": Case(plain=True),
    "plain sbh3d causal dropout": Case(layout="sbh3d", mask="causal", dropout=0.1, plain=True),
    "padding bshd gqa": Case(mask="padding", hg=2),
    "padding_causal sbhd dropout": Case(layout="sbhd_sbhd_sbhd", mask="padding_causal", dropout=0.1),
    "thd padding_causal": Case(layout="thd_thd_thd", mask="padding_causal"),
    "t3hd padding": Case(layout="t3hd", mask="padding"),
    "bias no_mask": Case(bias=True),
    "bias causal dropout": Case(mask="causal", bias=True, dropout=0.1),
    "sink off_by_one": Case(mask="causal", softmax_type="off_by_one"),
    "sink learnable dropout": Case(softmax_type="learnable", offset=True, dropout=0.1),
    "max logit padding": Case(mask="padding", max_logit=True, training=False),
    "paged padding": Case(layout="paged_kv_bshd_bshd_bshd", mask="padding", training=False),
    "fp8 causal": Case(dtype=FP8, d=128, mask="causal"),
    "fp8 padding": Case(dtype=FP8, d=128, mask="padding"),
    "max512 causal": Case(mask="causal", backend=FusedAttnBackend.F16_max512_seqlen),
    "max512 bias no_mask": Case(bias=True, s=128, backend=FusedAttnBackend.F16_max512_seqlen),
}

LENS = [40, 64]  # per-sequence lengths of the padding masks (the second fills its rows)


@pytest.fixture
def launches(monkeypatch):
    """The tensors each launch is given (a launch with ``rng_state`` binds its seed and offset
    after them, as launch.execute does), with plan building and the device stood in."""
    calls: list[list[torch.Tensor]] = []

    def execute(plan, buffers, device, checked=(), rng_state=None):
        calls.append(list(buffers) + (list(ops._seed_offset(rng_state)) if rng_state is not None else []))

    plan = SimpleNamespace(launch=SimpleNamespace(mode="ordered"), tuning=None, evicted=False, hits=0, last_used=0,
                           workspace_size=0)  # fmt: skip
    monkeypatch.setattr(first_call, "_require_cuda", lambda cfg, q: ENV)
    monkeypatch.setattr(varlen, "current_raw_stream", lambda index: 0)
    monkeypatch.setattr(ops._Prepared, "get_plan", lambda self: plan)
    monkeypatch.setattr(launchers, "_execute", execute)
    ops.forget_prepared()
    varlen.clear()
    yield calls
    ops.forget_prepared()
    varlen.clear()


def _meta_tables(names: list[str]) -> dict[str, torch.Tensor]:
    return {n: torch.zeros(16, dtype=torch.float32) for n in names}


def _inputs(c: Case) -> dict[str, Any]:
    """q, k, v (+ page tables) and the call's keyword arguments."""
    kw: dict[str, Any] = {}
    paged = c.layout.startswith("paged")
    if paged:  # two pages of 32 tokens per sequence, pages in reverse order
        q = torch.zeros(B, c.s, H, c.d, dtype=c.dtype)
        k, v = (torch.zeros(2 * B, c.s // 2, c.hg, c.d, dtype=c.dtype) for _ in range(2))
        table = torch.arange(2 * B, dtype=torch.int32).flip(0).view(B, 2).contiguous()
        kw.update(page_table_k=table, page_table_v=table.clone())
    else:
        q, k, v = make_qkv(QKVLayout.coerce(c.layout), B, H, c.hg, c.s, c.s, c.d, dtype=c.dtype, device="cpu")
    thd = "t" in c.layout.split("_")[0] and not paged
    if c.mask.startswith("padding") or thd:
        lens = LENS if not thd else [c.s] * B
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    else:
        cu = torch.arange(0, (B + 1) * c.s, c.s, dtype=torch.int32)
    kw.update(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    if c.bias:
        kw.update(attn_bias_type="post_scale_bias", attn_bias=torch.zeros(1, H, c.s, c.s, dtype=c.dtype))
    if c.dropout:
        kw.update(dropout=c.dropout, rng_state=torch.tensor([1234, 16], dtype=torch.int64))
    if c.softmax_type != "vanilla":
        kw["softmax_type"] = c.softmax_type
        if c.offset:
            kw["softmax_offset"] = torch.zeros(1, H, 1, 1, dtype=torch.float32)
    if c.dtype == FP8:
        kw.update(_meta_tables(["d_scale_qkv", "d_scale_s", "q_scale_s", "q_scale_o", "amax_s", "amax_o"]))
    return kw


def _expect_runtime(c: Case, cfg, kw: dict) -> dict[int, Callable[[torch.Tensor], bool]]:
    """Lengths and ragged offsets: the cu_seqlens' values, continued over a bucket's padding."""
    cu = kw["cu_seqlens_q"]
    ext = torch.cat((cu, cu[-1:].expand(cfg.b + 1 - cu.shape[0])))
    lens = (ext[1:] - ext[:-1]).view(cfg.b, 1, 1, 1)

    def equal(expected):
        return lambda t: t.dtype == expected.dtype and torch.equal(t.reshape(expected.shape), expected)

    per_token = {Uid.RAGGED_Q: kw["q"].stride(0), Uid.RAGGED_K: kw["k"].stride(0), Uid.RAGGED_V: kw["v"].stride(0),
                 Uid.RAGGED_O: H * c.d, Uid.RAGGED_STATS: H}  # fmt: skip
    out = {Uid.SEQ_LEN_Q: equal(lens), Uid.SEQ_LEN_KV: equal(lens)}
    out.update({u: equal(ext.to(torch.int64) * n) for u, n in per_token.items()})
    if cfg.paged is not None:
        out[Uid.PAGE_TABLE_K] = lambda t: t.data_ptr() == kw["page_table_k"].data_ptr()
        out[Uid.PAGE_TABLE_V] = lambda t: t.data_ptr() == kw["page_table_v"].data_ptr()
    if c.backend == FusedAttnBackend.F16_max512_seqlen and not cfg.mask.is_padding:
        full = torch.full((cfg.b, 1, 1, 1), c.s, dtype=torch.int32)  # max512 binds the full lengths without a mask
        out[Uid.SEQ_LEN_Q] = out[Uid.SEQ_LEN_KV] = equal(full)
    return out


def _slot(table: torch.Tensor, offset: int) -> Callable[[torch.Tensor], bool]:
    return lambda t: tuple(t.shape) == (1, 1, 1, 1) and t.data_ptr() == table.data_ptr() + 4 * offset


def _check(uids: tuple, bound: list[torch.Tensor], expect: dict[int, Callable[[torch.Tensor], bool]]) -> None:
    names = [Uid.NAMES[u] for u in uids]
    assert len(bound) == len(uids), f"{len(bound)} tensors bound for the graph's {len(uids)} operands {names}"
    wrong = [Uid.NAMES[u] for u, t in zip(uids, bound) if not expect[u](t)]
    assert not wrong, f"operands bound with the wrong tensor: {wrong} (graph order {names})"


def _rng(kw: dict) -> dict[int, Callable[[torch.Tensor], bool]]:
    state = kw.get("rng_state")
    if state is None:
        return {}
    return {Uid.SEED: lambda t: t.data_ptr() == state.data_ptr(), Uid.OFFSET: lambda t: t.data_ptr() == state.data_ptr() + 8}


def _forward(c: Case, kw: dict) -> tuple:
    seen: list = []
    res = ops.fused_attn_fwd(c.training, c.s, c.s, kw.pop("cu_seqlens_q"), kw.pop("cu_seqlens_kv"), kw.pop("q"),
                             kw.pop("k"), kw.pop("v"), None, c.backend, qkv_layout=c.layout, attn_mask_type=c.mask,
                             return_max_logit=c.max_logit, _prepared=seen, **kw)  # fmt: skip
    return res, seen[0]


@pytest.mark.parametrize("name", list(CASES))
def test_forward_binds_each_operand_its_graph_names(name, launches):
    c = CASES[name]
    kw = _inputs(c)
    call = dict(kw)
    (out, aux, *maybe_max), prep = _forward(c, kw)
    cfg = prep.cfg
    assert prep.plain == c.plain
    if c.backend is not None:
        assert prep.backend.enum == c.backend
    uids = prep.backend.operand_uids(cfg, Direction.FWD)
    expect: dict[int, Callable[[torch.Tensor], bool]] = {
        Uid.Q: lambda t: t is call["q"], Uid.K: lambda t: t is call["k"], Uid.V: lambda t: t is call["v"],
        Uid.O: lambda t: t is out, Uid.STATS: lambda t: t is aux[0],
        Uid.MAX: lambda t: t.shape == aux[0].shape and t.dtype == torch.float32 and t is not aux[0],
        **_rng(call), **_expect_runtime(c, cfg, call),
    }  # fmt: skip
    if c.bias:
        expect[Uid.BIAS] = lambda t: t is call["attn_bias"]
    if cfg.has_sink:
        sink = call.get("softmax_offset", prep.zero_sink)
        expect[Uid.SINK] = lambda t: t is sink
        assert aux[-1] is sink  # it rides along for the backward
    if c.dtype == FP8:
        for u, (n, off) in {Uid.DESCALE_Q: ("d_scale_qkv", META_QKV), Uid.DESCALE_K: ("d_scale_qkv", META_QKV),
                            Uid.DESCALE_V: ("d_scale_qkv", META_QKV), Uid.DESCALE_S: ("d_scale_s", META_S),
                            Uid.SCALE_S: ("q_scale_s", META_S), Uid.SCALE_O: ("q_scale_o", META_O),
                            Uid.AMAX_S: ("amax_s", META_S), Uid.AMAX_O: ("amax_o", META_O)}.items():  # fmt: skip
            expect[u] = _slot(call[n], off)
    assert len(launches) == 1
    _check(uids, launches[0], expect)
    assert bool(maybe_max) == c.max_logit
    if c.dropout:
        assert aux[1] is call["rng_state"]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.training])
def test_backward_binds_each_operand_its_graph_names(name, launches):
    c = CASES[name]
    kw = _inputs(c)
    call = dict(kw)
    (out, aux), _ = _forward(c, kw)
    d_o = torch.zeros_like(out)
    bwd_meta = _meta_tables(["d_scale_qkv", "d_scale_s", "d_scale_o", "d_scale_do", "d_scale_dp", "q_scale_s",
                             "q_scale_dp", "q_scale_dqkv", "amax_dp", "amax_dqkv"]) if c.dtype == FP8 else {}  # fmt: skip
    seen: list = []
    opts = {n: call[n] for n in ("attn_bias_type", "dropout", "softmax_type") if n in call}
    grads = ops.fused_attn_bwd(c.s, c.s, call["cu_seqlens_q"], call["cu_seqlens_kv"], call["q"], call["k"], call["v"], out,
                               d_o, None, aux, c.backend, qkv_layout=c.layout, attn_mask_type=c.mask, _prepared=seen,
                               **opts, **bwd_meta)  # fmt: skip
    prep = seen[0]
    cfg = prep.cfg
    assert prep.plain == c.plain
    uids = prep.backend.operand_uids(cfg, Direction.BWD)
    dq, dk, dv, dbias, d_sink = (grads + [None])[:5]
    rng = _rng({"rng_state": aux[1]} if c.dropout else {})
    expect: dict[int, Callable[[torch.Tensor], bool]] = {
        Uid.Q: lambda t: t is call["q"], Uid.K: lambda t: t is call["k"], Uid.V: lambda t: t is call["v"],
        Uid.O: lambda t: t is out, Uid.STATS: lambda t: t is aux[0], Uid.DO: lambda t: t is d_o,
        Uid.DQ: lambda t: t.data_ptr() == dq.data_ptr() and t.shape == dq.shape,
        Uid.DK: lambda t: t.data_ptr() == dk.data_ptr() and t.shape == dk.shape,
        Uid.DV: lambda t: t.data_ptr() == dv.data_ptr() and t.shape == dv.shape,
        Uid.DS: lambda t: tuple(t.shape) == (cfg.b, H, c.s, c.s) and t.dtype == cfg.dtype,  # max512's scratch
        **rng, **_expect_runtime(c, cfg, call),
    }  # fmt: skip
    if c.bias:
        expect[Uid.BIAS] = lambda t: t is call["attn_bias"]
        expect[Uid.DBIAS] = lambda t: dbias is not None and t.data_ptr() == dbias.data_ptr()
    if cfg.has_sink:
        expect[Uid.SINK] = lambda t: t is aux[prep.sink_index]
        expect[Uid.DSINK] = lambda t: d_sink is not None and t is d_sink
    if c.dtype == FP8:
        slots = {Uid.DESCALE_Q: ("d_scale_qkv", META_QKV), Uid.DESCALE_K: ("d_scale_qkv", META_QKV),
                 Uid.DESCALE_V: ("d_scale_qkv", META_QKV), Uid.DESCALE_O: ("d_scale_o", META_O),
                 Uid.DESCALE_DO: ("d_scale_do", META_DO), Uid.DESCALE_S: ("d_scale_s", META_S),
                 Uid.DESCALE_DP: ("d_scale_dp", META_DP), Uid.SCALE_S: ("q_scale_s", META_S),
                 Uid.SCALE_DQ: ("q_scale_dqkv", META_DQKV), Uid.SCALE_DK: ("q_scale_dqkv", META_DQKV),
                 Uid.SCALE_DV: ("q_scale_dqkv", META_DQKV), Uid.SCALE_DP: ("q_scale_dp", META_DP),
                 Uid.AMAX_DP: ("amax_dp", META_DP)}  # fmt: skip
        expect.update({u: _slot(bwd_meta[n], off) for u, (n, off) in slots.items()})
        tables = [t.data_ptr() for t in bwd_meta.values()]
        for u in (Uid.AMAX_DQ, Uid.AMAX_DK, Uid.AMAX_DV):  # scratch rows, reduced into amax_dqkv afterwards
            expect[u] = lambda t: tuple(t.shape) == (1, 1, 1, 1) and not any(p <= t.data_ptr() < p + 64 for p in tables)
    assert len(launches) == 2
    _check(uids, launches[1], expect)
