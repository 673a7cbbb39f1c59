"""The ``te-cudnn plans tune`` command without a GPU (its help, the refusal without a CUDA device,
bad configs rejected before any GPU work), and how ``plans show`` and ``plans list`` present a
stored tuning record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from te_cudnn.backends import Direction
from te_cudnn.cli import main
from te_cudnn.plans import cache as cache_mod
from te_cudnn.plans.store import PlanStore

from _autotune_cpu import no_autotune_env  # noqa: F401 - autouse: TE_CUDNN_AUTOTUNE unset, warnings reset
from _autotune_cpu import stand_in_plan as _plan
from _autotune_cpu import tuned_plan as _tuned_plan
from _plan_helpers import FACTS, sizes_key


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_tune_help(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plans", "tune", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: te-cudnn plans tune")
    for word in ("configs", "--retune", "--store", "--json", "needs a GPU", "plans warm", "plans show"):
        assert word in out, word
    for key in ("b", "h", "hg", "sq", "skv", "d", "d_v", "layout", "mask", "dtype", "training"):
        assert f"\n  {key} " in out, key
    with pytest.raises(SystemExit) as exc:
        main(["plans", "--help"])
    assert exc.value.code == 0 and "tune" in capsys.readouterr().out


def _configs(tmp_path: Path, configs: Any) -> Path:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(configs))
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_tune_needs_cuda(capsys, tmp_path: Path) -> None:
    configs = _configs(tmp_path, [{"b": 1, "h": 4, "sq": 128, "d": 64, "mask": "causal"}])
    rc, out, err = run(capsys, "plans", "tune", str(configs), "--store", str(tmp_path / "s"))
    assert rc == 1 and out == ""
    assert err == (f"te-cudnn: plans tune needs a CUDA device (it times every engine on it); check the file here with "
                   f"`te-cudnn plans warm --check {configs}`\n")  # fmt: skip
    assert not (tmp_path / "s").exists()


def test_tune_rejects_bad_configs_before_any_gpu_work(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("no device check before the file is checked"))
    configs = _configs(tmp_path, [{"b": 1, "h": 4, "sq": 128, "d": 64}, {"b": 1, "h": 4, "sq": 128, "d": 64, "x": 1}])
    rc, _, err = run(capsys, "plans", "tune", str(configs))
    assert rc == 2 and "config 2: unknown key 'x'" in err and "plans warm --check" in err
    rc, _, err = run(capsys, "plans", "tune", str(tmp_path / "missing.json"))
    assert rc == 2 and "cannot read" in err


@pytest.fixture
def tuned_store(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "store"
    s = PlanStore(root, FACTS)
    k, kb = sizes_key(), sizes_key(Direction.BWD)
    cache_mod._save_built(s, k, k.describe(device=False), _tuned_plan(k))
    cache_mod._save_built(s, kb, kb.describe(device=False), _plan(kb))
    return root, s.path_for(k.describe(device=False))


def test_show_lists_the_candidates_times(capsys, tuned_store: tuple[Path, Path]) -> None:
    root, path = tuned_store
    rc, out, err = run(capsys, "plans", "show", path.stem[:10], "--store", str(root))
    assert rc == 0 and err == ""
    assert "plan_name: eng4_k3=2" in out and "direction: fwd" in out
    assert "tuning: {" not in out  # the record is rendered, not dumped
    assert "chosen [1] eng4_k3=2 (0.4100 ms), heuristic [0] eng0_k2=1 (0.5200 ms), speed-up 1.268x" in out
    for name, ms in (("eng0_k2=1", "0.5200 ms"), ("eng4_k3=2", "0.4100 ms"), ("eng7_k9=0", "0.4500 ms")):
        assert any(name in line and ms in line for line in out.splitlines()), name
    assert "error: not built" in out and "error: RuntimeError: CUDNN_STATUS_EXECUTION_FAILED" in out
    rc, out, _ = run(capsys, "plans", "show", path.stem, "--store", str(root), "--json")
    header = json.loads(out)
    assert rc == 0 and header["tuning"]["chosen"]["name"] == "eng4_k3=2" and len(header["tuning"]["candidates"]) == 5


def test_list_marks_tuned_plans(capsys, tuned_store: tuple[Path, Path]) -> None:
    root, path = tuned_store
    rc, out, _ = run(capsys, "plans", "list", "--store", str(root), "--json")
    rows = {r["entry"]: r for r in json.loads(out)["plans"]}
    assert rc == 0 and rows[path.stem]["tuned"] == "1.27x"
    assert sorted(r["tuned"] for r in rows.values()) == ["-", "1.27x"]
    rc, out, _ = run(capsys, "plans", "list", "--store", str(root))
    assert rc == 0 and "tuned" in out.splitlines()[1] and "1.27x" in out
