"""Running one backward as several smaller calls, where cuDNN's engine falls off a cliff.

With cuDNN 9.19 on Hopper the FP8 backward's only engine takes about 4x the time for 2x the
work once ``b * h >= 64``, while splitting the call over halves of the batch gives the same
results in about half the time (the numbers are in the benchmark results). The split is an execution choice like an engine: the autotuner
(:mod:`te_cudnn.plans.tune`) times it for FP8 backward keys, on the same operands, after
checking that the parts reproduce the whole call's outputs, and records the fastest choice in
the tuning record (``record["split"]``) stored with the plan, so a later process reads it
instead of measuring. Nothing splits without that measurement (no hard-coded threshold).

A split cuts every tensor of the call into ``parts`` zero-copy views along the batch dim or,
for one sequence (``b == 1``), along whole GQA head groups (query heads ``[i h/n, (i+1) h/n)``
with key/value heads ``[i hg/n, (i+1) hg/n)``); the gradients are written into the views of
full results in the layout's own strides, and the amax outputs combine by their maximum.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

from ..enums import FusedAttnBackend
from .key import Direction
from .order import order_rng, round_order

__all__ = ["PARTS", "splittable", "split_choices", "split_config", "part_slices", "slice_operand", "measure_splits",
           "chosen_split"]

_log = logging.getLogger("te_cudnn")

#: The numbers of parts tried.
PARTS = (2, 4)


def splittable(key: Any) -> bool:
    """FP8 backward keys of dense layouts (the only measured cliff), without dropout (a part's
    Philox stream would differ from the whole call's) or a sink (its gradient sums over the batch)."""

    cfg = key.config
    return (key.backend == FusedAttnBackend.FP8 and key.direction == Direction.BWD and not cfg.is_ragged
            and cfg.paged is None and not cfg.empty and not cfg.has_dropout and not cfg.has_sink)  # fmt: skip


def split_choices(cfg: Any) -> list[tuple[str, int]]:
    """``(dim, parts)`` a configuration can be cut into: batch halves/quarters; whole GQA head
    groups of one sequence (``heads``; the stats stay contiguous only when ``b == 1``); and for a
    few sequences both (``batch_heads``: one sequence per part, its heads in 2 or 4 groups)."""
    heads = [m for m in PARTS if cfg.hg % m == 0 and cfg.h % m == 0]
    if cfg.b == 1:
        return [("heads", m) for m in heads]
    return [("batch", n) for n in PARTS if cfg.b % n == 0] + [("batch_heads", cfg.b * m) for m in heads if cfg.b <= 4]


def head_groups(cfg_b: int, dim: str, parts: int) -> int:
    """How many head groups each sequence is cut into."""
    return 1 if dim == "batch" else parts if dim == "heads" else parts // cfg_b


def split_config(cfg: Any, dim: str, parts: int) -> Any:
    """The configuration of one part (strides are unchanged: the parts are views)."""
    if dim == "batch":
        return replace(cfg, b=cfg.b // parts)
    m = head_groups(cfg.b, dim, parts)
    return replace(cfg, b=1 if dim == "batch_heads" else cfg.b, h=cfg.h // m, hg=cfg.hg // m)


def part_slices(dim: str, parts: int, b: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Per part: ``((batch start, batch count), (head group, head groups))``; a head group is
    ``h / groups`` query heads with their ``hg / groups`` key/value heads."""
    m = head_groups(b, dim, parts)
    per = b // parts if dim == "batch" else (1 if dim == "batch_heads" else b)
    return [(((i // m) * per, per), (i % m, m)) for i in range(parts)]


def slice_operand(t: Any, dim: str, index: int, parts: int, sizes: tuple[int, int, int], axes: tuple[int, int]) -> Any:
    """Part ``index`` of operand ``t`` (batch dim ``axes[0]``, head dim ``axes[1]``; ``sizes`` =
    ``(b, h, hg)``): a view; tensors without those dims (the scalars) are shared."""
    if t is None:
        return t
    b = sizes[0]
    (start, count), (g, groups) = part_slices(dim, parts, b)[index]
    if count != b and t.dim() > axes[0] and t.shape[axes[0]] == b:
        t = t.narrow(axes[0], start, count)
    if groups > 1 and t.dim() > axes[1] and t.shape[axes[1]] in sizes[1:] and t.shape[axes[1]] > 1:
        n = t.shape[axes[1]] // groups
        t = t.narrow(axes[1], g * n, n)
    return t


def chosen_split(record: Optional[dict]) -> Optional[tuple[str, int]]:
    """The split a tuning record chose, or None (no record, no split measured, or whole calls won)."""
    split = None if record is None else record.get("split")
    if not isinstance(split, dict) or not split.get("chosen"):
        return None
    dim, parts = split["chosen"]
    return str(dim), int(parts)


def measure_splits(key: Any, whole_ms: float, ops: dict, want: dict, build_part: Callable[[Any], Any],
                   run: Callable[[Any, dict], None], compare: Callable[[Any, Any, Any], Optional[str]],
                   time_ms: Callable[[Callable[[], None]], float], min_speedup: float,
                   whole: Optional[Callable[[], None]] = None, rounds: int = 1) -> dict[str, Any]:  # fmt: skip
    """Time every split of ``key`` against the whole call.

    ``ops`` are the whole call's operands (uid -> tensor, outputs included) and ``want`` the
    whole call's outputs on them; ``build_part(cfg)`` builds a plan for a part's configuration;
    ``run(plan, ops)`` launches a plan; ``compare(uid, got, want)`` says why outputs disagree
    (None: they agree); ``time_ms(fn)`` is the median milliseconds of ``fn``. A split serves
    only if its parts reproduce ``want`` and it is ``min_speedup`` times faster. With ``whole``
    (a launch of the whole call) the whole call is timed again beside the splits; the timings
    come from ``rounds`` interleaved rounds, each in a fresh seeded order (medians over rounds;
    :mod:`te_cudnn.plans.order`), so a drift of the GPU's clocks hits every contender alike;
    otherwise ``whole_ms`` (measured before) is
    the yardstick. Returns the record entry ``{"whole_ms", "candidates": [{"dim", "parts",
    "median_ms" | "error"}], "chosen", "rounds"}``."""
    cfg = key.config
    candidates: list[dict[str, Any]] = []
    runnable: list[tuple[dict[str, Any], Callable[[], None]]] = []
    for dim, parts in split_choices(cfg):
        entry: dict[str, Any] = {"dim": dim, "parts": parts}
        candidates.append(entry)
        try:
            plan = build_part(split_config(cfg, dim, parts))
            sizes = (cfg.b, cfg.h, cfg.hg)
            views = [{uid: slice_operand(t, dim, i, parts, sizes, (0, 1)) for uid, t in ops.items()}
                     for i in range(parts)]  # fmt: skip
            for uid in want:
                ops[uid].zero_()

            def run_all(views: Sequence[dict] = views, plan: Any = plan) -> None:
                for part in views:
                    run(plan, part)

            run_all()
            for uid, t in want.items():
                if views[0][uid] is ops[uid]:  # a shared scalar (amax): each part writes its own; the runtime takes the max
                    continue
                why = compare(uid, ops[uid], t)
                if why is not None:
                    raise RuntimeError(f"the parts disagree with the whole call: {why}")
            runnable.append((entry, run_all))
        except Exception as exc:  # noqa: BLE001 - recorded; the whole call serves
            entry["error"] = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
    timed: list[tuple[Optional[dict[str, Any]], Callable[[], None]]] = list(runnable)
    if whole is not None:
        timed.insert(0, (None, whole))
    samples: list[list[float]] = [[] for _ in timed]
    rng = order_rng()
    for _ in range(max(rounds, 1)):
        for i in round_order(range(len(timed)), rng):
            try:
                samples[i].append(float(time_ms(timed[i][1])))
            except Exception as exc:  # noqa: BLE001 - recorded; the whole call serves
                entry = timed[i][0]
                if entry is None:
                    raise
                entry.setdefault("error", (str(exc).splitlines() or [type(exc).__name__])[0][:300])
    if whole is not None:
        whole_ms = statistics.median(samples[0])
    best: Optional[tuple[float, str, int]] = None
    for (entry, _), got in zip(timed, samples):
        if entry is None or "error" in entry or not got:
            continue
        entry["median_ms"] = ms = round(statistics.median(got), 6)
        if ms * min_speedup <= whole_ms and (best is None or ms < best[0]):
            best = (ms, entry["dim"], entry["parts"])
    chosen = None if best is None else [best[1], best[2]]
    _log.info("split tuning for %s: whole call %.4f ms; %s -> %s", key, whole_ms,
              ", ".join(f"{c['dim']}/{c['parts']}: {c.get('median_ms', c.get('error'))}" for c in candidates),
              chosen or "whole call")  # fmt: skip
    return {"whole_ms": round(whole_ms, 6), "candidates": candidates, "chosen": chosen, "rounds": max(rounds, 1)}
