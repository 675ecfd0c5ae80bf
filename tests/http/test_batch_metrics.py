"""The /metrics gauges of batch jobs' lines (queued, running, finished): absent until the app hands
Metrics the batch runner's counts, then read from them at every scrape."""

from __future__ import annotations

import re

from swama.engine.client import EngineStatus
from swama.handlers.http.observability import Metrics

GAUGES = {"queued": "swama_batch_lines_queued", "running": "swama_batch_lines_running",
          "finished": "swama_batch_lines_finished"}


class StatusEngine:
    """What Metrics reads of an engine: its status."""

    def status(self) -> EngineStatus:
        return EngineStatus([], 0, 0, "bundled", 0, 0)


def _sample(text: str, name: str) -> float:
    [value] = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")]
    return value


def _text(metrics: Metrics) -> str:
    return metrics.exposition()[0].decode()


def test_the_batch_gauges_are_absent_until_watched() -> None:
    text = _text(Metrics(StatusEngine()))  # type: ignore[arg-type]
    assert "swama_batch_lines" not in text


def test_the_batch_gauges_read_the_runner_s_counts_at_each_scrape() -> None:
    metrics = Metrics(StatusEngine())  # type: ignore[arg-type]
    counts = {"queued": 7, "running": 2, "finished": 40}
    metrics.watch_batches(lambda: dict(counts))
    text = _text(metrics)
    for state, name in GAUGES.items():
        assert _sample(text, name) == counts[state]
        assert re.search(rf"^# TYPE {name} gauge$", text, re.M), name
    assert re.search(r"^# HELP swama_batch_lines_queued Lines of batch jobs waiting to be answered$", text, re.M)
    assert re.search(r"^# HELP swama_batch_lines_running Lines of batch jobs being answered now$", text, re.M)
    assert re.search(r"^# HELP swama_batch_lines_finished Lines of batch jobs answered or failed$", text, re.M)

    counts.update(queued=0, running=1, finished=48)  # the next scrape reads them again
    text = _text(metrics)
    assert [_sample(text, name) for name in GAUGES.values()] == [0, 1, 48]
    assert _sample(text, "swama_running") == 0  # the engine's own gauges stay as they were
