"""One frozen, validated description of a fused-attention call.

:class:`AttnConfig` holds everything that decides which cuDNN graph serves a call (shapes,
strides, dtypes, layout, mask, bias, dropout, window, scale, determinism, device) and
nothing that does not (tensor values, pointers). It is built once per distinct call
signature by :func:`describe_fwd` / :func:`describe_bwd`, which are also where malformed
input is rejected with ``ValueError`` / ``TypeError`` naming the argument and its value.
Strings become enums here, at the boundary.

One concern per module: :mod:`.description` (the :class:`AttnConfig` dataclass and the
dtypes it takes), :mod:`.from_tensors` (``describe_fwd`` / ``describe_bwd``: a call's
tensors and options), :mod:`.from_sizes` (``describe_shapes``: sizes alone, for selection
and graph building without tensors), :mod:`.checks` (argument checks, each naming the
argument) and :mod:`.geometry` (BHSD dims and strides, cuDNN's alignment rules).
"""

from .checks import check_softmax_offset
from .description import F16_DTYPES, FP8_DTYPES, AttnConfig
from .from_sizes import describe_shapes
from .from_tensors import describe_bwd, describe_fwd

# Also read from here: by the modules that check and describe arguments the same way, and by tests.
from .checks import _check_cu_seqlens, _value  # noqa: F401
from .geometry import aligned_contiguous_strides  # noqa: F401

__all__ = ["AttnConfig", "describe_fwd", "describe_bwd", "describe_shapes", "check_softmax_offset", "F16_DTYPES", "FP8_DTYPES"]
