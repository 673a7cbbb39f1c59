"""Enum values and names against TransformerEngine's tables (spec §1.1, §1.3); CPU only."""

from __future__ import annotations

import enum

import pytest

import te_cudnn
from te_cudnn.enums import (
    BACKEND_F16arb_ELTS_PER_THREADS,
    BACKEND_FP8_THREADS_PER_CTA,
    META_DO,
    META_DP,
    META_DQKV,
    META_O,
    META_QKV,
    META_S,
    AttnBiasType,
    AttnMaskType,
    Fp8BwdIdx,
    Fp8FwdIdx,
    FusedAttnBackend,
    QKVFormat,
    QKVLayout,
    QKVLayoutGroup,
    SoftmaxType,
)

# ----------------------------------------------------------------------------- TE's tables
# NVTE_QKV_Layout, written out from the spec table (not from the package).
TE_QKV_LAYOUT = {
    "sb3hd": 0, "sbh3d": 1, "sbhd_sb2hd": 2, "sbhd_sbh2d": 3, "sbhd_sbhd_sbhd": 4,
    "bs3hd": 5, "bsh3d": 6, "bshd_bs2hd": 7, "bshd_bsh2d": 8, "bshd_bshd_bshd": 9,
    "t3hd": 10, "th3d": 11, "thd_t2hd": 12, "thd_th2d": 13, "thd_thd_thd": 14,
    "sbhd_bshd_bshd": 15, "bshd_sbhd_sbhd": 16, "thd_bshd_bshd": 17, "thd_sbhd_sbhd": 18,
    "paged_kv_bshd_bshd_bshd": 19, "paged_kv_bshd_sbhd_sbhd": 20, "paged_kv_sbhd_bshd_bshd": 21,
    "paged_kv_sbhd_sbhd_sbhd": 22, "paged_kv_thd_bshd_bshd": 23, "paged_kv_thd_sbhd_sbhd": 24,
    "bhsd_bhsd_bhsd": 25,
}  # fmt: skip
TE_QKV_FORMAT = {
    "sbhd": 0, "bshd": 1, "thd": 2, "bshd_2sbhd": 3, "sbhd_2bshd": 4,
    "thd_2bshd": 5, "thd_2sbhd": 6, "bhsd": 7, "NOT_SET": 8,
}  # fmt: skip
TE_LAYOUT_GROUP = {
    "L_3HD": 0, "L_H3D": 1, "L_HD_2HD": 2, "L_HD_H2D": 3, "L_HD_HD_HD": 4, "Paged_KV_HD_HD_HD": 5, "SD_SD_SD": 6,
}  # fmt: skip
TE_MASK = {
    "no_mask": 0, "padding": 1, "causal": 2, "padding_causal": 3,
    "causal_bottom_right": 4, "padding_causal_bottom_right": 5, "arbitrary": 6,
}  # fmt: skip
TE_BIAS = {"no_bias": 0, "pre_scale_bias": 1, "post_scale_bias": 2, "alibi": 3}
TE_SOFTMAX = {"vanilla": 0, "off_by_one": 1, "learnable": 2}
TE_BACKEND = {"No_Backend": -1, "F16_max512_seqlen": 0, "F16_arbitrary_seqlen": 1, "FP8": 2}

TABLES = [
    (QKVLayout, TE_QKV_LAYOUT),
    (QKVFormat, TE_QKV_FORMAT),
    (QKVLayoutGroup, TE_LAYOUT_GROUP),
    (AttnMaskType, TE_MASK),
    (AttnBiasType, TE_BIAS),
    (SoftmaxType, TE_SOFTMAX),
    (FusedAttnBackend, TE_BACKEND),
]
TABLE_IDS = [cls.__name__ for cls, _ in TABLES]


@pytest.mark.parametrize(("cls", "table"), TABLES, ids=TABLE_IDS)
def test_members_match_te_table(cls: type[enum.IntEnum], table: dict[str, int]) -> None:
    assert issubclass(cls, enum.IntEnum)
    assert {m.name: m.value for m in cls} == table
    # Declaration order is TE's order (by value), so iteration lists them as TE does.
    assert [m.value for m in cls] == sorted(table.values())


@pytest.mark.parametrize(("cls", "table"), TABLES, ids=TABLE_IDS)
def test_lookup_by_name_and_value(cls: type[enum.IntEnum], table: dict[str, int]) -> None:
    for name, value in table.items():
        assert cls[name] is cls(value)
        assert cls[name] == value  # IntEnum compares equal to TE's int
        assert int(cls[name]) == value
        assert str(cls[name]) == name  # "causal", not "AttnMaskType.causal"


def test_qkv_layout_has_26_members_and_15_core() -> None:
    assert len(QKVLayout) == 26
    assert [QKVLayout(i).name for i in range(15)] == list(TE_QKV_LAYOUT)[:15]


def test_fused_attn_backend_te_access_styles() -> None:
    assert FusedAttnBackend.FP8 == 2
    assert FusedAttnBackend["FP8"] is FusedAttnBackend.FP8
    assert FusedAttnBackend["F16_arbitrary_seqlen"] == 1
    assert FusedAttnBackend["F16_max512_seqlen"] == 0
    assert FusedAttnBackend["No_Backend"] == -1
    assert FusedAttnBackend(-1) is FusedAttnBackend.No_Backend
    assert te_cudnn.FusedAttnBackend is FusedAttnBackend


def test_mask_properties() -> None:
    padding = {AttnMaskType.padding, AttnMaskType.padding_causal, AttnMaskType.padding_causal_bottom_right}
    causal = {
        AttnMaskType.causal,
        AttnMaskType.padding_causal,
        AttnMaskType.causal_bottom_right,
        AttnMaskType.padding_causal_bottom_right,
    }
    bottom_right = {AttnMaskType.causal_bottom_right, AttnMaskType.padding_causal_bottom_right}
    for m in AttnMaskType:
        assert m.is_padding == (m in padding), m
        assert m.is_causal == (m in causal), m
        assert m.is_bottom_right == (m in bottom_right), m


# ----------------------------------------------------------------------------- FP8 meta
def test_meta_constants() -> None:
    assert (META_QKV, META_O, META_S) == (2, 3, 8)
    assert (META_DQKV, META_DO, META_DP) == (0, 3, 5)
    for value in (META_QKV, META_O, META_S, META_DQKV, META_DO, META_DP):
        assert type(value) is int
    # re-exported at package level with the same values
    assert (te_cudnn.META_QKV, te_cudnn.META_O, te_cudnn.META_S) == (2, 3, 8)
    assert (te_cudnn.META_DQKV, te_cudnn.META_DO, te_cudnn.META_DP) == (0, 3, 5)


def test_fp8_index_enums() -> None:
    # TE: FwdGEMM1_OUTPUT=2, FwdGEMM2_INPUT=3, FwdGEMM3_OUTPUT=8; BwdGRAD_OUTPUT1=0, GRAD_INPUT2=3, GRAD_INPUT3=5
    assert {m.name: m.value for m in Fp8FwdIdx} == {"QKV": 2, "O": 3, "S": 8}
    assert {m.name: m.value for m in Fp8BwdIdx} == {"DQKV": 0, "DO": 3, "DP": 5}


def test_rng_constants() -> None:
    assert BACKEND_F16arb_ELTS_PER_THREADS == 16
    assert BACKEND_FP8_THREADS_PER_CTA == 128


# ----------------------------------------------------------------------------- coerce
ALL_MEMBERS = [m for cls, _ in TABLES for m in cls]


@pytest.mark.parametrize("member", ALL_MEMBERS, ids=[f"{type(m).__name__}.{m.name}" for m in ALL_MEMBERS])
def test_coerce_member_int_and_string(member: enum.IntEnum) -> None:
    cls = type(member)
    assert cls.coerce(member) is member
    assert cls.coerce(int(member)) is member
    assert cls.coerce(member.name) is member
    assert cls.coerce(member.name.upper()) is member
    assert cls.coerce(member.name.lower()) is member
    mixed = "".join(c.upper() if i % 2 else c.lower() for i, c in enumerate(member.name))
    assert cls.coerce(mixed) is member


def test_coerce_unknown_string_lists_names() -> None:
    with pytest.raises(ValueError, match=r"attn_mask_type='causal_top_left' is not a valid AttnMaskType") as ei:
        AttnMaskType.coerce("causal_top_left", argument="attn_mask_type")
    msg = str(ei.value)
    for name in TE_MASK:
        assert repr(name) in msg


def test_coerce_unknown_string_default_argument_is_class_name() -> None:
    with pytest.raises(ValueError, match=r"^QKVLayout='sbhd' is not a valid QKVLayout; expected one of 'sb3hd'"):
        QKVLayout.coerce("sbhd")


def test_coerce_unknown_int_lists_values() -> None:
    with pytest.raises(ValueError, match=r"attn_bias_type=7 is not a valid AttnBiasType value") as ei:
        AttnBiasType.coerce(7, argument="attn_bias_type")
    for name, value in TE_BIAS.items():
        assert f"{name}={value}" in str(ei.value)
    with pytest.raises(ValueError, match=r"FusedAttnBackend=3 is not a valid FusedAttnBackend value.*No_Backend=-1"):
        FusedAttnBackend.coerce(3)


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(1.0, "float"), (True, "bool"), (False, "bool"), (None, "NoneType"), ([2], "list"), (b"causal", "bytes")],
)
def test_coerce_wrong_type(value: object, type_name: str) -> None:
    with pytest.raises(TypeError, match=rf"^attn_mask_type must be a AttnMaskType, an int or a string, got {type_name}$"):
        AttnMaskType.coerce(value, argument="attn_mask_type")

