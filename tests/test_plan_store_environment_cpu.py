"""Where the plan store lives and how large it may grow: ``default_store`` under
TE_CUDNN_PLAN_STORE (a directory or off), XDG_CACHE_HOME and HOME; TE_CUDNN_PLAN_STORE_MAX_MB and
TE_CUDNN_PLAN_CACHE_SIZE (a bad value warns once and gives the default); and the test suite's
own temporary store; CPU only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from te_cudnn.plans import store as store_mod
from te_cudnn.plans.store import default_store, env_number, fingerprint_of

from _plan_helpers import FACTS
from _plan_store_cpu import BLOB, Recorder, desc


@pytest.mark.parametrize("value", ["off", "OFF", "0", "none", "false"])
def test_default_store_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", value)
    assert default_store(FACTS) is None


def test_default_store_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(tmp_path / "custom"))
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE_MAX_MB", "3")
    s = default_store(FACTS)
    assert s is not None and s.root == tmp_path / "custom" and s.facts == FACTS
    assert s.dir == tmp_path / "custom" / fingerprint_of(FACTS) and s.max_bytes == 3 << 20
    s.save(desc(), BLOB)
    assert default_store(FACTS).load(desc()).blob == BLOB


def test_default_store_xdg_and_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TE_CUDNN_PLAN_STORE", raising=False)
    monkeypatch.delenv("TE_CUDNN_PLAN_STORE_MAX_MB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    s = default_store(FACTS)
    assert s.root == tmp_path / "xdg" / "te_cudnn" / "plans" and s.max_bytes == 512 << 20
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store(FACTS).root == tmp_path / "home" / ".cache" / "te_cudnn" / "plans"


def test_test_suite_uses_a_temporary_store() -> None:
    root = store_mod._default_root()
    home = Path(os.path.expanduser("~")) / ".cache" / "te_cudnn"
    assert root is not None and "te_cudnn-test-plans-" in str(root) and home not in root.parents


def test_plan_store_max_mb_accepts_fractions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(tmp_path))
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE_MAX_MB", "1.5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert default_store(FACTS).max_bytes == 3 << 19


@pytest.mark.parametrize("value", ["abc", "-3", "0", "nan", "inf", "1 MB"])
def test_bad_plan_store_max_mb_warns_once_and_uses_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE", str(tmp_path))
    monkeypatch.setenv("TE_CUDNN_PLAN_STORE_MAX_MB", value)
    monkeypatch.setattr(store_mod, "_env_warned", set())
    with Recorder() as seen:
        stores = [default_store(FACTS) for _ in range(3)]
    assert [s.max_bytes for s in stores] == [512 << 20] * 3
    assert seen == [f"te_cudnn: TE_CUDNN_PLAN_STORE_MAX_MB={value!r} is not a positive number of megabytes; "
                    f"using the default 512"]  # fmt: skip
    stores[0].save(desc(), BLOB)  # and the store works
    assert stores[1].load(desc()).blob == BLOB


@pytest.mark.parametrize(
    "value,expected", [("64", 64), (" 8 ", 8), ("", 512), ("abc", None), ("0", None), ("-1", None), ("1.5", None)]
)
def test_env_number_for_the_plan_cache_size(monkeypatch: pytest.MonkeyPatch, value: str, expected: int | None) -> None:
    monkeypatch.setenv("TE_CUDNN_PLAN_CACHE_SIZE", value)
    monkeypatch.setattr(store_mod, "_env_warned", set())
    with Recorder() as seen:
        got = env_number("TE_CUDNN_PLAN_CACHE_SIZE", 512, integer=True, what="a positive whole number of plans")
    assert got == (expected or 512) and isinstance(got, int)
    if expected is None:
        assert seen == [f"te_cudnn: TE_CUDNN_PLAN_CACHE_SIZE={value!r} is not a positive whole number of plans; "
                        f"using the default 512"]  # fmt: skip
    else:
        assert seen == []


@pytest.mark.slow
def test_bad_plan_cache_size_does_not_break_import() -> None:
    code = "import te_cudnn; print(te_cudnn.plan_cache.maxsize)"
    env = dict(os.environ, TE_CUDNN_PLAN_CACHE_SIZE="abc")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "512"
    assert res.stderr.count("TE_CUDNN_PLAN_CACHE_SIZE='abc' is not a positive whole number of plans; using the default 512") == 1
