"""The operand check (``TE_CUDNN_CHECK_OPERANDS=1``, ``te_cudnn.launch.check_operands``) on the CPU.

Real graphs are built by the sub-backends' builders and validated by the cuDNN frontend (no GPU
needed); CPU tensors laid out as te_cudnn's callers and launch paths lay them out (q, k, v from
``te_cudnn.testing.make_qkv``, gradients from ``te_cudnn.layouts.alloc_qkv_grads``, FP8 scales
from ``te_cudnn.ops.fp8_fwd_operands``, dropout's seed and offset from ``launch.seed_offset``,
lengths as ``te_cudnn.varlen`` derives them) must agree with what each graph declares for every
uid; the same bindings with one operand of other strides, dtype, shape or alignment must not,
and the error names the operand with the declared and the bound geometry. With the mode on,
``execute`` and ``launch`` raise before anything runs; the declarations of a plan loaded from
the plan store (which carries no tensor descriptions) come from its builder and agree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from array import array
from typing import Any, Optional

import pytest
import torch

from te_cudnn import launch
from te_cudnn.backends import BY_ENUM, Direction, Uid
from te_cudnn.config import describe_bwd, describe_fwd
from te_cudnn.enums import META_DO, META_DP, META_DQKV, META_O, META_QKV, META_S, FusedAttnBackend, QKVFormat, QKVLayout
from te_cudnn.launch import check_bound, declared_in_graph, declared_operands, operand_mismatches, seed_offset
from te_cudnn.layouts import alloc_qkv_grads, layout_info
from te_cudnn.ops import fp8_bwd_operands, fp8_fwd_operands
from te_cudnn.plans import CompiledPlan, make_key
from te_cudnn.runtime import cudnn_module, frontend_version
from te_cudnn.testing import make_qkv

F16 = BY_ENUM[FusedAttnBackend.F16_arbitrary_seqlen]
MAX512 = BY_ENUM[FusedAttnBackend.F16_max512_seqlen]
FP8 = BY_ENUM[FusedAttnBackend.FP8]
BF16, F32, I32, I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.fixture(autouse=True)
def _restore_mode():
    before = launch.checking_operands()
    yield
    launch.check_operands(before)


# ------------------------------------------------------------------------------ bindings


def _cu(lengths: list[int]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=I32)


def _lens(cu: torch.Tensor, batch: int) -> torch.Tensor:
    """Per-sequence lengths [batch, 1, 1, 1] as te_cudnn.varlen derives them from cu_seqlens."""
    return torch.diff(cu.view(-1, 1, 1, 1), dim=0)[:batch].contiguous()


class Call:
    """A call's configurations (forward, backward) and its operands by uid, allocated or viewed
    the way te_cudnn's launch paths bind them."""

    def __init__(self, layout: str, mask: str, *, b: int = 2, h: int = 4, hg: int = 2, sq: int = 64, skv: int = 64,
                 d: int = 64, dtype: torch.dtype = BF16, bias: bool = False, dropout: float = 0.0,
                 softmax: str = "vanilla", qkv: Optional[tuple] = None) -> None:  # fmt: skip
        self.layout = QKVLayout[layout]
        info = layout_info(self.layout)
        q, k, v = qkv or make_qkv(self.layout, b, h, hg, sq, skv, d, dtype=dtype, device="cpu")
        padding = "padding" in mask or info.q_format == QKVFormat.thd
        cu_q, cu_kv = (_cu([sq] * b), _cu([skv] * b)) if padding else (None, None)
        attn_bias = torch.zeros(1, h, sq, skv, dtype=dtype) if bias else None
        sink = torch.zeros(1, h, 1, 1, dtype=F32) if softmax == "learnable" else None
        self.fwd = describe_fwd(
            is_training=True, max_seqlen_q=sq, max_seqlen_kv=skv, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, q=q, k=k,
            v=v, qkv_dtype=dtype, attn_bias=attn_bias, attn_scale=None, dropout=dropout, qkv_layout=self.layout,
            attn_bias_type="post_scale_bias" if bias else "no_bias", attn_mask_type=mask, softmax_type=softmax,
            window_size=(-1, -1), bottom_right_diagonal=None, softmax_offset=sink,
        )  # fmt: skip
        cfg = self.fwd
        o = torch.empty((*q.shape[:-1], cfg.d_v), dtype=dtype)  # results in q's format, contiguous
        stats = torch.empty((q.shape[0], h, 1) if cfg.ragged_q else (b, h, sq, 1), dtype=F32)
        rng = torch.zeros(2, dtype=I64)
        aux = [stats, rng] + ([attn_bias] if bias else []) + ([sink] if sink is not None else [])
        self.bwd, *_ = describe_bwd(cfg, q=q, o=o, d_o=torch.empty_like(o), aux_ctx_tensors=aux, deterministic=False)
        dq, dk, dv = alloc_qkv_grads(self.layout, q, k, v)
        seed, offset = seed_offset(rng)
        self.operands: dict[int, Any] = {
            Uid.Q: q, Uid.K: k, Uid.V: v, Uid.O: o, Uid.STATS: stats, Uid.DO: torch.empty_like(o), Uid.DQ: dq,
            Uid.DK: dk, Uid.DV: dv, Uid.SEED: seed, Uid.OFFSET: offset, Uid.BIAS: attn_bias,
            Uid.DBIAS: None if attn_bias is None else torch.empty(attn_bias.shape, dtype=dtype),
            Uid.SINK: sink, Uid.DSINK: None if sink is None else torch.zeros_like(sink),
        }  # fmt: skip
        batch = cfg.b  # the graph's batch (bucketed when every side is THD): the runtime buffers' size
        if padding:  # cu_seqlens continued with their last value over the bucket's empty sequences
            for uid, cu in ((Uid.SEQ_LEN_Q, cu_q), (Uid.SEQ_LEN_KV, cu_kv)):
                self.operands[uid] = _lens(torch.cat([cu, cu[-1:].expand(batch + 1 - cu.shape[0])]), batch)
        offsets = torch.zeros(5, batch + 1, 1, 1, 1, dtype=I64).unbind(0)  # as varlen's one multiply gives them
        for uid, t in zip((Uid.RAGGED_Q, Uid.RAGGED_K, Uid.RAGGED_V, Uid.RAGGED_O, Uid.RAGGED_STATS), offsets):
            self.operands[uid] = t

    def spec(self, direction: Direction, backend=F16):
        spec = backend.build(self.fwd if direction == Direction.FWD else self.bwd, direction)
        spec.graph.validate()
        return spec

    def buffers(self, uids, **replace: Any) -> list:
        """The operands of ``uids`` in order; ``replace``: operands by graph name (Uid.NAMES)."""
        by_name = {Uid.NAMES[u]: u for u in uids}
        ops = dict(self.operands)
        for name, t in replace.items():
            ops[by_name[name]] = t
        return [ops[u] for u in uids]


def _mixed_thd_bshd() -> Call:
    """thd_bshd_bshd: THD queries against a bshd cache (make_qkv makes no mixed formats)."""
    b, h, hg, sq, skv, d = 2, 4, 2, 48, 64, 64
    q = torch.empty(b * sq, h, d, dtype=BF16)
    k, v = torch.empty(b, skv, hg, d, dtype=BF16), torch.empty(b, skv, hg, d, dtype=BF16)
    return Call("thd_bshd_bshd", "padding_causal", b=b, h=h, hg=hg, sq=sq, skv=skv, d=d, qkv=(q, k, v))


CALLS = {
    "bshd-gqa-causal": lambda: Call("bshd_bshd_bshd", "causal"),
    "sbhd-no_mask-fp16": lambda: Call("sbhd_sbhd_sbhd", "no_mask", dtype=torch.float16),
    "sbh3d-packed": lambda: Call("sbh3d", "causal", hg=4),
    "bs3hd-packed": lambda: Call("bs3hd", "causal", hg=4),
    "bshd_bs2hd": lambda: Call("bshd_bs2hd", "causal"),
    "sbhd_sbh2d-cross": lambda: Call("sbhd_sbh2d", "no_mask", sq=32, skv=96),
    "bshd-padding": lambda: Call("bshd_bshd_bshd", "padding_causal"),
    "bshd-bias": lambda: Call("bshd_bshd_bshd", "no_mask", hg=4, bias=True),
    "bshd-dropout": lambda: Call("bshd_bshd_bshd", "causal", dropout=0.1),
    "bshd-learnable-sink": lambda: Call("bshd_bshd_bshd", "causal", softmax="learnable"),
    "thd": lambda: Call("thd_thd_thd", "padding_causal"),
    "t3hd-packed": lambda: Call("t3hd", "padding", hg=4),
    "thd_bshd_bshd-mixed": _mixed_thd_bshd,
}


# ------------------------------------------------------------------------------ agreement


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
def test_bindings_agree_with_their_graphs(name: str, direction: Direction) -> None:
    call = CALLS[name]()
    spec = call.spec(direction)
    declared = declared_in_graph(spec.graph, spec.uids)
    assert declared is not None and [d.uid for d in declared] == list(spec.uids)
    assert all(d.dtype is not None for d in declared), "a validated graph declares every operand's dtype"
    assert operand_mismatches(declared, call.buffers(spec.uids)) == []
    if call.fwd.ragged_q:
        assert next(d for d in declared if d.uid == Uid.Q).ragged


def test_paged_decode_bindings_agree_and_a_strided_cache_seqlens_does_not() -> None:
    """A paged decode step as fused_attn_decode binds it: constant query lengths, cache_seqlens
    viewed as [b, 1, 1, 1], the page table as [b, 1, pages, 1] for K and for V. A column of an
    int32 [b, 2] table (stride 2) read in place would give cuDNN every other length: refused,
    naming cache_seqlens."""
    b, h, d = 3, 4, 64
    pool = torch.empty(8, 16, 2, d, dtype=BF16)
    table = torch.arange(6, dtype=I32).view(b, 2)
    q = torch.empty(b, 1, h, d, dtype=BF16)
    cfg = describe_fwd(is_training=False, max_seqlen_q=1, max_seqlen_kv=32, cu_seqlens_q=_cu([1] * b),
                       cu_seqlens_kv=_cu([20, 32, 5]), q=q, k=pool, v=pool.clone(), qkv_dtype=BF16, attn_bias=None,
                       attn_scale=None, dropout=0.0, qkv_layout="paged_kv_bshd_bshd_bshd", attn_bias_type="no_bias",
                       attn_mask_type="padding", softmax_type="vanilla", window_size=(-1, -1),
                       bottom_right_diagonal=None, page_table_k=table, page_table_v=table)  # fmt: skip
    spec = F16.build(cfg, Direction.FWD)
    spec.graph.validate()
    declared = declared_in_graph(spec.graph, spec.uids)
    lens2d = torch.zeros(b, 2, dtype=I32)
    ops = {Uid.Q: q, Uid.K: pool, Uid.V: pool, Uid.O: torch.empty_like(q),
           Uid.STATS: torch.empty(b, h, 1, 1, dtype=F32), Uid.SEQ_LEN_Q: torch.ones(b, 1, 1, 1, dtype=I32),
           Uid.SEQ_LEN_KV: lens2d[:, 0].contiguous().view(b, 1, 1, 1), Uid.PAGE_TABLE_K: table.view(b, 1, 2, 1),
           Uid.PAGE_TABLE_V: table.view(b, 1, 2, 1)}  # fmt: skip
    assert operand_mismatches(declared, [ops[u] for u in spec.uids]) == []
    strided = lens2d[:, 0].view(b, 1, 1, 1)
    assert strided.stride(0) == 2
    problems = operand_mismatches(declared, [strided if u == Uid.SEQ_LEN_KV else ops[u] for u in spec.uids])
    assert len(problems) == 1 and "cache_seqlens" in problems[0] and "geometry differs" in problems[0], problems
    assert "strides [1, 1, 1, 1]" in problems[0] and f"strides {list(strided.stride())}" in problems[0], problems
    transposed = torch.zeros(2, b, dtype=I32).t()[:, None, :, None]  # a column-major page table
    problems = operand_mismatches(declared, [transposed if u == Uid.PAGE_TABLE_K else ops[u] for u in spec.uids])
    assert len(problems) == 1 and problems[0].startswith("page_table_k (from page_table_k"), problems


def _fp8_call(d_o_dtype: torch.dtype = E5M2):
    b, h, s, d = 2, 4, 64, 128
    q, k, v = (torch.empty(b, s, h, d, dtype=E4M3) for _ in range(3))
    fwd = describe_fwd(is_training=True, max_seqlen_q=s, max_seqlen_kv=s, cu_seqlens_q=None, cu_seqlens_kv=None, q=q,
                       k=k, v=v, qkv_dtype=E4M3, attn_bias=None, attn_scale=None, dropout=0.0,
                       qkv_layout="bshd_bshd_bshd", attn_bias_type="no_bias", attn_mask_type="causal",
                       softmax_type="vanilla", window_size=(-1, -1), bottom_right_diagonal=None)  # fmt: skip
    o, stats = torch.empty(b, s, h, d, dtype=E4M3), torch.empty(b, h, s, 1, dtype=F32)
    d_o = torch.empty(b, s, h, d, dtype=d_o_dtype)
    bwd, *_ = describe_bwd(fwd, q=q, o=o, d_o=d_o, aux_ctx_tensors=[stats, torch.zeros(2, dtype=I64)],
                           deterministic=False)  # fmt: skip
    return fwd, bwd, (q, k, v, o, stats, d_o)


def test_fp8_bindings_agree_with_their_graphs() -> None:
    """FP8: the scaling operands are [1, 1, 1, 1] views of one slot of the fp32 metadata tables
    (4-byte aligned, not 16), the backward's gradients in dO's E5M2."""
    fwd, bwd, (q, k, v, o, stats, d_o) = _fp8_call()
    tables = [torch.ones(16, dtype=F32) for _ in range(10)]
    scales = fp8_fwd_operands(tables[0], META_QKV, tables[1], META_S, tables[2], META_S, tables[3], META_O, tables[4],
                              META_S, tables[5], META_O)  # fmt: skip
    spec = FP8.build(fwd, Direction.FWD)
    spec.graph.validate()
    declared = declared_in_graph(spec.graph, spec.uids)
    assert operand_mismatches(declared, [q, k, v, o, stats, *scales]) == []
    wrong = fp8_fwd_operands(tables[0].double(), META_QKV, *[x for t in tables[1:6] for x in (t, META_S)])
    problems = operand_mismatches(declared, [q, k, v, o, stats, *wrong])
    assert [p.split(" ")[0] for p in problems] == ["descale_q", "descale_k", "descale_v"], problems
    assert all("dtype differs" in p and "float64" in p for p in problems)

    dq, dk, dv = alloc_qkv_grads(bwd.layout, q, k, v, dtype=E5M2)
    amax3 = torch.empty(3, 1, 1, 1, dtype=F32)
    bwd_scales = fp8_bwd_operands(amax3, tables[0], META_QKV, tables[1], META_O, tables[2], META_DO, tables[3], META_S,
                                  tables[4], META_DP, tables[5], META_S, tables[6], META_DQKV, tables[7], META_DP,
                                  tables[8], META_DP)  # fmt: skip
    spec = FP8.build(bwd, Direction.BWD)
    spec.graph.validate()
    declared = declared_in_graph(spec.graph, spec.uids)
    assert operand_mismatches(declared, [q, k, v, o, stats, d_o, dq, dk, dv, *bwd_scales]) == []
    e4m3_grads = alloc_qkv_grads(bwd.layout, q, k, v)  # the forward's format, not dO's
    problems = operand_mismatches(declared, [q, k, v, o, stats, d_o, *e4m3_grads, *bwd_scales])
    assert [p.split(" ")[0] for p in problems] == ["dq", "dk", "dv"], problems


def test_max512_bindings_agree_with_their_graphs() -> None:
    """max512 declares K (and V in its backward) transposed, [b, h, d, s]: the caller's [b, s, h, d]
    tensor addresses the same elements; the saved softmax is [b, h, sq, skv] in the io dtype."""
    call = Call("bshd_bshd_bshd", "causal", hg=4, sq=128, skv=128)
    b, h, s = 2, 4, 128
    softmax = torch.empty(b, h, s, s, dtype=BF16)
    full = torch.full((b, 1, 1, 1), s, dtype=I32)
    extra = {Uid.STATS: softmax, Uid.DS: torch.empty_like(softmax), Uid.SEQ_LEN_Q: full, Uid.SEQ_LEN_KV: full}
    for direction in Direction:
        cfg = call.fwd if direction == Direction.FWD else call.bwd
        spec = MAX512.build(cfg, direction)  # validated by libcudnn only: the declarations are read unvalidated
        declared = declared_in_graph(spec.graph, spec.uids)
        assert declared is not None
        k_decl = next(d for d in declared if d.uid == Uid.K)
        if direction == Direction.FWD:
            assert k_decl.dims == (b, h, 64, s), "max512's forward declares K^T"
        ops = {**call.operands, **extra}
        assert operand_mismatches(declared, [ops[u] for u in spec.uids]) == []
        problems = operand_mismatches(declared, [softmax.float() if u == Uid.STATS else ops[u] for u in spec.uids])
        assert len(problems) == 1 and problems[0].startswith("stats") and "dtype differs" in problems[0]


# ------------------------------------------------------------------------------ mismatches


def _dense_fwd() -> tuple[Call, Any, tuple]:
    call = Call("bshd_bshd_bshd", "causal", dropout=0.1)
    spec = call.spec(Direction.FWD)
    return call, spec, declared_in_graph(spec.graph, spec.uids)


def _misaligned_like(t: torch.Tensor) -> torch.Tensor:
    base = torch.empty(t.numel() + 16, dtype=t.dtype)
    out = base[1 : t.numel() + 1].view(t.shape)
    assert out.data_ptr() % 16
    return out


def _sbhd_memory(t: torch.Tensor) -> torch.Tensor:
    """``t`` ([b, s, h, d]) allocated as [s, b, h, d]: the same shape, other strides."""
    return torch.empty(t.shape[1], t.shape[0], *t.shape[2:], dtype=t.dtype).transpose(0, 1)


MISMATCHES = {  # operand (graph name) -> (replacement, the reason the message gives)
    "q": (lambda c: _sbhd_memory(c.operands[Uid.Q]), "geometry differs"),
    "k": (lambda c: c.operands[Uid.K].to(torch.float16), "dtype differs"),
    "v": (lambda c: c.operands[Uid.V][:, :, :1].expand(c.operands[Uid.V].shape), "geometry differs"),  # broadcast heads
    "o": (lambda c: _misaligned_like(c.operands[Uid.O]), "not 16-byte aligned"),
    "stats": (lambda c: torch.empty(2, 4, 64, 2, dtype=F32)[..., :1], "geometry differs"),
    "seed": (lambda c: torch.zeros(1, 1, 1, 1, dtype=I32), "dtype differs"),
    "offset": (lambda c: None, "not a tensor"),
}


@pytest.mark.parametrize("operand", list(MISMATCHES))
def test_one_wrong_operand_is_named_with_both_geometries(operand: str) -> None:
    call, spec, declared = _dense_fwd()
    make, reason = MISMATCHES[operand]
    bad = make(call)
    problems = operand_mismatches(declared, call.buffers(spec.uids, **{operand: bad}))
    assert len(problems) == 1, problems
    (problem,) = problems
    decl = next(d for d in declared if Uid.NAMES[d.uid] == operand)
    assert problem.startswith(f"{decl.role} (uid {decl.uid}): "), problem
    assert reason in problem, problem
    assert f"the graph declares dims {list(decl.dims)} strides {list(decl.strides)}" in problem, problem
    if isinstance(bad, torch.Tensor):
        assert f"bound shape {list(bad.shape)} strides {list(bad.stride())}" in problem, problem
    with pytest.raises(ValueError, match=rf"uid {decl.uid}\)"):
        check_bound(_plan(call.fwd, spec), call.buffers(spec.uids, **{operand: bad}))


def test_a_tensor_of_another_shape_with_the_same_strides_is_caught() -> None:
    """O and dO of a batch of one are contiguous with the strides of a batch of two: the call
    signature does not tell them apart, the geometry does."""
    call = Call("bshd_bshd_bshd", "causal")
    spec = call.spec(Direction.BWD)
    declared = declared_in_graph(spec.graph, spec.uids)
    o = call.operands[Uid.O]
    small = torch.empty(1, *o.shape[1:], dtype=o.dtype)
    assert small.stride() == o.stride()
    problems = operand_mismatches(declared, call.buffers(spec.uids, o=small, d_o=small))
    assert [p.split(" (uid")[0] for p in problems] == ["o (from out, or o in the backward)", "d_o"], problems


def test_thd_operands_are_checked_by_heads_features_and_token_stride() -> None:
    call = Call("thd_thd_thd", "padding_causal")
    spec = call.spec(Direction.FWD)
    declared = declared_in_graph(spec.graph, spec.uids)
    q = call.operands[Uid.Q]
    t, h, d = q.shape
    fewer_tokens = q[: t // 2]  # ragged offsets place the sequences: any token count
    assert operand_mismatches(declared, call.buffers(spec.uids, q=fewer_tokens)) == []
    for bad in (torch.empty(t, h, d + 8, dtype=BF16)[..., :d],  # padded heads: another head and token stride
                torch.empty(h, t, d, dtype=BF16).transpose(0, 1),  # head-major: another token stride
                torch.empty(t, h, d, dtype=torch.float16),
                q.view(2, t // 2, h, d)):  # fmt: skip
        problems = operand_mismatches(declared, call.buffers(spec.uids, q=bad))
        assert len(problems) == 1 and problems[0].startswith("q (uid 1): "), problems
        assert "THD [t, h, d] placed by ragged offsets" in problems[0]


def test_count_device_and_all_problems_are_reported() -> None:
    call, spec, declared = _dense_fwd()
    buffers = call.buffers(spec.uids)
    problems = operand_mismatches(declared, buffers[:-1])
    assert len(problems) == 1 and problems[0].startswith(f"{len(buffers) - 1} operands bound but the graph declares "
                                                         f"{len(buffers)}: q, k"), problems  # fmt: skip
    problems = operand_mismatches(declared, buffers, device=torch.device("cuda", 0))
    assert len(problems) == len(buffers) and all("not on cuda:0" in p for p in problems), problems
    assert operand_mismatches(declared, buffers, device=torch.device("cpu")) == []
    with pytest.raises(ValueError) as err:
        check_bound(_plan(call.fwd, spec), call.buffers(spec.uids, q=_sbhd_memory(buffers[0]), k=buffers[1].half()))
    message = str(err.value)
    assert message.startswith("operands bound to the plan for PlanKey(F16_arbitrary_seqlen fwd:")
    assert "q (uid 1): geometry differs" in message and "(uid 2): dtype differs" in message
    assert "\n" not in message


# ------------------------------------------------------------------------------ plans and the mode


def _plan(cfg, spec, graph: Any = None) -> CompiledPlan:
    key = make_key(F16.enum, spec.direction, cfg, 91900, frontend_version())
    return CompiledPlan(key, spec.graph if graph is None else graph, spec.uids, 0, "test", 0.0)


def test_a_plan_without_tensor_descriptions_is_declared_by_its_builder() -> None:
    """A plan deserialized from the plan store has a graph without tensor descriptions: its
    declarations come from its sub-backend's builder for its key, equal to the built graph's."""
    call = Call("bshd_bshd_bshd", "padding_causal", dropout=0.1)
    for direction in Direction:
        spec = call.spec(direction)
        built = _plan(call.fwd if direction == Direction.FWD else call.bwd, spec)
        stored = _plan(call.fwd if direction == Direction.FWD else call.bwd, spec, graph=cudnn_module().pygraph())
        assert stored.graph.find_tensor(Uid.Q) is None
        assert declared_operands(stored) == declared_operands(built) == declared_in_graph(spec.graph, spec.uids)
        assert declared_operands(stored) is declared_operands(stored), "read once per plan"
        check_bound(stored, call.buffers(spec.uids))


def test_check_operands_mode() -> None:
    call, spec, declared = _dense_fwd()
    plan = _plan(call.fwd, spec)
    with pytest.raises(TypeError, match="bool"):
        launch.check_operands(1)  # type: ignore[arg-type]
    launch.check_operands(False)
    assert not launch.checking_operands()
    launch.check_operands(True)
    assert launch.checking_operands()
    before = dict(launch.operand_checks)
    # execute compares the tensors before it launches anything (the rng_state becomes seed and offset)
    buffers = call.buffers(spec.uids)[:-2]
    with pytest.raises(ValueError, match=r"q \(uid 1\): geometry differs"):
        launch.execute(plan, [_sbhd_memory(buffers[0]), *buffers[1:]], torch.device("cuda", 0), (),
                       torch.zeros(2, dtype=I32))  # fmt: skip
    with pytest.raises(ValueError, match=r"offset \(from rng_state\[1\]\) \(uid 8\): dtype differs"):
        launch.execute(plan, [*buffers], torch.device("cpu"), (), torch.zeros(2, dtype=I32))
    # launch sees pointers only: their count, null pointers, alignment
    ptrs = [t.data_ptr() for t in call.buffers(spec.uids)]
    with pytest.raises(ValueError, match=f"{len(ptrs) - 1} pointers for the {len(ptrs)} operands q, k"):
        launch.launch(plan, array("Q", ptrs[:-1]), 0)
    with pytest.raises(ValueError, match=r"v \(from v, or fused_attn_decode's v_cache\) \(uid 3\): pointer 0x0 is "
                                         r"null"):  # fmt: skip
        launch.launch(plan, array("Q", [*ptrs[:2], 0, *ptrs[3:]]), 0)
    with pytest.raises(ValueError, match=r"o \(from out, or o in the backward\) \(uid 4\): pointer 0x[0-9a-f]+ is not "
                                         r"16-byte aligned"):  # fmt: skip
        launch.launch(plan, array("Q", [*ptrs[:3], ptrs[3] + 2, *ptrs[4:]]), 0)
    # the offset operand is rng_state[1]: 8-byte aligned is all it needs
    assert ptrs[-1] % 16 == 8 and not launch.check_pointers(plan, array("Q", ptrs))
    assert launch.operand_checks["tensors"] == before["tensors"] + 2
    assert launch.operand_checks["pointers"] == before["pointers"] + 4


@pytest.mark.slow
def test_environment_turns_the_mode_on_at_import() -> None:
    code = "import te_cudnn.launch as l; print(l.checking_operands())"
    for value, expected in (("1", "True"), ("0", "False")):
        env = {**os.environ, "TE_CUDNN_CHECK_OPERANDS": value}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected
