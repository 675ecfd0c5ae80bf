"""POST /tokenize on tiny vision models (Qwen3.5 and Gemma 3 families): a chat with images counts the
tokens its images expand to, exactly as /v1/chat/completions' `usage.prompt_tokens` does, and reports
the multimodal context limit such a prompt is held to."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import install_folder
from PIL import Image

from live_server import LiveServer, start_server
from swama.engine.client import EngineSettings, read

VISION_MODELS = {"test/tiny-qwen3_5-vl": "qwen3_5_vl", "test/tiny-gemma3-vl": "gemma3_vl"}
MULTIMODAL_LIMIT = 4096  # engine/kinds/vision.py MULTIMODAL_CONTEXT_LIMIT


def png(width: int, height: int) -> str:
    pixels = np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def vision_server(tiny_vision_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("tokenize-vision-store")
    for model, folder in VISION_MODELS.items():
        install_folder(root, model, tiny_vision_dirs[folder])
    server = start_server(root, root.parent / "tokenize-vision-server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(vision_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vision_server.url, timeout=120) as client:
        yield client


def _counts(http: httpx.Client, model: str, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    tokenized = http.post("/tokenize", json={"model": model, "messages": messages})
    assert tokenized.status_code == 200, tokenized.text
    chat = http.post("/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 1,
                                                   "temperature": 0})
    assert chat.status_code == 200, chat.text
    return tokenized.json(), chat.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("model", VISION_MODELS)
def test_image_tokens_count_as_the_chat_completion_counts_them(http: httpx.Client, model: str) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is in these pictures?"},
                                             {"type": "image_url", "image_url": {"url": png(64, 48)}},
                                             {"type": "image_url", "image_url": {"url": png(32, 32)}}]}]
    tokenized, prompt_tokens = _counts(http, model, messages)
    assert tokenized["count"] == prompt_tokens
    assert tokenized["max_model_len"] == min(read(EngineSettings).context_limit, MULTIMODAL_LIMIT)
    text_only, text_prompt_tokens = _counts(http, model, [{"role": "user", "content": "What is in these pictures?"}])
    assert text_only["count"] == text_prompt_tokens < prompt_tokens
    assert text_only["max_model_len"] == read(EngineSettings).context_limit


@pytest.mark.parametrize("model", VISION_MODELS)
def test_token_strings_and_detokenize_on_a_vision_model(http: httpx.Client, model: str) -> None:
    r = http.post("/tokenize", json={"model": model, "prompt": "A cat on a mat.", "return_token_strs": True})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert len(answer["token_strs"]) == answer["count"] == len(answer["tokens"])
    r = http.post("/detokenize", json={"model": model, "tokens": answer["tokens"]})
    assert r.status_code == 200 and r.json()["prompt"].endswith("A cat on a mat.")
