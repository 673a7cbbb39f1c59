"""What the numbers were measured on: versions, GPU and driver (:func:`environment`), and the
GPU's measured ceilings (:func:`measure_peaks`)."""

from __future__ import annotations

import platform
import subprocess
import time
from typing import Any, Callable, Optional

import torch

from ..runtime import versions
from .failures import _one_line
from .measure import copy_bandwidth_gbps, fp8_matmul_peak_tflops, free_memory, matmul_peak_tflops


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        line = out.stdout.strip().splitlines()
        if out.returncode == 0 and line:
            return line[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def environment() -> dict[str, Any]:
    """What the numbers were measured on: GPU, driver, CUDA, cuDNN, torch, frontend, te_cudnn."""

    env: dict[str, Any] = dict(versions())
    env["driver"] = _driver_version() if torch.cuda.is_available() else "none"
    env["python"] = platform.python_version()
    env["torch_cudnn"] = str(torch.backends.cudnn.version()) if torch.cuda.is_available() else "none"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
        env["sm_count"] = p.multi_processor_count
    env["time"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return env


def measure_peaks(log: Callable[[str], None]) -> dict[str, Any]:
    peaks: dict[str, Any] = {}
    for key, fn in (("matmul_bf16_tflops", matmul_peak_tflops), ("matmul_fp8_tflops", fp8_matmul_peak_tflops),
                    ("copy_gbps", copy_bandwidth_gbps)):  # fmt: skip
        try:
            peaks[key] = fn()
        except Exception as exc:  # noqa: BLE001 - a ceiling we could not measure is left out
            peaks[key] = None
            peaks[f"{key}_error"] = _one_line(exc)
    free_memory()
    log(f"ceilings: bf16 matmul {_fmt(peaks.get('matmul_bf16_tflops'))} TFLOP/s, fp8 matmul "
        f"{_fmt(peaks.get('matmul_fp8_tflops'))} TFLOP/s, device copy {_fmt(peaks.get('copy_gbps'))} GB/s")  # fmt: skip
    return peaks


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.0f}"
