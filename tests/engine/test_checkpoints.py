"""Decision checkpoints (Clef and PPLX-Decider 2, tiny random weights): recognised as their own kind,
answering /v1/systemone through mlx-vlm's own prediction code, refused elsewhere by name."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import typesafe_sdk
from conftest import install_folder
from PIL import Image
from precision import DTYPE
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

from live_server import LiveServer, start_server
from swama.engine.files.kinds import DECISION, kind_of

pytestmark = pytest.mark.slow

CLEF = "test/tiny-clef"
DECIDER = "test/tiny-decider2"
QUESTIONS = {
    "cat": {"type": "noul", "instructions": "Does the listing mention a cat?"},
    "room": {"type": "choice", "instructions": "Which room is described?",
             "criteria": {"kitchen": None, "garage": "where the car is parked"}},
    "light": {"type": "score", "instructions": "How bright is it?", "criteria": ["dark", "normal", "bright"]},
}
STATE = {"listing": "A bright flat with a cat flap in the kitchen door."}


def _png() -> str:
    rng = np.random.default_rng(3)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


PNG = _png()


@pytest.fixture(scope="module")
def checkpoint_server(tiny_checkpoint_dirs: dict[str, Path],
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("checkpoint-store")
    install_folder(root, CLEF, tiny_checkpoint_dirs["clef"])
    install_folder(root, DECIDER, tiny_checkpoint_dirs["decider2"])
    server = start_server(root, root.parent / "checkpoint-server.log", "--clef-model", CLEF)
    yield server
    server.stop()


def _library_prediction(folder: Path, images: list | None = None) -> dict:
    """What mlx-vlm's own decision code answers for the same questions (its loader, its prompt)."""
    from mlx_vlm import load
    from mlx_vlm.decision import predict

    from swama.handlers.media.images import ImageRef, load_data_image, open_image

    model, processor = load(str(folder))
    model.set_dtype(DTYPE)  # the dtype the server computes in (the tiny checkpoints are stored in float32)
    media = {"images": [open_image(load_data_image(ImageRef("x", u))).convert("RGB") for u in images]} if images else {}
    return predict(model, processor, STATE, QUESTIONS, **media)


def _systemone(server: LiveServer, model: str, **extra: object) -> httpx.Response:
    return httpx.post(server.v1 + "/systemone", timeout=120,
                      json={"model": model, "state": STATE, "questions": QUESTIONS, **extra})


def test_checkpoints_are_their_own_kind(tiny_checkpoint_dirs: dict[str, Path], checkpoint_server: LiveServer) -> None:
    assert {kind_of(p) for p in tiny_checkpoint_dirs.values()} == {DECISION}
    listed = httpx.get(checkpoint_server.v1 + "/models").json()["data"]
    assert {m["id"]: m["kind"] for m in listed} == {CLEF: "decision", DECIDER: "decision"}


@pytest.mark.parametrize(("model", "arch", "images"), [
    (CLEF, "clef", None), (CLEF, "clef", [PNG]), (DECIDER, "decider2", None)])
def test_systemone_answers_are_the_librarys_own(checkpoint_server: LiveServer, tiny_checkpoint_dirs: dict[str, Path],
                                               model: str, arch: str, images: list | None) -> None:
    r = _systemone(checkpoint_server, model, **({"images": images} if images else {}))
    assert r.status_code == 200, r.text
    body, expected = r.json(), _library_prediction(tiny_checkpoint_dirs[arch], images)
    assert body["model"] == model
    assert body["usage"] == {"input_tokens": expected["usage"]["input_tokens"], "output_tokens": 0}
    answers, library = body["answers"], expected["answers"]
    assert list(answers) == list(QUESTIONS)
    assert answers["cat"] == {"type": "noul", "noul": library["cat"]["probability"]}  # no x_label_mass
    assert answers["room"]["probabilities"] == library["room"]["probabilities"]
    assert answers["room"]["choice"] == library["room"]["value"]
    assert answers["light"]["probabilities"] == library["light"]["probabilities"]
    assert answers["light"]["legend"] == {"0": "dark", "1": "normal", "2": "bright"}
    assert all("x_label_mass" not in a for a in answers.values())
    # Confidence by the System One formulas (not the checkpoint's own metadata), from its probabilities.
    p = list(answers["room"]["probabilities"].values())
    # The wire rounds to 4 decimals, and the formulas here start from those rounded probabilities: each
    # off by 5e-5, which these formulas carry to at most 3e-4, and the answer's own rounding adds 5e-5.
    assert answers["room"]["confidence"] == pytest.approx(min(1.0, max(0.0, (2 * max(p) / sum(p) - 1) / (2 - 1))),
                                                          abs=5e-4)
    assert answers["room"]["confidence"] != library["room"]["metadata"]["confidence"]
    q = [v / sum(answers["light"]["probabilities"].values()) for v in answers["light"]["probabilities"].values()]
    mode = q.index(max(q))
    spread = sum(v * abs(i - mode) for i, v in enumerate(q))
    assert answers["light"]["confidence"] == pytest.approx(max(0.0, 1 - spread / (2 / 3)), abs=5e-4)
    assert answers["light"]["score"] == pytest.approx(sum(i * v for i, v in enumerate(q)), abs=5e-4)


def test_clef_reads_images_and_the_decider_does_not(checkpoint_server: LiveServer) -> None:
    plain, seen = _systemone(checkpoint_server, CLEF).json(), _systemone(checkpoint_server, CLEF, images=[PNG]).json()
    assert seen["usage"]["input_tokens"] > plain["usage"]["input_tokens"]
    refused = _systemone(checkpoint_server, DECIDER, images=[PNG])
    assert (refused.status_code, refused.json()["error"]["message"]) == (
        400, "This decision checkpoint reads text only; it does not take images.")


@pytest.mark.parametrize("model", [CLEF, DECIDER])
def test_typesafe_sdk_on_a_checkpoint(checkpoint_server: LiveServer, model: str) -> None:
    with TypeSafeClient(base_url=checkpoint_server.url, api_key="local", model=model, timeout=120,
                        retry=typesafe_sdk.RetryPolicy(max_retries=0)) as ts:
        result = ts.system_one(state=STATE, questions={
            "cat": Noul(instructions=QUESTIONS["cat"]["instructions"]),
            "room": Choice(instructions=QUESTIONS["room"]["instructions"], criteria=QUESTIONS["room"]["criteria"]),
            "light": Score(instructions=QUESTIONS["light"]["instructions"], criteria=QUESTIONS["light"]["criteria"]),
        })
    assert result.raw_http_response.json()["answers"] == _systemone(checkpoint_server, model).json()["answers"]


def test_other_routes_refuse_a_checkpoint_by_name(checkpoint_server: LiveServer) -> None:
    r = httpx.post(checkpoint_server.v1 + "/decisions", timeout=60, json={
        "model": CLEF, "input": "x", "questions": [{"type": "predicate", "instructions": "Is it?"}]})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, f"Model '{CLEF}' is a decision checkpoint: it answers System One questions on /v1/systemone, "
             "not /v1/decisions.")
    r = httpx.post(checkpoint_server.v1 + "/chat/completions", timeout=60, json={
        "model": DECIDER, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and f"'{DECIDER}' is a decision model" in json.dumps(r.json())


def _clef_route(server: LiveServer, **extra: object) -> httpx.Response:
    return httpx.post(server.url + "/client/v4/accounts/local/ai/run/@cf/cloudflare/clef", timeout=120,
                      headers={"Authorization": "Bearer local"},
                      json={"model": "clef", "state": STATE, "questions": QUESTIONS, **extra})


def test_the_clef_route_answers_through_the_checkpoint(checkpoint_server: LiveServer) -> None:
    """`--clef-model` names a Clef checkpoint: the Workers AI route answers through its head, in the
    v4 envelope, exactly as /v1/systemone does."""
    r = _clef_route(checkpoint_server, images=[PNG])
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["success"], body["errors"], body["messages"]) == (True, [], [])
    assert body["result"] == _systemone(checkpoint_server, CLEF, images=[PNG]).json()
    assert body["result"]["model"] == CLEF


def test_the_clef_route_on_a_decider(tiny_checkpoint_dirs: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "store"
    install_folder(root, DECIDER, tiny_checkpoint_dirs["decider2"])
    server = start_server(root, tmp_path / "decider.log", "--clef-model", DECIDER)
    try:
        r = _clef_route(server)
        assert r.status_code == 200, r.text
        assert r.json()["result"] == _systemone(server, DECIDER).json()
        refused = _clef_route(server, images=[PNG])
        assert (refused.status_code, refused.json()["errors"]) == (400, [
            {"code": 5006, "message": "This decision checkpoint reads text only; it does not take images."}])
    finally:
        server.stop()


def test_checkpoints_refuse_debiasing_and_calibration(checkpoint_server: LiveServer) -> None:
    """A checkpoint answers through its own head, not next-token scores: there is nothing to reorder."""
    for extra in ({"x_debias": "permute"}, {"x_calibration": "contextual"}):
        r = _systemone(checkpoint_server, CLEF, **extra)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith("x_debias and x_calibration apply to chat models")
    assert _systemone(checkpoint_server, CLEF, x_debias="none").status_code == 200
