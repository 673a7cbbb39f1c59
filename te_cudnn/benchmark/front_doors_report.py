"""The front-door benchmark's report: ``front_doors.md`` (every number, in tables) and
``front_doors.png`` (host µs per cached forward of every door, and each measure's speed
against its reference with the paired 95 % interval), both drawn from the run's
``front_doors.json``; :func:`replot` draws them again from that file alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .chart import pyplot

__all__ = ["markdown", "speed_ratios", "chart", "write", "replot"]

HF_PAIRED = "te_cudnn vs sdpa, paired by turn (median, 95 % interval)"


def markdown(res: dict[str, Any]) -> str:
    """``front_doors.md``: the host table, the drop-in's fwd+bwd table and the Hugging Face tables."""
    lines = ["## Front doors", "", f"Measured on {res['device']}.", "", "### Host µs per cached forward (b=1 h=8 s=128 "
             "d=64 bf16, no gradient)", "", "| call | host µs | vs torch SDPA default |", "|---|---|---|"]  # fmt: skip
    if res.get("packed_one_row"):
        lines[4:4] = ["te_cudnn's one-row inference calls over contiguous caches (decode steps) ran packed "
                      "(`te_cudnn.packed_rows`, `TE_CUDNN_PACKED_ONE_ROW=1`).", ""]
    if res.get("heuristic_one_row_plans"):
        lines[4:4] = ["te_cudnn's one-row inference forwards (decode steps) ran cuDNN's heuristic split-KV plans, "
                      "not the plans without a workspace (`te_cudnn.plans.one_row`).", ""]
    host = res.get("host", {})
    base = host.get("torch SDPA (default backend)")
    for name, us in host.items():
        lines.append(f"| {name} | {us:.1f} | {us / base:.2f}× |" if base else f"| {name} | {us:.1f} | |")
    lines += ["", "### Drop-in forward+backward (causal, ms per step; medians over interleaved rounds, ratios paired "
              "by round with their 95 % interval)", "",
              "GPU: steps queued behind a spin, run back to back (the kernels and the gradient accumulation). "
              "Paced: the same steps at the host's pace, and the host µs per step.", "",
              "| shape | inputs | te_cudnn GPU | torch cuDNN GPU | ratio | interval | paced te_cudnn / torch | "
              "paced ratio (interval) | host µs te_cudnn / torch |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in res.get("fwd_bwd", []):
        interval = f"{r['ratio_low']:.3f}–{r['ratio_high']:.3f}" if "ratio_low" in r else ""
        paced = host = paced_ratio = ""
        if "paced_te_cudnn_ms" in r:
            paced = f"{r['paced_te_cudnn_ms']:.3f} / {r['paced_torch_cudnn_ms']:.3f}"
            paced_ratio = f"{r['paced_ratio']:.3f} ({r['paced_ratio_low']:.3f}–{r['paced_ratio_high']:.3f})"
            host = f"{r['host_te_cudnn_us']:.0f} / {r['host_torch_cudnn_us']:.0f}"
        lines.append(f"| {r['shape']} | {r['inputs']} | {r['te_cudnn_ms']:.3f} | {r['torch_cudnn_ms']:.3f} | "
                     f"{r['ratio']:.3f} | {interval} | {paced} | {paced_ratio} | {host} |")  # fmt: skip
    hf = res.get("hf")
    if hf:
        lines += ["", f"### Hugging Face ({hf['model']})", "",
                  "Paired: the contenders' samples taken in turns, call by call (steps in lockstep or switched: "
                  "step by step), median ratio and its 95 % interval.", "",
                  "| measure | sdpa | te_cudnn | te_cudnn / sdpa | paired (95 % interval) |",
                  "|---|---|---|---|---|"]  # fmt: skip
        paired = hf.get(HF_PAIRED, {})
        for k, v in hf.get("sdpa", {}).items():
            t = hf.get("te_cudnn", {}).get(k)
            if isinstance(v, float) and isinstance(t, float):
                turn = f"{paired[k][0]:.3f} ({paired[k][1]:.3f}–{paired[k][2]:.3f})" if k in paired else ""
                lines.append(f"| {k} | {v:.1f} | {t:.1f} | {t / v:.3f} | {turn} |")
            else:
                lines.append(f"| {k} | {v} | {t} | | |")
        controls = hf.get("controls, paired by turn (median, 95 % interval)", {})
        if controls:
            switched = any("switched step by step" in m for m in controls)
            lines += ["", ("The switched generate steps, prefill and the training step run on one model whose "
                           "attention implementation changes step by step or call by call." if switched else
                           "Prefill and the training step run on one model whose attention implementation changes "
                           "call by call.") + " Controls of the same turns: `sdpa` against itself (the measure's own "
                      "spread; whole generate calls: the `sdpa` model's call taken twice per turn), and `sdpa` with "
                      "one Python autograd node per layer that launches nothing (what one more autograd node per "
                      "layer costs a training step).", "",
                      "| measure | pair | ratio of medians | paired ratio (95 % interval) |", "|---|---|---|---|"]  # fmt: skip
            for measure, pairs in controls.items():
                for pair, (med, low, high, *of_medians) in pairs.items():
                    by_medians = f"{of_medians[0]:.3f}" if of_medians else ""
                    lines.append(f"| {measure} | {pair} | {by_medians} | {med:.3f} ({low:.3f}–{high:.3f}) |")
    return "\n".join(lines) + "\n"


def speed_ratios(res: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    """``(label, median, low, high)`` of te_cudnn's speed over its reference's, paired, for the
    drop-in's fwd+bwd GPU time (against torch's cuDNN SDPA) and every Hugging Face measure with
    a paired interval (against ``sdpa``). Higher is better throughout: a ratio of times (ms)
    is inverted, its interval's ends swapped; a ratio of tokens/s is kept."""
    rows = []
    for r in res.get("fwd_bwd", []):
        if "ratio_low" in r:
            rows.append((f"drop-in fwd+bwd GPU, {r['shape']}, {r['inputs']}", 1 / r["ratio"], 1 / r["ratio_high"],
                         1 / r["ratio_low"]))  # fmt: skip
    for measure, (med, low, high) in (res.get("hf") or {}).get(HF_PAIRED, {}).items():
        if measure.endswith(" ms"):
            rows.append((f"HF {measure[:-3]}", 1 / med, 1 / high, 1 / low))
        else:
            rows.append((f"HF {measure.replace(' tokens/s', '')}", med, low, high))
    return rows


def chart(res: dict[str, Any], path: Path) -> None:
    """``front_doors.png``: host µs per cached forward of every door; below it, when the run
    has them, :func:`speed_ratios` as points with their intervals around 1. Raises ImportError
    without matplotlib."""
    plt = pyplot()
    host = res.get("host", {})
    ratios = speed_ratios(res)
    heights = [0.45 * len(host) + 1.2] + ([0.32 * len(ratios) + 1.2] if ratios else [])
    fig, axes = plt.subplots(len(heights), 1, figsize=(10, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    ax = axes[0][0]
    names = list(host)
    ax.barh(names, [host[n] for n in names], color=["#76b900" if n.startswith("te_cudnn") else "#888888" for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("host µs per cached forward (lower is better)")
    ax.set_title(f"Front doors\n{res['device']}", fontsize=10)
    for i, n in enumerate(names):
        ax.text(host[n], i, f" {host[n]:.1f}", va="center")
    ax.margins(x=0.1)
    if ratios:
        ax = axes[1][0]
        ys = range(len(ratios))
        med = [r[1] for r in ratios]
        ax.errorbar(med, ys, xerr=[[m - r[2] for m, r in zip(med, ratios)], [r[3] - m for m, r in zip(med, ratios)]],
                    fmt="o", color="#76b900", ecolor="#555555", capsize=3)  # fmt: skip
        ax.axvline(1.0, color="#888888", linestyle="--", linewidth=1)
        ax.set_yticks(list(ys), [r[0] for r in ratios], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("te_cudnn speed / reference speed (higher is better)")
        ax.set_title("paired median and 95 % interval; the reference: torch's cuDNN SDPA (drop-in),\n"
                     "transformers' sdpa (HF)", fontsize=9)  # fmt: skip
        for y, (_, m, _, high) in zip(ys, ratios):
            ax.text(high, y, f"  {m:.3f}", va="center", fontsize=8)
        ax.margins(x=0.1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(res: dict[str, Any], out: Path) -> None:
    """``front_doors.json``, ``.md`` and (with matplotlib) ``.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "front_doors.json").write_text(json.dumps(res, indent=1))
    _draw(res, out)


def replot(folder: Path) -> None:
    """``front_doors.md`` and ``.png`` drawn again from ``folder``'s ``front_doors.json``.
    Raises OSError when the file cannot be read, ValueError when it is not a front-door report."""
    path = Path(folder) / "front_doors.json"
    try:
        res = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e})") from e
    if not isinstance(res, dict) or "device" not in res or "host" not in res:
        raise ValueError(f"{path} is not a front-door report (no 'device' and 'host' entries)")
    _draw(res, Path(folder))


def _draw(res: dict[str, Any], out: Path) -> None:
    (out / "front_doors.md").write_text(markdown(res))
    try:
        chart(res, out / "front_doors.png")
    except ImportError:
        pass
