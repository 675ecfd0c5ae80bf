"""Live requests before batch lines: the admission's order of waiting prompts, and the door's stamp."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swama.engine.decisions.decide import DecisionJob
from swama.engine.priority import BATCH, live_first
from swama.engine.serving.admission import Admission, Pending
from swama.engine.serving.engine import Engine
from swama.engine.settings import EngineSettings


def row(rid: int, batch: bool) -> Pending:
    return Pending(rid, [1, 2, 3], [], 0, batch=batch)


def test_a_live_prompt_is_read_before_the_batch_lines_waiting() -> None:
    admission = Admission(model=None, budget=64, bucketed=False)
    for rid, batch in [(1, True), (2, False), (3, True), (4, False), (5, True)]:
        admission.add(row(rid, batch))
    # Live prompts in their own order ahead of every batch line; batch lines keep theirs.
    assert [r.rid for r in admission.waiting] == [2, 4, 1, 3, 5]


def test_live_first_keeps_each_group_s_order() -> None:
    items = [("a", True), ("b", False), ("c", True), ("d", False)]
    assert [name for name, _ in live_first(items, lambda item: item[1])] == ["b", "d", "a", "c"]


def test_the_door_stamps_a_line_sent_by_the_batch_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the runner's context says crosses into the engine on the job itself (then to an engine
    process with it): a request sent outside that context stays live."""
    seen: list[bool] = []

    async def scored(self: Engine, model_id: str, job: DecisionJob):  # noqa: ANN202
        seen.append(job.batch)
        yield None

    monkeypatch.setattr(Engine, "_score", scored)
    engine = Engine(EngineSettings(models_root=tmp_path))

    async def ask() -> None:
        job = DecisionJob("text", [], 64)
        [_ async for _ in engine.decide("m", job)]
        token = BATCH.set(True)
        try:
            [_ async for _ in engine.decide("m", job)]
        finally:
            BATCH.reset(token)
        [_ async for _ in engine.decide("m", job)]

    asyncio.run(ask())
    assert seen == [False, True, False]
