"""table.md (:func:`to_markdown`) and the short summary printed after a run (:func:`to_summary`)."""

from __future__ import annotations

from typing import Optional

from .formatting import _num, _table
from .ratios import RATIO_CONFIDENCE
from .rows import REFERENCE, _contenders, _div, flat_rows, headline
from .targets import _targets

MODES = ("fwd", "bwd", "fwd_bwd")


def _grid(results: dict, flat: list[dict], cell, *, only: Optional[callable] = None) -> list[str]:
    """Rows = cases, columns = contenders that ran (or failed) on any case of this selection."""
    cases = [c for c in results.get("cases", []) if only is None or only(c)]
    by = {(r["case"], r["contender"]): r for r in flat}
    names = [n for n in _contenders(results)
             if any(by.get((c["name"], n), {}).get("status") in ("ok", "error") for c in cases)]
    if not cases or not names:
        return ["(nothing ran)"]
    rows = []
    for c in cases:
        line = [c["name"]]
        for n in names:
            r = by.get((c["name"], n))
            if r is None or r["status"] == "skipped":
                line.append("—")
            elif r["status"] == "error":
                line.append("error")
            else:
                line.append(cell(r, c))
        rows.append(line)
    return _table(["case", *names], rows)


def _time_cell(mode: Optional[str] = None, ratio: bool = False):
    def cell(r: dict, case: dict) -> str:
        m = mode or headline(case)
        v = r.get(f"{m}_ms")
        if v is None:
            return "error" if f"{m}:" in (r.get("errors") or "") else ""
        text = _num(v)
        if ratio and r.get("ratio_vs_sdpa_cudnn") is not None:
            text += f" ({r['ratio_vs_sdpa_cudnn']:.2f}×)"
        return text

    return cell


def _env_lines(results: dict) -> list[str]:
    env, peaks, st = results.get("env", {}), results.get("peaks") or {}, results.get("settings", {})
    gpu = env.get("gpu", "?")
    extra = ", ".join(x for x in (f"{env['sm_count']} SMs" if env.get("sm_count") else "",
                                  f"{env['gpu_memory_gib']} GiB" if env.get("gpu_memory_gib") else "") if x)  # fmt: skip
    ceilings = [f"dense bf16 matmul {_num(peaks.get('matmul_bf16_tflops'))} TFLOP/s (8192³)"]
    if peaks.get("matmul_fp8_tflops"):
        ceilings.append(f"fp8 matmul {_num(peaks['matmul_fp8_tflops'])} TFLOP/s")
    ceilings.append(f"device copy {_num(peaks.get('copy_gbps'))} GB/s (read + write)")
    rows = [
        ["GPU", gpu + (f" ({extra})" if extra else "")],
        ["driver", str(env.get("driver", "?"))],
        ["CUDA / cuDNN / frontend", f"{env.get('cuda', '?')} / {env.get('cudnn', '?')} / {env.get('frontend', '?')}"],
        ["torch / te_cudnn / Python", f"{env.get('torch', '?')} / {env.get('te_cudnn', '?')} / {env.get('python', '?')}"],
        ["measured ceilings", "; ".join(ceilings)],
        ["run", f"{'quick' if st.get('quick') else 'full'}, {len(results.get('cases', []))} cases, at most "
                f"{st.get('rounds', '?')} interleaved rounds per mode, {_num(st.get('wall_s'), 3)} s, {env.get('time', '')}"],
    ]  # fmt: skip
    return _table(["", ""], rows)


def _paired_lines(flat: list[dict]) -> list[str]:
    """Every te_cudnn contender's and the hand-built graphs' ratio to the reference, paired by round."""
    rows = [[r["case"], r["contender"], f"{r['ratio_vs_sdpa_cudnn']:.3f}", f"{r['ratio_paired']:.3f}",
             f"[{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]"]
            for r in flat if r.get("ratio_paired") is not None
            and (r["contender"].startswith("te_cudnn") or r["contender"].startswith("cuDNN graph"))]  # fmt: skip
    if not rows:
        return []
    return [f"## Ratios to {REFERENCE}, paired by round", "",
            "The headline mode's time over the reference's in each interleaved round (both timed in that round), "
            f"the median over rounds and a distribution-free {RATIO_CONFIDENCE:.0%} interval for it (order "
            "statistics of the per-round ratios). Round-to-round clock drift cancels in each pair.", "",
            *_table(["case", "contender", "ratio of medians", "paired median", "interval"], rows), ""]


def _host_lines(results: dict) -> list[str]:
    host = results.get("host")
    if not host:
        return []
    if "error" in host:
        return ["## Host time per cached call", "", f"failed: {host['error']}", ""]
    us = host.get("us", {})
    yard = us.get(host.get("yardstick"))
    rows = [[n, _num(u, 3), "" if yard is None or n == host.get("yardstick") else f"{u - yard:+.2f}"]
            for n, u in us.items()]  # fmt: skip
    lines = ["## Host time per cached call", "",
             f"{host.get('problem', '')}; median of {host.get('rounds')} interleaved rounds x {host.get('calls')} "
             f"back-to-back calls (perf_counter, then one synchronize).", ""]  # fmt: skip
    lines += _table(["call", "µs", f"minus {host.get('yardstick')}"], rows)
    for n in host.get("notes", []):
        lines.append(f"- not timed: {n}")
    for name, delta in (host.get("thd_vs_reuse_us") or {}).items():
        lines.append(f"- {name}: {delta:+.2f} µs against the version-keyed reuse (reuse_lengths)")
    if host.get("te_cudnn_launch"):
        lines.append(f"- te_cudnn launch path: {host['te_cudnn_launch']}"
                     + (f" ({host['te_cudnn_plan']})" if host.get("te_cudnn_plan") else ""))  # fmt: skip
    tuned = host.get("tuned") or {}
    if tuned.get("us"):
        tus = tuned["us"]
        tyard = tus.get(host.get("yardstick"))
        lines += ["", f"With the host problem's plan autotuned ({tuned.get('plan')}; the heuristic plan: "
                      f"{tuned.get('heuristic_plan')}), in interleaved rounds of their own:", ""]  # fmt: skip
        lines += _table(["call", "µs", f"minus {host.get('yardstick')}"],
                        [[n, _num(u, 3), "" if tyard is None or n == host.get("yardstick") else f"{u - tyard:+.2f}"]
                         for n, u in tus.items()])  # fmt: skip
    elif tuned.get("error"):
        lines.append(f"- autotuned plan not timed: {tuned['error']}")
    return lines + [""]


def _skip_lines(flat: list[dict]) -> list[str]:
    by_reason: dict[tuple[str, str, str], list[str]] = {}
    for r in flat:
        if r["status"] in ("skipped", "error"):
            by_reason.setdefault((r["status"], r["contender"], r.get("reason") or ""), []).append(r["case"])
        elif r.get("errors"):  # ran, but a mode failed
            by_reason.setdefault(("error", r["contender"], r["errors"]), []).append(r["case"])
    lines = []
    for (status, who, why), cases in sorted(by_reason.items(), key=lambda kv: (kv[0][0] != "error", kv[0][1])):
        lines.append(f"- **{status}** {who} on {', '.join(cases)}: {why}")
    return lines


def _fp8_lines(results: dict, flat: list[dict]) -> list[str]:
    by = {(r["case"], r["contender"]): r for r in flat if r["status"] == "ok"}
    rows = []
    for c in results.get("cases", []):
        f8, bf = by.get((c["name"], "te_cudnn fp8")), by.get((c["name"], "te_cudnn"))
        if f8 and bf:
            rows.append([c["name"], *(f"{_num(_div(bf.get(f'{m}_ms'), f8.get(f'{m}_ms')), 3)}×" for m in MODES)])
    if not rows:
        return []
    return ["## FP8 vs bf16 (te_cudnn): speed-up of the FP8 sub-backend", "",
            *_table(["case", "fwd", "bwd", "fwd+bwd"], rows), ""]  # fmt: skip


def _thd_lines(flat: list[dict]) -> list[str]:
    by = {(r["case"], r["contender"]): r for r in flat if r["status"] == "ok"}
    thd, pad = by.get(("thd_mixed_16k", "te_cudnn")), by.get(("thd_mixed_16k_padded", "te_cudnn"))
    if not (thd and pad):
        return []
    ratios = "; ".join(f"{m} {_num(_div(thd.get(f'{m}_ms'), pad.get(f'{m}_ms')), 3)}" for m in MODES)
    return ["## Packed (THD) vs padded batch, te_cudnn", "", f"THD time / padded time: {ratios}", ""]


def _same_phase_lines(raw: list[dict]) -> list[str]:
    """Contenders timed after the others (autotuned: tuning replaces te_cudnn's plans) against the
    contenders timed again beside them, in the same interleaved rounds."""
    rows = []
    for r in raw:
        same = r.get("same_phase")
        if r["status"] != "ok" or not same:
            continue
        for mode in MODES:
            mine = r.get(f"{mode}_ms")
            if mine is None:
                continue
            cells = [f"{n} {_num(_div(mine, t.get(mode)), 3)}×" for n, t in same.items() if t.get(mode)]
            rows.append([r["case"], r["contender"], mode, _num(mine), "; ".join(cells)])
    if not rows:
        return []
    return ["## Late contenders beside the others, same rounds", "",
            "Autotuned contenders run after the rest (tuning replaces te_cudnn's cached plans); the contenders "
            "that do not share those plans are timed again in the same interleaved rounds: time / theirs.", "",
            *_table(["case", "contender", "mode", "ms", "ratio to (same rounds)"], rows), ""]


def to_markdown(results: dict) -> str:
    flat = flat_rows(results)
    training = lambda c: c.get("training", True)  # noqa: E731
    decode = lambda c: not c.get("training", True)  # noqa: E731
    out = ["# te_cudnn benchmark", "", *_env_lines(results), ""]
    targets = _targets(results, flat)
    if targets:
        out += ["## Targets", "", *targets, ""]
    out += ["## Time (ms): fwd+bwd for training, fwd for decode", "",
            f"GPU time, median over interleaved rounds: CUDA-graph replay of back-to-back calls (eager calls "
            f"where a call takes over 20 ms or capture failed). (×) = time relative to {REFERENCE} on the same "
            f"case (below 1 is faster). — = not run (reasons below).", "",
            *_grid(results, flat, _time_cell(ratio=True)), ""]  # fmt: skip
    out += _same_phase_lines(results.get("results", []))
    out += _paired_lines(flat)
    for mode, title in (("fwd", "Forward (ms)"), ("bwd", "Backward after a forward (ms)")):
        out += [f"## {title}", "", *_grid(results, flat, _time_cell(mode), only=training), ""]
    out += ["## Eager back-to-back calls, fwd+bwd (ms; decode: fwd)", "",
            "Events around consecutive eager calls: host overhead shows where the GPU waits for the host.", "",
            *_grid(results, flat, lambda r, c: _num(r.get(f"{headline(c)}_eager_ms"))), ""]  # fmt: skip
    out += ["## Throughput, fwd+bwd TFLOP/s (% of the measured matmul peak)", "",
            "Unmasked (query, key) pairs only; fwd 4·h·d FLOPs per pair, bwd 2.5x that. FP8 rows against the "
            "fp8 matmul peak.", "",
            *_grid(results, flat, lambda r, c: "" if r.get("fwd_bwd_tflops") is None else
                   f"{r['fwd_bwd_tflops']:.0f}" + ("" if r.get("pct_of_peak") is None else f" ({r['pct_of_peak']:.0f}%)"),
                   only=training), ""]  # fmt: skip
    if any(decode(c) for c in results.get("cases", [])):
        out += ["## Decode: KV-cache read bandwidth, GB/s (% of the device copy bandwidth)", "",
                *_grid(results, flat, lambda r, c: "" if r.get("kv_gbps") is None else
                       f"{r['kv_gbps']:.0f}" + ("" if r.get("pct_of_copy_bw") is None else f" ({r['pct_of_copy_bw']:.0f}%)"),
                       only=decode), ""]  # fmt: skip
    out += _host_lines(results)
    out += ["## Peak memory of one fwd+bwd (decode: fwd), MiB above the shared inputs", "",
            "The contender's own state (preallocated outputs, workspaces) plus what the call allocates. te_cudnn: "
            "(ratio of inputs + peak to inputs + outputs + gradients + workspace).", "",
            *_grid(results, flat, lambda r, c: _num(r.get("peak_mib")) + (
                "" if r.get("mem_ratio") is None else f" ({r['mem_ratio']:.3f})")), ""]  # fmt: skip
    out += ["## Agreement: relative error of O against the case's first bf16 contender (te_cudnn where it runs)", "",
            "‖O − O_ref‖ / ‖O_ref‖ on the same inputs; bf16 implementations differ by about 1e-3 to 1e-2, FP8 more.",
            "", *_grid(results, flat, lambda r, c: "" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"), ""]  # fmt: skip
    out += ["## First call and plans (ms)", "",
            "First call: prepare + one call, synchronized (plan builds, torch.compile). te_cudnn: plans built / "
            "loaded from the plan store in that call, and their milliseconds.", "",
            *_grid(results, flat, _first_cell), ""]  # fmt: skip
    out += _fp8_lines(results, flat)
    out += _thd_lines(flat)
    out += ["## Cases", "", *_table(["case", "group", "what", "note"], [
        [c["name"], c.get("group", ""), c.get("description", ""), c.get("note", "")] for c in results.get("cases", [])]), ""]
    notes: dict[tuple[str, str], list[str]] = {}
    for r in flat:
        for note in filter(None, (n.strip() for n in (r.get("notes") or "").split(";"))):
            notes.setdefault((r["contender"], note), []).append(r["case"])
    if notes:
        out += ["## Notes", "", *(f"- {who} on {', '.join(cs)}: {note}" for (who, note), cs in notes.items()), ""]
    skips = _skip_lines(flat)
    if skips:
        out += ["## Not run", "", *skips, ""]
    return "\n".join(out)


def to_summary(results: dict) -> str:
    """The short form printed after a run that wrote its files: versions, targets, the time grid."""
    flat = flat_rows(results)
    env = results.get("env", {})
    head = (f"te_cudnn benchmark: {env.get('gpu', '?')}, driver {env.get('driver', '?')}, CUDA {env.get('cuda', '?')}, "
            f"cuDNN {env.get('cudnn', '?')}, torch {env.get('torch', '?')}, frontend {env.get('frontend', '?')}")  # fmt: skip
    out = [head, ""]
    targets = _targets(results, flat)
    if targets:
        out += ["Targets:", *targets, ""]
    out += [f"fwd+bwd ms (decode: fwd), (×) = time / {REFERENCE}'s:", "", *_grid(results, flat, _time_cell(ratio=True))]
    failed = [r for r in flat if r["status"] == "error" or r.get("errors")]
    if failed:
        out += ["", f"{len(failed)} contender runs failed (see table.md, 'Not run')"]
    return "\n".join(out)


def _first_cell(r: dict, case: dict) -> str:
    text = _num(r.get("first_call_ms"))
    if r.get("plans_built") or r.get("plans_loaded"):
        text += f" (built {r.get('plans_built') or 0}: {_num(r.get('build_ms') or 0.0)}; loaded " \
                f"{r.get('plans_loaded') or 0}: {_num(r.get('load_ms') or 0.0)})"
    elif r.get("build_ms") is not None:
        text += f" (build {_num(r['build_ms'])})"
    return text
