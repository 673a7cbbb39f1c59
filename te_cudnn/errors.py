"""Typed errors.

* Malformed input (wrong dtype, device, shape, stride, ...) raises the built-in
  ``ValueError`` / ``TypeError`` with the argument's name and value, before any GPU work.
* A well-formed configuration that no sub-backend serves raises
  :class:`UnsupportedConfigError`, which carries every sub-backend's reasons. It subclasses
  ``NotImplementedError`` so callers can catch it and choose another attention.
* A configuration the declarations accept but cuDNN itself declines at plan time raises
  :class:`GraphBuildError` with cuDNN's message and the plan key.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["TeCudnnError", "UnsupportedConfigError", "GraphBuildError", "CudnnUnavailableError", "CaptureMissError",
           "MisalignedError"]


class TeCudnnError(Exception):
    """Base class of te_cudnn's own errors."""


class UnsupportedConfigError(TeCudnnError, NotImplementedError):
    """No sub-backend serves this configuration; ``reasons`` maps each one to its reasons."""

    def __init__(self, summary: str, reasons: Mapping[Any, Sequence[str]]):
        self.summary = summary
        self.reasons = {k: list(v) for k, v in reasons.items()}
        super().__init__(self._format())

    def _format(self) -> str:
        lines = [f"No cuDNN fused-attention sub-backend supports {self.summary}"]
        for backend, why in self.reasons.items():
            name = getattr(backend, "name", str(backend))
            if why:
                lines.append(f"  {name} declined because:")
                lines.extend(f"    - {r}" for r in why)
            else:
                lines.append(f"  {name}: supported")
        return "\n".join(lines)


class GraphBuildError(TeCudnnError):
    """cuDNN declined to plan or build a graph our declarations accepted."""

    def __init__(self, key: Any, stage: str, cause: BaseException):
        self.key = key
        self.stage = stage
        self.cause = cause
        super().__init__(
            f"cuDNN could not {stage} the graph for {key}: {type(cause).__name__}: {cause}\n"
            "Set CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr (and CUDNN_FRONTEND_LOG_INFO=1 "
            "CUDNN_FRONTEND_LOG_FILE=stderr) to see cuDNN's own reasons."
        )


class CudnnUnavailableError(TeCudnnError, RuntimeError):
    """Execution was requested where no CUDA device or libcudnn is available."""


class CaptureMissError(TeCudnnError, RuntimeError):
    """A call inside CUDA-graph capture needs a plan (or a call signature) that is not ready.

    Building a cuDNN plan and preparing a new call signature copy small tensors to the GPU and
    may synchronize, which a capture forbids. Run the same step once eagerly (outside capture,
    same shapes, strides and options) before capturing; ``torch.cuda.make_graphed_callables``
    does this with its warm-up iterations."""

    def __init__(self, what: str):
        super().__init__(
            f"te_cudnn: {what} during CUDA-graph capture. Run one eager step with the same shapes, strides and "
            "options before capturing (torch.cuda.make_graphed_callables' warm-up does this), so the plan is "
            "built and the call signature is known when the capture starts."
        )


class MisalignedError(TeCudnnError, ValueError):
    """An operand does not start on the 16-byte boundary cuDNN reads from (a ValueError naming it)."""
