"""``te-cudnn explain``: the sub-backend a configuration gets on the measured Hopper machine, the
reasons of those that decline, dtype aliases, and errors that name the options typed, run
in-process; CPU only."""

from __future__ import annotations

import json

import pytest

from te_cudnn.cli import build_parser, main

from _cli import EXPLAIN, run


def test_explain_supported(capsys) -> None:
    rc, out, _ = run(capsys, *EXPLAIN)
    assert rc == 0
    assert "-> F16_arbitrary_seqlen" in out and "F16_max512_seqlen: declined" in out
    assert not out.startswith("note:")  # dense: the batch is what was asked for
    rc, out, _ = run(capsys, *EXPLAIN, "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["backend"] == "F16_arbitrary_seqlen"
    assert set(data) == {"backend", "reasons", "config", "env", "batch", "planned"}
    assert data["batch"] == 1 and data["planned"] == {"b": 1, "sq": 2048, "skv": 2048}
    assert "sm90" in data["env"] and "sq=2048" in data["config"]


def test_explain_thd_says_which_batch_it_checks(capsys) -> None:
    rc, out, _ = run(capsys, "explain", "--heads", "16", "--sq", "1000", "--d", "128", "--layout", "thd_thd_thd",
                     "--mask", "padding_causal", "--batch", "3", "--target", "hopper")  # fmt: skip
    assert rc == 0
    assert out.splitlines()[0] == ("note: THD plans are keyed on buckets, so --batch 3 --sq 1000 --skv 1000 is checked "
                                   "as b=32 sq=1024 skv=1024")  # fmt: skip
    rc, out, _ = run(capsys, "explain", "--heads", "16", "--sq", "1000", "--d", "128", "--layout", "thd_thd_thd",
                     "--mask", "padding_causal", "--batch", "3", "--target", "hopper", "--json")  # fmt: skip
    data = json.loads(out)
    assert data["batch"] == 3 and data["planned"] == {"b": 32, "sq": 1024, "skv": 1024}


def test_explain_unsupported(capsys) -> None:
    rc, out, _ = run(capsys, *EXPLAIN, "--bias", "pre_scale_bias")
    assert rc == 1 and "No_Backend" in out and "pre_scale_bias" in out
    rc, out, _ = run(capsys, *EXPLAIN, "--bias", "pre_scale_bias", "--json")
    assert rc == 1 and json.loads(out)["backend"] == "No_Backend"


@pytest.mark.parametrize(
    ("name", "expected"),
    [("bf16", "bfloat16"), ("BF16", "bfloat16"), ("bfloat16", "bfloat16"), ("torch.bfloat16", "bfloat16"),
     ("fp16", "float16"), ("half", "float16"), ("float16", "float16"), ("fp8", "float8_e4m3fn"),
     ("e4m3", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e4m3fn"), ("e5m2", "float8_e5m2")],
)  # fmt: skip
def test_explain_dtype_aliases(capsys, name: str, expected: str) -> None:
    rc, out, err = run(capsys, *EXPLAIN, "--dtype", name, "--json")
    assert err == "" and rc in (0, 1)
    assert json.loads(out)["config"].split(",")[0] == f"bshd_bshd_bshd {expected}"


def test_explain_bad_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--sq", "2048", "--d", "128"])  # --heads is required
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == ("te-cudnn explain: the following arguments are required: --heads (see `te-cudnn explain "
                   "--help`)\n")  # fmt: skip
    for argv in ([*EXPLAIN[:-2], "--target", "ampere"], ["explain", "--heads", "many", "--sq", "2048", "--d", "128"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1
    for bad in ("notadtype", "Tensor", "float32", "int8"):
        rc, _, err = run(capsys, *EXPLAIN, "--dtype", bad)  # checked by the command, not argparse
        assert rc == 2
        assert err == (f"te-cudnn: --dtype {bad!r} is not a dtype fused attention takes; accepted: bfloat16, bf16, "
                       "float16, fp16, half, float8_e4m3fn, fp8, e4m3, fp8_e4m3, float8_e5m2, e5m2, fp8_e5m2\n")  # fmt: skip
    rc, _, err = run(capsys, *EXPLAIN, "--gqa-groups", "3")
    assert rc == 2 and err == "te-cudnn: --gqa-groups 3 does not divide --heads 16\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [(("--heads", "0"), "--heads 0 must be >= 1"),
     (("--d", "0"), "--d 0 must be >= 1"),
     (("--batch", "-1"), "--batch -1 must be >= 0"),
     (("--dropout", "1.5"), "--dropout 1.5 must be in [0, 1)"),
     (("--dropout", "0.5", "--inference"), "--dropout 0.5 during inference (--inference)"),
     (("--window", "-3", "-1"), "--window -3 -1 entries must be >= -1"),
     (("--window", "-1", "4"), "--window -1 4 has right=4 but --mask causal allows no keys right of the diagonal"),
     (("--layout", "bshd"), "--layout 'bshd' is not a valid QKVLayout"),
     (("--layout", "bs3hd", "--gqa-groups", "4"), "--sq == --skv and --heads == --gqa-groups, got"),
     (("--layout", "bshd_bs2hd", "--d-v", "64"), "packs k and v, so --d 128 must equal --d-v 64"),
     (("--softmax-type", "sinks"), "--softmax-type 'sinks' is not a valid SoftmaxType"),
     (("--bias", "x"), "--bias 'x' is not a valid AttnBiasType")],
)  # fmt: skip
def test_explain_errors_name_the_options_typed(capsys, extra: tuple[str, ...], message: str) -> None:
    """The library's messages name its parameters (num_gqa_groups=3); the command's name the
    options the user typed (--gqa-groups 3)."""
    from te_cudnn.cli import EXPLAIN_FLAGS

    rc, out, err = run(capsys, *EXPLAIN, *extra)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("te-cudnn: ") and message in err, err
    assert not any(f"{name}=" in err or ("_" in name and name in err) for name in EXPLAIN_FLAGS), err


def test_explain_help_documents_every_option(capsys) -> None:
    """Every option of `explain` has help text, and those with a default say it."""
    parser = build_parser()
    xp = parser._subparsers._group_actions[0].choices["explain"]  # noqa: SLF001 - argparse offers no public way
    for action in xp._actions:  # noqa: SLF001
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, action.option_strings
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: bfloat16)", "(default: bshd_bshd_bshd)", "(default: no_mask)", "(default: no_bias)",
                  "(default: 1)", "(default: 0.0)", "(default: (-1, -1))", "(default: current)", "(default: --heads)",
                  "(default: --sq)", "(default: --d)", "bf16", "fp16", "e4m3"):  # fmt: skip
        assert shown in text, shown
