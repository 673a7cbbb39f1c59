"""Does sweeping the engines' knobs find faster plans than cuDNN's heuristics rank?

Runs benchmark cases with te_cudnn, te_cudnn autotuned (with ``TE_CUDNN_AUTOTUNE_KNOBS``, default
48 values per knob here), the hand-built graph and torch SDPA cuDNN, side by side (the benchmark's
interleaved timing), then prints every tuning record: each candidate's time, the heuristic plan's
and the choice.

    python tools/probe_knob_sweep.py [--cases test_0,test_3,llama_h32_s8k,decode_kv8k] [--knobs 48] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="test_0,test_3,llama_h32_s8k,decode_kv8k")
    ap.add_argument("--knobs", type=int, default=48)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    os.environ["TE_CUDNN_AUTOTUNE_KNOBS"] = str(a.knobs)
    os.environ.setdefault("TE_CUDNN_PLAN_STORE", "off")  # tune in this process, whatever a store holds

    from te_cudnn import plan_cache  # noqa: PLC0415
    from te_cudnn.benchmark.cases import select_cases  # noqa: PLC0415
    from te_cudnn.benchmark.contenders import select_contenders  # noqa: PLC0415
    from te_cudnn.benchmark.report import flat_rows, to_markdown  # noqa: PLC0415
    from te_cudnn.benchmark.runner import Settings, run_benchmark  # noqa: PLC0415
    from te_cudnn.plans.tune import format_record  # noqa: PLC0415

    settings = Settings(host=False, every_case=True)
    res = run_benchmark(select_cases(a.cases), select_contenders("te_cudnn,te_cudnn_autotuned,hand_built,sdpa_cudnn"),
                        settings)  # fmt: skip
    for row in flat_rows(res):
        if row.get("fwd_bwd_ms") is not None or row.get("fwd_ms") is not None:
            print(f"  {row['case']:16s} {row['contender']:22s} fwd {row.get('fwd_ms')} bwd {row.get('bwd_ms')} "
                  f"fwd+bwd {row.get('fwd_bwd_ms')}")  # fmt: skip
    records = []
    for plan in plan_cache.plans():
        record = getattr(plan, "tuning", None)
        if record:
            print(f"\n{plan.key}")
            print(format_record(record, indent="  "))
            records.append({"key": str(plan.key), "record": record})
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "knob_sweep.json"), "w") as f:
            json.dump({"results": res, "records": records}, f, indent=1, default=str)
        with open(os.path.join(a.out, "table.md"), "w") as f:
            f.write(to_markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
