"""``te-cudnn plans warm`` and ``plans tune``: a file of configurations, each checked (``--check``:
without a GPU, with the sub-backend that would serve it), then built or autotuned."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

try:
    import tomllib
except ImportError:  # Python 3.10: configuration files are JSON only
    tomllib = None

from ..enums import AttnMaskType, QKVLayout
from ..layouts import layout_info
from ..ops import fused_attn_bwd, fused_attn_fwd
from ..plans import plan_cache
from ..plans.store import _default_root
from ..plans.tune import autotuning, format_record, tune_key
from ..runtime import HOPPER_CUDNN_919, current_env
from ..selection import explain
from ..testing import make_qkv
from .common import CONFIG_KEYS, EXIT_FAILED, EXIT_USAGE, CliError, as_typed, emit, one_line, parse_dtype

__all__ = ["WARM_KEYS", "warm_epilog", "cmd_warm", "cmd_tune"]

# ----------------------------------------------------------------------------- plans warm
_REQUIRED = object()
#: A warm configuration's keys: (accepted types, default, meaning). ``--help`` prints this.
WARM_KEYS: dict[str, tuple[tuple[type, ...], Any, str]] = {
    "b": ((int,), _REQUIRED, "batch size (THD layouts: number of sequences)"),
    "h": ((int,), _REQUIRED, "query heads"),
    "hg": ((int,), "h", "key/value heads (GQA/MQA; must divide h)"),
    "sq": ((int,), _REQUIRED, "query sequence length (THD: tokens per sequence)"),
    "skv": ((int,), "sq", "key/value sequence length"),
    "d": ((int,), _REQUIRED, "head dim of q and k"),
    "d_v": ((int,), "d", "head dim of v"),
    "layout": ((str,), "bshd_bshd_bshd", "qkv_layout: an sbhd, bshd or thd layout, packed or not"),
    "mask": ((str,), "no_mask", "attn_mask_type"),
    "softmax_type": ((str,), "vanilla", "vanilla, off_by_one or learnable (attention sinks)"),
    "dtype": ((str,), "bfloat16", "bfloat16/bf16 or float16/fp16/half"),
    "training": ((bool,), True, "also build the backward plan"),
    "deterministic": ((bool,), False, "the deterministic backward"),
    "dropout": ((float, int), 0.0, "dropout probability"),
    "window": ((list,), [-1, -1], "sliding window [left, right]; -1 is unbounded"),
    "attn_scale": ((float, int, type(None)), None, "softmax scale (null: 1/sqrt(d))"),
    "name": ((str,), "", "a label for the output"),
}
_SIZES = ("b", "h", "hg", "sq", "skv", "d", "d_v")


def warm_epilog() -> str:
    """``plans warm`` / ``plans tune --help``'s epilog: a configuration's keys, their defaults, an example."""
    rows = []
    for key, (types, default, meaning) in WARM_KEYS.items():
        if default is _REQUIRED:
            shown = "required"
        else:
            shown = f"default: same as {default}" if key in ("hg", "skv", "d_v") else f"default: {json.dumps(default)}"
        rows.append(f"  {key:14} {meaning} ({shown})")
    return (
        "CONFIGS is a JSON list of objects (or TOML [[config]] tables); keys:\n" + "\n".join(rows)
        + '\n\nexample: [{"name": "llama-8b train", "b": 2, "h": 32, "hg": 8, "sq": 8192, "d": 128, "mask": "causal"}]'
        "\n(more in examples/warm_configs.json of the source tree). Unknown keys are an error."
    )  # fmt: skip


def _load_configs(name: str) -> list[Any]:
    try:
        text = Path(name).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror or exc}", EXIT_USAGE) from None
    except UnicodeDecodeError as exc:
        raise CliError(f"cannot read {name}: not text ({exc})", EXIT_USAGE) from None
    try:
        if name.endswith(".toml"):
            if tomllib is None:
                raise CliError(f"cannot read {name}: TOML needs Python 3.11 or later; use JSON", EXIT_USAGE)
            data = tomllib.loads(text).get("config", [])
        else:
            data = json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        raise CliError(f"cannot read {name}: {one_line(exc)}", EXIT_USAGE) from None
    if not isinstance(data, list):
        raise CliError(f"{name}: expected a JSON list of configurations (or TOML [[config]] tables), "
                       f"got a JSON {'object' if isinstance(data, dict) else type(data).__name__}", EXIT_USAGE)  # fmt: skip
    return data


def _check_config(c: Any) -> dict[str, Any]:
    """One configuration with its defaults filled in; ``ValueError`` naming the key otherwise."""
    if not isinstance(c, dict):
        raise ValueError(f"a configuration is an object of keys, got {json.dumps(c)}")
    unknown = [k for k in c if k not in WARM_KEYS]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; accepted keys: {', '.join(WARM_KEYS)}")
    missing = [k for k, (_, default, _) in WARM_KEYS.items() if default is _REQUIRED and k not in c]
    if missing:
        raise ValueError(f"missing key {missing[0]!r} (required: b, h, sq, d)")
    for key, value in c.items():
        types = WARM_KEYS[key][0]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"{key}={json.dumps(value)} must be {want}")
    out = {k: c.get(k, d) for k, (_, d, _) in WARM_KEYS.items()}
    for key in ("hg", "skv", "d_v"):
        if key not in c:
            out[key] = out[WARM_KEYS[key][1]]
    for key in _SIZES:
        if out[key] < 1:
            raise ValueError(f"{key}={out[key]} must be >= 1 (a zero-size call builds no plan)")
    w = out["window"]
    if len(w) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in w):
        raise ValueError(f"window={json.dumps(w)} must be [left, right], two integers")
    layout = QKVLayout.coerce(out["layout"], argument="layout")
    info = layout_info(layout)
    if layout.value >= 15:
        raise ValueError(f"layout={layout.name!r}: plans warm makes the 15 sbhd, bshd and thd layouts; mixed-format "
                         "and paged layouts are built by their first call")  # fmt: skip
    AttnMaskType.coerce(out["mask"], argument="mask")
    try:
        dtype = parse_dtype(out["dtype"], argument="dtype")
    except CliError as exc:
        raise ValueError(str(exc)) from None
    if dtype.itemsize == 1:
        raise ValueError(f"dtype={out['dtype']!r}: FP8 plans need FP8 scaling tensors; they are built by the first "
                         "FP8 call")
    if out["h"] % out["hg"]:
        raise ValueError(f"hg={out['hg']} must divide h={out['h']} (GQA/MQA)")
    if (info.packs_qkv or info.packs_kv) and out["d_v"] != out["d"]:
        raise ValueError(f"layout={layout.name!r} packs k and v: it needs d_v == d")
    if info.packs_qkv and (out["sq"] != out["skv"] or out["h"] != out["hg"]):
        raise ValueError(f"layout={layout.name!r} packs q, k and v: it needs sq == skv and h == hg")
    out["layout"], out["torch_dtype"] = layout.name, dtype
    return out


def _check_configs(configs: list[Any]) -> list[dict[str, Any]]:
    """Each configuration checked, in file order: with its defaults filled in, or with a
    ``"problem"`` line (``config N (name): ...``). Both carry a ``"label"``."""
    checked = []
    for i, c in enumerate(configs, 1):
        name = c.get("name") if isinstance(c, dict) else None
        label = f"config {i}" + (f" ({name})" if isinstance(name, str) and name else "")
        try:
            checked.append({**_check_config(c), "label": label})
        except (ValueError, TypeError) as exc:
            checked.append({"label": label, "problem": f"{label}: {one_line(exc)}"})
    return checked


def _explain_config(c: dict[str, Any], env) -> Any:
    return explain(
        is_training=c["training"], q_dtype=c["torch_dtype"], kv_dtype=c["torch_dtype"], qkv_layout=c["layout"],
        attn_bias_type="no_bias", attn_mask_type=c["mask"], softmax_type=c["softmax_type"], dropout=float(c["dropout"]),
        num_attn_heads=c["h"], num_gqa_groups=c["hg"], max_seqlen_q=c["sq"], max_seqlen_kv=c["skv"],
        head_dim_qk=c["d"], head_dim_v=c["d_v"], window_size_left=c["window"][0], window_size_right=c["window"][1],
        deterministic=c["deterministic"], batch_size=c["b"], env=env,
    )  # fmt: skip


def _warm_check(args, checked: list[dict[str, Any]]) -> int:
    """``--check``: for each configuration, in file order, what is wrong with it or the
    sub-backend that would serve it (or every reason why none would), without a GPU. Exit 2
    when a configuration is malformed, 1 when one is valid but served by no sub-backend."""
    env = current_env()
    env = env if env.can_execute else HOPPER_CUDNN_919
    lines, results = [f"checked {args.configs} against {env.describe()}"], []
    for c in checked:
        if "problem" not in c:
            try:
                ex = _explain_config(c, env)
            except (ValueError, TypeError) as exc:
                c = {"label": c["label"], "problem": f"{c['label']}: {as_typed(one_line(exc), CONFIG_KEYS)}"}
        if "problem" in c:
            results.append({"config": c["label"], "problem": c["problem"]})
            lines.append(c["problem"])
            continue
        served = ex.backend.name != "No_Backend"
        reasons = {} if served else {n: why for n, why in ex.reasons.items() if why}
        results.append({"config": c["label"], "summary": ex.config.summary(), "backend": ex.backend.name,
                        "reasons": reasons})  # fmt: skip
        lines.append(f"{c['label']}: {ex.config.summary()} -> {ex.backend.name}")
        lines += [f"    {n}: {'; '.join(why)}" for n, why in reasons.items()]
    malformed = sum("problem" in r for r in results)
    declined = sum(r.get("backend") == "No_Backend" for r in results)
    lines.append(f"{len(results) - malformed - declined} of {len(results)} configuration(s) valid and served"
                 + (f"; {malformed} malformed" if malformed else "") + (f"; {declined} not served" if declined else ""))
    emit(args, {"env": env.describe(), "configs": results}, "\n".join(lines))
    return EXIT_USAGE if malformed else EXIT_FAILED if declined else 0


def _warm_one(c: dict[str, Any]) -> None:
    dtype, sq, skv = c["torch_dtype"], c["sq"], c["skv"]
    q, k, v = make_qkv(QKVLayout[c["layout"]], c["b"], c["h"], c["hg"], sq, skv, c["d"], c["d_v"], dtype=dtype)
    cu_q = torch.arange(0, (c["b"] + 1) * sq, sq, dtype=torch.int32, device="cuda")
    cu_kv = torch.arange(0, (c["b"] + 1) * skv, skv, dtype=torch.int32, device="cuda")
    kw = dict(qkv_layout=c["layout"], attn_mask_type=c["mask"], attn_scale=c["attn_scale"], dropout=float(c["dropout"]),
              window_size=tuple(c["window"]), softmax_type=c["softmax_type"])  # fmt: skip
    offset = None if c["softmax_type"] != "learnable" else torch.zeros(1, c["h"], 1, 1, device="cuda")
    out, aux = fused_attn_fwd(c["training"], sq, skv, cu_q, cu_kv, q, k, v, dtype, None, softmax_offset=offset, **kw)
    if c["training"]:
        fused_attn_bwd(sq, skv, cu_q, cu_kv, q, k, v, out, out, dtype, aux, None, deterministic=c["deterministic"],
                       **kw)


def cmd_warm(args) -> int:
    checked = _check_configs(_load_configs(args.configs))
    if args.check:
        return _warm_check(args, checked)
    problems = [c["problem"] for c in checked if "problem" in c]
    if problems:  # before any GPU work
        more = f"; {len(problems) - 1} more problem(s)" if len(problems) > 1 else ""
        raise CliError(f"{args.configs}: {problems[0]}{more}; `te-cudnn plans warm --check {args.configs}` lists "
                       "every configuration", EXIT_USAGE)  # fmt: skip
    configs = checked
    if not torch.cuda.is_available():
        raise CliError(f"plans warm needs a CUDA device; check the file here with `te-cudnn plans warm --check "
                       f"{args.configs}`")
    if args.store:
        os.environ["TE_CUDNN_PLAN_STORE"] = args.store
    failures = 0
    for i, c in enumerate(configs, 1):
        print(f"\r[{i}/{len(configs)}] {c['label']}", end="", file=sys.stderr, flush=True)
        try:
            _warm_one(c)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next configuration
            failures += 1
            print(f"\nte-cudnn: {c['label']} failed: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
    print(file=sys.stderr)
    s = plan_cache.stats()
    done = len(configs) - failures
    emit(args, s.as_dict(), f"warmed {done}/{len(configs)} configs: {s.builds} built, {s.loads} loaded")
    return EXIT_FAILED if failures else 0


# ----------------------------------------------------------------------------- plans tune
def _tune_entry(plan: Any, retuned: bool) -> dict[str, Any]:
    """What ``plans tune`` reports of one plan of a configuration."""
    if plan.tuning is not None:
        status = "tuned now" if plan.source == "built" or retuned else "tuned earlier (from the store)"
    else:
        status = "not tuned: " + (plan.tuning_error or "its sub-backend's plans are not tuned (not stored)")
    return {"direction": plan.key.direction.value, "backend": plan.key.backend.name, "plan": plan.plan_name,
            "status": status, "tuned": plan.tuning is not None, "tuning": plan.tuning,
            "key": plan.key.describe()}  # fmt: skip


def cmd_tune(args) -> int:
    checked = _check_configs(_load_configs(args.configs))
    problems = [c["problem"] for c in checked if "problem" in c]
    if problems:  # before any GPU work
        more = f"; {len(problems) - 1} more problem(s)" if len(problems) > 1 else ""
        raise CliError(f"{args.configs}: {problems[0]}{more}; `te-cudnn plans warm --check {args.configs}` lists "
                       "every configuration", EXIT_USAGE)  # fmt: skip
    if not torch.cuda.is_available():
        raise CliError(f"plans tune needs a CUDA device (it times every engine on it); check the file here with "
                       f"`te-cudnn plans warm --check {args.configs}`")  # fmt: skip
    if args.store:
        os.environ["TE_CUDNN_PLAN_STORE"] = args.store
    if _default_root() is None:
        print("te-cudnn: warning: the plan store is off (TE_CUDNN_PLAN_STORE=off): the tunings are shown, not kept",
              file=sys.stderr)  # fmt: skip
    failures, results, lines = 0, [], []
    for i, c in enumerate(checked, 1):
        print(f"\r[{i}/{len(checked)}] {c['label']}", end="", file=sys.stderr, flush=True)
        plan_cache.clear()  # what is cached afterwards is this configuration's plans
        entry: dict[str, Any] = {"config": c["label"], "plans": []}
        try:
            with autotuning(True):
                _warm_one(c)
            for plan in sorted(plan_cache.plans(), key=lambda p: p.key.direction.value != "fwd"):
                retuned = False
                if args.retune and plan.source == "store":
                    tune_key(plan.key)
                    plan, retuned = plan_cache.find(plan.key) or plan, True
                entry["plans"].append(_tune_entry(plan, retuned))
        except Exception as exc:  # noqa: BLE001 - report and go on with the next configuration
            entry["error"] = f"{type(exc).__name__}: {one_line(exc)}"
        results.append(entry)
        failures += "error" in entry or any(not p["tuned"] for p in entry["plans"])
        lines.append(f"{c['label']}:" + (f" failed: {entry['error']}" if "error" in entry else ""))
        for p in entry["plans"]:
            lines.append(f"  {p['direction']} ({p['backend']}): {p['status']}")
            if p["tuning"] is not None:
                lines.append(format_record(p["tuning"], indent="    "))
    print(file=sys.stderr)
    tuned = sum(p["tuned"] for r in results for p in r["plans"])
    lines.append(f"tuned {tuned} plan(s) of {len(checked)} configuration(s)"
                 + (f"; {failures} failed" if failures else ""))
    store = os.environ.get("TE_CUDNN_PLAN_STORE") or str(_default_root())
    emit(args, {"store": store, "configs": results, "failures": failures}, "\n".join(lines))
    return EXIT_FAILED if failures else 0

