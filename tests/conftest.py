"""Markers, hardware gates and a version banner.

``gpu`` tests need a CUDA device (and libcudnn); ``fp8`` tests also need FP8 support. Both
are skipped cleanly elsewhere, with the reason in the summary.
"""

from __future__ import annotations

import pytest
import torch


def _cudnn_version() -> int | None:
    try:
        from te_cudnn.runtime import current_env

        return current_env().cudnn_version
    except Exception:
        return None


HAS_GPU = torch.cuda.is_available()


def pytest_report_header(config):
    import te_cudnn
    from te_cudnn.runtime import current_env, frontend_version

    env = current_env()
    return [
        f"te_cudnn {te_cudnn.__version__}, torch {torch.__version__}, cudnn-frontend {frontend_version()}",
        f"runtime: {env.describe()}",
    ]


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device with cuDNN")
    skip_fp8 = pytest.mark.skip(reason="needs a GPU with FP8 attention (sm90+)")
    has_cudnn = HAS_GPU and _cudnn_version() is not None
    fp8_ok = has_cudnn and torch.cuda.get_device_capability()[0] >= 9
    for item in items:
        if "gpu" in item.keywords and not has_cudnn:
            item.add_marker(skip_gpu)
        if "fp8" in item.keywords and not fp8_ok:
            item.add_marker(skip_fp8)
