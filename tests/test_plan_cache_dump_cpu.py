"""``PlanCache.dump``: a plan cache written out as JSON (process, time, statistics, and every plan
with its key, source, hits and build time, least recently used first); CPU only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from te_cudnn.backends import Direction
from te_cudnn.plans import CompiledPlan, PlanCache, PlanKey

from _plan_store_cpu import key


def test_plan_cache_dump(tmp_path: Path) -> None:
    def builder(k: PlanKey, make_spec) -> CompiledPlan:
        plan = CompiledPlan(k, graph=object(), uids=(), workspace_size=0, plan_name="test", build_seconds=0.001)
        if k.config.sq == 1024:
            plan.source = "store"  # as if deserialized from the plan store
        return plan

    cache = PlanCache(maxsize=8, builder=builder)
    k1, k2, k3 = key(), key(Direction.BWD), key(max_seqlen_q=1024)
    for k in (k1, k2, k1, k3, k1):
        cache.get_or_build(k, lambda: None)
    out = tmp_path / "dump.json"
    cache.dump(str(out))
    assert not list(tmp_path.glob("*.tmp-*"))
    data = json.loads(out.read_text())
    assert data["pid"] == os.getpid() and isinstance(data["time"], float)
    s = data["stats"]
    assert s["loads"] == 1 and s["builds"] == 2 and s["hits"] == 2 and s["misses"] == 3 and s["entries"] == 3
    assert s == cache.stats().as_dict()
    plans = data["plans"]
    assert [p["key"]["direction"] for p in plans] == ["bwd", "fwd", "fwd"]  # least recently used first
    assert [p["key"]["sq"] for p in plans] == [512, 1024, 512]
    assert [p["source"] for p in plans] == ["built", "store", "built"]
    assert [p["hits"] for p in plans] == [0, 0, 2]
    assert all(p["plan_name"] == "test" and p["workspace_bytes"] == 0 and p["build_ms"] == 1.0 for p in plans)
    assert plans[2]["key"]["backend"] == "F16_arbitrary_seqlen" and plans[2]["key"]["layout"] == "bshd_bshd_bshd"
