"""Decisions on models whose cache cannot be trimmed back to a shared prefix (Qwen3.5-style recurrent
linear-attention layers, Gemma-3-style sliding windows): the prefix state is snapshot once and
restored for every question, with the same answers as scoring each question from scratch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlx.core as mx
import pytest
from conftest import install_folder
from precision import BF16_TINY_PROBABILITY, f32_reordered, forward_products, tol

from live_server import LiveServer, start_server
from swama.engine.decisions.decide import DecisionJob, DecisionRun
from swama.engine.decisions.scorer import decision_choice_view, decision_score_view, predicate_view
from swama.engine.text.language import load_language_model
from tools.testmodels.tiny import build_tiny_model

HYBRID = "test/tiny-qwen3_5"
INPUT = "My invoice from March charged me twice for the same plan. " * 12
# A restored snapshot and a fresh prefill round the tiny models' logits apart. float32: another
# summation order (tests/precision.py) through these 4-layer models (F32_TINY_PROBABILITY counts 2),
# logits under 16, a probability moving by half a logit's bound; bf16: steps of 0.0625 under 16, by up
# to four steps on a log-odds; a probability moves by at most a quarter of that.
BOUND = tol(f32_reordered(16, forward_products(4, 64, 128, 16, 512)) / 2, BF16_TINY_PROBABILITY)


def _run(model, job: DecisionJob, reuse: bool):
    run = DecisionRun(model, job, prefix_reuse=reuse)
    run.start()
    while not run.done:
        run.score_next()
    return run.result()


@pytest.mark.parametrize("arch", ["qwen3_5", "gemma3_text"])
def test_snapshot_of_the_prefix_matches_fresh_scoring(arch: str, smollm2_dir: Path, tmp_path: Path) -> None:
    """Qwen3.5-style recurrent layers, and Gemma-3-style sliding windows once the prefix is longer
    than the window."""
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    model = load_language_model(arch, build_tiny_model(smollm2_dir, tmp_path / arch, arch=arch))
    cache = make_prompt_cache(model.model)
    model.model(mx.array([list(range(40))]), cache=cache)  # past the 32-token window
    assert not can_trim_prompt_cache(cache)  # the case this path exists for
    questions = [predicate_view(f"Is point {i} about billing?") for i in range(6)] + [
        decision_choice_view("Which team?", [("billing", None), ("technical", None), ("sales", None)]),
        decision_score_view("How urgent?", [("low", None), ("medium", None), ("high", None)])]
    job = DecisionJob(INPUT, questions, context_limit=4096)
    shared, fresh = _run(model, job, True), _run(model, job, False)
    assert shared.shared_prefix_tokens > 100 and fresh.shared_prefix_tokens == 0
    assert shared.input_tokens == fresh.input_tokens
    for a, b in zip(shared.answers, fresh.answers, strict=True):
        assert max(abs(x - y) for x, y in zip(a.probabilities, b.probabilities, strict=True)) < BOUND
    again = _run(model, job, True)  # restoring never changes the snapshot: repeats are exact
    assert [a.probabilities for a in again.answers] == [a.probabilities for a in shared.answers]


@pytest.fixture(scope="module")
def hybrid_servers(tiny_hybrid_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, LiveServer]]:
    root = tmp_path_factory.mktemp("hybrid-store")
    install_folder(root, HYBRID, tiny_hybrid_dir)
    shared = start_server(root, root.parent / "hybrid-shared.log")
    fresh = start_server(root, root.parent / "hybrid-fresh.log", "--no-decision-prefix-cache")
    yield shared, fresh
    shared.stop()
    fresh.stop()


DECISION = {"model": HYBRID, "input": INPUT, "questions": [
    {"type": "predicate", "name": "billing", "instructions": "Is this a billing issue?"},
    {"type": "choice", "name": "team", "instructions": "Which team?",
     "choices": [{"value": "billing"}, {"value": "technical"}, {"value": "sales"}]},
    {"type": "score", "name": "urgency", "instructions": "How urgent?",
     "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high"}]}]}
SYSTEMONE = {"model": HYBRID, "state": {"message": INPUT}, "questions": {
    "billing": {"type": "noul", "instructions": "Is this a billing issue?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "technical": None}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "medium", "high"]}}}


def _probabilities(body: dict) -> list[float]:
    answers = body["answers"]
    found = []
    for answer in answers.values() if isinstance(answers, dict) else answers:
        if "probability" in answer:
            found.append(answer["probability"])
        elif "noul" in answer:
            found.append(answer["noul"])
        else:
            probs = answer["probabilities"]
            found += list(probs.values()) if isinstance(probs, dict) else [p["probability"] for p in probs]
    return found


@pytest.mark.parametrize(("path", "body"), [("/decisions", DECISION), ("/systemone", SYSTEMONE)])
def test_both_decision_routes_agree_with_and_without_the_shared_prefix(
        hybrid_servers: tuple[LiveServer, LiveServer], path: str, body: dict) -> None:
    shared, fresh = hybrid_servers
    replies = [httpx.post(server.v1 + path, json=body, timeout=120) for server in (shared, fresh)]
    for reply in replies:
        assert reply.status_code == 200, reply.text
    a, b = (_probabilities(r.json()) for r in replies)
    assert len(a) == len(b) > 3
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < BOUND
    assert replies[0].json()["usage"]["input_tokens"] == replies[1].json()["usage"]["input_tokens"]
    repeat = httpx.post(shared.v1 + path, json=body, timeout=120)
    assert json.loads(repeat.content)["answers"] == replies[0].json()["answers"]


def test_a_short_prefix_on_a_sliding_window_is_not_trimmed_back(smollm2_dir: Path, tmp_path: Path) -> None:
    """A prefix shorter than the window looks trimmable, but a suffix that wraps past the window
    overwrites it: such caches take the snapshot path too, and answers equal fresh scoring."""
    folder = build_tiny_model(smollm2_dir, tmp_path / "g", arch="gemma3_text")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 48}))  # past the chat header
    model = load_language_model("gemma3_text", folder)
    questions = [predicate_view(f"Is point {i} about billing, given everything said above?") for i in range(4)]
    job = DecisionJob("Short.", questions, context_limit=4096)
    shared, fresh = _run(model, job, True), _run(model, job, False)
    assert 0 < shared.shared_prefix_tokens < 48 < shared.input_tokens // len(questions)  # the suffix wraps
    for a, b in zip(shared.answers, fresh.answers, strict=True):
        assert max(abs(x - y) for x, y in zip(a.probabilities, b.probabilities, strict=True)) < BOUND
