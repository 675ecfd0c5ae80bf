"""Batched suffix scoring (DecisionRun.score_batch): the questions' suffixes run in one forward pass
that attends the shared prefix in place (or, where a model cannot, a tiled copy of it), with the
same answers as scoring them one by one."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from precision import (
    BF16_PROBABILITY,
    BF16_TINY_PROBABILITY,
    F32_LOGIT,
    F32_PROBABILITY,
    F32_TINY_LOGIT,
    F32_TINY_PROBABILITY,
    f32_reordered,
    forward_products,
    tol,
)

from swama.engine.decisions import decide
from swama.engine.decisions.decide import DecisionJob, DecisionRun, batch_chunks, kv_bytes_per_token
from swama.engine.decisions.packed_prefill import packable, pick_pack, prefill_pack
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
# How far a batched answer's probabilities may be from one pass per question. float32: the batch sums
# in another order (tests/precision.py); bf16: the batch rounds its logits apart from the single
# passes, by up to four steps on a log-odds (SmolLM2's logits in steps of 0.125, the tiny model's of
# 0.0625), which moves a probability by up to a quarter of that.
BOUND = tol(F32_TINY_PROBABILITY, BF16_TINY_PROBABILITY)
BOUNDS = {"tiny": BOUND, "smollm2": tol(F32_PROBABILITY, BF16_PROBABILITY)}
# The tiny hybrid has 4 layers where F32_TINY_PROBABILITY counts 2.
HYBRID = tol(f32_reordered(16, forward_products(4, 64, 128, 16, 512)) / 2, BF16_TINY_PROBABILITY)


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
    assert_close(answers, one_by_one(started(model, reuse=False)), HYBRID)


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
    state = decide.decision_state(tiny)
    default, state.fused = state.fused, False  # round robin, as the CPU picks (a GPU takes whole runs)
    try:
        rows = decide.pick_rows(runs, 9)
    finally:
        state.fused = default
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
IN_PLACE = {"tiny": tol(F32_TINY_LOGIT, 0.25), "smollm2": tol(F32_LOGIT, 0.25)}


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_in_place_passes_equal_passes_over_copies_of_the_prefix(name: str, request: pytest.FixtureRequest) -> None:
    """One request's pass, and one pass across three requests whose prefixes differ in length (each
    run's rows a segment with its own prefix and RoPE offset), give the logits of the passes that copy
    every row's prefix."""
    import mlx.core as mx

    model = request.getfixturevalue(name)
    state = decide.decision_state(model)
    default, state.in_place = state.in_place, True  # the default
    run = started(model)
    chunk = run.prepared[:9]
    in_place = run._batch_logits(chunk)
    assert state.in_place  # the model's attention went through the shared-prefix path
    state.in_place = False
    try:
        copied = run._batch_logits(chunk)
    finally:
        state.in_place = True
    assert mx.abs(in_place - copied).max().item() <= IN_PLACE[name]

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
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) <= IN_PLACE[name]


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


# -- prefixes read in packs (engine/decisions/packed_prefill.py) and fused passes ---------------------

SIMILAR = [INPUT, INPUT + " Please hurry.", INPUT[:-40]]  # prefixes of nearly the same length


def prepared(model: LoadedModel, texts: list[str], per: int = 4) -> list[DecisionRun]:
    questions = mixed_questions()
    runs = [DecisionRun(model, DecisionJob(text, questions[i * per:(i + 1) * per], 4096)) for i, text in enumerate(texts)]
    for run in runs:
        run.prepare()
    return runs


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
@pytest.mark.parametrize("step", [1, 128])
def test_prefixes_read_in_a_pack_equal_prefixes_read_alone(name: str, step: int, request: pytest.FixtureRequest) -> None:
    """Each run's keys and values from one right-padded forward over three prefixes (padded to a
    multiple of `step`, as on a GPU) are those of its prefix read alone, and its cache is a view of
    its row of the pack."""
    import mlx.core as mx

    model = request.getfixturevalue(name)
    alone, packed = prepared(model, SIMILAR), prepared(model, SIMILAR)
    for run in alone:
        run.prefill()
    assert len({run.prefix for run in packed}) == 3 and all(packable(run) for run in packed)
    prefill_pack(packed, step)
    for a, b in zip(alone, packed, strict=True):
        for x, y in zip(a.shared, b.shared, strict=True):
            assert y.offset == a.prefix and y.pack[2] == packed.index(b)
            for u, v in zip(x.keys_and_values(), y.keys_and_values(), strict=True):
                assert u.shape == v.shape
                assert mx.abs(u - v).max().item() <= PACKED[name]


# The keys and values of a prefix read in a pack against alone: float32 rounding of products of
# another height, keys and values under the logits' magnitude (measured: SmolLM2's under 24, the tiny
# model's under 4) and fed by fewer products, so the logits' bounds hold; bf16, a step of the largest
# keys' spacing.
PACKED = {"tiny": tol(F32_TINY_LOGIT, 0.125), "smollm2": tol(F32_LOGIT, 0.125)}


class Prefix:
    def __init__(self, prefix: int) -> None:
        self.prefix = prefix


def test_a_pack_takes_the_oldest_run_then_prefixes_of_its_length_within_the_budget() -> None:
    runs = [Prefix(n) for n in (1000, 4000, 990, 1010, 300, 1020, 1000)]
    # The 4,000-token prefix would pad the others (and the 300 be padded past a quarter): they wait.
    assert [r.prefix for r in pick_pack(runs, 32768, 1)] == [1000, 990, 1010, 1020, 1000]
    assert [r.prefix for r in pick_pack(runs, 3100, 1)] == [1000, 990, 1010]  # 3 x 1,010 within the budget
    assert [r.prefix for r in pick_pack(runs, 32768, 128, powers=True)] == [1000, 990, 1010, 1020]
    assert [r.prefix for r in pick_pack(runs[1:], 2000, 1)] == [4000]  # the oldest goes, alone if it must
    assert [r.prefix for r in pick_pack(runs[4:], 32768, 1)] == [300]


def test_a_run_with_images_or_no_shared_prefix_is_not_packed(tiny: LoadedModel) -> None:
    [run] = prepared(tiny, [INPUT], per=1)
    assert run.prefix == 0 and not packable(run)
    [run] = prepared(tiny, [INPUT])
    assert packable(run)
    run.prefix_reuse = False
    assert not packable(run)


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_fused_passes_equal_passes_over_copies_of_the_prefix(name: str, request: pytest.FixtureRequest) -> None:
    """A GPU's pass (every segment's rows end to end in one attention call, segments padded to a
    power of two, prefixes read from their pack's buffers) gives the logits of the pass that copies
    every row's prefix: prefixes from one pack, from a pack and alone, in another order; uneven rows."""
    import mlx.core as mx

    from swama.engine.decisions import shared_prefix
    from swama.engine.decisions.heads import logits_at

    model = request.getfixturevalue(name)
    packed = prepared(model, SIMILAR, per=5)
    prefill_pack(packed, 128)
    [single] = prepared(model, [OTHER_INPUT], per=3)
    single.prefill()
    mixes = [packed, [packed[0], single, packed[2]], packed[::-1], packed[1:]]
    for runs in mixes if name == "tiny" else mixes[:2]:  # SmolLM2's CPU attention with a mask is slow
        rows = [(run, q) for run in runs for q in run.prepared[: 5 - runs.index(run)]]  # 5, 4, 3 rows
        suffixes = [q.ids[run.prefix:] for run, q in rows]
        width = max(len(s) for s in suffixes)
        tokens = mx.array([s + [0] * (width - len(s)) for s in suffixes])
        positions, columns = mx.arange(len(rows)), mx.array([len(s) - 1 for s in suffixes])
        net, split = runs[0].net, runs[0].split
        caches = shared_prefix.layer_caches([(run.shared, c) for run, c in decide.consecutive([r for r, _ in rows])],
                                            fused=True)
        fused = logits_at(net, split, tokens, caches, positions, columns)
        assert shared_prefix.attended(caches) and caches[0].layout.groups == (4 if len(runs) == 3 else 2)
        copies = decide.merged_prefixes([run for run, _ in rows])
        for layer in copies:
            layer.prepare(lengths=[len(s) for s in suffixes], right_padding=[width - len(s) for s in suffixes])
        copied = logits_at(net, split, tokens, copies, positions, columns)
        assert mx.abs(fused - copied).max().item() <= IN_PLACE[name]


def test_fused_passes_take_whole_requests(tiny: LoadedModel) -> None:
    """Where passes are fused, a pass takes requests whole, in order (the last in part, to fill its
    rows); elsewhere the questions go round robin."""
    state = decide.decision_state(tiny)
    runs = prepared(tiny, SIMILAR)
    prefill_pack(runs, 1)
    default = state.fused
    try:
        state.fused = True
        assert [runs.index(r) for r, _ in decide.pick_rows(runs, 9)] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
        assert [runs.index(r) for r, _ in decide.pick_rows(runs, 3)] == [0, 0, 0]  # the first, in part
        state.fused = False
        assert [runs.index(r) for r, _ in decide.pick_rows(runs, 9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    finally:
        state.fused = default


def decided_while_busy(model: LoadedModel, jobs: list[DecisionJob], fused: bool, rows: int | None = None,
                       stagger: float = 0.0) -> tuple[list[DecisionRun], Scheduler, list[int]]:
    """The jobs' runs prepared, then decided through one scheduler (fused passes or not; `rows` a pass)
    while the model is held busy until all of them wait, `stagger` seconds apart: the runs, the
    scheduler and the order in which the requests were answered."""
    state = decide.decision_state(model)
    answered: list[int] = []

    async def together() -> tuple[list[DecisionRun], Scheduler]:
        scheduler = Scheduler(model, prompt_cache=None)
        if rows is not None:
            scheduler.decision_rows = rows
        try:
            runs = [DecisionRun(model, job) for job in jobs]
            for run in runs:
                run.prepare()
            gate = threading.Event()
            held = scheduler.call(gate.wait)
            deciding = []
            for i, run in enumerate(runs):
                task = asyncio.ensure_future(scheduler.decide(run))
                task.add_done_callback(lambda _, i=i: answered.append(i))
                deciding.append(task)
                await asyncio.sleep(stagger)
            await asyncio.sleep(0.1)
            gate.set()
            await asyncio.wrap_future(held)
            await asyncio.gather(*deciding)
            return runs, scheduler
        finally:
            scheduler.close()

    default = state.fused
    state.fused = fused
    try:
        runs, scheduler = asyncio.run(together())
    finally:
        state.fused = default
    return runs, scheduler, answered


@pytest.mark.parametrize("fused", [False, True])
def test_requests_waiting_to_start_are_read_in_one_pack(tiny: LoadedModel, fused: bool) -> None:
    """Three requests arriving while the model is busy have their prefixes read in one forward and
    their questions scored in one pass, with the answers each gets alone."""
    jobs = [DecisionJob(text, mixed_questions()[i * 4:(i + 1) * 4], 4096) for i, text in enumerate(SIMILAR)]
    alone = [one_by_one(started(tiny, job)) for job in jobs]
    runs, scheduler, _ = decided_while_busy(tiny, jobs, fused)
    assert scheduler.decision_packs == 1 and scheduler.decision_passes == 1
    assert all(run.shared[0].pack is not None for run in runs)
    assert_as_alone(runs, alone, BOUND)


def test_live_questions_fill_a_pass_before_a_batch_job_s(tiny: LoadedModel) -> None:
    """Round robin runs over the live requests first; a batch job's questions take only what is left."""
    questions = mixed_questions()
    batch = DecisionRun(tiny, DecisionJob(INPUT, questions[:6], 4096, batch=True))
    live = DecisionRun(tiny, DecisionJob(OTHER_INPUT, questions[6:10], 4096))
    for run in (batch, live):
        run.start()
    assert [run for run, _ in decide.pick_rows([batch, live], 4)] == [live] * 4
    assert [run for run, _ in decide.pick_rows([batch, live], 6)] == [batch] * 2 + [live] * 4  # grouped by run
    assert [run for run, _ in decide.pick_rows([batch], 4)] == [batch] * 4  # alone, a batch job takes the pass


@pytest.mark.parametrize("fused", [False, True])
def test_a_live_request_is_answered_before_batch_jobs_that_waited_longer(tiny: LoadedModel, fused: bool) -> None:
    """Two batch jobs wait on a busy model, then a live request comes: its prefix is read and its
    questions scored first, each still with the answers it gets alone."""
    questions = mixed_questions()
    jobs = [DecisionJob(SIMILAR[0], questions[:8], 4096, batch=True),
            DecisionJob(SIMILAR[1], questions[8:16], 4096, batch=True),
            DecisionJob(SIMILAR[2], questions[16:20], 4096)]
    alone = [one_by_one(started(tiny, job)) for job in jobs]
    runs, _, answered = decided_while_busy(tiny, jobs, fused, rows=4, stagger=0.05)
    assert answered[0] == 2, answered  # the live request, though it came last
    assert_as_alone(runs, alone, BOUND)
