"""Decisions on real SmolLM2 weights: the official clients against a live server, and the scorer
against a direct computation of the same logits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import mlx.core as mx
import openai
import pytest
import typesafe_sdk
from precision import (
    BF16_NEAR_TIE,
    BF16_PROBABILITY,
    F32_PROBABILITY,
    F32_UNIT,
    F64_ARITHMETIC,
    ON_GPU,
    f32_reordered,
    tol,
)
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

from live_server import LiveServer
from swama.engine.decisions.decide import DecisionJob, DecisionResult, DecisionRun
from swama.engine.decisions.scorer import (
    build_content,
    decision_choice_view,
    decision_score_view,
    labels_for,
    predicate_view,
)
from swama.engine.text.language import load_language_model

pytestmark = pytest.mark.slow

SMOL = "smollm2"
# The server's batches and cached prefixes against a direct forward pass: two computations of SmolLM2's
# logits in another summation order. bf16: they may move a log-odds by BF16_NEAR_TIE (steps of 0.125),
# a probability by a quarter of that (BF16_PROBABILITY).
BOUND = tol(F32_PROBABILITY, BF16_PROBABILITY)
# Fresh scoring against the direct forward pass: the same prefill, only the vocabulary projection of
# the last position runs alone. float32: a logit's 576 products (SmolLM2's hidden width, logits under
# 32) in another order, 7.3e-4, a probability half that (measured equal). bf16: its logits round apart
# from the whole model's, as BOUND.
FRESH = tol(f32_reordered(32, 576) / 2, BF16_PROBABILITY)
# A label mass is exp(label logit - log-sum-exp of all logits). float32: relatively as the two
# log-sum-exps, each summing 49,152 positive terms (SmolLM2's vocabulary) to within V u = 2.9e-3 of the
# exact sum in any order (measured 1.6e-4 apart: the reference's MLX sum adds in sequence). bf16: the
# same up to BF16_NEAR_TIE swing, as a factor of exp(0.5) ~ 1.65.
MASS_RTOL = tol(2 * 49152 * F32_UNIT, math.exp(BF16_NEAR_TIE) - 1)


def _png_data_url() -> str:
    import base64
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


PNG_URL = _png_data_url()
INPUT = "My invoice charged me twice."
QUESTIONS = [
    {"type": "predicate", "name": "billing", "instructions": "Is this a billing issue?"},
    {"type": "choice", "name": "team", "instructions": "Which team should handle this?",
     "choices": [{"value": "billing"}, {"value": "technical"}, {"value": "sales"}]},
    {"type": "score", "name": "urgency", "instructions": "How urgent is it?",
     "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high", "description": "needs action today"}]},
    {"type": "choice", "instructions": "Was the customer charged correctly?",
     "choices": [{"value": True}, {"value": False}]},
]


@pytest.fixture(scope="module")
def client(model_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=model_server.v1, api_key="sk-local", max_retries=0, timeout=120)


def decide(client: openai.OpenAI):
    return client.decisions.create(model=SMOL, input=INPUT, questions=QUESTIONS)


def test_openai_sdk_decisions(client: openai.OpenAI) -> None:
    d = decide(client)
    assert d.model == SMOL
    assert [a.type for a in d.answers] == ["predicate", "choice", "score", "choice"]
    assert [a.name for a in d.answers] == ["billing", "team", "urgency", None]
    assert 0 < d.answers[0].probability < 1
    # Probabilities are normalised and scored in float64 on the host, and come through JSON exactly.
    for a in d.answers[1:]:
        assert math.isclose(sum(p.probability for p in a.probabilities), 1.0, abs_tol=F64_ARITHMETIC)
        assert 0 <= a.confidence <= 1
    team = d.answers[1]
    assert team.choice == max(team.probabilities, key=lambda p: p.probability).value
    assert [p.value for p in d.answers[3].probabilities] == [True, False]  # typed values come back typed
    urgency = d.answers[2]
    assert [p.label for p in urgency.probabilities] == ["low", "medium", "high"]
    assert math.isclose(urgency.score, sum(p.value * p.probability for p in urgency.probabilities),
                        abs_tol=F64_ARITHMETIC)
    assert d.usage.input_tokens > 100 and d.usage.total_tokens == d.usage.input_tokens
    assert d.usage.output_tokens == 0


def test_deterministic_and_independent_of_chat(client: openai.OpenAI) -> None:
    first = decide(client).model_dump()
    client.chat.completions.create(model=SMOL, max_tokens=8, messages=[{"role": "user", "content": "Hello!"}])
    second = decide(client).model_dump()
    assert first == second


def score(model, job: DecisionJob, *, prefix_reuse: bool) -> DecisionResult:
    """The engine's scoring steps (`Engine.decide` runs them one turn each), back to back."""
    run = DecisionRun(model, job, prefix_reuse=prefix_reuse)
    run.start()
    while not run.done:
        run.score_next()
    return run.result()


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path):
    return load_language_model("smollm2", smollm2_dir)


def direct_probabilities(model, text: str, view) -> tuple[list[float], float]:
    """Fresh forward pass over the chat-rendered prompt; softmax over the label logits."""
    labels = labels_for(view)
    prompt = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": build_content(text, view, labels)}], add_generation_prompt=True,
        enable_thinking=False, tokenize=False)
    ids = model.tokenizer.encode(prompt, add_special_tokens=False)
    logits = model.model(mx.array(ids)[None])[0, -1].astype(mx.float32)
    logp = logits - mx.logsumexp(logits)
    label_ids = [model.tokenizer.encode(prompt + label, add_special_tokens=False)[-1] for label in labels]
    lp = [float(logp[i]) for i in label_ids]
    z = [math.exp(x - max(lp)) for x in lp]
    return [x / sum(z) for x in z], sum(math.exp(x) for x in lp)


def views() -> list:
    return [predicate_view("Is this a billing issue?"),
            decision_choice_view("Which team should handle this?", [("billing", None), ("technical", None),
                                                                     ("sales", None)]),
            decision_score_view("How urgent is it?", [("low", None), ("medium", None),
                                                      ("high", "needs action today")])]


def test_scores_equal_a_direct_computation(smollm2, client: openai.OpenAI) -> None:
    direct = [direct_probabilities(smollm2, INPUT, v) for v in views()]
    served = decide(client).answers
    assert math.isclose(served[0].probability, direct[0][0][0], abs_tol=BOUND)
    for answer, (probs, _) in zip(served[1:3], direct[1:], strict=True):
        for got, want in zip([p.probability for p in answer.probabilities], probs, strict=True):
            assert math.isclose(got, want, abs_tol=BOUND)
    fresh = score(smollm2, DecisionJob(INPUT, views(), 16384), prefix_reuse=False)
    for answer, (probs, mass) in zip(fresh.answers, direct, strict=True):
        assert all(math.isclose(a, b, abs_tol=FRESH) for a, b in zip(answer.probabilities, probs, strict=True))
        assert math.isclose(answer.mass, mass, rel_tol=MASS_RTOL)


def test_shared_prefix_equals_fresh_caches(smollm2) -> None:
    text = "Ticket: " + " ".join(f"line {i} of a long customer complaint about billing." for i in range(30))
    many = views() * 2
    shared = score(smollm2, DecisionJob(text, many, 16384), prefix_reuse=True)
    fresh = score(smollm2, DecisionJob(text, many, 16384), prefix_reuse=False)
    assert shared.shared_prefix_tokens > 300 and fresh.shared_prefix_tokens == 0
    assert shared.input_tokens == fresh.input_tokens
    for a, b in zip(shared.answers, fresh.answers, strict=True):
        assert max(abs(x - y) for x, y in zip(a.probabilities, b.probabilities, strict=True)) < BOUND
        # The same choice, or in bf16 two choices whose probabilities are within twice BOUND: a
        # near-tie that rounding may turn around (float32 allows no tie: these top two lie 0.13 or
        # more apart, nine times 2 BOUND).
        tie = abs(b.probabilities[a.choice_index] - b.probabilities[b.choice_index])
        assert a.choice_index == b.choice_index or tie < tol(0.0, 2 * BF16_PROBABILITY)


def test_systemone_with_the_typesafe_sdk(model_server: LiveServer) -> None:
    with TypeSafeClient(base_url=model_server.url, api_key="local", model=SMOL, timeout=120, compression="zstd",
                        retry=typesafe_sdk.RetryPolicy(max_retries=0)) as ts:
        result = ts.system_one(
            state={"document": "I was charged twice. Please help. " * 40},  # > 1 KiB: sent zstd-compressed
            questions={
                "team": Choice(instructions="Which team?", criteria={"billing": None, "technical": None}),
                "billing": Noul(instructions="Is this a billing issue?"),
                "urgency": Score(instructions="How urgent?", criteria=["Can wait", "Needs attention today"]),
            },
        )
        raw = result.raw_http_response.json()
        assert result.raw_http_response.request.headers["content-encoding"] == "zstd"
    assert result.choices["team"].choice in ("billing", "technical")
    assert 0 < result.nouls["billing"].noul < 1
    assert 0 <= result.scores["urgency"].score <= 1
    assert list(raw["answers"]) == ["team", "billing", "urgency"]
    assert raw["answers"]["urgency"]["legend"] == {"0": "Can wait", "1": "Needs attention today"}
    assert all(0 < a["x_label_mass"] <= 1 for a in raw["answers"].values())
    assert raw["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and raw["usage"]["output_tokens"] == 0


def test_systemone_errors_reach_sdk_users(model_server: LiveServer) -> None:
    with TypeSafeClient(base_url=model_server.url, api_key="local", model=SMOL,
                        retry=typesafe_sdk.RetryPolicy(max_retries=0)) as ts:
        with pytest.raises(typesafe_sdk.TypeSafeBadRequestError, match="at least two options"):
            ts.system_one(state="x", questions={"q": Choice(instructions="Pick", criteria={"only": None})})
        with pytest.raises(typesafe_sdk.TypeSafeNotFoundError, match="not available locally"):
            ts.system_one(state="x", questions={"q": Noul(instructions="Is it?")}, model="nobody/nothing")


def test_sdk_default_model_name_uses_the_servers_model(model_server: LiveServer) -> None:
    r = httpx.post(model_server.v1 + "/systemone", timeout=120, json={
        "model": "jev-latest", "state": "hello", "questions": {"q": {"type": "noul", "instructions": "Is it a greeting?"}}})
    assert r.status_code == 200 and r.json()["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_systemone_and_decisions_agree(model_server: LiveServer) -> None:
    state = {"ticket": "Refund please", "tags": ["billing"]}
    s1 = httpx.post(model_server.v1 + "/systemone", timeout=120, json={
        "model": SMOL, "state": state,
        "questions": {"t": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "sales": None}},
                      "u": {"type": "noul", "instructions": "Is it urgent?"}}}).json()
    d = httpx.post(model_server.v1 + "/decisions", timeout=120, json={
        "model": SMOL, "input": json.dumps(state, separators=(",", ":")),
        "questions": [{"type": "choice", "instructions": "Which team?", "choices": [{"value": "billing"},
                                                                                  {"value": "sales"}]},
                      {"type": "predicate", "instructions": "Is it urgent?"}]}).json()
    assert list(s1["answers"]["t"]["probabilities"].values()) == [p["probability"] for p in d["answers"][0]["probabilities"]]
    assert s1["answers"]["u"]["noul"] == d["answers"][1]["probability"]
    assert s1["usage"]["input_tokens"] == d["usage"]["input_tokens"]


@pytest.mark.parametrize(("route", "body", "status", "message"), [
    ("/decisions", {"model": "nobody/x", "input": "x", "questions": [{"type": "predicate", "instructions": "i"}]},
     404, "The model is not available locally."),
    ("/decisions", {"model": SMOL, "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": PNG_URL}]}],
        "questions": [{"type": "predicate", "instructions": "i"}]}, 400, "no vision processor"),
    ("/systemone", {"model": SMOL, "state": "x", "images": [PNG_URL],
                    "questions": {"q": {"type": "noul", "instructions": "i"}}}, 400, "no vision processor"),
])
def test_refusals_on_the_live_server(model_server: LiveServer, route: str, body: dict, status: int,
                                     message: str) -> None:
    r = httpx.post(model_server.v1 + route, json=body, timeout=120)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]


def test_context_refusals(tmp_path: Path, model_store: Path) -> None:
    from live_server import start_server

    server = start_server(model_store, tmp_path / "log", "--context-limit", "64")
    try:
        s1 = httpx.post(server.v1 + "/systemone", timeout=120, json={
            "model": SMOL, "state": "x " * 100, "questions": {"q": {"type": "noul", "instructions": "i"}}})
        d = httpx.post(server.v1 + "/decisions", timeout=120, json={
            "model": SMOL, "input": "x " * 100, "questions": [{"type": "predicate", "instructions": "i"}]})
    finally:
        server.stop()
    assert s1.status_code == 400 and d.status_code == 400
    assert s1.json()["error"]["message"] == (
        "maximum context length: The decision prompt exceeds the configured context limit.")
    assert d.json()["error"]["message"] == "The decision prompt exceeds the configured context limit."


def test_concurrent_requests_share_the_model_fairly(model_server: LiveServer) -> None:
    """A one-question request sent while a 120-question request runs does not wait for all 120 (with
    40, the big request could be in its last pass when the small one came, and end 2 ms before it)."""
    import concurrent.futures
    import time

    url = model_server.v1 + "/decisions"
    big = {"model": SMOL, "input": "A long ticket. " * 20,
           "questions": [{"type": "predicate", "instructions": f"Is statement {i} true?"} for i in range(120)]}
    small = {"model": SMOL, "input": "hi", "questions": [{"type": "predicate", "instructions": "Is it a greeting?"}]}
    finished: dict[str, float] = {}

    def send(name: str, body: dict) -> int:
        r = httpx.post(url, json=body, timeout=300)
        finished[name] = time.monotonic()
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(send, "big", big)
        # The small one must arrive while the big one runs: on a GPU all 40 questions take well
        # under a second (measured on an H200: the big one was done before a 1 s pause ended).
        time.sleep(0.05 if ON_GPU else 1.0)
        second = pool.submit(send, "small", small)
        assert first.result() == 200 and second.result() == 200
    assert finished["small"] < finished["big"]


def test_more_than_26_choices_use_pair_labels(model_server: LiveServer, smollm2) -> None:
    choices = [{"value": f"option {i}"} for i in range(30)]
    r = httpx.post(model_server.v1 + "/decisions", timeout=300, json={
        "model": SMOL, "input": "Pick one.", "questions": [
            {"type": "choice", "instructions": "Which option?", "choices": choices}]})
    assert r.status_code == 200, r.text
    probs = r.json()["answers"][0]["probabilities"]
    assert [p["value"] for p in probs] == [c["value"] for c in choices]
    # Normalised in float64 on the host, and exact through JSON.
    assert math.isclose(sum(p["probability"] for p in probs), 1.0, abs_tol=F64_ARITHMETIC)
    # The prompt the scorer used carries two-letter labels from the start.
    from swama.engine.decisions.decide import DecisionJob, prepare

    prepared = prepare(smollm2, DecisionJob("Pick one.", [decision_choice_view(
        "Which option?", [(c["value"], None) for c in choices])], 16384))
    text = smollm2.tokenizer.decode(prepared[0].ids)
    assert "\nAA: option 0\n" in text and "\nA: option 0" not in text
    assert len(set(prepared[0].label_ids)) == 30
