"""Batched suffix scoring (DecisionRun.score_batch): the questions' suffixes run in one forward pass
that attends the shared prefix in place (or, where a model cannot, a tiled copy of it), with the
same answers as scoring them one by one."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from precision import BF16_PROBABILITY, BF16_TINY_PROBABILITY, tol

from swama.engine.decisions import decide
from swama.engine.decisions.decide import DecisionJob, DecisionRun, batch_chunks, kv_bytes_per_token
from swama.engine.decisions.scorer import (
    ScoredAnswer,
    decision_choice_view,
    decision_score_view,
    predicate_view,
)
from swama.engine.model import LoadedModel
from swama.engine.serving.scheduler import Scheduler
from swama.engine.text.language import load_language_model
from tools.testmodels.tiny import build_tiny_model

pytestmark = pytest.mark.slow

INPUT = "\n".join(f"Message {i}: the invoice for order {1000 + i} was charged twice; the customer wants a refund "
                  f"to the original card before the end of the month." for i in range(12))
# How far a batched answer's probabilities may be from one pass per question. bf16: the batch rounds
# its logits apart from the single passes, by up to four steps on a log-odds (SmolLM2's logits in
# steps of 0.125, the tiny model's of 0.0625), which moves a probability by up to a quarter of that.
BOUND = tol(1e-4, BF16_TINY_PROBABILITY)
BOUNDS = {"tiny": BOUND, "smollm2": tol(1e-4, BF16_PROBABILITY)}


def mixed_questions() -> list:
    """20 questions of the three kinds whose suffixes differ in length."""
    found = []
    for i in range(20):
        detail = " and, given everything said above," * (i % 4)
        if i % 3 == 0:
            found.append(predicate_view(f"Is point {i}{detail} about billing?"))
        elif i % 3 == 1:
            found.append(decision_choice_view(f"Which team{detail} should take point {i}?",
                                              [("billing", None), ("technical", "bugs and outages"), ("sales", None)]))
        else:
            found.append(decision_score_view(f"How urgent{detail} is point {i}?",
                                             [("low", None), ("medium", None), ("high", "needs action today")]))
    return found


JOB = DecisionJob(INPUT, mixed_questions(), context_limit=4096)


class Spy:
    """Counts the batched passes of a run and their row counts."""

    def __init__(self, run: DecisionRun) -> None:
        self.rows: list[int] = []
        inner = run._batch_logits

        def counted(chunk):
            self.rows.append(len(chunk))
            return inner(chunk)

        run._batch_logits = counted  # type: ignore[method-assign]


def one_by_one(run: DecisionRun) -> list[ScoredAnswer]:
    while not run.done:
        run.score_next()
    return run.answers


def started(model: LoadedModel, job: DecisionJob = JOB, reuse: bool = True) -> DecisionRun:
    run = DecisionRun(model, job, prefix_reuse=reuse)
    run.start()
    return run


def assert_close(a: list[ScoredAnswer], b: list[ScoredAnswer], bound: float = BOUND) -> None:
    assert len(a) == len(b) == len(JOB.questions)
    for x, y in zip(a, b, strict=True):
        assert x.kind == y.kind and len(x.probabilities) == len(y.probabilities)
        assert max(abs(p - q) for p, q in zip(x.probabilities, y.probabilities, strict=True)) < bound


def rescored(run: DecisionRun) -> list[ScoredAnswer]:
    """The run's questions scored again from the same prefix (the batched pass left it as it was)."""
    run.answers = []
    return one_by_one(run)


@pytest.fixture(scope="module")
def tiny(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_language_model("tiny", build_tiny_model(smollm2_dir, tmp_path_factory.mktemp("tiny") / "qwen3"))


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> LoadedModel:
    return load_language_model("smollm2", smollm2_dir)


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_batched_answers_equal_one_pass_per_question(name: str, request: pytest.FixtureRequest) -> None:
    model = request.getfixturevalue(name)
    run = started(model)
    assert run.batches and run.prefix > 100
    lengths = {len(q.ids) - run.prefix for q in run.prepared}
    assert len(lengths) > 3  # suffixes of different lengths: the padding is exercised
    spy = Spy(run)
    batched = run.score_batch()
    assert spy.rows == [20] and run.done and batched == run.answers
    assert_close(batched, rescored(run), BOUNDS[name])
    # Forced small chunks, on the same prefix: several passes, the same answers.
    run.answers = []
    run.batch_logits_bytes = 4 * max(lengths) * run.position_bytes
    spy.rows = []
    chunked = run.score_batch()
    assert len(spy.rows) >= 5 and max(spy.rows) <= 4 and sum(spy.rows) == 20
    assert_close(chunked, batched, BOUNDS[name])


def test_batched_answers_equal_a_fresh_cache_per_question(tiny: LoadedModel) -> None:
    """Against scoring every question alone from scratch (prefix_reuse=False), not only against the
    shared-prefix path."""
    batched = started(tiny).score_batch()
    assert_close(batched, one_by_one(started(tiny, reuse=False)))


def test_max_rows_takes_the_questions_in_order(tiny: LoadedModel) -> None:
    whole = started(tiny).score_batch()
    run = started(tiny)
    spy = Spy(run)
    first = run.score_batch(max_rows=7)
    single = run.score_next()
    rest = run.score_batch(max_rows=100)
    assert spy.rows == [7, 12] and len(first) == 7 and run.done and run.score_batch() == []
    assert run.answers == [*first, single, *rest]
    assert_close(run.answers, whole)


def test_the_cache_copy_bound_splits_the_batch(tiny: LoadedModel) -> None:
    run = started(tiny)
    widest = max(len(q.ids) for q in run.prepared)  # prefix plus the longest suffix
    run.batch_cache_bytes = 3 * widest * kv_bytes_per_token(run.shared)
    spy = Spy(run)
    answers = run.score_batch()
    assert max(spy.rows) <= 3 and len(spy.rows) >= 7
    assert_close(answers, rescored(run))


def test_without_a_shared_prefix_whole_prompts_are_batched(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """No common prefix (prefix 0) with prefix reuse on: the whole prompts, right-padded, in batched
    passes (a tight output bound takes a few rows at a time)."""
    monkeypatch.setattr(decide, "common_prefix", lambda sequences: 0)
    run = started(tiny)
    assert run.prefix == 0 and run.shared is None and run.batches
    widest = max(len(q.ids) for q in run.prepared)
    run.batch_logits_bytes = 5 * widest * run.position_bytes
    per_chunk = run.batch_logits_bytes // (widest * run.position_bytes)
    assert 1 < per_chunk < 20  # the bound splits this batch, and still batches
    spy = Spy(run)
    batched = run.score_batch()
    assert sum(spy.rows) == 20 and 1 < max(spy.rows) <= per_chunk + 1 and len(spy.rows) < 20
    assert_close(batched, one_by_one(started(tiny, reuse=False)))


def test_prefix_reuse_off_stays_one_fresh_pass_per_question(tiny: LoadedModel) -> None:
    run = started(tiny, reuse=False)
    assert not run.batches
    spy = Spy(run)
    answers = run.score_batch()
    assert spy.rows == []
    assert [a.probabilities for a in answers] == [a.probabilities for a in one_by_one(started(tiny, reuse=False))]


def test_a_hybrid_model_falls_back_to_one_question_at_a_time(smollm2_dir: Path, tmp_path: Path) -> None:
    """Qwen3.5-style recurrent layers: the prefix is a snapshot, not a trimmable KV cache, so
    score_batch scores each question with score_next, exactly."""
    model = load_language_model("hybrid", build_tiny_model(smollm2_dir, tmp_path / "qwen3_5", arch="qwen3_5"))
    run = started(model)
    assert run.prefix > 100 and run._snapshot is not None and not run.batches
    spy = Spy(run)
    answers = run.score_batch()
    assert spy.rows == []
    assert [a.probabilities for a in answers] == [a.probabilities for a in one_by_one(started(model))]
    assert_close(answers, one_by_one(started(model, reuse=False)))


def test_batch_chunks() -> None:
    vocab = 10
    assert batch_chunks([], vocab, 0, 0, 1, 1) == []
    assert batch_chunks([3, 5, 2], vocab, 0, 0, 10**9, 10**9) == [range(0, 3)]
    # logits: rows x widest x 10 x 4 bytes within 400 -> rows x widest <= 10
    assert batch_chunks([3, 5, 2, 1, 1], vocab, 0, 0, 400, 10**9) == [range(0, 2), range(2, 5)]
    # a row over every bound still goes, alone
    assert batch_chunks([50, 50], vocab, 0, 0, 1, 1) == [range(0, 1), range(1, 2)]
    # cache copy: rows x (prefix + widest) x 2 bytes within 100 -> rows x (20 + widest) <= 50
    assert batch_chunks([4, 4, 5, 1], vocab, 20, 2, 10**9, 100) == [range(0, 2), range(2, 4)]


OTHER_INPUT = "Customer: the app crashes when I open settings; it started after the last update."


def three_jobs() -> list[DecisionJob]:
    """Three requests with different inputs (prefixes of different lengths), 14 questions in all."""
    questions = mixed_questions()
    return [DecisionJob(INPUT, questions[:5], 4096), DecisionJob(OTHER_INPUT, questions[5:9], 4096),
            DecisionJob(INPUT[:300], questions[9:14], 4096)]


def scored_together(model: LoadedModel, jobs: list[DecisionJob],
                    setup: Callable[[Scheduler], None] = lambda _: None) -> tuple[list[DecisionRun], int]:
    """The jobs' runs started, then scored through one scheduler (after `setup(scheduler)`) while
    the model is held busy until all of them wait; the runs and the scheduler's pass count."""

    async def together() -> tuple[list[DecisionRun], int]:
        scheduler = Scheduler(model, prompt_cache=None)
        setup(scheduler)
        try:
            runs = [DecisionRun(model, job) for job in jobs]
            for run in runs:
                await scheduler.run(run.start)
            assert all(run.joins_others for run in runs)
            gate = threading.Event()
            held = scheduler.call(gate.wait)  # the model is busy while all the requests arrive
            scoring = [asyncio.ensure_future(scheduler.score(run)) for run in runs]
            await asyncio.sleep(0.1)
            gate.set()
            await asyncio.wrap_future(held)
            await asyncio.gather(*scoring)
            return runs, scheduler.decision_passes
        finally:
            scheduler.close()

    return asyncio.run(together())


def assert_as_alone(runs: list[DecisionRun], alone: list[list[ScoredAnswer]], bound: float) -> None:
    for run, reference in zip(runs, alone, strict=True):
        assert len(run.answers) == len(reference)
        for x, y in zip(run.answers, reference, strict=True):
            assert max(abs(p - q) for p, q in zip(x.probabilities, y.probabilities, strict=True)) < bound


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_questions_of_concurrent_requests_share_one_pass(name: str, request: pytest.FixtureRequest) -> None:
    """Three requests waiting on one model are scored in one batched pass, with the answers each gets
    alone."""
    model = request.getfixturevalue(name)
    jobs = three_jobs()
    alone = [one_by_one(started(model, job)) for job in jobs]
    runs, passes = scored_together(model, jobs)
    assert passes == 1  # 14 questions of three requests, one pass
    assert len({run.prefix for run in runs}) == 3  # three different prefixes shared one batch
    assert_as_alone(runs, alone, BOUNDS[name])


def test_merged_prefixes_lay_out_what_mlx_lm_merges(tiny: LoadedModel) -> None:
    """A pass's prefix cache, built with one repeat per run, equals mlx-lm's row-by-row merge; and the
    rows of a pass come grouped by run, each run's questions in order."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    questions = mixed_questions()
    runs = [started(tiny, DecisionJob(text, questions[i:i + 4], 4096))
            for i, text in enumerate([INPUT, OTHER_INPUT, INPUT[:300]])]
    rows = decide.pick_rows(runs, 9)
    assert [runs.index(run) for run, _ in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for run in runs:
        assert [q for r, q in rows if r is run] == run.pending()[:3]
    order = [run for run, _ in rows]
    ours = decide.merged_prefixes(order)
    for i, layer in enumerate(ours):
        theirs = BatchKVCache.merge([run.shared[i] for run in order])
        assert mx.array_equal(layer.keys, theirs.keys) and mx.array_equal(layer.values, theirs.values)
        assert layer.left_padding.tolist() == theirs.left_padding.tolist()
        assert layer.offset.tolist() == theirs.offset.tolist() and layer._idx == theirs._idx


def test_passes_overlap_and_answer_as_alone(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """With three rows a pass, 14 questions of three requests take five passes, each launched before
    the one before it is finished; every request gets the answers it gets alone."""
    import swama.engine.serving.scheduler as scheduling

    jobs = three_jobs()
    alone = [one_by_one(started(tiny, job)) for job in jobs]
    order: list[str] = []
    launch = scheduling.launch_across

    def launched(rows):
        order.append("launch")
        return launch(rows)

    monkeypatch.setattr(scheduling, "launch_across", launched)

    def setup(scheduler: Scheduler) -> None:
        scheduler.decision_rows = 3
        finish = scheduler._finish_pass

        def finished(*args):
            order.append("finish")
            return finish(*args)

        scheduler._finish_pass = finished  # type: ignore[method-assign]

    runs, passes = scored_together(tiny, jobs, setup)
    assert passes == 5
    assert order == ["launch", "launch", "finish", "launch", "finish", "launch", "finish", "launch", "finish",
                     "finish"]
    assert_as_alone(runs, alone, BOUND)


# -- the shared prefix attended in place (engine/decisions/shared_prefix.py) --------------------------

# Logits of the in-place pass against the same pass over copies of the prefix: float32 rounding (the
# sums run in another order); bf16: the in-place pass computes in float32 where MLX's attention
# rounds its inputs, a few steps of the logits' spacing.
IN_PLACE = tol(1e-4, 0.25)


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_in_place_passes_equal_passes_over_copies_of_the_prefix(name: str, request: pytest.FixtureRequest) -> None:
    """One request's pass, and one pass across three requests whose prefixes differ in length (each
    run's rows a segment with its own prefix and RoPE offset), give the logits of the passes that copy
    every row's prefix."""
    import mlx.core as mx

    model = request.getfixturevalue(name)
    state = decide.decision_state(model)
    default, state.in_place = state.in_place, True  # the default on the CPU; a GPU's is copies
    run = started(model)
    chunk = run.prepared[:9]
    in_place = run._batch_logits(chunk)
    assert state.in_place  # the model's attention went through the shared-prefix path
    state.in_place = False
    try:
        copied = run._batch_logits(chunk)
    finally:
        state.in_place = True
    assert mx.abs(in_place - copied).max().item() <= IN_PLACE

    questions = mixed_questions()
    runs = [started(model, DecisionJob(text, questions[i:i + 4], 4096))
            for i, text in enumerate([INPUT, OTHER_INPUT, INPUT[:300]])]
    assert len({r.prefix for r in runs}) == 3
    rows = decide.pick_rows(runs, 9)
    together = [decide.launch_across(rows)]
    for r in runs:
        r.launched = 0
    state.in_place = False
    try:
        together.append(decide.launch_across(rows))
    finally:
        state.in_place = default
    got, want = ([row.labels for row in pending.rows()] for pending in together)
    for a, b in zip(got, want, strict=True):  # each row's label logits
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) <= IN_PLACE


def test_a_model_whose_attention_bypasses_its_module_falls_back_to_copies(
        tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a pass shows the model's attention did not go through the shared-prefix path (it calls
    MLX's attention itself), the model's passes copy the prefix from then on, with the same answers."""
    import sys

    from mlx_lm.models.base import scaled_dot_product_attention

    alone = one_by_one(started(tiny))
    monkeypatch.setattr(sys.modules[type(tiny.model).__module__], "scaled_dot_product_attention",
                        scaled_dot_product_attention)
    state = decide.decision_state(tiny)
    default, state.in_place = state.in_place, True
    run = started(tiny)
    try:
        while not run.done:
            run.score_batch()
        assert not state.in_place
        assert_close(run.answers, alone)
    finally:
        state.in_place = default
