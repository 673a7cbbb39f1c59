"""Which result rows cuDNN writes under a padding mask, and so which results te_cudnn zero-fills.

te_cudnn promises exact zeros in every row past a sequence's end (O, dQ, dK, dV), as
TransformerEngine does for THD. The rule:

1. Without a padding mask or a THD layout every row is inside a sequence: nothing is filled.
2. The lengths a padding-mask call binds (:func:`length_remap`) avoid the rows that engines
   may handle specially around *empty* sequences, leaving every other sequence bit-identical
   (O; the backward's dQ accumulates in a nondeterministic order):

   * :attr:`Lengths.ONE_QUERY` (``max_seqlen_q = 1``): one-row engines may compute row 0 of
     every sequence, even one whose query length is 0, so every sequence is bound with one
     query row, and a sequence without a query with no keys: its one row sees no key;
   * :attr:`Lengths.EVERY_KEY` (longer queries, on the graphs the static rule below names):
     engines may leave every row of a sequence without keys unwritten, so such a sequence is
     bound with one key and no query rows: all its rows then lie past its end.

3. A result is zero-filled before the launch unless *both*:

   * the static rule lets te_cudnn rely on cuDNN for it (:func:`skips_out_fill`,
     :func:`skips_grads_fill`): the lengths are remapped (O: either remap; dQ, dK, dV:
     :attr:`Lengths.EVERY_KEY` without ``deterministic=True``), on the F16 arbitrary-seqlen
     sub-backend, with no window, bias, dropout or sink, no THD side (and, for longer
     queries, no paged KV cache and no bottom-right causal mask, under which a row of a
     sequence with more queries than keys sees no key: a row inside the sequence, which no
     remap turns into one past its end). Calls with a THD side are always filled: the rows
     between and after the sequences of a token buffer belong to no sequence, so no launch is
     asked to write them;
   * the call's plan is given and its engine was checked on this machine
     (:func:`te_cudnn.plans.padded_rows.rows_verified`: a probe that runs the plan with partial
     lengths into NaN-prefilled results, recorded per GPU architecture, cuDNN version and
     engine configuration in the plan store, or in memory without one).

So without a plan (at prepare time), with an engine that failed or could not be checked, or
during a CUDA-graph capture before any check, results are zero-filled. The remap does not
depend on the engine: it is a function of the call's description, so the backward binds the
forward's lengths.
"""

from __future__ import annotations

import enum

from .backends import SubBackend
from .config import AttnConfig
from .enums import AttnBiasType, FusedAttnBackend

__all__ = ["Lengths", "length_remap", "skips_out_fill", "skips_grads_fill"]


class Lengths(enum.Enum):
    """How a padding-mask call's per-sequence lengths are bound (see the module docstring)."""

    AS_GIVEN = 0
    ONE_QUERY = 1
    EVERY_KEY = 2


def _remappable(cfg: AttnConfig, backend: SubBackend) -> bool:
    """The graphs whose lengths te_cudnn remaps for longer queries, and whose results it may
    leave to cuDNN: F16 arbitrary-seqlen, no window, dropout, sink or bias."""
    return (backend.enum == FusedAttnBackend.F16_arbitrary_seqlen and not cfg.has_window and not cfg.has_dropout
            and not cfg.has_sink and cfg.bias_type == AttnBiasType.no_bias)  # fmt: skip


def length_remap(cfg: AttnConfig, backend: SubBackend) -> Lengths:
    """The lengths a call binds: a function of the call's description (forward and backward
    alike), so the backward's lengths are the forward's."""
    if not cfg.mask.is_padding or cfg.is_ragged:
        return Lengths.AS_GIVEN
    if cfg.sq == 1:  # a correction, wherever one query row per sequence is bound
        return Lengths.ONE_QUERY
    if cfg.paged is None and not cfg.mask.is_bottom_right and _remappable(cfg, backend):
        return Lengths.EVERY_KEY
    return Lengths.AS_GIVEN


def skips_out_fill(cfg: AttnConfig, backend: SubBackend) -> bool:
    """The static rule for O: whether te_cudnn may leave the rows past each sequence's end to
    cuDNN, once the engine is checked (``te_cudnn.plans.padded_rows.fills_out``)."""
    return length_remap(cfg, backend) is not Lengths.AS_GIVEN and _remappable(cfg, backend)


def skips_grads_fill(cfg: AttnConfig, backend: SubBackend) -> bool:
    """The static rule for dQ, dK and dV, likewise (``te_cudnn.plans.padded_rows.fills_grads``)."""
    return length_remap(cfg, backend) is Lengths.EVERY_KEY and not cfg.deterministic
