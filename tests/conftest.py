"""Markers, hardware gates and a version banner.

``gpu`` tests need a CUDA device (and libcudnn); ``fp8`` tests also need FP8 support. Both
are skipped cleanly elsewhere, with the reason in the summary.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

import pytest
import torch

# The suites never touch the user's plan store: stale plans there would hide a change to the
# graph builders, and tests would write into ~/.cache. Set at import, before te_cudnn creates
# its store (pytest_configure drops any store made earlier); processes the tests start inherit
# it, and those that pass their own TE_CUDNN_PLAN_STORE override it.
_TEST_PLAN_STORE = tempfile.mkdtemp(prefix="te_cudnn-test-plans-")  # 0700
os.environ["TE_CUDNN_PLAN_STORE"] = _TEST_PLAN_STORE

# Seeded random tests draw their configurations at collection. Parallel workers (pytest-xdist)
# must collect the same tests, so without an explicit TE_CUDNN_TEST_SEED every worker of a run
# takes the one the run's id gives (a fresh seed per run, as before).
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID")
if _RUN_ID and not os.environ.get("TE_CUDNN_TEST_SEED"):
    os.environ["TE_CUDNN_TEST_SEED"] = str(int(hashlib.sha256(_RUN_ID.encode()).hexdigest(), 16) % (1 << 31))


def _cudnn_version() -> int | None:
    try:
        from te_cudnn.runtime import current_env

        return current_env().cudnn_version
    except Exception:
        return None


HAS_GPU = torch.cuda.is_available()


def pytest_configure(config):
    from te_cudnn.plans import cache

    cache._stores.clear()


def pytest_unconfigure(config):
    shutil.rmtree(_TEST_PLAN_STORE, ignore_errors=True)


def pytest_report_header(config):
    from te_cudnn.runtime import current_env, format_versions

    return [format_versions(), f"runtime: {current_env().describe()}", f"plan store (temporary): {_TEST_PLAN_STORE}"]


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
