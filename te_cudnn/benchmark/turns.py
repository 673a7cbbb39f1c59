"""Timing contenders in turns, so that the host's slow spells fall on all of them alike.

Host-bound work (Hugging Face decoding: 10–20 ms of transformers' Python per step) runs at a
speed that drifts by several per cent over seconds on a shared host, far more than the
difference between two attention implementations. Three granularities:

* :func:`alternating`: whole calls take turns, call by call (the first of a turn alternating);
  the per-turn samples pair the contenders.
* :class:`StepClock`: a ``generate`` streamer that keeps each call's median interval between
  new tokens (decode steps alone, without the prefill and the host's stalls).
* :func:`generate_in_turns`: whole ``generate`` calls of several models, each in its own
  thread, that hand on at every new token, so that the models decode in lockstep; each call's
  time is the sum of its own stretches (waiting for the others left out), paired call by call
  and step by step. A whole call then moves with the host only as much as the steps it shares
  with its partner do.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable, Optional

import torch

__all__ = ["alternating", "StepClock", "Turns", "generate_in_turns"]

#: seconds a participant waits for its turn before giving up (a partner that hangs)
TURN_TIMEOUT_S = 600.0


def alternating(fns: dict[str, Callable[[], Any]], reps: int, paired: Optional[dict] = None,
                prepare: Optional[dict[str, Callable[[], Any]]] = None) -> dict[str, float]:  # fmt: skip
    """Median seconds per call of each function after one warm-up call each, the functions
    taking turns call by call (the first of a turn alternating), so that a slow spell of the
    host falls on all of them alike. ``paired`` receives the per-turn samples; ``prepare``'s
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
        turn.reverse()
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


class Turns:
    """Threads taking turns in the order of ``names``, reversed after each full turn (A B, B A,
    A B, ...: the first of a turn alternating). :meth:`wait` blocks until it is the caller's
    turn; :meth:`hand_on` gives the turn to the next participant that has not finished."""

    def __init__(self, names: list[str]) -> None:
        self._cond = threading.Condition()
        self._order = list(names)
        self._pos = 0
        self._finished: set[str] = set()

    def _holder(self) -> str:
        return self._order[self._pos]

    def wait(self, name: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._holder() == name, timeout=TURN_TIMEOUT_S):
                raise TimeoutError(f"{name} waited {TURN_TIMEOUT_S:g} s for its turn (held by {self._holder()})")

    def hand_on(self, name: str, finished: bool = False) -> None:
        """Give the turn on if ``name`` holds it; ``finished``: ``name`` takes no more turns
        (a participant that finishes out of turn, on an error, only leaves the order)."""
        with self._cond:
            if finished:
                self._finished.add(name)
            holder = self._holder()
            if (holder == name or holder in self._finished) and len(self._finished) < len(self._order):
                while True:
                    self._pos += 1
                    if self._pos == len(self._order):
                        self._order.reverse()
                        self._pos = 0
                    if self._holder() not in self._finished:
                        break
            self._cond.notify_all()


class _TurnClock:
    """A ``generate`` streamer that hands the turn on at every new token and times its own
    stretches between turns (``stretches``: the set-up to the prompt, then one per new token,
    then the rest of the call). transformers passes each token to ``put`` after copying it to
    the host, so the stretch's GPU work is done when the turn moves on."""

    def __init__(self, name: str, turns: Turns) -> None:
        self.name, self.turns = name, turns
        self.stretches: list[float] = []
        self._t0 = 0.0

    def start(self) -> None:
        self.turns.wait(self.name)
        self._t0 = time.perf_counter()

    def put(self, value: Any) -> None:
        self.stretches.append(time.perf_counter() - self._t0)
        self.turns.hand_on(self.name)
        self.turns.wait(self.name)
        self._t0 = time.perf_counter()

    def end(self) -> None:
        pass

    def finish(self) -> None:
        self.stretches.append(time.perf_counter() - self._t0)
        self.turns.hand_on(self.name, finished=True)


def generate_in_turns(models: dict[str, Any], ids: torch.Tensor, rounds: int,
                      **generate_kwargs: Any) -> tuple[dict[str, list[float]], dict[str, list[float]], dict]:  # fmt: skip
    """``generate`` of every model on ``ids`` in lockstep: each model has one thread for all
    rounds, whose calls hand the turn on at every new token (:class:`Turns`; the first model of
    a round alternates, and a round starts when every thread is ready). One untimed round
    first: what a thread keeps for itself (torch's cuDNN SDPA caches its graphs per thread) is
    warm before the timed rounds, as plans and the allocator are. Returns ``(calls, steps,
    outputs)``: per model, the seconds of each timed call (the sum of its own stretches), the
    seconds of each decode step (new token 2 onwards, ``rounds * (tokens - 1)`` samples paired
    by position), and the last round's ``generate`` outputs."""
    names = list(models)
    schedule = [Turns(names if r % 2 == 0 else names[::-1]) for r in range(rounds + 1)]
    start = threading.Barrier(len(names), timeout=TURN_TIMEOUT_S)
    calls: dict[str, list[float]] = {name: [] for name in names}
    steps: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}

    def run(name: str) -> None:
        for r, turns in enumerate(schedule):
            try:
                start.wait()  # the previous round has ended for every thread
            except threading.BrokenBarrierError:  # another thread failed: its error is raised
                return
            clock = _TurnClock(name, turns)
            try:
                clock.start()
                outputs[name] = models[name].generate(ids, streamer=clock, **generate_kwargs)
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread below
                errors[name] = e
                start.abort()
            finally:
                clock.finish()
            if name in errors:
                return
            if r:
                calls[name].append(sum(clock.stretches))
                steps[name].extend(clock.stretches[2:-1])  # after the set-up and the prefill's token

    threads = [threading.Thread(target=run, args=(name,), name=f"generate {name}") for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        name, e = next(iter(errors.items()))
        raise RuntimeError(f"generate of {name!r} failed in turns: {e}") from e
    return calls, steps, outputs
