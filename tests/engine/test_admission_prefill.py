"""The batch's admission: waiting prompts prefilled together, in as few forwards as the token budget
allows, with shapes from a small set on a GPU.

The stall seen at 32 streams on an H200 (seconds to a first token with the GPU idle) came from prefill
forwards of ever new shapes: MLX builds a cuDNN attention graph for each new (rows, query length,
key length, strides, mask) of a prefill, with the device waiting, and mlx-lm's batch prefills
whatever group of up to 8 prompts is waiting, padded to the group's longest. These tests hold the
admission to its promise on any device: the shapes it would send a GPU come from a small set
whatever the prompts' lengths and resumed prefixes, and reading prompts that way gives the same
next-token logits as reading each alone.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
import scheduled
from precision import F32_TINY_LOGIT

from swama.engine.serving.admission import ALIGN, MIN_LENGTH, Admission, Pending, bucket
from swama.engine.serving.scheduler import Scheduler
from swama.engine.text.generator import ChatRequest, Sampling
from swama.engine.text.language import load_language_model
from swama.engine.text.prompt_cache import PromptCache


class Recorder:
    """A model whose forwards are recorded by shape: (rows, tokens, key/value positions before them)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.shapes: list[tuple[int, int, int]] = []

    def __call__(self, tokens: mx.array, cache: Any = None) -> mx.array:
        self.shapes.append((tokens.shape[0], tokens.shape[1], int(cache[0]._idx)))
        return self.model(tokens, cache=cache)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Any:
    return load_language_model("tiny", tiny_model_dir)


def _fresh(model: Any) -> list[Any]:
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def _prompts(count: int, seed: int, longest: int = 300) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 4000) for _ in range(rng.randrange(2, longest))] for _ in range(count)]


def _admit(model: Any, prompts: list[list[int]], budget: int, bucketed: bool,
           resumed: dict[int, int] | None = None, forward: Any = None) -> tuple[list[Any], int]:
    """Every prompt read through an Admission (whose forwards `forward` makes, the model's own by
    default); each prompt's cache by index, and the forwards it took."""
    admission = Admission(forward or model.model, budget, bucketed, max_rows=64)
    for i, ids in enumerate(prompts):
        cache, done = _fresh(model.model), 0
        if resumed and resumed.get(i):  # a resumed prefix: read alone first, as a prompt cache would hold it
            done = resumed[i]
            model.model(mx.array([ids[:done]]), cache=cache)
            mx.eval([c.state for c in cache])
        admission.add(Pending(i, ids, cache, done))
    ready, forwards = {}, 0
    while len(admission):
        forwards += 1
        for group in admission.step():  # each row's own cache, taken out of its group's
            for i, row in enumerate(group.rows):
                ready[row.rid] = [c.extract(i) for c in group.cache] if group.batched else group.cache
    return [ready[i] for i in range(len(prompts))], forwards


def _next_logits(model: Any, ids: list[int], cache: list[Any]) -> mx.array:
    logits = model.model(mx.array([ids[-1:]]), cache=cache)[0, -1]
    mx.eval(logits)
    return logits


def test_64_waiting_prompts_are_read_in_one_forward(tiny: Any) -> None:
    prompts = [[11, 12, 13] + [100 + i] * (30 + i % 9) for i in range(64)]
    for bucketed in (False, True):
        _, forwards = _admit(tiny, prompts, budget=4096, bucketed=bucketed)
        assert forwards == 1, bucketed


def test_a_prompt_longer_than_the_budget_is_read_in_chunks(tiny: Any) -> None:
    recorder = Recorder(tiny.model)
    ready, forwards = _admit(tiny, [list(range(5, 1005))], budget=256, bucketed=True, forward=recorder)
    assert forwards == 4 and [s[1] for s in recorder.shapes] == [256, 256, 256, 256]
    assert [s[2] for s in recorder.shapes] == [0, 256, 512, 768]  # chunks start at aligned offsets
    assert ready[0][0].offset == 999


def test_gpu_prefill_shapes_come_from_a_small_set_whatever_the_prompts(tiny: Any) -> None:
    """The cause of the stall, held: many waves of prompts of random lengths and resumed prefixes give
    prefill shapes of power-of-two rows and lengths at offsets that are multiples of ALIGN, and few of
    them; read exactly (as on the CPU) the same waves give a new shape at almost every forward."""
    shapes: dict[bool, set[tuple[int, int, int]]] = {}
    for bucketed in (True, False):
        recorder = Recorder(tiny.model)
        for wave in range(6):
            prompts = _prompts(24, seed=wave, longest=600)
            resumed = {i: (ALIGN if bucketed else 300) for i in range(24) if len(prompts[i]) > 301 and i % 3 == 0}
            _admit(tiny, prompts, budget=2048, bucketed=bucketed, resumed=resumed, forward=recorder)
        shapes[bucketed] = set(recorder.shapes)
    for rows, length, offset in shapes[True]:
        assert rows & (rows - 1) == 0 and length == bucket(length) and length >= MIN_LENGTH
        assert offset % ALIGN == 0
    assert len(shapes[True]) <= 20, sorted(shapes[True])
    assert len(shapes[False]) > 2 * len(shapes[True]), (len(shapes[False]), len(shapes[True]))


def test_while_rows_decode_prompts_arriving_one_by_one_wait_to_be_read_together(tiny: Any) -> None:
    """With a wait of 3 turns, prompts that arrive one a turn while rows decode are read in one forward
    once the first has waited 3 turns; a forward's worth of them, or an idle batch, goes at once."""
    recorder = Recorder(tiny.model)
    admission = Admission(recorder, 512, True, max_rows=8, wait=3)
    read: list[list[int]] = []
    for turn in range(6):
        if turn < 4:
            admission.add(Pending(turn, [5 + turn] * 20, _fresh(tiny.model), 0))
        read.append(sorted(row.rid for group in admission.step(decoding=True) for row in group.rows))
    assert read == [[], [], [], [0, 1, 2, 3], [], []] and len(recorder.shapes) == 1

    for rid in range(8):  # 8 rows of 32 padded tokens: max_rows waiting, read at once
        admission.add(Pending(10 + rid, [7] * 20, _fresh(tiny.model), 0))
    assert len(sum((g.rows for g in admission.step(decoding=True)), [])) == 8
    admission.add(Pending(20, [9] * 20, _fresh(tiny.model), 0))
    assert [r.rid for g in admission.step(decoding=False) for r in g.rows] == [20]  # nothing decodes: no wait
    assert len(recorder.shapes) == 3


def test_without_a_wait_every_turn_reads_what_waits(tiny: Any) -> None:
    admission = Admission(tiny.model, 512, True, max_rows=8)
    for rid in range(3):
        admission.add(Pending(rid, [5 + rid] * 20, _fresh(tiny.model), 0))
        assert [r.rid for g in admission.step(decoding=True) for r in g.rows] == [rid]


@pytest.mark.parametrize("bucketed", [False, True])
def test_prompts_read_together_give_the_logits_each_gives_alone(tiny: Any, bucketed: bool) -> None:
    prompts = _prompts(12, seed=7, longest=90)
    resumed = {} if bucketed else {3: 30, 5: 20}  # on a GPU a resumed prefix is a multiple of ALIGN
    ready, _ = _admit(tiny, prompts, budget=512, bucketed=bucketed, resumed=resumed)
    for ids, row in zip(prompts, ready, strict=True):
        alone = _fresh(tiny.model)
        tiny.model(mx.array([ids[:-1]]), cache=alone)
        expected, got = _next_logits(tiny, ids, alone), _next_logits(tiny, ids, row)
        assert mx.abs(expected - got).max().item() < F32_TINY_LOGIT  # another batch composition and padding


def test_bucketed_admission_in_the_scheduler_gives_the_tokens_of_one_request_alone(tiny: Any) -> None:
    """Greedy rows admitted with GPU shapes (padded, grouped by powers of two) decode the tokens each
    request decodes alone."""
    requests = [ChatRequest([{"role": "user", "content": f"Item {i}: " + "tell me more " * (i % 5)}],
                            sampling=Sampling(temperature=0), max_tokens=12, context_limit=2048) for i in range(11)]

    async def run() -> list[Any]:
        scheduler = Scheduler(tiny, prompt_cache=PromptCache(1 << 28), rows=16, prefill_step=256)
        scheduler.bucketed = True
        try:
            return await asyncio.gather(*(scheduled.collect(scheduler, r) for r in requests))
        finally:
            scheduler.close()

    together = asyncio.run(run())
    for request, (_, finished) in zip(requests, together, strict=True):
        assert finished.token_ids == scheduled.alone(tiny, request).token_ids


def test_rows_of_a_group_that_finish_early_leave_with_their_own_rows_of_the_cache(tiny: Any) -> None:
    """A group whose prompts end in different chunks (not a group `step` forms today, whose prompts
    all fit one forward): the finished rows leave with the caches filtered to them, the others read on,
    and every prompt's next-token logits are those of reading it alone."""
    from swama.engine.serving.admission import _Group

    prompts = [list(range(5, 15)), list(range(20, 120))]
    admission = Admission(tiny.model, 64, False)
    group = _Group([Pending(i, ids, _fresh(tiny.model), 0) for i, ids in enumerate(prompts)])
    first = admission._read(group)  # a share of 32 tokens a row: the short prompt ends now
    assert [r.rid for g in first for r in g.rows] == [0] and [r.rid for r in group.rows] == [1]
    later = []
    while group.rows:
        later += admission._read(group)
    caches = {g.rows[i].rid: [c.extract(i) for c in g.cache] for g in first + later for i in range(len(g.rows))}
    for rid, ids in enumerate(prompts):
        alone = _fresh(tiny.model)
        tiny.model(mx.array([ids[:-1]]), cache=alone)
        # Read in a group of two and in chunks against alone: float32 sums in another order.
        assert mx.abs(_next_logits(tiny, ids, alone) - _next_logits(tiny, ids, caches[rid])).max().item() < F32_TINY_LOGIT
