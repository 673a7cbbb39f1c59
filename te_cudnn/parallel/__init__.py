"""Context parallelism: one attention over a sequence split across the ranks of a
``torch.distributed`` process group (NCCL).

* :func:`context_parallel_attention` — ring (``"p2p"``), all-to-all (``"a2a"``, Ulysses),
  all-gather (``"all_gather"``, Llama 3) or hierarchical (``"a2a+p2p"``: all-to-all inside
  groups, the ring across them; :mod:`~te_cudnn.parallel.hierarchical`) attention with
  autograd; :func:`simulate_context_parallel` runs the same code for virtual ranks in one process.
* :mod:`~te_cudnn.parallel.partition` — the dual-chunk split of a batch (dense or THD) into
  each rank's part, and the gather back (:func:`shard`, :func:`unshard`, ...).
* :mod:`~te_cudnn.parallel.schedule` — which tile each ring step computes, with or without a
  sliding window (pure functions); :mod:`~te_cudnn.parallel.ring_sink` — the attention sink
  folded into the ring's result.

Layers: ``partition``/``schedule`` -> ``transport`` -> ``ring``/``ulysses``/``all_gather`` ->
``ring_sink``/``hierarchical`` -> ``api``.
"""

from .api import (CpOptions, a2a_rank_alone, context_parallel_attention, cp_decline_reasons, ring_rank_alone,
                  simulate_context_parallel)
from .partition import (
    dual_chunks,
    gather_sequence,
    gather_thd,
    pad_cu_seqlens,
    pad_thd,
    seq_dim,
    shard,
    split_sequence,
    split_thd,
    thd_local_cu_seqlens,
    thd_partition_index,
    thd_valid_lengths,
    unpad_thd,
    unshard,
)

__all__ = [
    "context_parallel_attention", "simulate_context_parallel", "ring_rank_alone", "a2a_rank_alone", "cp_decline_reasons", "CpOptions",
    "shard", "unshard", "split_sequence", "gather_sequence", "pad_cu_seqlens", "pad_thd", "unpad_thd",
    "split_thd", "gather_thd", "thd_partition_index", "thd_valid_lengths", "thd_local_cu_seqlens", "dual_chunks",
    "seq_dim",
]  # fmt: skip
