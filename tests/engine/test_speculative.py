"""Speculative decoding in the batch scheduler (engine/speculative/).

Greedy rows that draft give the tokens plain decoding gives (where the two part, the step was a
float32 near-tie of another pass shape); sampled rows keep the model's distribution; budgets, stop
sequences, penalties, prompt-cache hand-back and cancellation act as without drafting; rows whose
processors must see every token once (log probabilities, a grammar), seeded rows, and models whose
caches cannot be cut back per row never draft.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from precision import F32_LOGIT, F32_TINY_LOGIT, parting, top_two_gap
from scheduled import alone, collect

from swama.engine.model import LoadedModel
from swama.engine.serving.scheduler import Scheduler
from swama.engine.speculative.ngram import PromptLookup
from swama.engine.speculative.policy import Speculation
from swama.engine.speculative.verify import verify_sampled
from swama.engine.text.generator import ChatRequest, Finished, Sampling, TextDelta, prepare
from swama.engine.text.grammar import Constraint
from swama.engine.text.language import load_language_model
from swama.engine.text.prompt_cache import PromptCache
from swama.engine.text.sampler import Sampler
from tools.testmodels.tiny import build_tiny_model

pytestmark = pytest.mark.slow

NGRAM = Speculation("ngram", 8)
OFF = Speculation("off")
CODE = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * 3}\n" for i in range(12))
ECHO = f"Here is a file:\n```python\n{CODE}```\nReturn the whole file unchanged, in a code block."
PROMPTS = [ECHO, "Tell me a short story about a cat who learns to swim.", "List three prime numbers."]
# float32: a top-two logit gap where another pass shape's rounding may pick either: two logits, each
# off by its bound (tests/precision.py), may swap where they are within twice it.
NEAR_TIE = {"tiny": 2 * F32_TINY_LOGIT, "smollm2": 2 * F32_LOGIT}


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def model(request: pytest.FixtureRequest, tiny_model_dir: Path, smollm2_dir: Path) -> LoadedModel:
    folder = tiny_model_dir if request.param == "tiny" else smollm2_dir
    return load_language_model(request.param, folder)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> LoadedModel:
    return load_language_model("smollm2", smollm2_dir)


def _request(prompt: str, max_tokens: int = 96, **sampling: Any) -> ChatRequest:
    return ChatRequest([{"role": "user", "content": prompt}], sampling=Sampling(**{"temperature": 0, **sampling}),
                       max_tokens=max_tokens, context_limit=4096)


def _next_turn(request: ChatRequest, answer: str, max_tokens: int) -> ChatRequest:
    """The conversation's next turn after `answer`: an edit of the file it copied."""
    return ChatRequest([*request.messages, {"role": "assistant", "content": answer},
                        {"role": "user", "content": "Now add a docstring to f2."}],
                       sampling=Sampling(temperature=0), max_tokens=max_tokens, context_limit=4096)


def _scheduled(model: LoadedModel, requests: list[ChatRequest], speculation: Speculation = NGRAM, rows: int = 8,
               prompt_cache: PromptCache | None = None,
               draft: LoadedModel | None = None) -> tuple[list[tuple[str, Finished]], Any]:
    async def run() -> tuple[list[tuple[str, Finished]], Any]:
        scheduler = Scheduler(model, prompt_cache=prompt_cache, rows=rows, prefill_step=256, speculation=speculation,
                              draft=draft)
        try:
            results = await asyncio.gather(*(collect(scheduler, r) for r in requests))
            return results, getattr(scheduler._gen, "counters", None)
        finally:
            scheduler.close()

    return asyncio.run(run())


def _assert_same(model: LoadedModel, request: ChatRequest, plain: Finished, drafted: Finished) -> None:
    parted = parting(plain.token_ids, drafted.token_ids)
    if parted is None:
        assert drafted.finish_reason == plain.finish_reason
        return
    gap = top_two_gap(model, prepare(model, request).ids + list(plain.token_ids[:parted]))
    assert gap < NEAR_TIE[model.id], f"drafted and plain decoding part at token {parted} without a near-tie (gap {gap})"


def test_prompt_lookup_drafts_what_followed_the_latest_match() -> None:
    lookup = PromptLookup()
    lookup.add([1, 2, 3, 4, 5, 9, 2, 3, 7, 8])
    assert lookup.draft(2, 3) == []  # (8, 2) never occurred, and one token is too short a match
    lookup.add([2])
    assert lookup.draft(3, 3) == [7, 8, 2]  # (2, 3) last ended at position 8: 7, 8, then the 2 just added
    assert lookup.draft(3, 1) == [7]
    assert lookup.draft(6, 3) == []  # (2, 6) never occurred
    assert lookup.draft(3, 0) == []


def test_greedy_rows_that_draft_give_the_tokens_of_plain_decoding(model: LoadedModel) -> None:
    requests = [_request(p, max_tokens=64) for p in PROMPTS]
    plain = [alone(model, r) for r in requests]
    together, counters = _scheduled(model, requests)
    one_by_one = [_scheduled(model, [r], rows=1)[0][0] for r in requests]
    for request, single, (_, batched), (_, by_itself) in zip(requests, plain, together, one_by_one, strict=True):
        _assert_same(model, request, single, batched)
        _assert_same(model, request, single, by_itself)
    if model.id == "smollm2":  # the real model copies the file: most drafts hold (the random one copies nothing)
        assert counters.drafted > 0 and counters.steps > 0
        assert together[0][1].draft_tokens > together[0][1].completion_tokens // 2


def test_a_draft_model_drafts_for_every_row_and_greedy_output_stays_plain(smollm2: LoadedModel,
                                                                           smollm2_dir: Path,
                                                                           tiny_model_dir: Path) -> None:
    """A draft model of the same tokenizer proposes for rows joining and leaving a batch of two: with
    SmolLM2 drafting for itself nearly every draft holds, with the tiny random model few do; either
    way the tokens are plain decoding's."""
    requests = [_request(p, max_tokens=n) for p, n in zip(PROMPTS * 2, [40, 24, 8, 16, 30, 12], strict=True)]
    plain = [alone(smollm2, r) for r in requests]
    itself = load_language_model("smollm2-draft", smollm2_dir)
    tiny = load_language_model("tiny", tiny_model_dir)
    # Drafting for itself, greedy: a draft fails only at a near-tie between the two passes' shapes.
    for draft, least in ((itself, 0.8), (tiny, 0.0)):
        results, counters = _scheduled(smollm2, requests, Speculation("draft", 4), rows=2, draft=draft)
        for request, single, (_, drafted) in zip(requests, plain, results, strict=True):
            _assert_same(smollm2, request, single, drafted)
        assert counters.drafted > 50 and counters.accepted >= least * counters.drafted


def test_budgets_and_stop_sequences_cut_a_drafted_run_where_plain_decoding_would(smollm2: LoadedModel) -> None:
    plain_text, plain = _scheduled(smollm2, [_request(ECHO)], OFF)[0][0]
    for n in (1, 2, 7, 29):
        (text, short), = _scheduled(smollm2, [_request(ECHO, max_tokens=n)])[0]
        assert short.finish_reason == "length" and short.token_ids == plain.token_ids[:n]
    stop = "f3"
    assert stop in plain_text
    request = _request(ECHO)
    request.stop = [stop]
    (text, stopped), = _scheduled(smollm2, [request])[0]
    (off_text, off), = _scheduled(smollm2, [request], OFF)[0]
    assert (text, stopped.finish_reason) == (off_text, off.finish_reason) == (plain_text.split(stop)[0], "stop")
    assert stopped.draft_tokens > 0


def test_penalties_apply_at_every_drafted_position(smollm2: LoadedModel) -> None:
    request = _request(ECHO, max_tokens=64, repetition_penalty=1.15, presence_penalty=0.3)
    plain = alone(smollm2, request)
    (_, drafted), = _scheduled(smollm2, [request])[0]
    _assert_same(smollm2, request, plain, drafted)
    assert drafted.draft_tokens > 0  # penalties change the text, yet drafts still hold


def test_rows_that_must_see_every_token_or_are_seeded_never_draft(smollm2: LoadedModel) -> None:
    logprobs = _request(ECHO, max_tokens=48)
    logprobs.logprobs = 2
    grammar = _request(ECHO, max_tokens=48)
    grammar.constraint = Constraint("json_object")
    seeded = _request(ECHO, max_tokens=48, temperature=0.7, seed=7)
    free = _request(ECHO, max_tokens=48)
    results, _ = _scheduled(smollm2, [logprobs, grammar, seeded, free])
    assert [f.draft_tokens for _, f in results[:3]] == [0, 0, 0]
    assert results[3][1].draft_tokens > 0
    assert results[0][1].token_ids == results[3][1].token_ids  # greedy either way
    (_, seeded_off), = _scheduled(smollm2, [seeded], OFF)[0]
    assert results[2][1].token_ids == seeded_off.token_ids  # the seed alone fixes a seeded row's tokens


def test_a_drafted_row_hands_the_prompt_cache_exactly_its_tokens(smollm2: LoadedModel) -> None:
    """The cache a finished row leaves holds its prompt and output, no rejected draft: the next turn
    of the conversation resumes from it and decodes as it does from a fresh prefill."""
    cache = PromptCache(1 << 30)
    first = _request(ECHO, max_tokens=80)
    (answer, done), = _scheduled(smollm2, [first], prompt_cache=cache)[0]
    assert done.draft_tokens > 0
    follow = _next_turn(first, answer, max_tokens=40)
    (_, resumed), = _scheduled(smollm2, [follow], prompt_cache=cache)[0]
    assert resumed.cached_tokens > len(prepare(smollm2, first).ids)
    _assert_same(smollm2, follow, alone(smollm2, follow), resumed)


def test_a_cancelled_drafting_row_leaves_the_others_exact(smollm2: LoadedModel) -> None:
    requests = [_request(ECHO, max_tokens=120), _request(PROMPTS[2], max_tokens=40)]
    plain = alone(smollm2, requests[1])

    async def run() -> Finished:
        scheduler = Scheduler(smollm2, prompt_cache=PromptCache(1 << 30), rows=4, prefill_step=256,
                              speculation=NGRAM)
        try:
            async def cancel_early() -> None:
                n = 0
                async for event in scheduler.generate(requests[0]):
                    n += isinstance(event, TextDelta)
                    if n >= 5:
                        break  # the client goes away mid-run

            _, (_, other) = await asyncio.gather(cancel_early(), collect(scheduler, requests[1]))
            return other
        finally:
            scheduler.close()

    _assert_same(smollm2, requests[1], plain, asyncio.run(run()))


def test_sliding_window_layers_draft_and_keep_plain_decoding(smollm2_dir: Path, tmp_path: Path) -> None:
    """Gemma 3's text stack (a 32-token window on every other layer), drafting for itself (a random
    model copies nothing from its prompt, so the draft model drafts): prompts of about 230 tokens, so
    the windows have rotated before the first draft, and 300 tokens of output, so the slots no query
    can see any more are dropped while the rows draft and verify."""
    folder = build_tiny_model(smollm2_dir, tmp_path / "g", arch="gemma3_text")
    model, itself = load_language_model("gemma3", folder), load_language_model("gemma3-draft", folder)
    requests = [ChatRequest([{"role": "user", "content": f"Count the {topic}. " * 40}], sampling=Sampling(temperature=0),
                            max_tokens=n, context_limit=4096) for topic, n in (("rivers", 300), ("bridges", 24))]
    plain = [alone(model, r) for r in requests]
    results, counters = _scheduled(model, requests, Speculation("draft", 4), draft=itself)
    for single, (_, drafted) in zip(plain, results, strict=True):
        assert parting(single.token_ids, drafted.token_ids) is None
    # Drafting for itself, greedy: a draft fails only at a near-tie between the two passes' shapes; 324
    # tokens in drafts of 4 make far more than 40 drafted.
    assert counters.accepted > 0.8 * counters.drafted > 40


def test_models_whose_caches_cannot_be_cut_back_per_row_decode_plainly(tiny_hybrid_dir: Path) -> None:
    model = load_language_model("tiny-hybrid", tiny_hybrid_dir)
    requests = [_request(p, max_tokens=24) for p in PROMPTS]
    drafted, counters = _scheduled(model, requests)
    plain, _ = _scheduled(model, requests, OFF)
    assert counters.steps == 0 and counters.drafted == 0
    assert [f.token_ids for _, f in drafted] == [f.token_ids for _, f in plain]


# -- sampling keeps the model's distribution ---------------------------------------------------------


def _tv(a: Counter[int], b: Counter[int], rare: int = 0) -> float:
    """Total variation distance of two samples' frequencies; outcomes seen fewer than `rare` times in
    both together count as one outcome (many rare ones inflate the distance of finite samples)."""
    common = {k for k in set(a) | set(b) if a[k] + b[k] >= rare}

    def lumped(c: Counter[int]) -> Counter[int]:
        out: Counter[int] = Counter()
        for k, v in c.items():
            out[k if k in common else -1] += v
        return out

    a, b = lumped(a), lumped(b)
    n, m = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / n - b[k] / m) for k in set(a) | set(b))


def test_the_verification_rule_emits_tokens_as_plain_draws_do() -> None:
    """Against a fixed distribution, a draft of its most likely token, of a likely one, and of a token
    outside top-k: the first emitted token (accepted draft, or the residual draw) follows p."""
    mx.random.seed(0)
    logits = mx.array([[2.0, 1.5, 1.0, 0.2, -1.0, -3.0]] * 2)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    sampler = Sampler(0.8, 0.0, 0.0, 4)
    p = sampler.probabilities(logprobs[0]).tolist()
    draws = 6000
    for draft in (0, 2, 5):
        seen: Counter[int] = Counter()
        for _ in range(draws):
            accepted, token = verify_sampled(sampler, logprobs, [draft])
            seen[draft if accepted.item() else int(token.item())] += 1
        expected = Counter({i: round(q * draws) for i, q in enumerate(p)})
        # 6,000 draws from p: their distance to it averages 0.008 (sd 0.004, simulated); 0.025 lies
        # past its 99.9th percentile.
        assert _tv(seen, expected) < 0.025, (draft, seen, p)
        assert seen[4] == seen[5] == 0  # top-k keeps the filtered-out tokens out


def test_sampled_rows_that_draft_keep_the_distribution_of_plain_sampling(tiny_model_dir: Path) -> None:
    """The tiny model, a prompt that holds its own likely continuation twice (so prompt lookup drafts
    from it), temperature 0.8 and top-k 4: over 384 unseeded runs of 6 tokens each with drafting and
    without, every position's token frequencies agree within a total variation distance of 0.12
    (outcomes seen under 20 times lumped together; two samples of 384 from one such distribution
    differ by about 0.05 on average)."""
    model = load_language_model("tiny", tiny_model_dir)
    seed_prompt = prepare(model, _request("Count the rivers.")).ids
    greedy = alone(model, ChatRequest([], prompt=seed_prompt, sampling=Sampling(temperature=0), max_tokens=12,
                                       context_limit=4096)).token_ids
    prompt = seed_prompt + list(greedy) + seed_prompt + list(greedy[:2])
    rows = 16

    def sample(speculation: Speculation) -> tuple[list[Counter[int]], int]:
        positions: list[Counter[int]] = [Counter() for _ in range(6)]
        drafted = 0
        mx.random.seed(1)
        for _ in range(384 // rows):
            requests = [ChatRequest([], prompt=prompt, sampling=Sampling(temperature=0.8, top_k=4, top_p=1.0),
                                    max_tokens=6, context_limit=4096) for _ in range(rows)]
            results, counters = _scheduled(model, requests, speculation, rows=rows)
            drafted += counters.accepted if counters is not None else 0
            for _, f in results:
                for i, t in enumerate(f.token_ids):
                    positions[i][t] += 1
        return positions, drafted

    with_drafts, accepted = sample(NGRAM)
    without, _ = sample(OFF)
    assert accepted > 100  # drafting really ran
    for i in range(6):
        assert _tv(with_drafts[i], without[i], rare=20) < 0.12, (i, with_drafts[i], without[i])


def test_quantized_caches_draft_and_roll_back_as_plain_decoding_does(smollm2: LoadedModel) -> None:
    """--kv-bits 8: the row caches a drafting batch keeps are quantized too (a verification writes its
    positions quantized and cuts rejected ones back per row); the file copy decodes to the tokens of
    quantized decoding one token a step, and the cache the row leaves resumes the next turn."""
    from swama.engine.text.kv_policy import KVQuant, use_kv_quant

    use_kv_quant(smollm2, KVQuant(8))
    try:
        request = _request(ECHO, max_tokens=80)
        (_, plain), = _scheduled(smollm2, [request], OFF)[0]
        cache = PromptCache(1 << 30)
        results, counters = _scheduled(smollm2, [request, _request(PROMPTS[2], max_tokens=30)], prompt_cache=cache)
        (answer, drafted), _ = results
        assert drafted.token_ids == plain.token_ids and drafted.draft_tokens > drafted.completion_tokens // 2
        assert counters.accepted > 0
        follow = _next_turn(request, answer, max_tokens=8)
        (_, resumed), = _scheduled(smollm2, [follow], prompt_cache=cache)[0]
        assert resumed.cached_tokens > len(prepare(smollm2, request).ids)
        assert all(hasattr(c, "bits") for entry in cache._entries.values() for c in entry.cache)
    finally:
        use_kv_quant(smollm2, None)
