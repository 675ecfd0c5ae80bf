"""Cloudflare Workers AI's Clef routes on a real server over SmolLM2, through the clients users run:
the official `cloudflare` SDK and `clef-evals`, unchanged, pointed at swama by their base URL. Also
the v4 envelope on answers and refusals, images on a tiny vision model, `--clef-model`, and the
answers matching /v1/systemone's for the same request."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from clef_evals import ClefAuthError, ClefConfig, ClefJudge, Noul, Score
from cloudflare import AuthenticationError, BadRequestError, Cloudflare
from conftest import TINY_ID, install_folder
from PIL import Image
from precision import BF16_TINY_PROBABILITY, F64_ARITHMETIC, f32_reordered, forward_products, tol

from live_server import LiveServer, start_server

RUN = "/client/v4/accounts/local/ai/run/@cf/cloudflare/"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QWEN_VL = "test/tiny-qwen3_5-vl"
# The vision model's probabilities beside the shifted orders against alone: its tiny text stack (4 layers,
# H 64, I 128, heads of 16, logits under 16) in another summation order; a probability moves by half a logit.
VL_PROBABILITY = tol(f32_reordered(16, forward_products(4, 64, 128, 16, 512)) / 2, BF16_TINY_PROBABILITY)
KEY = "clef-secret"
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?",
               "criteria": {"true": "they want money back", "false": "anything else"}},
    "topic": {"type": "choice", "instructions": "What is the message about?",
              "criteria": {"billing": "invoices and payments", "shipping": None, "other": "anything else"}},
    "anger": {"type": "score", "instructions": "How angry is the customer?",
              "criteria": ["calm", "annoyed", "furious"]},
}
REQUEST = {"model": "clef", "state": "I was charged twice for my order. Please give me my money back.",
           "questions": QUESTIONS}


def png_url(seed: int = 0) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (32, 48, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def post(server: LiveServer, path: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers, timeout=120)


def refusal(response: httpx.Response, status: int, code: int) -> str:
    """The message of a Cloudflare error envelope, after checking its shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["result"] is None and body["success"] is False and body["messages"] == []
    (error,) = body["errors"]
    assert error["code"] == code and isinstance(error["message"], str) and error["message"]
    return error["message"]


@pytest.fixture(scope="module")
def key_server(model_store: Path) -> Iterator[LiveServer]:
    server = start_server(model_store, model_store.parent / "clef-key-server.log", "smollm2", "--api-key", KEY)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def vision_server(tiny_vision_dirs: dict[str, Path], tiny_model_dir: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server started on the text model whose Clef model is the vision one (`--clef-model`)."""
    root = tmp_path_factory.mktemp("clef-vision-store")
    install_folder(root, QWEN_VL, tiny_vision_dirs["qwen3_5_vl"])
    install_folder(root, TINY_ID, tiny_model_dir)
    server = start_server(root, root.parent / "clef-vision-server.log", TINY_ID, "--clef-model", QWEN_VL)
    yield server
    server.stop()


def test_the_cloudflare_sdk_runs_clef(model_server: LiveServer) -> None:
    client = Cloudflare(api_token="local", base_url=model_server.url + "/client/v4", max_retries=0)
    for name, selector in (("@cf/cloudflare/clef", "clef"), ("@cf/cloudflare/clef-flash", "clef-flash")):
        result = client.ai.run(name, account_id="local", extra_body={**REQUEST, "model": selector})
        assert result["model"] == SMOL  # the local model that answered
        answers = result["answers"]
        assert list(answers) == ["refund", "topic", "anger"]
        assert 0 <= answers["refund"]["noul"] <= 1
        assert set(answers["topic"]["probabilities"]) == {"billing", "shipping", "other"}
        assert answers["topic"]["choice"] in answers["topic"]["probabilities"]
        assert answers["anger"]["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
        assert 0 <= answers["anger"]["score"] <= 2
        assert result["usage"]["input_tokens"] > 0 and result["usage"]["output_tokens"] == 0
    with pytest.raises(BadRequestError) as refused:
        client.ai.run("@cf/cloudflare/clef", account_id="local", extra_body={**REQUEST, "model": "gpt-4o"})
    assert refused.value.status_code == 400


def test_clef_evals_judges_through_swama(model_server: LiveServer) -> None:
    for model in ("@cf/cloudflare/clef", "@cf/cloudflare/clef-flash"):
        config = ClefConfig.from_env({"CLEF_ACCOUNT_ID": "local", "CLEF_API_TOKEN": "local", "CLEF_MODEL": model,
                                      "CLEF_BASE_URL": model_server.url + "/client/v4", "CLEF_MAX_RETRIES": "0"})
        with ClefJudge(config=config) as judge:
            yes = judge.judge_binary("I want a refund now.", "Does the customer ask for a refund?")
            assert 0 <= yes <= 1
            decision = judge.judge_choice("The parcel never arrived.", "What is it about?",
                                          {"billing": "payments", "shipping": "delivery"})
            assert decision.choice in ("billing", "shipping")
            # Normalised in float64 on the host, and exact through JSON.
            assert sum(decision.probabilities.values()) == pytest.approx(1, abs=F64_ARITHMETIC)
            response = judge.run_questions("Fine, thanks.", {
                "ok": Noul(instructions="Is the customer satisfied?"),
                "mood": Score(instructions="How happy?", criteria=["sad", "neutral", "happy"])})
            assert set(response.answers) == {"ok", "mood"}


def test_answers_equal_systemone(model_server: LiveServer) -> None:
    clef = post(model_server, RUN + "clef", REQUEST)
    assert clef.status_code == 200, clef.text
    assert clef.headers["content-type"] == "application/json"
    envelope = clef.json()
    assert list(envelope) == ["result", "success", "errors", "messages"]
    assert envelope["success"] is True and envelope["errors"] == [] and envelope["messages"] == []
    systemone = post(model_server, "/v1/systemone", {**REQUEST, "model": "smollm2"})
    assert systemone.status_code == 200, systemone.text
    assert envelope["result"] == systemone.json()
    # Without the /client/v4 prefix (a base URL of just the server) and on clef-flash: the same answer.
    for path in ("/accounts/x/ai/run/@cf/cloudflare/clef", RUN + "clef-flash"):
        again = post(model_server, path, {**REQUEST, "model": " clef-flash "})
        assert again.status_code == 200 and again.json()["result"] == envelope["result"]


def test_bad_requests_get_cloudflare_errors(model_server: LiveServer) -> None:
    url = model_server.url + RUN + "clef"
    assert refusal(httpx.post(url, content=b"{nope", timeout=30, headers={"content-type": "application/json"}),
                   400, 5006)
    assert "reads only application/json bodies" in refusal(httpx.post(url, content=b"{}", timeout=30), 415, 5006)
    assert refusal(post(model_server, RUN + "clef", {**REQUEST, "model": "jev-latest"}), 400, 5006) == \
        "model must be clef or clef-flash."
    assert "state" in refusal(post(model_server, RUN + "clef", {"model": "clef", "questions": QUESTIONS}),
                              400, 5006)
    assert refusal(post(model_server, RUN + "clef", {**REQUEST, "images": None}), 400, 5006) == \
        "images must be an array."
    too_many = {f"q{i}": QUESTIONS["refund"] for i in range(65)}
    assert refusal(post(model_server, RUN + "clef", {**REQUEST, "questions": too_many}), 400, 5006) == \
        "A request accepts at most 64 questions."
    same_options = {"type": "choice", "instructions": "Which?", "criteria": {"Yes": None, " yes ": None}}
    message = refusal(post(model_server, RUN + "clef", {**REQUEST, "questions": {"q": same_options}}), 400, 5006)
    systemone = post(model_server, "/v1/systemone", {**REQUEST, "model": "smollm2", "questions": {"q": same_options}})
    assert message == systemone.json()["error"]["message"]  # the same rule, worded the same
    # Images need a vision model; SmolLM2 has none.
    assert refusal(post(model_server, RUN + "clef", {**REQUEST, "images": [png_url()]}), 400, 5006) \
        .startswith("Images are not supported by this model")


def test_unknown_routes_and_models_under_client_v4(model_server: LiveServer) -> None:
    paths = httpx.get(model_server.url + "/openapi.json", timeout=30).json()["paths"]
    for prefix in ("/client/v4", ""):
        for model in ("clef", "clef-flash"):
            assert "post" in paths[f"{prefix}/accounts/{{account_id}}/ai/run/@cf/cloudflare/{model}"]
    assert "@cf/meta/llama-3-8b-instruct" in refusal(
        post(model_server, "/client/v4/accounts/local/ai/run/@cf/meta/llama-3-8b-instruct", REQUEST), 400, 5007)
    assert refusal(post(model_server, "/client/v4/accounts/local/ai/models/search", {}), 404, 7000)
    assert refusal(httpx.get(model_server.url + RUN + "clef", timeout=30), 405, 7001)


def test_the_api_key_is_checked_when_set(key_server: LiveServer) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refusal(post(key_server, RUN + "clef", REQUEST, **headers), 401, 10000)
    with pytest.raises(AuthenticationError):
        Cloudflare(api_token="wrong", base_url=key_server.url + "/client/v4", max_retries=0).ai.run(
            "@cf/cloudflare/clef", account_id="local", extra_body=REQUEST)
    config = ClefConfig(account_id="local", api_token="wrong", base_url=key_server.url + "/client/v4",
                        max_retries=0)
    with ClefJudge(config=config) as judge, pytest.raises(ClefAuthError):
        judge.judge_binary("x", "Is it?")
    ok = Cloudflare(api_token=KEY, base_url=key_server.url + "/client/v4", max_retries=0).ai.run(
        "@cf/cloudflare/clef", account_id="local", extra_body=REQUEST)
    assert ok["model"] == SMOL


def test_images_on_the_clef_model(vision_server: LiveServer) -> None:
    image = png_url(1)
    body = {**REQUEST, "questions": {"refund": QUESTIONS["refund"]},
            "images": [image, {"content_type": "image/png", "base64": image.split(",", 1)[1]}]}
    clef = post(vision_server, RUN + "clef", body)
    assert clef.status_code == 200, clef.text
    result = clef.json()["result"]
    assert result["model"] == QWEN_VL  # --clef-model, not the server's model
    systemone = post(vision_server, "/v1/systemone", {**body, "model": QWEN_VL})
    assert systemone.status_code == 200 and result == systemone.json()
    # Image rules, as /v1/systemone words them, in Cloudflare's envelope.
    assert refusal(post(vision_server, RUN + "clef", {**body, "images": ["data:image/png;base64,AAAA"]}),
                   400, 5006).startswith("images[0]")
    assert refusal(post(vision_server, RUN + "clef", {**body, "images": [image] * 5}), 400, 5006) == \
        "A request accepts at most 4 images."
    bad_type = {"content_type": "image/gif", "base64": "R0lGOD"}
    assert "content_type" in refusal(post(vision_server, RUN + "clef", {**body, "images": [bad_type]}), 400, 5006)


def test_images_with_debiasing(vision_server: LiveServer) -> None:
    """The shifted orders share the images' prefill; a content-free answer has no images."""
    body = {**REQUEST, "images": [png_url(2)], "x_debias": "permute", "x_calibration": "contextual"}
    r = post(vision_server, RUN + "clef", body)
    assert r.status_code == 200, r.text
    plain = post(vision_server, RUN + "clef", {**REQUEST, "images": [png_url(2)]}).json()["result"]["answers"]
    answers = r.json()["result"]["answers"]
    assert answers["topic"]["x_adjustment"]["orders"] == 3
    assert list(plain["topic"]["probabilities"].values()) == \
        pytest.approx(answers["topic"]["x_adjustment"]["raw_probabilities"], abs=VL_PROBABILITY)
    assert all(a["x_adjustment"]["calibration"] == "contextual" for a in answers.values())
