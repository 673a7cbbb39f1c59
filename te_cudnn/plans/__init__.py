"""Plan keys, the plan cache and cuDNN handles."""

from .cache import CacheStats, CompiledPlan, PlanCache, build_plan, plan_cache
from .handles import handle_for
from .key import PlanKey, make_key

__all__ = ["CacheStats", "CompiledPlan", "PlanCache", "PlanKey", "build_plan", "handle_for", "make_key", "plan_cache"]
