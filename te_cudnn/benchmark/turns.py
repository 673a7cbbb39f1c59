"""Timing contenders in turns, so that the host's slow spells fall on all of them alike.

Host-bound work (Hugging Face decoding: 10–20 ms of transformers' Python per step) runs at a
speed that drifts by several per cent over seconds on a shared host, far more than the
difference between two attention implementations. Four granularities:

* :func:`alternating`: whole calls take turns, call by call; the per-turn samples pair the
  contenders.
* :class:`StepClock`: a ``generate`` streamer that keeps each call's median interval between
  new tokens (decode steps alone, without the prefill and the host's stalls).
* :func:`decode_in_lockstep`: greedy decode steps of several models, each with its own
  cache, taking turns step by step; the steps pair by position. Two steps 10–20 ms apart
  share the host's speed, so only the difference of the two steps remains.
* :class:`SwitchingSteps`: a ``generate`` streamer that switches one model's attention
  implementation after every new token, so that the contenders take turns step by step
  inside one ``generate`` call (its own loop, cache and stopping check), in a fixed cycle;
  the steps of a turn pair the contenders.

In :func:`alternating` and :func:`decode_in_lockstep` each turn starts one contender later
than the last (:func:`next_turn`), so that every contender takes every place in a turn alike
and, with three or more, none ever runs right after itself: whatever a call leaves behind for
the next one (the allocator's and the caches' state) falls on all of them alike. (Reversing
the order instead would keep the middle one of three in the middle, always after another
contender, while the others follow themselves every other turn.)

The lockstep runs in one thread: torch's cuDNN SDPA keeps its graphs per thread (a new
thread builds them again), and handing on between threads made the paired intervals far
wider (see the performance guide).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional, Sequence

import torch

__all__ = ["alternating", "next_turn", "StepClock", "SwitchingSteps", "decode_in_lockstep"]


def next_turn(order: list) -> list:
    """The order of the next turn: ``order`` rotated by one place (in place; also returned)."""
    order.append(order.pop(0))
    return order


def alternating(fns: dict[str, Callable[[], Any]], reps: int, paired: Optional[dict] = None,
                prepare: Optional[dict[str, Callable[[], Any]]] = None) -> dict[str, float]:  # fmt: skip
    """Median seconds per call of each function after one warm-up call each, the functions
    taking turns call by call (each turn starting one later: :func:`next_turn`), so that a
    slow spell of the host falls on all of them alike. ``paired`` receives the per-turn samples; ``prepare``'s
    function of a name, if any, runs untimed before each of that name's calls."""
    prepare = prepare or {}
    for name, fn in fns.items():
        if name in prepare:
            prepare[name]()
        fn()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in fns}
    turn = list(fns.items())
    for _ in range(reps):
        for name, fn in turn:
            if name in prepare:
                prepare[name]()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
        next_turn(turn)
    if paired is not None:
        paired.update(times)
    return {name: statistics.median(t) for name, t in times.items()}


class StepClock:
    """A ``generate`` streamer that times the decode steps: transformers hands it the prompt,
    then each new token as its step ends; at the end of a call it keeps the median interval
    between new tokens. That median leaves out the prefill and the host's occasional stalls,
    which make whole-call times of host-bound decoding vary by ±15 % from call to call."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.medians: list[float] = []

    def put(self, value: Any) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        steps = [b - a for a, b in zip(self.stamps[1:], self.stamps[2:])]  # stamps[0]: the prompt
        if steps:
            self.medians.append(statistics.median(steps))
        self.stamps = []


class SwitchingSteps:
    """A ``generate`` streamer that hands the decode steps of one model to contenders in turns.

    ``switch`` maps each contender to a function that selects it (for Hugging Face models,
    ``model.set_attn_implementation``). transformers calls :meth:`put` with the prompt and
    then with each new token as its step ends; every call switches to the next contender,
    untimed, and starts the clock of the step it begins. The steps follow ``cycle``, a
    sequence of the contenders repeated call after call (default: each contender once, in
    ``switch``'s order); a turn is one pass through it. ``seconds[name][t]`` is the mean of
    ``name``'s steps in turn ``t`` (complete turns only, so the contenders pair by turn). The
    prefill (the interval that ends on the first token) is not timed; it runs on the cycle's
    last contender, so that the first step, like every other, follows the one before it in
    the cycle.

    Whatever a switch of implementation costs the step after it (transformers' own work,
    the caches of the host) must fall on all contenders alike: when two contenders select
    the same implementation (a control against itself), the cycle should put the other one
    between them, e.g. ``("te_cudnn", "sdpa", "te_cudnn", "sdpa, again")``, so that every
    step follows a real switch and both implementations run every other step."""

    def __init__(self, switch: dict[str, Callable[[], Any]], cycle: Optional[Sequence[str]] = None) -> None:
        if len(switch) < 2:
            raise ValueError(f"switch needs two or more contenders, got {list(switch)}")
        cycle = list(switch) if cycle is None else list(cycle)
        if set(cycle) != set(switch) or any(a == b for a, b in zip(cycle, cycle[1:] + cycle[:1])):
            raise ValueError(f"cycle must name every contender of switch ({list(switch)}) and never the same one "
                             f"twice in a row (counting from its end to its start), got {cycle}")  # fmt: skip
        self.switch, self.cycle = switch, tuple(cycle)
        self.seconds: dict[str, list[float]] = {name: [] for name in switch}
        self._turn: dict[str, list[float]] = {}
        self._place = 0
        self._running: Optional[str] = None
        self._started = 0.0
        self._puts = 0

    def put(self, value: Any) -> None:
        now = time.perf_counter()
        if self._running is not None:
            self._turn.setdefault(self._running, []).append(now - self._started)
            self._place += 1
            if self._place == len(self.cycle):
                for name, secs in self._turn.items():
                    self.seconds[name].append(sum(secs) / len(secs))
                self._turn, self._place = {}, 0
        self._puts += 1
        if self._puts == 1:  # the prompt: the prefill that follows is not timed
            self._running = None
            self.switch[self.cycle[-1]]()
            return
        self._running = self.cycle[self._place]
        self.switch[self._running]()
        self._started = time.perf_counter()

    def end(self) -> None:
        """The call's last turn, if incomplete, is dropped; the next call starts afresh."""
        self._turn, self._place, self._running, self._puts = {}, 0, None, 0


def decode_in_lockstep(models: dict[str, Any], ids: torch.Tensor, steps: int, rounds: int) -> tuple[dict, dict]:
    """Greedy decode steps of each model with its own dynamic cache, the models taking turns
    step by step (each turn starting one later: :func:`next_turn`), so that the host's slow spells, which move
    whole ``generate`` calls by several per cent, fall on both sides of a pair. Every step ends
    on its new token's value on the host, as ``generate``'s stopping check does. One untimed
    round first (plans and allocator warm). Returns ``(seconds per step, tokens)``: ``rounds *
    steps`` samples per model, paired by position, and each model's ``[b, steps]`` tokens of
    the last round."""
    seconds: dict[str, list[float]] = {name: [] for name in models}
    tokens: dict[str, torch.Tensor] = {}
    for r in range(rounds + 1):
        caches, last, made = {}, {}, {name: [] for name in models}
        for name, model in models.items():
            out = model(ids, use_cache=True)
            caches[name], last[name] = out.past_key_values, out.logits[:, -1:].argmax(-1)
        turn = list(models)
        for _ in range(steps):
            for name in turn:
                t0 = time.perf_counter()
                out = models[name](last[name], past_key_values=caches[name], use_cache=True)
                last[name] = out.logits[:, -1:].argmax(-1)
                bool((last[name] < 0).any())  # the token on the host: the step is done
                if r:
                    seconds[name].append(time.perf_counter() - t0)
                made[name].append(last[name])
            next_turn(turn)
        tokens = {name: torch.cat(t, dim=1) for name, t in made.items()}
    return seconds, tokens
