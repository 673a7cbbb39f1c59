"""chart.png: throughput per case and contender against the measured ceilings (matplotlib, the
optional ``bench`` extra; without it no chart is drawn, saying why)."""

from __future__ import annotations

from typing import Optional

from .rows import _contenders, flat_rows


def pyplot():
    """matplotlib's ``pyplot`` on the off-screen Agg backend: the benchmark's one import of
    matplotlib (the optional ``bench`` extra). Raises ImportError without it."""
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after use("Agg"): never a GUI backend

    return plt


def write_chart(results: dict, path: str) -> Optional[str]:
    """A PNG: fwd+bwd TFLOP/s per training case and KV-cache GB/s per decode case, one bar per
    contender, with the measured ceilings as lines. Returns None, or why no chart was written."""
    try:
        plt = pyplot()
    except ImportError:
        return "matplotlib is not installed (pip install 'te_cudnn[bench]'); no chart written"
    flat = [r for r in flat_rows(results) if r["status"] == "ok"]
    cases = results.get("cases", [])
    panels = [("fwd+bwd TFLOP/s", "fwd_bwd_tflops", [c for c in cases if c.get("training", True)],
               (results.get("peaks") or {}).get("matmul_bf16_tflops"), "bf16 matmul peak"),
              ("decode: KV-cache read GB/s", "kv_gbps", [c for c in cases if not c.get("training", True)],
               (results.get("peaks") or {}).get("copy_gbps"), "device copy")]  # fmt: skip
    panels = [p for p in panels if any(r.get(p[1]) is not None for r in flat if r["case"] in {c["name"] for c in p[2]})]
    if not panels:
        return "no case with a throughput to draw"
    names = [n for n in _contenders(results) if any(r["contender"] == n for r in flat)]
    by = {(r["case"], r["contender"]): r for r in flat}
    widths = [max(4.0, 0.9 * len(p[2])) for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths) + 3, 5.5), squeeze=False,
                             gridspec_kw={"width_ratios": widths})  # fmt: skip
    colors = plt.get_cmap("tab10")
    bar = 0.8 / max(1, len(names))
    for ax, (title, key, pcases, ceiling, ceiling_name) in zip(axes[0], panels):
        for j, n in enumerate(names):
            xs, ys = [], []
            for i, c in enumerate(pcases):
                v = by.get((c["name"], n), {}).get(key)
                if v is not None:
                    xs.append(i - 0.4 + bar * (j + 0.5))
                    ys.append(v)
            if xs:
                ax.bar(xs, ys, bar, label=n, color=colors(j % 10))
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1)
            ax.text(len(pcases) - 0.5, ceiling, f" {ceiling_name} {ceiling:.0f}", va="bottom", ha="right", fontsize=8)
        ax.set_xticks(range(len(pcases)))
        ax.set_xticklabels([c["name"] for c in pcases], rotation=45, ha="right", fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper center", ncol=min(5, len(labels)), fontsize=8, frameon=False)
    env = results.get("env", {})
    fig.suptitle(f"te_cudnn benchmark: {env.get('gpu', '?')}, cuDNN {env.get('cudnn', '?')}, torch {env.get('torch', '?')}",
                 y=0.02, fontsize=9)  # fmt: skip
    fig.tight_layout(rect=(0, 0.04, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
