"""Vision-language models in the engine: loading by kind, generation with images, and decisions that
share one vision encoding and one prefix prefill across their questions."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from precision import BF16_TINY_PROBABILITY, f32_reordered, forward_products, tol

from swama.engine.decisions.decide import DecisionJob, DecisionRun
from swama.engine.decisions.scorer import (
    DecisionError,
    decision_choice_view,
    decision_score_view,
    predicate_view,
)
from swama.engine.errors import EngineError
from swama.engine.files.kinds import VISION
from swama.engine.kinds.vision import vision_of
from swama.engine.model import LoadedModel
from swama.engine.serving.loaders import load_model
from swama.engine.text.generator import ChatRequest, Finished, Sampling, generate

# One shared encoding and prefix against one per question round the tiny models' logits apart.
# float32: another summation order through their 4-layer text stacks (F32_TINY_PROBABILITY counts 2),
# logits under 16, a probability moving by half a logit's bound; bf16: steps of 0.0625 under 16, by up
# to four steps on a log-odds; a probability moves by at most a quarter of that.
BOUND = tol(f32_reordered(16, forward_products(4, 64, 128, 16, 512)) / 2, BF16_TINY_PROBABILITY)
ARCHS = ("qwen3_5_vl", "gemma3_vl")


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module", params=ARCHS)
def vlm(request: pytest.FixtureRequest, tiny_vision_dirs: dict[str, Path]) -> LoadedModel:
    return load_model(request.param, tiny_vision_dirs[request.param])


def _run(model: LoadedModel, job: DecisionJob, reuse: bool) -> DecisionRun:
    run = DecisionRun(model, job, prefix_reuse=reuse)
    run.start()
    while not run.done:
        run.score_next()
    return run


QUESTIONS = [predicate_view(f"Does the picture show item {i}?") for i in range(8)] + [
    decision_choice_view("Which room?", [("kitchen", None), ("garage", None), ("garden", None)]),
    decision_score_view("How bright?", [("dark", None), ("normal", None), ("bright", None)])]


def test_loaded_by_kind_through_mlx_vlm(vlm: LoadedModel) -> None:
    vision = vision_of(vlm)
    assert vlm.kind == VISION and vision is not None and vlm.has_chat_template
    assert vision.image_token_id is not None


def test_one_vision_encoding_per_request_matches_per_question_encoding(vlm: LoadedModel) -> None:
    job = DecisionJob("Photos from the listing.", QUESTIONS, context_limit=16384,
                      images=(photo(120, 90), photo(64, 64, seed=1)))
    shared, fresh = _run(vlm, job, True), _run(vlm, job, False)
    assert (shared.vision_encodings, fresh.vision_encodings) == (1, len(QUESTIONS))
    a, b = shared.result(), fresh.result()
    assert a.shared_prefix_tokens > shared.prepared[0].processed.last_image_index
    assert a.input_tokens == b.input_tokens
    for x, y in zip(a.answers, b.answers, strict=True):
        assert max(abs(p - q) for p, q in zip(x.probabilities, y.probabilities, strict=True)) < BOUND
    again = _run(vlm, job, True).result()
    assert [x.probabilities for x in again.answers] == [x.probabilities for x in a.answers]


def test_images_change_the_answer_and_count_as_input_tokens(vlm: LoadedModel) -> None:
    text_only = _run(vlm, DecisionJob("A listing.", QUESTIONS[:1], context_limit=16384), True).result()
    with_image = _run(vlm, DecisionJob("A listing.", QUESTIONS[:1], context_limit=16384,
                                       images=(photo(96, 96),)), True).result()
    assert with_image.input_tokens > text_only.input_tokens
    assert with_image.answers[0].probabilities != text_only.answers[0].probabilities


def test_low_detail_resizes_to_512_pixels(tiny_vision_dirs: dict[str, Path]) -> None:
    # The tiny Qwen3.5 processor takes up to 1024x1024 pixels' worth of area, so a 1000x800 photo
    # keeps its size by default and is halved with detail "low".
    model = load_model("qwen", tiny_vision_dirs["qwen3_5_vl"])
    big = (photo(1000, 800),)
    default = _run(model, DecisionJob("x", QUESTIONS[:1], context_limit=16384, images=big), True).result()
    low = _run(model, DecisionJob("x", QUESTIONS[:1], context_limit=16384, images=big, low_detail=True),
               True).result()
    assert default.input_tokens - low.input_tokens > 400


def test_multimodal_context_limit(vlm: LoadedModel) -> None:
    long_text = "The listing describes the house in detail. " * 520  # ~4,200 tokens: over 4096
    job = DecisionJob(long_text, QUESTIONS[:1], context_limit=16384)
    assert _run(vlm, job, True).result().input_tokens > 4096  # fine without images
    with pytest.raises(DecisionError, match="^The decision prompt exceeds the configured context limit"):
        _run(vlm, DecisionJob(long_text, QUESTIONS[:1], context_limit=16384, images=(photo(64, 64),)), True)
    with pytest.raises(DecisionError, match="^maximum context length: "):
        _run(vlm, DecisionJob(long_text, QUESTIONS[:1], context_limit=16384, images=(photo(64, 64),),
                              systemone=True), True)


def test_images_on_a_text_model_are_refused(tiny_model_dir: Path) -> None:
    model = load_model("text", tiny_model_dir)
    with pytest.raises(DecisionError, match="it has no vision processor"):
        _run(model, DecisionJob("x", QUESTIONS[:1], context_limit=4096, images=(photo(32, 32),)), True)
    request = ChatRequest([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                          images=[photo(32, 32)], max_tokens=2)
    with pytest.raises(EngineError, match="it has no vision processor"):
        list(generate(model, request, threading.Event()))


def _generate(model: LoadedModel, images: list[Image.Image], text: str = "Describe it.") -> tuple[str, Finished]:
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": text}]
    request = ChatRequest([{"role": "user", "content": content if images else text}], images=images,
                          sampling=Sampling(temperature=0.0), max_tokens=6)
    events = list(generate(model, request, threading.Event()))
    return "".join(getattr(e, "text", "") for e in events), events[-1]


def test_generation_with_images(vlm: LoadedModel) -> None:
    text, done = _generate(vlm, [photo(96, 64), photo(64, 96, seed=2)])
    plain_text, plain = _generate(vlm, [])
    assert done.completion_tokens > 0 and done.prompt_tokens > plain.prompt_tokens
    again, _ = _generate(vlm, [photo(96, 64), photo(64, 96, seed=2)])
    assert again == text  # greedy and deterministic
    # A text-only request after an image request is not disturbed by the image's positions.
    assert _generate(vlm, [])[0] == plain_text
