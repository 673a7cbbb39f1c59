"""``te-cudnn plans warm``: the configuration file (JSON or TOML, the shipped example), ``--check``
naming each problem by the file's keys, and the refusals before any GPU work, run in-process;
CPU only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from te_cudnn.cli import main

from _cli import run


# ----------------------------------------------------------------------------- plans warm
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "warm_configs.json"


def _configs(tmp_path: Path, configs: Any) -> Path:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(configs))
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_warm_needs_cuda(capsys, tmp_path: Path) -> None:
    configs = _configs(tmp_path, [{"b": 1, "h": 4, "sq": 128, "d": 64, "mask": "causal"}])
    rc, _, err = run(capsys, "plans", "warm", str(configs), "--store", str(tmp_path / "s"))
    assert rc == 1
    assert err == (f"te-cudnn: plans warm needs a CUDA device; check the file here with `te-cudnn plans warm --check "
                   f"{configs}`\n")  # fmt: skip
    assert not (tmp_path / "s").exists()


def test_warm_unreadable_configs(capsys, tmp_path: Path) -> None:
    rc, _, err = run(capsys, "plans", "warm", str(tmp_path / "missing.json"))
    assert rc == 2 and err == f"te-cudnn: cannot read {tmp_path / 'missing.json'}: No such file or directory\n"
    (tmp_path / "obj.json").write_text('{"b": 1}')
    rc, _, err = run(capsys, "plans", "warm", str(tmp_path / "obj.json"), "--check")
    assert rc == 2 and "expected a JSON list of configurations" in err and "got a JSON object" in err


def test_warm_example_file_checks_on_cpu(capsys) -> None:
    """The shipped example is valid, and every configuration in it is served on the measured Hopper machine."""
    raw = json.loads(EXAMPLES.read_text())
    assert len(raw) >= 5
    layouts = {c.get("layout", "bshd_bshd_bshd") for c in raw}
    assert {"bshd_bshd_bshd", "thd_thd_thd"} <= layouts
    assert any(c.get("hg", c["h"]) != c["h"] for c in raw)  # GQA
    assert any(c.get("training") is False for c in raw)  # inference
    assert any("padding" in c.get("mask", "") for c in raw)
    rc, out, err = run(capsys, "plans", "warm", "--check", str(EXAMPLES), "--json")
    assert rc == 0 and err == ""
    report = json.loads(out)
    assert [r["backend"] for r in report["configs"]] == ["F16_arbitrary_seqlen"] * len(raw)
    assert [r["config"] for r in report["configs"]] == [f"config {i} ({c['name']})" for i, c in enumerate(raw, 1)]
    rc, out, _ = run(capsys, "plans", "warm", "--check", str(EXAMPLES))
    assert rc == 0 and out.splitlines()[-1] == f"{len(raw)} of {len(raw)} configuration(s) valid and served"


BAD_CONFIGS = [
    ({"b": 2, "heads": 16, "sq": 128, "d": 64}, "unknown key 'heads'; accepted keys: b, h, hg, sq, skv, d, d_v, layout, "
                                                "mask, softmax_type, dtype, training, deterministic, dropout, window, attn_scale, name"),
    ({"b": 2, "h": 16, "d": 64}, "missing key 'sq' (required: b, h, sq, d)"),
    ({"b": 2, "h": 16, "sq": "128", "d": 64}, 'sq="128" must be int'),
    ({"b": 2, "h": 16, "sq": 128, "d": 64, "training": 1}, "training=1 must be bool"),
    ({"b": True, "h": 16, "sq": 128, "d": 64}, "b=true must be int"),
    ({"b": 0, "h": 16, "sq": 128, "d": 64}, "b=0 must be >= 1 (a zero-size call builds no plan)"),
    ({"b": 1, "h": 16, "hg": 3, "sq": 128, "d": 64}, "hg=3 must divide h=16 (GQA/MQA)"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "layout": "bshd"}, "layout='bshd' is not a valid QKVLayout"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "layout": "paged_kv_bshd_bshd_bshd"}, "mixed-format and paged layouts"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "mask": "causl"}, "mask='causl' is not a valid AttnMaskType"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "dtype": "float32"}, "dtype 'float32' is not a dtype fused attention takes"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "dtype": "fp8"}, "FP8 plans need FP8 scaling tensors"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "window": [1]}, "window=[1] must be [left, right], two integers"),
    ({"b": 1, "h": 16, "hg": 4, "sq": 128, "d": 64, "layout": "bs3hd"}, "packs q, k and v: it needs sq == skv and h == hg"),
    ({"b": 1, "h": 16, "sq": 128, "d": 64, "d_v": 32, "layout": "bshd_bs2hd"}, "packs k and v: it needs d_v == d"),
    ("x", 'a configuration is an object of keys, got "x"'),
]  # fmt: skip


def test_warm_check_names_each_problem(capsys, tmp_path: Path) -> None:
    good = {"name": "fine", "b": 1, "h": 16, "sq": 128, "d": 64}
    declined = {"b": 1, "h": 16, "sq": 128, "d": 264}  # valid, but no sub-backend takes d=264
    configs = _configs(tmp_path, [c for c, _ in BAD_CONFIGS] + [good, declined])
    rc, out, err = run(capsys, "plans", "warm", "--check", str(configs))
    assert rc == 2 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"checked {configs} against ")
    for i, (_, message) in enumerate(BAD_CONFIGS, 1):
        (line,) = [line for line in lines if line.startswith(f"config {i}: ")]
        assert message in line, (line, message)
    n = len(BAD_CONFIGS)
    assert any(line.startswith(f"config {n + 1} (fine): bshd_bshd_bshd bfloat16") and line.endswith("-> F16_arbitrary_seqlen")
               for line in lines)  # fmt: skip
    assert any(line.startswith(f"config {n + 2}: ") and line.endswith("-> No_Backend") for line in lines)
    assert any("F16_arbitrary_seqlen:" in line and "d_qk=264" in line for line in lines)
    assert lines[-1] == f"1 of {n + 2} configuration(s) valid and served; {n} malformed; 1 not served"

    rc, out, err = run(capsys, "plans", "warm", "--check", str(_configs(tmp_path, [good, declined])))
    assert rc == 1 and err == ""  # valid, one not served


def test_warm_check_names_the_file_keys(capsys, tmp_path: Path) -> None:
    configs = _configs(tmp_path, [{"b": 1, "h": 16, "sq": 128, "d": 64, "dropout": 0.5, "training": False},
                                  {"b": 1, "h": 16, "sq": 128, "d": 64, "mask": "causal", "window": [-1, 4]}])  # fmt: skip
    rc, out, _ = run(capsys, "plans", "warm", "--check", str(configs))
    assert rc == 2
    assert "config 1: dropout=0.5 during inference (training=false)" in out
    assert "config 2: window=[-1, 4] has right=4 but mask=causal" in out
    assert "is_training" not in out and "window_size" not in out and "attn_mask_type" not in out


def test_warm_rejects_unknown_keys_before_any_gpu_work(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A normal run checks the whole file first: a wrong key is an error (exit 2) even where a GPU is present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the check comes before any GPU question
    configs = _configs(tmp_path, [{"b": 1, "h": 4, "sq": 128, "d": 64}, {"b": 1, "h": 4, "sq": 128, "d": 64, "mask_type": "causal"},
                                  {"b": 1, "h": 4, "sq": 128}])  # fmt: skip
    rc, out, err = run(capsys, "plans", "warm", str(configs), "--store", str(tmp_path / "s"))
    assert rc == 2 and out == ""
    assert err == (f"te-cudnn: {configs}: config 2: unknown key 'mask_type'; accepted keys: b, h, hg, sq, skv, d, d_v, "
                   "layout, mask, softmax_type, dtype, training, deterministic, dropout, window, attn_scale, name; 1 more problem(s); "
                   f"`te-cudnn plans warm --check {configs}` lists every configuration\n")  # fmt: skip
    assert not (tmp_path / "s").exists()


def test_warm_help_names_every_key_and_default(capsys) -> None:
    from te_cudnn.cli import WARM_KEYS

    with pytest.raises(SystemExit) as exc:
        main(["plans", "warm", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and line.split()[0] in WARM_KEYS}
    assert set(rows) == set(WARM_KEYS)
    for key, (_, default, _) in WARM_KEYS.items():
        if key in ("b", "h", "sq", "d"):
            assert rows[key].endswith("(required)"), rows[key]
        elif key in ("hg", "skv", "d_v"):
            assert rows[key].endswith(f"(default: same as {default})"), rows[key]
        else:
            assert rows[key].endswith(f"(default: {json.dumps(default)})"), rows[key]
    assert "examples/warm_configs.json" in out and "--check" in out


def test_warm_toml(capsys, tmp_path: Path) -> None:
    pytest.importorskip("tomllib")
    path = tmp_path / "c.toml"
    path.write_text('[[config]]\nb = 1\nh = 8\nsq = 256\nd = 64\nmask = "causal"\n\n[[config]]\nb = 1\nh = 8\nsq = 256\nd = 64\nheads = 2\n')
    rc, out, _ = run(capsys, "plans", "warm", "--check", str(path))
    assert rc == 2
    assert "config 1: bshd_bshd_bshd bfloat16, b=1 h=8" in out and "config 2: unknown key 'heads'" in out
