"""Every sub-backend's operands are declared once (``te_cudnn.backends.operands``); this file
derives from those declarations alone, and checks against the graphs the real cuDNN frontend
builds and validates on the CPU, for every sub-backend in both directions:

* the binding order (== ``operand_uids`` == the ``GraphSpec``'s uids), each operand's dims,
  strides, dtype, placement, alignment and what the caller passes for it (== what
  ``te_cudnn.launch.declared_in_graph`` reads from the built graph);
* which operands are keyed and which per-call: every configuration field a keyed operand is
  derived from survives ``make_key`` (changing it changes the plan key), the key's own
  configuration declares the same operands, and per-call operands (lengths, ragged offsets,
  page tables) depend on nothing but their bounds, their values never reaching the key;
* what the entry points bind (``fused_attn_fwd`` / ``fused_attn_bwd`` for F16, max512 and
  FP8, ``fused_attn_decode``) passes the per-call checks generated from the declarations.
"""

from __future__ import annotations

import itertools
from dataclasses import fields, replace
from enum import Enum
from typing import Any

import pytest
import test_binding_cpu
import torch

from te_cudnn import decode, launchers, ops
from te_cudnn.backends import BY_ENUM, OPERANDS_BY_UID, Direction, Uid
from te_cudnn.backends.operands import Source, alignment
from te_cudnn.config import AttnConfig, describe_fwd, describe_shapes
from te_cudnn.enums import FusedAttnBackend, QKVFormat, QKVLayout
from te_cudnn.launch import declared_in_graph, operand_mismatches
from te_cudnn.layouts import CORE_LAYOUTS, layout_info
from te_cudnn.plans import make_key
from te_cudnn.runtime import RuntimeEnv

ARB = BY_ENUM[FusedAttnBackend.F16_arbitrary_seqlen]
MAX512 = BY_ENUM[FusedAttnBackend.F16_max512_seqlen]
FP8 = BY_ENUM[FusedAttnBackend.FP8]
#: Hopper with a cuDNN that serves every feature declared here (THD sinks in training need 9.26)
ENV = RuntimeEnv(sm=90, cudnn_version=92600, device_name="Hopper (assumed)")
BF16, E4M3, E5M2 = torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2
#: What make_key normalises per direction (fields that do not change that direction's graph)
NORMALISED = {Direction.FWD: {"deterministic", "do_stride", "cuda_graph"},
              Direction.BWD: {"is_training", "return_max_logit", "cuda_graph"}}  # fmt: skip
#: The only fields per-call operands may depend on: their bounds
BOUNDS = {"b", "mask", "ragged_q", "ragged_kv", "paged"}


# ------------------------------------------------------------------------------ configurations


def _shapes(layout="bshd_bshd_bshd", mask="causal", bias="no_bias", *, h=8, hg=8, sq=128, skv=128, d=64, dv=None,
            dtype=BF16, dropout=0.0, softmax="vanilla", window=(-1, -1), bias_shape=None, max_logit=False,
            training=True) -> AttnConfig:  # fmt: skip
    return describe_shapes(is_training=training, dtype=dtype, qkv_layout=layout, attn_bias_type=bias,
                           attn_mask_type=mask, softmax_type=softmax, dropout=dropout, num_attn_heads=h,
                           num_gqa_groups=hg, max_seqlen_q=sq, max_seqlen_kv=skv, head_dim_qk=d, head_dim_v=dv or d,
                           window_size=window, batch_size=2, bias_shape=bias_shape, return_max_logit=max_logit)  # fmt: skip


def _side(fmt: QKVFormat, b: int, s: int, h: int, d: int) -> torch.Tensor:
    shape = {QKVFormat.thd: (b * s, h, d), QKVFormat.bshd: (b, s, h, d), QKVFormat.sbhd: (s, b, h, d)}[fmt]
    return torch.empty(shape, dtype=BF16)


def _mixed(layout: str, mask: str, *, sq=64, skv=128, h=8, hg=2, b=2, lens=None) -> AttnConfig:
    """A mixed q/kv-format layout, described from CPU tensors (``lens``: the q side's lengths)."""
    info = layout_info(QKVLayout[layout])
    q, k, v = _side(info.q_format, b, sq, h, 64), _side(info.kv_format, b, skv, hg, 64), _side(info.kv_format, b, skv, hg, 64)
    cu_q = torch.tensor([0, *itertools.accumulate(lens or [sq] * b)], dtype=torch.int32)
    cu_kv = torch.arange(b + 1, dtype=torch.int32) * skv
    return describe_fwd(is_training=True, max_seqlen_q=sq, max_seqlen_kv=skv, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                        q=q, k=k, v=v, qkv_dtype=BF16, attn_bias=None, attn_scale=None, dropout=0.0, qkv_layout=layout,
                        attn_bias_type="no_bias", attn_mask_type=mask, softmax_type="vanilla", window_size=(-1, -1),
                        bottom_right_diagonal=None)  # fmt: skip


def _paged(layout: str, mask: str, *, sq=1, b=3, window=(-1, -1), table=None, lens_kv=40) -> AttnConfig:
    fmt_q, kv_fmt = layout.split("_")[2:4]
    q = {"bshd": torch.empty(b, sq, 8, 64), "sbhd": torch.empty(sq, b, 8, 64), "thd": torch.empty(b * sq, 8, 64)}[fmt_q]
    pool = (24, 16, 2, 64) if kv_fmt == "bshd" else (16, 24, 2, 64)
    table = torch.zeros(b, 4, dtype=torch.int32) if table is None else table
    return describe_fwd(is_training=False, max_seqlen_q=sq, max_seqlen_kv=64, cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32) * sq,
                        cu_seqlens_kv=torch.arange(b + 1, dtype=torch.int32) * lens_kv, q=q.to(BF16),
                        k=torch.empty(pool, dtype=BF16), v=torch.empty(pool, dtype=BF16), qkv_dtype=BF16,
                        attn_bias=None, attn_scale=None, dropout=0.0, qkv_layout=layout, attn_bias_type="no_bias",
                        attn_mask_type=mask, softmax_type="vanilla", window_size=window, bottom_right_diagonal=None,
                        page_table_k=table, page_table_v=table)  # fmt: skip


def _bwd(cfg: AttnConfig, **changes: Any) -> AttnConfig:
    return replace(cfg.for_backward(cfg.o_stride, False), **changes)


def _f16_cases():
    yield "bshd-causal", _shapes()
    yield "bshd-padding-gqa", _shapes(mask="padding_causal", hg=2)
    yield "bshd-dropout-dv", _shapes(dropout=0.1, dv=128)
    yield "bshd-bias-1hss", _shapes(mask="no_mask", bias="post_scale_bias")
    yield "bshd-bias-b1ss", _shapes(mask="no_mask", bias="post_scale_bias", bias_shape=(2, 1, 128, 128))
    yield "sbhd-alibi", _shapes("sbhd_sbhd_sbhd", bias="alibi")
    yield "sbhd-window", _shapes("sbhd_sbhd_sbhd", window=(32, 0))
    yield "bshd-off_by_one", _shapes(softmax="off_by_one")
    yield "bshd-learnable", _shapes(softmax="learnable", hg=2)
    yield "bshd-max_logit", _shapes(max_logit=True)
    yield "sb3hd-padding", _shapes("sb3hd", "padding")
    yield "bshd_bs2hd-cross", _shapes("bshd_bs2hd", sq=64)
    yield "sbhd_sbh2d-bottom_right", _shapes("sbhd_sbh2d", "causal_bottom_right", sq=64, hg=2)
    yield "thd-padding_causal", _shapes("thd_thd_thd", "padding_causal", hg=2)
    yield "thd-learnable-max_logit", _shapes("thd_thd_thd", "padding", softmax="learnable", max_logit=True)
    yield "t3hd-padding", _shapes("t3hd", "padding")
    yield "thd_bshd_bshd", _mixed("thd_bshd_bshd", "padding_causal")
    yield "sbhd_bshd_bshd", _mixed("sbhd_bshd_bshd", "no_mask")


def _fwd_only():
    yield "paged-bshd", _paged("paged_kv_bshd_bshd_bshd", "padding")
    yield "paged-thd-window", _paged("paged_kv_thd_bshd_bshd", "padding_causal_bottom_right", sq=4, window=(7, 0))


def _max512_cases():
    for layout, mask, bias, s in (("bshd_bshd_bshd", "causal", "no_bias", 128), ("sb3hd", "no_mask", "post_scale_bias", 128),
                                  ("bshd_bs2hd", "causal", "post_scale_bias", 256), ("sbhd_sb2hd", "no_mask", "no_bias", 64)):  # fmt: skip
        cfg = _shapes(layout, mask, bias, h=4, hg=4, sq=s, skv=s)
        yield f"{layout}-{mask}-{bias}-{s}", cfg, _bwd(cfg, saved_softmax=True)


def _fp8_cases():
    for name, kw in {"bshd-causal": {}, "sbhd-padding": {"layout": "sbhd_sbhd_sbhd", "mask": "padding"},
                     "bs3hd-no_mask": {"layout": "bs3hd", "mask": "no_mask"}, "off_by_one": {"softmax": "off_by_one"},
                     "learnable": {"softmax": "learnable", "mask": "padding_causal"}}.items():  # fmt: skip
        cfg = _shapes(dtype=E4M3, d=128, h=4, hg=4, sq=256, skv=256, **kw)
        yield name, cfg, _bwd(cfg, do_dtype=E5M2)
    yield "gqa-d64-inference", _shapes(dtype=E4M3, h=4, hg=2, training=False), None


def _cases() -> list:
    out = []
    for name, cfg in _f16_cases():
        out += [(ARB, name, cfg, Direction.FWD), (ARB, name, _bwd(cfg), Direction.BWD)]
    out += [(ARB, name, cfg, Direction.FWD) for name, cfg in _fwd_only()]
    for backend, cases in ((MAX512, _max512_cases()), (FP8, _fp8_cases())):
        for name, fwd, bwd in cases:
            out += [(backend, name, fwd, Direction.FWD)] + ([(backend, name, bwd, Direction.BWD)] if bwd else [])
    return [pytest.param(*c, id=f"{c[0].name}-{c[1]}-{c[3].value}") for c in out]


CASES = _cases()
#: the fixture recording what each launch binds (the plan and the device stood in)
launches = test_binding_cpu.launches


def _served(backend, name: str, cfg: AttnConfig, bwd: AttnConfig) -> list:
    return [pytest.param(backend, name, c, direction, id=f"{backend.name}-{name}-{direction.value}")
            for direction, c in ((Direction.FWD, cfg), (Direction.BWD, bwd))
            if not backend.not_supported_reasons(c, ENV, direction)]  # fmt: skip


def _slow_cases() -> list:
    """Every core layout x mask x bias type x feature each sub-backend serves, both directions."""
    variants = {"base": {}, "gqa": {"hg": 2}, "dropout": {"dropout": 0.1}, "learnable": {"softmax": "learnable"},
                "dv": {"dv": 128}, "fp16": {"dtype": torch.float16}, "s100": {"sq": 100, "skv": 100}}  # fmt: skip
    out = []
    for layout, mask, bias, (vname, kw) in itertools.product(sorted(CORE_LAYOUTS), list(ARB.caps.masks),
                                                             sorted(ARB.caps.bias_types), variants.items()):
        kw = {"sq": 64, **kw} if mask.is_bottom_right else kw
        try:
            cfg = _shapes(layout.name, mask.name, bias.name, **kw)
        except ValueError:  # a packed layout that cannot hold these sizes
            continue
        out += _served(ARB, f"{layout.name}-{mask.name}-{bias.name}-{vname}", cfg, _bwd(cfg))
        if vname in ("base", "fp16") and bias != bias.alibi and not mask.is_bottom_right:
            for s in (128, 512):
                cfg = _shapes(layout.name, mask.name, bias.name, **{**kw, "h": 4, "hg": 4, "sq": s, "skv": s})
                out += _served(MAX512, f"{layout.name}-{mask.name}-{bias.name}-{vname}-{s}", cfg,
                               _bwd(cfg, saved_softmax=True))  # fmt: skip
    for layout, mask, softmax, d, hg in itertools.product(sorted(FP8.caps.layouts), list(FP8.caps.masks),
                                                          ("vanilla", "off_by_one", "learnable"), (64, 128), (4, 2)):
        try:
            cfg = _shapes(layout.name, mask.name, dtype=E4M3, h=4, hg=hg, d=d, sq=256, skv=256, softmax=softmax)
        except ValueError:
            continue
        out += _served(FP8, f"{layout.name}-{mask.name}-{softmax}-{d}-{hg}", cfg, _bwd(cfg, do_dtype=E5M2))
    return out


SLOW_CASES = _slow_cases()


def test_the_cases_are_served_and_cover_every_kind_of_operand():
    """Every case is one its sub-backend serves, and together they declare every operand uid."""
    seen = set()
    for backend, name, cfg, direction in (p.values for p in CASES):
        assert not backend.not_supported_reasons(cfg, ENV, direction), (backend.name, name, direction)
        seen |= set(backend.operand_uids(cfg, direction))
    assert seen == set(Uid.NAMES)
    assert {p.values[0] for p in SLOW_CASES} == {ARB, MAX512, FP8} and len(SLOW_CASES) > 1000


# ------------------------------------------------------------------------------ declarations vs graphs


def _built(backend, cfg: AttnConfig, direction: Direction):
    spec = backend.build(cfg, direction)
    if backend is not MAX512:  # max512's generic graph validates only with libcudnn; its builder sets every dtype
        spec.graph.validate()
    return spec


def _agree(backend, cfg: AttnConfig, direction: Direction) -> None:
    table = backend.operands(direction)
    expected = backend.expected_operands(cfg, direction)
    spec = _built(backend, cfg, direction)
    order = tuple(d.uid for d in expected)
    assert order == backend.operand_uids(cfg, direction) == spec.uids == table.uids(cfg)
    assert spec.direction == direction
    assert declared_in_graph(spec.graph, spec.uids, table) == expected
    for d in expected:
        op = table[d.uid]
        assert d.role == op.role and d.role.startswith(Uid.NAMES[d.uid])
        assert d.align == (16 if op.align16 and torch.Size(d.dims).numel() > 1 else d.dtype.itemsize)
        assert d.ragged == (table.placement(op, cfg) is not None)
        if not op.output:  # inputs carry the declared name (outputs are named by their node)
            assert spec.graph.find_tensor(d.uid).name == (op.graph_name or op.name)
    # the per-call operands are the graph's last, in runtime_uids order
    runtime = backend.runtime_uids(cfg, direction)
    assert list(order[len(order) - len(runtime):]) == runtime
    assert runtime == [u for u in order if not table[u].keyed]
    assert all(table[u].source in (Source.LENGTHS, Source.OFFSETS, Source.TENSOR) for u in runtime)


@pytest.mark.parametrize("backend,name,cfg,direction", CASES)
def test_declarations_are_the_built_graphs(backend, name, cfg, direction):
    _agree(backend, cfg, direction)


@pytest.mark.slow
@pytest.mark.parametrize("backend,name,cfg,direction", SLOW_CASES)
def test_declarations_are_the_built_graphs_for_every_served_case(backend, name, cfg, direction):
    _agree(backend, cfg, direction)


def test_declarations_name_what_the_caller_passes_and_its_alignment():
    """Without the sub-backend, the operand check names each uid by its first declaration;
    FP8 scaling operands are slots of the caller's metadata tables (their element's alignment),
    max512's lengths a constant."""
    assert set(OPERANDS_BY_UID) == set(Uid.NAMES)
    assert OPERANDS_BY_UID[Uid.K].role == "k (from k, or fused_attn_decode's k_cache)"
    assert OPERANDS_BY_UID[Uid.SEQ_LEN_KV].role.endswith("fused_attn_decode's cache_seqlens)")
    fwd = FP8.operands(Direction.FWD)
    assert fwd[Uid.DESCALE_S].role == "descale_s (from d_scale_s[d_scale_s_offset])"
    assert fwd[Uid.DESCALE_S].source == Source.FP8_SLOT and not fwd[Uid.DESCALE_S].align16
    assert FP8.operands(Direction.BWD)[Uid.AMAX_DK].source == Source.SCRATCH
    assert MAX512.operands(Direction.FWD)[Uid.SEQ_LEN_Q].source == Source.CONSTANT
    assert MAX512.operands(Direction.FWD)[Uid.SEQ_LEN_Q].keyed
    assert ARB.operands(Direction.FWD)[Uid.SEQ_LEN_Q].source == Source.LENGTHS
    assert alignment(True, (1, 1, 1, 1), torch.float32) == 4 and alignment(True, (2, 1, 1, 1), torch.int32) == 16


# ------------------------------------------------------------------------------ keyed and per-call


def _variants(name: str, value: Any, cfg: AttnConfig) -> list:
    """Other values of the configuration field ``name``."""
    if name == "paged":
        return [(24, 16, 4)] if value is None else [(value[0] + 1, *value[1:]), (*value[:2], value[2] + 1)]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, 2 * value + 3]
    if isinstance(value, float):
        return [value / 2 + 0.25]
    if isinstance(value, torch.dtype):
        return [d for d in (torch.float16, BF16, E4M3, E5M2) if d != value]
    if isinstance(value, Enum):
        return [m for m in type(value) if m != value]
    if value is None:
        return {"do_stride": [(9, 8, 7, 1)], "do_dtype": [E5M2], "bias_shape": [(1, cfg.h, cfg.sq, cfg.skv)],
                "bias_stride": [(9, 8, 7, 1)]}[name]  # fmt: skip
    if value and isinstance(value[0], tuple):  # grad_strides
        return [tuple(tuple(s + 1 for s in t) if i == j else t for j, t in enumerate(value)) for i in range(len(value))]
    return [tuple(s + 1 if i == j else s for j, s in enumerate(value)) for i in range(len(value))]


def _key(backend, cfg: AttnConfig, direction: Direction):
    return make_key(backend.enum, direction, cfg, ENV.cudnn_version, "1.32.0")


@pytest.mark.parametrize("backend,name,cfg,direction", CASES)
def test_keyed_operands_are_in_the_plan_key(backend, name, cfg, direction):
    """A keyed operand's every field is in the plan key: changing one changes the key (fields the
    key normalises for this direction already hold the key's value); the key's configuration,
    which a plan loaded from the store is bound by, declares the same operands."""
    _keyed(backend, cfg, direction)


@pytest.mark.slow
@pytest.mark.parametrize("backend,name,cfg,direction", SLOW_CASES)
def test_keyed_operands_are_in_the_plan_key_for_every_served_case(backend, name, cfg, direction):
    _keyed(backend, cfg, direction)


def _keyed(backend, cfg: AttnConfig, direction: Direction) -> None:
    table = backend.operands(direction)
    key = _key(backend, cfg, direction)
    assert backend.expected_operands(key.config, direction) == backend.expected_operands(cfg, direction)
    checked = 0
    for op in table.present(cfg):
        used = table.key_fields(cfg, op.uid)  # none for the FP8 scaling operands: fixed [1, 1, 1, 1]
        if not op.keyed:
            assert used <= BOUNDS, f"per-call {op.name} depends on {sorted(used - BOUNDS)}"
            continue
        for field in sorted(used):
            if field in NORMALISED[direction]:
                assert getattr(cfg, field) == getattr(key.config, field), field
                continue
            for value in _variants(field, getattr(cfg, field), cfg):
                changed = replace(cfg, **{field: value})
                assert changed != cfg and _key(backend, changed, direction) != key, (op.name, field, value)
                checked += 1
    assert checked


def test_per_call_values_never_reach_the_key():
    """Lengths, ragged offsets and page tables are per call: other cu_seqlens values (the same
    buckets) and other page numbers describe the same configuration, key and operands."""
    pairs = [
        (_mixed("thd_bshd_bshd", "padding_causal", lens=[64, 64]), _mixed("thd_bshd_bshd", "padding_causal", lens=[10, 50])),
        (_paged("paged_kv_bshd_bshd_bshd", "padding"),
         _paged("paged_kv_bshd_bshd_bshd", "padding", table=torch.arange(12, dtype=torch.int32).view(3, 4), lens_kv=17)),
    ]  # fmt: skip
    for one, other in pairs:
        assert one == other and _key(ARB, one, Direction.FWD) == _key(ARB, other, Direction.FWD)
        per_call = {op.uid for op in ARB.operands(Direction.FWD).present(one) if not op.keyed}
        assert per_call and per_call == set(ARB.runtime_uids(one))
    names = {f.name for f in fields(AttnConfig)}
    assert BOUNDS <= names and all(n in names for d in NORMALISED.values() for n in d)


# ------------------------------------------------------------------------------ entry points


def _check_launch(prep, direction: Direction, buffers: list) -> None:
    expected = prep.backend.expected_operands(prep.cfg, direction)
    assert operand_mismatches(expected, buffers) == []


def _tables(names: str) -> dict[str, torch.Tensor]:
    return {n: torch.zeros(16, dtype=torch.float32) for n in names.split()}


ENTRY = {
    "f16-thd": {"layout": "thd_thd_thd", "mask": "padding_causal", "thd": True},
    "f16-bias-dropout": {"mask": "causal", "bias": True, "dropout": 0.1},
    "f16-learnable": {"mask": "causal", "softmax_type": "learnable"},
    "max512-bias": {"mask": "no_mask", "bias": True, "backend": FusedAttnBackend.F16_max512_seqlen},
    "fp8-padding-learnable": {"mask": "padding", "dtype": E4M3, "d": 128, "softmax_type": "learnable"},
}


@pytest.mark.parametrize("name", list(ENTRY))
def test_entry_points_bind_what_the_declarations_generate(name, launches):
    """fused_attn_fwd / fused_attn_bwd bind, operand by operand, tensors that pass the per-call
    checks generated from the declarations (geometry, dtype, alignment)."""
    c = dict(ENTRY[name])
    b, h, s, d, dtype = 2, 4, 128, c.get("d", 64), c.get("dtype", BF16)
    q, k, v = (torch.zeros((b * s, h, d) if c.get("thd") else (b, s, h, d), dtype=dtype) for _ in range(3))
    cu = torch.arange(b + 1, dtype=torch.int32) * s
    kw: dict[str, Any] = {"qkv_layout": c.get("layout", "bshd_bshd_bshd"), "attn_mask_type": c["mask"]}
    if c.get("bias"):
        kw.update(attn_bias_type="post_scale_bias", attn_bias=torch.zeros(1, h, s, s, dtype=dtype))
    if c.get("dropout"):
        kw.update(dropout=c["dropout"], rng_state=torch.tensor([1234, 16], dtype=torch.int64))
    if c.get("softmax_type"):
        kw.update(softmax_type=c["softmax_type"], softmax_offset=torch.zeros(1, h, 1, 1))
    fp8_fwd = _tables("d_scale_qkv d_scale_s q_scale_s q_scale_o amax_s amax_o") if dtype == E4M3 else {}
    seen: list = []
    out, aux = ops.fused_attn_fwd(True, s, s, cu, cu, q, k, v, None, c.get("backend"), _prepared=seen, **kw, **fp8_fwd)
    _check_launch(seen[0], Direction.FWD, launches[0])
    fp8_bwd = _tables("d_scale_qkv d_scale_s d_scale_o d_scale_do d_scale_dp q_scale_s q_scale_dp q_scale_dqkv "
                      "amax_dp amax_dqkv") if dtype == E4M3 else {}  # fmt: skip
    opts = {n: kw[n] for n in ("qkv_layout", "attn_mask_type", "attn_bias_type", "dropout", "softmax_type") if n in kw}
    seen.clear()
    ops.fused_attn_bwd(s, s, cu, cu, q, k, v, out, torch.zeros_like(out), None, aux, c.get("backend"), _prepared=seen,
                       **opts, **fp8_bwd)  # fmt: skip
    assert len(launches) == 2
    _check_launch(seen[0], Direction.BWD, launches[1])


@pytest.mark.parametrize("paged,sq", [(True, 1), (False, 1), (True, 4), (False, 4)], ids=["paged", "dense", "paged-4", "dense-4"])
def test_decode_binds_what_the_declarations_generate(paged, sq, launches, monkeypatch):
    """fused_attn_decode builds its forward through the F16 sub-backend: its binding order is the
    declarations', and what it binds passes the checks they generate."""
    monkeypatch.setattr(decode, "_execute", launchers._execute)  # the recorder
    made: list = []
    prepare = decode._prepare
    monkeypatch.setattr(decode, "_prepare", lambda *a: made.append(prepare(*a)) or made[-1])
    b, h, hg, dim = 3, 8, 2, 64
    q = torch.zeros(b, sq, h, dim, dtype=BF16)
    if paged:
        k = v = torch.zeros(b * 4, 16, hg, dim, dtype=BF16)
        table = torch.arange(b * 4, dtype=torch.int32).view(b, 4)
    else:
        k = v = torch.zeros(b, 64, hg, dim, dtype=BF16)
        table = None
    decode.fused_attn_decode(q, k, v, torch.full((b,), 5, dtype=torch.int32), table)
    prep = made[0].prep
    assert prep.backend is ARB
    assert decode.binding_order(paged) == ARB.operand_uids(prep.cfg, Direction.FWD)
    _check_launch(prep, Direction.FWD, launches[0])
    roles = [d.role for d in ARB.expected_operands(prep.cfg, Direction.FWD)]
    assert any("cache_seqlens" in r for r in roles) and ("page_table" in " ".join(roles)) == paged
