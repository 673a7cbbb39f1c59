"""Plan keys, the plan cache and cuDNN handles."""

from .cache import CacheStats, CompiledPlan, PlanCache, build_plan, plan_cache
from .handles import handle_for
from .key import PlanKey, make_key
from . import tune as _tune  # noqa: F401 - the autotuner hands itself to the cache (plans.cache.use_tuner)

__all__ = ["CacheStats", "CompiledPlan", "PlanCache", "PlanKey", "build_plan", "handle_for", "make_key", "plan_cache"]
