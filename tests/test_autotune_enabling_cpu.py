"""Switching autotuning (``te_cudnn.plans.tune``) on and off without a GPU: the TE_CUDNN_AUTOTUNE
environment variable, the ``autotuning`` context manager and decorator (a setting per thread),
and which plan keys are tuned at all.
"""

from __future__ import annotations

import threading
import warnings

import pytest

from te_cudnn.backends import Direction
from te_cudnn.enums import FusedAttnBackend
from te_cudnn.plans import make_key
from te_cudnn.plans import tune as tune_mod
from te_cudnn.plans.tune import ENV, autotune_enabled, autotuning, tunable, tuning_wanted

from _autotune_cpu import no_autotune_env  # noqa: F401 - autouse: TE_CUDNN_AUTOTUNE unset, warnings reset
from _plan_helpers import sizes_config, sizes_key


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("ON", True), (" yes ", True), ("0", False),
                                      ("off", False), ("", False), ("False", False), ("no", False)])  # fmt: skip
def test_environment_variable(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    assert autotune_enabled() is False  # unset: off
    monkeypatch.setenv(ENV, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # recognised values never warn
        assert autotune_enabled() is on


def test_unrecognised_value_is_off_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "maybe")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert autotune_enabled() is False and autotune_enabled() is False
    assert len(seen) == 1 and "TE_CUDNN_AUTOTUNE='maybe'" in str(seen[0].message)


def test_context_manager_overrides_the_environment_and_nests(monkeypatch: pytest.MonkeyPatch) -> None:
    with autotuning():
        assert autotune_enabled()
        with autotuning(False):
            assert not autotune_enabled()
            with autotuning(True):
                assert autotune_enabled()
            assert not autotune_enabled()
        assert autotune_enabled()
    assert not autotune_enabled()
    monkeypatch.setenv(ENV, "1")
    assert autotune_enabled()
    with autotuning(False):  # the block wins over the environment, both ways
        assert not autotune_enabled()
    assert autotune_enabled()


def test_context_manager_restores_on_error_and_works_as_decorator() -> None:
    with pytest.raises(RuntimeError):
        with autotuning():
            raise RuntimeError("boom")
    assert not autotune_enabled()

    @autotuning()
    def inside() -> bool:
        return autotune_enabled()

    assert inside() is True and autotune_enabled() is False


def test_the_setting_belongs_to_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, bool] = {}
    with autotuning():
        t = threading.Thread(target=lambda: seen.setdefault("other", autotune_enabled()))
        t.start()
        t.join()
        assert autotune_enabled()
    assert seen == {"other": False}  # a thread started inside follows the environment (unset: off)
    monkeypatch.setenv(ENV, "1")
    with autotuning(False):
        t = threading.Thread(target=lambda: seen.__setitem__("other", autotune_enabled()))
        t.start()
        t.join()
    assert seen == {"other": True}


def test_which_keys_are_tunable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tunable(sizes_key()) and tunable(sizes_key(Direction.BWD))
    assert not tunable(sizes_key(device=-1))  # no CUDA device
    max512 = make_key(FusedAttnBackend.F16_max512_seqlen, Direction.FWD, sizes_config(), 91900, "1.32.0")
    assert not tunable(max512)  # plans that are not stored are never tuned
    assert not tuning_wanted(sizes_key())  # off
    with autotuning():
        assert tuning_wanted(sizes_key()) and not tuning_wanted(max512)
        monkeypatch.setattr(tune_mod, "_capturing", lambda: True)
        assert not tuning_wanted(sizes_key())  # never during CUDA-graph capture
