"""What the process runs on: the cuDNN frontend module, the cuDNN library, the GPU.

The frontend (``import cudnn``) binds whichever libcudnn torch already loaded. On a machine
without a GPU or libcudnn it still imports and builds/validates graphs; only planning and
execution need the library and a device. :class:`RuntimeEnv` records the facts the
sub-backends' rules depend on (SM version, cuDNN version); unknown facts are ``None``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from ._version import __version__

__all__ = [
    "RuntimeEnv", "current_env", "cudnn_module", "frontend_version", "cudnn_version_string", "torch_dtype_to_cudnn",
    "versions", "format_versions",
]  # fmt: skip


@functools.lru_cache(maxsize=None)
def cudnn_module():
    """The ``cudnn`` frontend module (imported lazily; torch's libcudnn is loaded first)."""
    if torch.cuda.is_available():
        torch.backends.cudnn.version()  # make torch load its libcudnn so the frontend binds the same one
    import cudnn  # noqa: PLC0415 - deliberate lazy import

    return cudnn


def frontend_version() -> str:
    return str(cudnn_module().__version__)


def _backend_version() -> Optional[int]:
    try:
        return int(cudnn_module().backend_version())
    except Exception:  # no libcudnn on this machine: the frontend raises "Unable to find symbol"
        return None


def cudnn_version_string(version: Optional[int]) -> str:
    if version is None:
        return "unavailable"
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


@dataclass(frozen=True)
class RuntimeEnv:
    """Facts the capability rules read. ``None`` means unknown (no GPU / no libcudnn)."""

    sm: Optional[int]  # compute capability x 10, e.g. 90 for H100/H200
    cudnn_version: Optional[int]  # e.g. 91900 for 9.19.0
    device_name: str = ""

    @property
    def can_execute(self) -> bool:
        return self.sm is not None and self.cudnn_version is not None

    def describe(self) -> str:
        """``"NVIDIA H100 80GB HBM3 (sm90), cuDNN 9.19.0, frontend 1.32.0"``; ``"no GPU, ..."``
        when there is none."""
        if self.sm is None:
            gpu = self.device_name or "no GPU"
        else:
            gpu = f"{self.device_name} (sm{self.sm})" if self.device_name else f"sm{self.sm}"
        return f"{gpu}, cuDNN {cudnn_version_string(self.cudnn_version)}, frontend {frontend_version()}"


#: The machine te_cudnn's rules are checked against where there is no GPU (Hopper, sm90, with
#: cuDNN 9.19); used to describe and validate graphs on such a machine.
HOPPER_CUDNN_919 = RuntimeEnv(sm=90, cudnn_version=91900, device_name="Hopper (assumed)")


@functools.lru_cache(maxsize=None)
def _env_for_device(device: int) -> RuntimeEnv:
    if device < 0 or not torch.cuda.is_available():
        return RuntimeEnv(sm=None, cudnn_version=_backend_version())
    major, minor = torch.cuda.get_device_capability(device)
    return RuntimeEnv(sm=major * 10 + minor, cudnn_version=_backend_version(), device_name=torch.cuda.get_device_name(device))


def current_env(device: Optional[int] = None) -> RuntimeEnv:
    """The runtime facts for a CUDA device index (default: the current device, or none)."""
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    return _env_for_device(device)


def torch_dtype_to_cudnn(dtype: torch.dtype):
    dt = cudnn_module().data_type
    table = {
        torch.float16: dt.HALF,
        torch.bfloat16: dt.BFLOAT16,
        torch.float32: dt.FLOAT,
        torch.int32: dt.INT32,
        torch.int64: dt.INT64,
    }
    for name, cu in (("float8_e4m3fn", "FP8_E4M3"), ("float8_e5m2", "FP8_E5M2")):
        if hasattr(torch, name):
            table[getattr(torch, name)] = getattr(dt, cu)
    return table[dtype]


def versions() -> dict[str, str]:
    """The versions a bug report needs, as strings: ``te_cudnn``, ``torch``, ``cuda`` (torch's
    CUDA build, ``"none"`` for a CPU build), ``cudnn`` (the library the frontend binds),
    ``frontend`` and ``gpu`` (name and compute capability of the current device, or
    ``"no GPU"``). One place, so that ``te-cudnn --version``, the demo and the test header
    agree."""

    env = current_env()
    if env.sm is not None:
        gpu = f"{env.device_name} (sm{env.sm})"
    else:
        gpu = "no GPU"
    return {
        "te_cudnn": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "cudnn": cudnn_version_string(env.cudnn_version),
        "frontend": frontend_version(),
        "gpu": gpu,
    }


def format_versions(v: Optional[dict[str, str]] = None) -> str:
    """:func:`versions` on one line: ``te_cudnn 0.2.0, torch 2.11.0, CUDA 12.8, cuDNN 9.19.0,
    frontend 1.32.0, GPU NVIDIA H100 80GB HBM3 (sm90)`` (``..., no GPU`` without one)."""
    v = versions() if v is None else v
    gpu = v["gpu"] if v["gpu"] == "no GPU" else f"GPU {v['gpu']}"
    return (
        f"te_cudnn {v['te_cudnn']}, torch {v['torch']}, CUDA {v['cuda']}, cuDNN {v['cudnn']}, "
        f"frontend {v['frontend']}, {gpu}"
    )
