"""Which result rows cuDNN writes under a padding mask, and so which results te_cudnn zero-fills.

te_cudnn promises exact zeros in every row past a sequence's end (O, dQ, dK, dV), as
TransformerEngine does for THD. cuDNN writes those rows itself, as zeros, on every engine its
heuristics offer, except around *empty* sequences (cuDNN 9.19 on an H100,
``tools/probe_empty_rows.py``, ``benchmarks/2026-11-26-h100-empty-rows/``):

* with ``max_seqlen_q = 1`` the one-row engines compute row 0 of every sequence, even one whose
  query length is 0 (a row of attention where zeros are promised; a fill before the launch
  cannot help);
* with longer queries some engines (the forward's first choice among them) leave every row of a
  sequence without keys unwritten, and the backward's first choice leaves its dK/dV unwritten.

Both are removed by remapping the lengths bound to the graph, which leaves every other sequence
bit-identical (O; the backward's dQ accumulates in a nondeterministic order):

* :attr:`Lengths.ONE_QUERY` (``max_seqlen_q = 1``): query lengths of 1, and no keys for a sequence
  without a query, whose one row then sees no key and is written as zeros;
* :attr:`Lengths.EVERY_KEY` (longer queries): key lengths of at least 1, and no query rows for a
  sequence without keys, whose rows are then all past its end and written as zeros.

With the remap, the zero-fill is dropped where the probe covered the graph: the F16
arbitrary-seqlen sub-backend, dense (non-THD, non-paged for longer queries) layouts, no window,
bias, dropout or sink; the backward keeps it under ``deterministic=True`` (other engines) and for
one query row (not probed). Longer queries under the bottom-right causal mask keep their lengths
and the fills: there a query row sees no key whenever its sequence has more queries than keys, and
cuDNN leaves such rows unwritten (measured with ``fused_attn_decode``'s causal s_q > 1), which no
remap can turn into a row past the sequence's end. Everywhere else results are zero-filled before
the launch as before. The GPU tests prefill the results with NaN.
"""

from __future__ import annotations

import enum

from .backends import SubBackend
from .config import AttnConfig
from .enums import AttnBiasType, FusedAttnBackend

__all__ = ["Lengths", "length_remap", "fills_out", "fills_grads"]


class Lengths(enum.Enum):
    """How a padding-mask call's per-sequence lengths are bound (see the module docstring)."""

    AS_GIVEN = 0
    ONE_QUERY = 1
    EVERY_KEY = 2


def _probed(cfg: AttnConfig, backend: SubBackend) -> bool:
    """The graphs ``tools/probe_empty_rows.py`` covered."""
    return (backend.enum == FusedAttnBackend.F16_arbitrary_seqlen and not cfg.has_window and not cfg.has_dropout
            and not cfg.has_sink and cfg.bias_type == AttnBiasType.no_bias)  # fmt: skip


def length_remap(cfg: AttnConfig, backend: SubBackend) -> Lengths:
    """The lengths a call binds: a function of the call's description (forward and backward
    alike), so the backward's lengths are the forward's."""
    if not cfg.mask.is_padding or cfg.is_ragged:
        return Lengths.AS_GIVEN
    if cfg.sq == 1:  # a correction, wherever one query row per sequence is bound
        return Lengths.ONE_QUERY
    if cfg.paged is None and not cfg.mask.is_bottom_right and _probed(cfg, backend):
        return Lengths.EVERY_KEY
    return Lengths.AS_GIVEN


def fills_out(cfg: AttnConfig, backend: SubBackend) -> bool:
    """Whether a padding-mask / THD forward zero-fills O before cuDNN writes it."""
    if not (cfg.mask.is_padding or cfg.is_ragged):
        return False
    return length_remap(cfg, backend) is Lengths.AS_GIVEN or not _probed(cfg, backend)


def fills_grads(cfg: AttnConfig, backend: SubBackend) -> bool:
    """Whether a padding-mask / THD backward zero-fills dQ, dK and dV before cuDNN writes them."""
    if not (cfg.mask.is_padding or cfg.is_ragged):
        return False
    return length_remap(cfg, backend) is not Lengths.EVERY_KEY or cfg.deterministic
