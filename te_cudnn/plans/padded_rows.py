"""Which engines leave exact zeros in every result row past a sequence's end: checked, then recorded.

Under a padding mask or a THD layout te_cudnn promises exact zeros in the rows of O (forward)
and of dQ, dK and dV (backward) that lie past a sequence's end. It zero-fills those results
before the launch unless it *knows* that the plan's engine writes those rows itself
(``te_cudnn.row_fill`` asks :func:`rows_verified`). It knows only what it has checked, for
one (GPU architecture, cuDNN version, plan key, engine configuration) at a time:

* the check (:func:`probe`) runs the plan itself, on operands synthesized for its graph
  in its binding order (``te_cudnn.plans.tune.make_operands``: the graph's own shapes, strides
  and dtypes), with partial lengths (:func:`probe_batches`): on each side an empty sequence,
  sequences shorter than the maximum, a full one, a sequence with keys but no queries; THD
  sides with gaps between sequences and spare capacity after the last. The lengths are bound
  as calls bind them (``te_cudnn.row_fill.length_remap``). The results are prefilled with NaN
  (:class:`ResultCheck`); the engine passes when every row past a sequence's end came back
  exactly zero and every row inside one is finite;
* the verdict, passed or failed and why, is a record (:func:`make_record`) kept in memory for
  the process and, where a plan store is configured, in the store beside the plan
  (``PlanStore.save_record``, kind :data:`KIND`, named by the engine configuration). The store
  keeps it under its fingerprint (GPU model, compute capability, cuDNN, frontend and te_cudnn
  versions), and the record repeats the architecture, the cuDNN version and the engine, and
  is used only where they match. A later process on the same kind of machine reads it instead
  of probing; a plan brought in from elsewhere is probed again here.

Never during a CUDA-graph capture: there, without a record, the answer is False (fill). A probe
that cannot run (out of memory, a launch error) answers False for the process and stores
nothing. A probe costs a launch of the plan (one per batch: several only for batches of fewer
than four sequences) on freshly allocated operands of the call's shapes (for a backward, q,
k, v, O, dO and the gradients), once per plan key and engine.

The autotuner runs the same check on every candidate engine (``te_cudnn.plans.tune``) and
never chooses one that fails it; for keys whose results te_cudnn zero-fills whatever the
engine, the rows past each sequence's end start at zero there, as that fill leaves them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from ..backends import BY_ENUM, Direction, SubBackend, Uid
from ..config import AttnConfig
from .cache import store_for
from .handles import handle_for
from .tune_operands import length_operands, make_operands
from ..ragged import every_key_lens, one_query_lens
from ..row_fill import Lengths, length_remap, skips_grads_fill, skips_out_fill
from ..runtime import current_env

__all__ = [
    "fills_out", "fills_grads", "KIND", "RECORD_SEQUENCES", "RECORD_VERSION", "RESULTS", "ProbeBatch", "ResultCheck",
    "ResultRows", "forget", "make_record", "probe", "probe_batches", "record_for", "result_rows", "rows_verified",
    "valid_record",
]  # fmt: skip

_log = logging.getLogger("te_cudnn")

#: The kind of record in the plan store (``PlanStore.save_record``).
KIND = "padded_rows"
#: The version of a record; one of another version is not used (the engine is probed again).
RECORD_VERSION = 1
#: The results te_cudnn promises zeros in, past each sequence's end, per direction.
RESULTS = {Direction.FWD: (Uid.O,), Direction.BWD: (Uid.DQ, Uid.DK, Uid.DV)}
#: Outputs with one row per query position and per key position.
_Q_ROWS = frozenset({Uid.O, Uid.STATS, Uid.MAX, Uid.DQ})
_KV_ROWS = frozenset({Uid.DK, Uid.DV})
_RAGGED_Q_SIDE = frozenset({Uid.RAGGED_Q, Uid.RAGGED_O, Uid.RAGGED_STATS})


# ----------------------------------------------------------------------------- the batch a probe binds
@dataclass(frozen=True)
class ProbeBatch:
    """Per-sequence lengths for a check: the caller's (``lens_*``: rows past them must come back
    zero), the ones bound to the graph (``bound_*``: after te_cudnn.row_fill's remap), and for
    THD sides the token offsets where each sequence starts (``cu_*``, ``[b + 1]``, with gaps)."""

    lens_q: tuple[int, ...]
    lens_kv: tuple[int, ...]
    bound_q: tuple[int, ...]
    bound_kv: tuple[int, ...]
    cu_q: Optional[tuple[int, ...]] = None
    cu_kv: Optional[tuple[int, ...]] = None
    lengths: Lengths = Lengths.AS_GIVEN


def _short(full: int, j: int, step: int) -> int:
    """A length in ``[1, full - 1]`` (1 when ``full`` is 1), varied with ``j``."""
    return 1 + (full // 2 + step * j) % (full - 1) if full > 1 else 1


def _pairs(b: int, sq: int, skv: int, shift: int) -> list[tuple[int, int]]:
    """``b`` (query, key) length pairs cycling through four kinds, starting at kind ``shift``:
    shorter than the maximum on both sides, empty on both, full, keys without queries. A
    sequence with queries has at least as many keys, so that every row inside it sees a key
    under every mask (causal, bottom-right causal, windows)."""
    out = []
    for i in range(b):
        kind, j = (i + shift) % 4, (i + shift) // 4
        kv_short = _short(skv, j, 5)
        lq, lkv = ((_short(sq, j, 3), kv_short), (0, 0), (sq, skv), (0, kv_short))[kind]
        if lq:
            lkv = max(lkv, min(lq, skv))
            lq = min(lq, lkv)
        out.append((lq, lkv))
    return out


def _fit(lens: list[int], capacity: int) -> list[int]:
    """The lengths cut, in order, to a THD side's token capacity less room for the gaps and the
    tail of :func:`_starts`."""
    out, left = [], max(capacity - (2 + len(lens) // 2), min(capacity, 1))
    for n in lens:
        n = min(n, left)
        out.append(n)
        left -= n
    return out


def _starts(lens: Sequence[int], capacity: int) -> tuple[int, ...]:
    """Token offsets ``[b + 1]`` of a THD side: a one-token gap after every other sequence
    while the capacity allows one to spare after the last, so the check sees gaps and a tail."""
    spare = capacity - sum(lens)
    cu = [0]
    for i, n in enumerate(lens):
        gap = 1 if i % 2 == 0 and spare > 1 else 0
        spare -= gap
        cu.append(cu[-1] + n + gap)
    return tuple(cu)


def _bind(remap: Lengths, lens_q: Sequence[int], lens_kv: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The lengths calls bind for these caller's lengths (te_cudnn.ragged's own functions)."""
    b = len(lens_q)
    lq = torch.tensor(list(lens_q), dtype=torch.int32)
    lkv = torch.tensor(list(lens_kv), dtype=torch.int32)
    if remap is Lengths.ONE_QUERY:
        cu_q = torch.nn.functional.pad(torch.cumsum(lq, 0, dtype=torch.int32), (1, 0))
        cu_kv = torch.nn.functional.pad(torch.cumsum(lkv, 0, dtype=torch.int32), (1, 0))
        lq, lkv = one_query_lens(cu_q, cu_kv, b, torch.ones((b, 1, 1, 1), dtype=torch.int32))
    elif remap is Lengths.EVERY_KEY:
        lq, lkv = every_key_lens(lq, lkv)
    return tuple(int(x) for x in lq.flatten()), tuple(int(x) for x in lkv.flatten())


def probe_batches(cfg: AttnConfig, backend: Optional[SubBackend] = None) -> list[ProbeBatch]:
    """The batches a check runs, for the graph ``cfg`` describes: one, or a few when the batch
    is too small to hold every kind of sequence (:func:`_pairs`) at once. Without a padding
    mask or THD every row is valid: one batch of full lengths."""
    b, sq, skv = cfg.b, cfg.sq, cfg.skv
    if not (cfg.mask.is_padding or cfg.is_ragged):
        full_q, full_kv = (sq,) * b, (skv,) * b
        return [ProbeBatch(full_q, full_kv, full_q, full_kv)]
    remap = length_remap(cfg, backend) if backend is not None and cfg.mask.is_padding else Lengths.AS_GIVEN
    out = []
    for shift in range(0, 4, b) if b < 4 else (0,):
        pairs = _pairs(b, sq, skv, shift)
        lq, lkv = [p[0] for p in pairs], [p[1] for p in pairs]
        if cfg.ragged_kv:
            lkv = _fit(lkv, cfg.max_total_kv)
            lq = [min(n, nk) for n, nk in zip(lq, lkv)]  # a cut key side cuts its queries too
        if cfg.ragged_q:
            lq = _fit(lq, cfg.max_total_q)
        bound_q, bound_kv = _bind(remap, lq, lkv)
        out.append(ProbeBatch(tuple(lq), tuple(lkv), bound_q, bound_kv,
                              _starts(lq, cfg.max_total_q) if cfg.ragged_q else None,
                              _starts(lkv, cfg.max_total_kv) if cfg.ragged_kv else None, remap))  # fmt: skip
    return out


# ----------------------------------------------------------------------------- rows of the results
_FP8_NAMES = ("float8_e4m3fn", "float8_e5m2")
_FP8_NAN = 0x7F  # a NaN in both FP8 formats


def _is_fp8(t: Any) -> bool:
    return str(t.dtype).removeprefix("torch.") in _FP8_NAMES


def _fill(view: Any, mask: Any, value: float) -> None:
    """``view[mask] = value`` (0 or NaN; ``mask`` None: every row), written through to the
    buffer; FP8 through its bytes."""
    if _is_fp8(view):
        view, value = view.view(torch.uint8), (_FP8_NAN if math.isnan(value) else 0)
    if mask is None:
        view.fill_(value)
    else:
        view[mask] = value


def _comparable(view: Any) -> Any:
    """``view`` as a tensor that compares with 0 and tells finite values (FP8: as float32)."""
    return view.float() if _is_fp8(view) else view


def _select(view: Any, mask: Any) -> Any:
    """A copy of the rows ``view[mask]`` (FP8 through its bytes)."""
    if _is_fp8(view):
        return view.view(torch.uint8)[mask].view(view.dtype)
    return view[mask]


@dataclass(frozen=True)
class ResultRows:
    """Which rows of one output lie inside a sequence. Dense outputs (the graph's
    ``[b, h, s, d]``) are read as ``[b, s, h, d]`` with ``valid`` ``[b, s]``; THD outputs (a flat
    buffer) as ``[tokens, h, d]`` with ``valid`` ``[tokens]``; ``geometry`` holds the latter's
    (tokens, h, d, token stride, head stride, element stride)."""

    uid: int
    valid: Any
    geometry: Optional[tuple[int, int, int, int, int, int]] = None

    @property
    def name(self) -> str:
        return Uid.NAMES.get(self.uid, str(self.uid))

    def view(self, t: Any) -> Any:
        """``t`` (the output's buffer, or a clone of it) with one row per position."""
        if self.geometry is None:
            return t.permute(0, 2, 1, 3)
        tokens, h, d, st, sh, sd = self.geometry
        return t.as_strided((tokens, h, d), (st, sh, sd), t.storage_offset())

    def where(self, index: int) -> str:
        """The position of flat row ``index`` of ``valid``, in words."""
        if self.geometry is None:
            s = self.valid.shape[1]
            return f"sequence {index // s} row {index % s}"
        return f"token {index}"


def result_rows(graph: Any, ops: dict[int, Any], cfg: AttnConfig, uid: int, lens: Sequence[int],
                device: Any) -> ResultRows:  # fmt: skip
    """:class:`ResultRows` of output ``uid`` when the sequences have the caller's lengths
    ``lens`` (its side's); THD rows start where the bound ragged offsets in ``ops`` say."""
    t = graph.find_tensor(uid)
    dims, strides = [int(x) for x in t.dim], [int(x) for x in t.stride]
    if t.ragged_offset is None:
        rows = torch.arange(dims[2]).view(1, -1)
        valid = rows < torch.tensor(list(lens), dtype=torch.int64).view(-1, 1)
        return ResultRows(uid, valid.to(device))
    offsets_uid = int(t.ragged_offset.uid)
    tokens = cfg.max_total_q if offsets_uid in _RAGGED_Q_SIDE else cfg.max_total_kv
    offsets = [int(x) for x in ops[offsets_uid].flatten().tolist()]
    st = strides[2]
    valid = torch.zeros(tokens, dtype=torch.bool)
    for off, n in zip(offsets, lens):
        if off % st:
            raise ValueError(f"{Uid.NAMES.get(uid, uid)}: ragged offset {off} is not a whole number of tokens ({st})")
        valid[off // st : off // st + n] = True
    return ResultRows(uid, valid.to(device), (tokens, dims[1], dims[3], st, strides[1], strides[3]))


class ResultCheck:
    """The outputs of one graph on one set of operands, prefilled and checked row by row.

    ``ops``: the graph's operands (:func:`~te_cudnn.plans.tune.make_operands`); with
    ``bind=True`` the check runs on a copy of them in which the lengths and ragged offsets are
    ``batch``'s (the outputs and inputs stay shared). ``fill_padded``: :meth:`prefill`'s
    default. The promised results
    (:data:`RESULTS` of ``direction``) are checked: rows past a sequence's end exactly zero,
    rows inside one finite. Other row-shaped outputs (the softmax stats, the max) are compared
    on their valid rows only; the rest (dBias, amaxes, ...) whole."""

    def __init__(self, graph: Any, uids: Sequence[int], cfg: AttnConfig, direction: Direction, ops: dict[int, Any],
                 batch: ProbeBatch, device: Any, *, bind: bool = True, fill_padded: bool = False) -> None:  # fmt: skip

        self.batch = batch
        self.fill_padded = fill_padded
        self.ops = dict(ops)
        if bind and (cfg.mask.is_padding or cfg.is_ragged):
            self.ops.update(length_operands(graph, uids, cfg, device, lengths=(batch.bound_q, batch.bound_kv),
                                            cu_tokens=(batch.cu_q, batch.cu_kv)))  # fmt: skip
        produced = {t.uid for t in graph.get_outputs()}
        self.outputs = [uid for uid in uids if uid in produced]
        self.promised = [uid for uid in RESULTS[Direction(direction)] if uid in produced]
        self.rows = {uid: result_rows(graph, self.ops, cfg, uid, batch.lens_q if uid in _Q_ROWS else batch.lens_kv,
                                      device)
                     for uid in self.outputs if uid in _Q_ROWS or uid in _KV_ROWS}  # fmt: skip

    def prefill(self, fill_padded: Optional[bool] = None) -> None:
        """Promised results: NaN in every row, or, with ``fill_padded`` (default: the check's;
        what te_cudnn's zero-fill leaves before a launch), zeros past each sequence's end and NaN
        inside. Other outputs: zeros."""
        fill_padded = self.fill_padded if fill_padded is None else fill_padded
        nan = float("nan")
        for uid in self.outputs:
            buf = self.ops[uid]
            if uid in self.promised:
                r = self.rows[uid]
                view = r.view(buf)
                _fill(view, None, nan)
                if fill_padded:
                    _fill(view, ~r.valid, 0.0)
            else:
                buf.zero_()

    def problems(self) -> Optional[str]:
        """Why the promised results break the promise (None: every padded row is exactly zero
        and every valid row finite)."""
        found = []
        for uid in self.promised:
            r = self.rows[uid]
            v = _comparable(r.view(self.ops[uid]))
            lead = r.valid.dim()
            nonzero = (v != 0).flatten(lead).any(-1).flatten()  # NaN != 0
            nonfinite = (~torch.isfinite(v)).flatten(lead).any(-1).flatten()
            valid = r.valid.flatten()
            for bad, what, inside in ((nonzero & ~valid, "past a sequence's end are not exactly zero", False),
                                      (nonfinite & valid, "inside a sequence are not finite", True)):  # fmt: skip
                count = int(bad.sum())
                if not count:
                    continue
                first = int(bad.nonzero()[0, 0])
                row = v.flatten(0, lead - 1)[first].flatten()
                sample = row[~torch.isfinite(row)] if inside else row[row != 0]
                value = float(sample[0]) if sample.numel() else float("nan")
                total = int(valid.sum()) if inside else int((~valid).sum())
                found.append(f"{r.name}: {count} of {total} rows {what} (first: {r.where(first)}, {value:g})")
        return "; ".join(found) or None

    def snapshot(self) -> dict[int, Any]:
        """Copies of the outputs to compare between engines: row-shaped ones by their valid rows."""
        out = {}
        for uid in self.outputs:
            r = self.rows.get(uid)
            buf = self.ops[uid]
            out[uid] = buf.clone() if r is None else _select(r.view(buf), r.valid).clone()
        return out


# ----------------------------------------------------------------------------- records
#: How many sequences of a batch a record lists (the rest are counted: records stay small).
RECORD_SEQUENCES = 32


def _describe(batch: ProbeBatch) -> dict[str, Any]:
    """A batch as a record lists it: the remap, and the first :data:`RECORD_SEQUENCES`
    sequences' lengths (the caller's and the bound ones) and THD offsets."""

    def cut(values: Optional[Sequence[int]], extra: int = 0) -> Optional[list[int]]:
        return None if values is None else list(values[: RECORD_SEQUENCES + extra])

    return {"remap": batch.lengths.name, "sequences": len(batch.lens_q), "q": cut(batch.lens_q),
            "kv": cut(batch.lens_kv), "bound_q": cut(batch.bound_q), "bound_kv": cut(batch.bound_kv),
            "cu_q": cut(batch.cu_q, 1), "cu_kv": cut(batch.cu_kv, 1)}  # fmt: skip


def make_record(plan_name: str, direction: Direction, env: Any, batches: Sequence[ProbeBatch], why: Optional[str],
                results: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """The record of one probe: the verdict (``ok``) and why not, the engine configuration,
    the direction, the GPU (name and compute capability), cuDNN, the results and the lengths
    checked."""
    return {
        "version": RECORD_VERSION,
        "ok": why is None,
        "why": why,
        "engine": str(plan_name),
        "direction": Direction(direction).value,
        "gpu": env.device_name,
        "sm": env.sm,
        "cudnn": env.cudnn_version,
        "results": list(results),
        "lengths": [_describe(b) for b in batches],
        "timestamp": time.time(),
    }  # fmt: skip


def valid_record(record: Any, *, engine: Optional[str] = None, direction: Optional[Direction] = None,
                 sm: Optional[int] = None, cudnn: Optional[int] = None) -> bool:  # fmt: skip
    """A record of this version (:func:`make_record`), for this engine, direction, compute
    capability and cuDNN version where given."""
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return False
    if not isinstance(record.get("ok"), bool) or not isinstance(record.get("engine"), str):
        return False
    wanted = {"engine": engine, "direction": None if direction is None else Direction(direction).value, "sm": sm,
              "cudnn": cudnn}  # fmt: skip
    return all(value is None or record.get(name) == value for name, value in wanted.items())


# ----------------------------------------------------------------------------- the probe
def probe(plan: Any, cfg: Optional[AttnConfig] = None, backend: Optional[SubBackend] = None,
          direction: Optional[Direction] = None, *, seed: int = 0, env: Any = None) -> dict[str, Any]:  # fmt: skip
    """Run ``plan`` (a :class:`~te_cudnn.plans.cache.CompiledPlan`, through its launcher, as
    calls run it) on :func:`probe_batches`' lengths into NaN-prefilled results and return the
    record (:func:`make_record`). Needs the plan's device; raises what the launch raises.
    ``cfg`` / ``backend``: the call's description and sub-backend (default: the plan key's),
    which decide the lengths bound."""
    key = plan.key
    kcfg = key.config
    direction = key.direction if direction is None else Direction(direction)
    backend = BY_ENUM[key.backend] if backend is None else backend
    cfg = kcfg if cfg is None else cfg
    index = kcfg.device
    device = torch.device("cuda", index)
    env = current_env(index) if env is None else env
    batches = probe_batches(cfg, backend)
    with torch.cuda.device(index):
        handle = handle_for(index)
        # the layout of the operands: a plan loaded from the store describes no tensors, so the
        # key's graph is built again (validated, not planned) to read its dims, strides and dtypes
        spec = backend.build(kcfg, direction, handle)
        spec.graph.validate()
        if tuple(spec.uids) != tuple(plan.uids):
            raise ValueError(f"the key's graph binds {list(spec.uids)}, the plan {list(plan.uids)}")
        workspace = torch.empty(max(int(plan.workspace_size), 1), dtype=torch.uint8, device=device)
        stream = torch.cuda.current_stream(device)
        why = []
        checked: list[str] = []
        for batch in batches:
            ops = make_operands(spec.graph, spec.uids, kcfg, device, seed=seed, lengths=(batch.bound_q, batch.bound_kv),
                                cu_tokens=(batch.cu_q, batch.cu_kv))  # fmt: skip
            check = ResultCheck(spec.graph, spec.uids, kcfg, direction, ops, batch, device, bind=False)
            check.prefill()
            plan.launch([check.ops[u] for u in plan.uids], workspace, handle)
            stream.synchronize()
            checked = [Uid.NAMES[u] for u in check.promised]
            problem = check.problems()
            if problem is not None:
                why.append(problem)
            del ops, check
    return make_record(plan.plan_name, direction, env, batches, "; ".join(why) or None, checked)


# ----------------------------------------------------------------------------- verdicts
_records: dict[tuple, dict[str, Any]] = {}  # (plan key, engine) -> record: this process's verdicts
_locks: dict[tuple, threading.Lock] = {}
_locks_lock = threading.Lock()
_warned: set[str] = set()


def forget() -> None:
    """Forget this process's verdicts (the plan store keeps its records)."""
    with _locks_lock:
        _records.clear()
        _locks.clear()


def _warn_once(cause: str, message: str) -> None:
    if cause not in _warned:
        _warned.add(cause)
        warnings.warn(message, stacklevel=4)


def _capturing(device: int) -> bool:
    """Whether the current stream of ``device`` is capturing a CUDA graph (True where that
    cannot be told: nothing is launched then)."""
    try:
        with torch.cuda.device(device):
            return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001
        return True


def _store(device: int) -> Any:
    return store_for(device)


def record_for(plan: Any, direction: Optional[Direction] = None) -> Optional[dict[str, Any]]:
    """The record of ``plan``'s engine for its key: this process's, else the plan store's (for
    this GPU architecture and cuDNN version); None when it was never checked. Never probes."""
    memo = (plan.key, plan.plan_name)
    record = _records.get(memo)
    if record is not None:
        return record
    return _stored(plan, plan.key.direction if direction is None else Direction(direction))


def _stored(plan: Any, direction: Direction) -> Optional[dict[str, Any]]:
    device = plan.key.config.device
    if device < 0:
        return None
    try:
        env = current_env(device)
        store = _store(device)
        if store is None:
            return None
        record = store.load_record(plan.key.describe(device=False), KIND, plan.plan_name)
    except Exception:  # noqa: BLE001 - the store is an optimisation: probe instead
        return None
    ok = valid_record(record, engine=plan.plan_name, direction=direction, sm=env.sm, cudnn=env.cudnn_version)
    return record if ok else None


def _keep(plan: Any, record: dict[str, Any]) -> None:
    """Keep a probe's record in the plan store (when there is one); a failure is warned once."""
    store = _store(plan.key.config.device)
    if store is None:
        return
    try:
        store.save_record(plan.key.describe(device=False), KIND, plan.plan_name, record)
    except Exception as exc:  # noqa: BLE001 - storing is an optimisation: the process keeps the verdict
        message = f"te_cudnn: could not record a padded-row check in {store.dir}: {exc}; it is kept for this process only"
        store.warn_once(f"records-write:{type(exc).__name__}", message)


def rows_verified(plan: Any, cfg: Optional[AttnConfig] = None, backend: Optional[SubBackend] = None,
                  direction: Optional[Direction] = None) -> bool:  # fmt: skip
    """Whether ``plan``'s engine is known to leave exact zeros in every row of its results past
    a sequence's end (O forward; dQ, dK, dV backward) for this call's description: this
    process's record, else the plan store's, else a probe run now (:func:`probe`; recorded in
    memory and in the store). Never probes during a CUDA-graph capture: without a record the
    answer there is False. False also for a plan without a device or an engine name, and when
    the probe cannot run (warned once per kind of failure)."""
    if plan is None or getattr(plan, "plan_name", "unknown") in ("", "unknown"):
        return False
    key = plan.key
    memo = (key, plan.plan_name)
    record = _records.get(memo)
    if record is not None:
        return bool(record["ok"])
    if key.config.device < 0:
        return False
    direction = key.direction if direction is None else Direction(direction)
    with _locks_lock:
        lock = _locks.setdefault(memo, threading.Lock())
    with lock:  # one probe per engine and key, whichever thread asks first
        record = _records.get(memo)
        if record is not None:
            return bool(record["ok"])
        record = _stored(plan, direction)
        if record is None:
            if _capturing(key.config.device):
                return False
            try:
                record = probe(plan, cfg, backend, direction)
            except Exception as exc:  # noqa: BLE001 - unchecked: te_cudnn fills
                message = "; ".join(p.strip() for p in str(exc).splitlines() if p.strip())[:300]
                _warn_once(f"probe:{type(exc).__name__}", f"te_cudnn: could not check which result rows the engine "
                                                          f"{plan.plan_name} writes ({type(exc).__name__}: {message}); "
                                                          f"its results are zero-filled (further failures of this kind "
                                                          f"are not reported)")  # fmt: skip
                _records[memo] = {"ok": False, "why": f"the probe failed: {type(exc).__name__}: {message}",
                                  "engine": plan.plan_name, "direction": direction.value}  # fmt: skip
                return False
            _keep(plan, record)
            if not record["ok"] and _log.isEnabledFor(logging.INFO):
                _log.info("engine %s of %s leaves result rows past a sequence's end unwritten or nonzero (%s): "
                          "those results are zero-filled", plan.plan_name, key, record["why"])  # fmt: skip
        _records[memo] = record
        return bool(record["ok"])


def fills_out(cfg: AttnConfig, backend: SubBackend, plan: Any = None) -> bool:
    """Whether a padding-mask / THD forward zero-fills O before cuDNN writes it: yes unless the
    static rule allows skipping (te_cudnn.row_fill) and ``plan``'s engine is checked (:func:`rows_verified`)."""
    if not (cfg.mask.is_padding or cfg.is_ragged):
        return False
    if plan is None or not skips_out_fill(cfg, backend):
        return True
    return not rows_verified(plan, cfg, backend, Direction.FWD)


def fills_grads(cfg: AttnConfig, backend: SubBackend, plan: Any = None) -> bool:
    """Whether a padding-mask / THD backward zero-fills dQ, dK and dV before cuDNN writes them:
    yes unless the static rule allows skipping and ``plan``'s engine is checked."""
    if not (cfg.mask.is_padding or cfg.is_ragged):
        return False
    if plan is None or not skips_grads_fill(cfg, backend):
        return True
    return not rows_verified(plan, cfg, backend, Direction.BWD)
