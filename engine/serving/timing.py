"""Where a batch scheduler's thread spends its time, by part of its turn (read by /metrics and the
load benchmark, which diffs two readings to see one load level).

- admission: requests joining (prompt cache, sampling, rows queued for prefill) and rows leaving;
- prefill: batched forwards over waiting prompts, evaluated;
- graph: building decode steps' forward graphs (MLX is lazy: calling the model builds, it does not run);
- launch: handing a step's graph to the device (MLX encodes and launches its kernels on this thread);
- wait: reading a step's tokens back, waiting for the device where it has not finished them;
- batch: the rest of a decode step: mlx-lm's per-row bookkeeping (stops, budgets), rows joining the
  batch (their first forward, the caches merged) and leaving it (the caches filtered);
- post: swama's own per-row work on a step's tokens (log probabilities, draft counts, finished rows);
- delivery: handing a step's tokens to the front end (the event loop, or the engine process's channel);
- tasks and decisions: work queued on the model (a decision request's prefix, scored passes);
- idle: waiting for work.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PARTS = ("admission", "prefill", "graph", "launch", "wait", "batch", "post", "delivery", "tasks", "decisions", "idle")


class TurnClock:
    """Seconds per part of the scheduler's turns, and how many turns and decode steps there were."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.turns = 0
        self.steps = 0
        self.idle_since: float | None = None  # the scheduler waits for work since then

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def wait(self) -> None:
        self.idle_since = time.perf_counter()

    def woke(self) -> None:
        if self.idle_since is not None:
            self.seconds["idle"] += time.perf_counter() - self.idle_since
            self.idle_since = None

    def reading(self) -> dict[str, float]:
        """The parts so far, a wait still going on included (read from another thread)."""
        since = self.idle_since
        idle = self.seconds["idle"] + (time.perf_counter() - since if since is not None else 0.0)
        return {**self.seconds, "idle": idle, "turns": float(self.turns), "steps": float(self.steps)}


class TimedForward:
    """A model as the batch calls it, the time of each call counted as graph building (MLX evaluates
    lazily, so the call itself only builds the graph); everything else is the model's own."""

    def __init__(self, model: Any, clock: TurnClock) -> None:
        self._model = model
        self._clock = clock

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self._model(*args, **kwargs)
        finally:
            self._clock.seconds["graph"] += time.perf_counter() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
