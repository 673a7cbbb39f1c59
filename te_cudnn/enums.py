"""TransformerEngine-compatible enums and constants.

Every enum is an ``IntEnum`` whose integer values equal TransformerEngine's C enums
(``NVTE_QKV_Layout``, ``NVTE_Mask_Type``, ...), so ints and names travel between the two
libraries unchanged. Strings are accepted only at the public boundary, through
:func:`coerce` (``AttnMaskType.coerce("causal")``); everything inside the package works on
enum members.
"""

from __future__ import annotations

import enum
from typing import TypeVar

__all__ = [
    "QKVFormat",
    "QKVLayout",
    "QKVLayoutGroup",
    "AttnMaskType",
    "AttnBiasType",
    "SoftmaxType",
    "FusedAttnBackend",
    "Fp8FwdIdx",
    "Fp8BwdIdx",
    "META_QKV",
    "META_O",
    "META_S",
    "META_DQKV",
    "META_DO",
    "META_DP",
    "BACKEND_F16arb_ELTS_PER_THREADS",
    "BACKEND_FP8_THREADS_PER_CTA",
]

_E = TypeVar("_E", bound="_NamedIntEnum")


_NAME_TABLES: dict[type, dict[str, "_NamedIntEnum"]] = {}


class _NamedIntEnum(enum.IntEnum):
    """IntEnum that converts from its own members, ints or (case-insensitive) names."""

    @classmethod
    def coerce(cls: type[_E], value: object, *, argument: str | None = None) -> _E:
        """Return the member for ``value`` (member, int or name string).

        Raises ``ValueError`` naming ``argument`` and listing the accepted names when
        ``value`` is not one of them, and ``TypeError`` for other types.
        """
        if isinstance(value, cls):
            return value
        arg = argument or cls.__name__
        if isinstance(value, str):
            member = cls._by_name().get(value.lower())
            if member is None:
                names = ", ".join(repr(n) for n in cls._by_name())
                raise ValueError(f"{arg}={value!r} is not a valid {cls.__name__}; expected one of {names}")
            return member
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                raise ValueError(
                    f"{arg}={value!r} is not a valid {cls.__name__} value; expected one of "
                    f"{', '.join(f'{m.name}={m.value}' for m in cls)}"
                ) from None
        raise TypeError(f"{arg} must be a {cls.__name__}, an int or a string, got {type(value).__name__}")

    @classmethod
    def _by_name(cls) -> dict[str, "_NamedIntEnum"]:
        table = _NAME_TABLES.get(cls)
        if table is None:  # built once per enum, not per coerce
            table = _NAME_TABLES[cls] = {m.name.lower(): m for m in cls}
        return table

    def __str__(self) -> str:  # "causal", not "AttnMaskType.causal": strings at the edge match TE
        return self.name


class QKVFormat(_NamedIntEnum):
    """Memory format of one tensor (``NVTE_QKV_Format``); ``X_2Y`` means q in X, k/v in Y."""

    sbhd = 0
    bshd = 1
    thd = 2
    bshd_2sbhd = 3
    sbhd_2bshd = 4
    thd_2bshd = 5
    thd_2sbhd = 6
    bhsd = 7
    NOT_SET = 8


class QKVLayoutGroup(_NamedIntEnum):
    """How q, k and v share memory (``NVTE_QKV_Layout_Group``)."""

    L_3HD = 0  # q, k, v interleaved before h: [.., 3, h, d]
    L_H3D = 1  # interleaved after h: [.., h, 3, d]
    L_HD_2HD = 2  # q separate, k/v interleaved before h
    L_HD_H2D = 3  # q separate, k/v interleaved after h
    L_HD_HD_HD = 4  # three separate tensors
    Paged_KV_HD_HD_HD = 5
    SD_SD_SD = 6


class QKVLayout(_NamedIntEnum):
    """The 26 named q/k/v layouts of ``NVTE_QKV_Layout`` (0-14 are the core layouts)."""

    sb3hd = 0
    sbh3d = 1
    sbhd_sb2hd = 2
    sbhd_sbh2d = 3
    sbhd_sbhd_sbhd = 4
    bs3hd = 5
    bsh3d = 6
    bshd_bs2hd = 7
    bshd_bsh2d = 8
    bshd_bshd_bshd = 9
    t3hd = 10
    th3d = 11
    thd_t2hd = 12
    thd_th2d = 13
    thd_thd_thd = 14
    sbhd_bshd_bshd = 15
    bshd_sbhd_sbhd = 16
    thd_bshd_bshd = 17
    thd_sbhd_sbhd = 18
    paged_kv_bshd_bshd_bshd = 19
    paged_kv_bshd_sbhd_sbhd = 20
    paged_kv_sbhd_bshd_bshd = 21
    paged_kv_sbhd_sbhd_sbhd = 22
    paged_kv_thd_bshd_bshd = 23
    paged_kv_thd_sbhd_sbhd = 24
    bhsd_bhsd_bhsd = 25


class AttnMaskType(_NamedIntEnum):
    """Attention masks (``NVTE_Mask_Type``). Row i is a query, column j a key.

    ``causal`` aligns the diagonal top-left (j <= i); ``causal_bottom_right`` aligns it to the
    bottom-right corner (j <= i + skv - sq). ``padding*`` masks also drop keys/queries past
    each sequence's actual length. ``arbitrary`` (a user-given mask) is never fused.
    """

    no_mask = 0
    padding = 1
    causal = 2
    padding_causal = 3
    causal_bottom_right = 4
    padding_causal_bottom_right = 5
    arbitrary = 6

    @property
    def is_padding(self) -> bool:
        return self in (AttnMaskType.padding, AttnMaskType.padding_causal, AttnMaskType.padding_causal_bottom_right)

    @property
    def is_causal(self) -> bool:
        return self in (
            AttnMaskType.causal,
            AttnMaskType.padding_causal,
            AttnMaskType.causal_bottom_right,
            AttnMaskType.padding_causal_bottom_right,
        )

    @property
    def is_bottom_right(self) -> bool:
        return self in (AttnMaskType.causal_bottom_right, AttnMaskType.padding_causal_bottom_right)


class AttnBiasType(_NamedIntEnum):
    """Additive score bias (``NVTE_Bias_Type``). ``pre_scale_bias`` is never fused."""

    no_bias = 0
    pre_scale_bias = 1
    post_scale_bias = 2
    alibi = 3


class SoftmaxType(_NamedIntEnum):
    """Softmax denominator: vanilla Σexp, off_by_one 1+Σexp, learnable exp(α_h)+Σexp."""

    vanilla = 0
    off_by_one = 1
    learnable = 2


class FusedAttnBackend(_NamedIntEnum):
    """cuDNN fused-attention sub-backends; ``FusedAttnBackend["FP8"]`` works as in TE."""

    No_Backend = -1
    F16_max512_seqlen = 0
    F16_arbitrary_seqlen = 1
    FP8 = 2


class Fp8FwdIdx(_NamedIntEnum):
    """Forward FP8 metadata slots (index ``fp8_meta["scaling_fwd"]``).

    Named for what they hold in attention; the values are TransformerEngine's GEMM slots.
    Forward and backward tables are separate enums because both use the value 3.
    """

    QKV = 2  # q, k, v share one scale (TE: GEMM1_OUTPUT)
    O = 3  # noqa: E741 - attention output (TE: GEMM2_INPUT)
    S = 8  # softmax(QK^T), internal (TE: GEMM3_OUTPUT)


class Fp8BwdIdx(_NamedIntEnum):
    """Backward FP8 metadata slots (index ``fp8_meta["scaling_bwd"]``)."""

    DQKV = 0  # dq, dk, dv share one scale (TE: GRAD_OUTPUT1)
    DO = 3  # incoming output gradient (TE: GRAD_INPUT2)
    DP = 5  # dO·V^T, internal (TE: GRAD_INPUT3)


META_QKV: int = int(Fp8FwdIdx.QKV)
META_O: int = int(Fp8FwdIdx.O)
META_S: int = int(Fp8FwdIdx.S)
META_DQKV: int = int(Fp8BwdIdx.DQKV)
META_DO: int = int(Fp8BwdIdx.DO)
META_DP: int = int(Fp8BwdIdx.DP)

# Philox offset increments per call, as TransformerEngine advances the torch generator.
BACKEND_F16arb_ELTS_PER_THREADS = 16
BACKEND_FP8_THREADS_PER_CTA = 128


for _enum in (QKVFormat, QKVLayoutGroup, QKVLayout, AttnMaskType, AttnBiasType, SoftmaxType, FusedAttnBackend,
              Fp8FwdIdx, Fp8BwdIdx):  # fmt: skip
    _enum._by_name()  # every name table is built at import (torch.compile then never sees one being built)
