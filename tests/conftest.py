from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from live_server import LiveServer, start_server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a slow test first, each file's tests in their own order. The workers of `tools/dev.sh
    test` take whole files in this order: a slow file taken last would keep one worker busy while the
    others stand idle."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@functools.cache
def _served_components() -> dict[str, Any]:
    from swama.handlers.http.openapi import merged_spec

    return merged_spec()["components"]


def served_schema_accepts(component: str, instance: Any) -> bool:
    """Whether `instance` is valid as `component` of the document /openapi.json serves: what a
    client validating against it (or generating requests from it) takes as allowed."""
    schema = {"$ref": f"#/components/schemas/{component}", "components": _served_components()}
    return jsonschema.Draft202012Validator(schema).is_valid(instance)


@functools.cache
def handler_rules() -> dict[str, list[re.Pattern[str]]]:
    """The refusals the served document states as rules no schema can say (each operation's
    x-swama-handler-rules, copied there from its overlay), by operation id."""
    from swama.handlers.http.openapi import merged_spec

    return {op["operationId"]: [re.compile(p) for p in op.get("x-swama-handler-rules", [])]
            for item in merged_spec()["paths"].values() for op in item.values()}


def stated_handler_rule(operation_id: str, message: str) -> bool:
    """Whether `message` is the refusal of a rule the operation's overlay lists as handler-only."""
    return any(p.search(message) for p in handler_rules().get(operation_id, []))


@pytest.fixture(scope="session", autouse=True)
def _own_data_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Files and batch jobs of in-process apps go to this worker's own folder, never ~/.swama/data
    (one server per data folder: parallel workers would collide)."""
    previous = os.environ.get("SWAMA_DATA")
    os.environ["SWAMA_DATA"] = str(tmp_path_factory.mktemp("data"))
    yield
    if previous is None:
        os.environ.pop("SWAMA_DATA", None)
    else:
        os.environ["SWAMA_DATA"] = previous


@pytest.fixture(scope="session")
def empty_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real server over an empty model store."""
    root = tmp_path_factory.mktemp("empty-store")
    server = start_server(root, root.parent / "empty-server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def install_folder(root: Path, repo_id: str, folder: Path) -> Path:
    """Install a model folder into a store at `root` the way `swama create` does (a copy: tests damage
    stored files in place, so a store never shares a file with the cache it was made from)."""
    from swama.engine.files.sources import create
    from swama.engine.files.store import ModelStore

    return create(ModelStore(root), folder, repo_id, say=lambda _: None).path


def make_store(tmp_path_factory: pytest.TempPathFactory, name: str, models: dict[str, Path]) -> Path:
    """A fresh store named `name` holding each model folder under its id."""
    root = tmp_path_factory.mktemp(name)
    for repo_id, folder in models.items():
        install_folder(root, repo_id, folder)
    return root


SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_ID = "test/tiny-qwen3"
THINKING_ID = "test/tiny-qwen3-thinking"
OPENING_ID = "test/tiny-opening-thinker"


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path, tiny_model_dir: Path,
                tiny_thinking_dir: Path, tiny_opening_thinker_dir: Path) -> Path:
    """A store with SmolLM2 (real weights), the tiny random model, and two tiny random models with Qwen3's
    own tokenizer that think: one with Qwen3's chat template, one whose generation prompt opens the
    think block (as Qwen3.5's does)."""
    return make_store(tmp_path_factory, "store", {SMOLLM2_ID: smollm2_dir, TINY_ID: tiny_model_dir,
                                                  THINKING_ID: tiny_thinking_dir,
                                                  OPENING_ID: tiny_opening_thinker_dir})


@pytest.fixture(scope="session")
def model_server(model_store: Path) -> Iterator[LiveServer]:
    """A real server over SmolLM2 and the tiny models."""
    server = start_server(model_store, model_store.parent / "model-server.log", "smollm2")
    yield server
    server.stop()

@pytest.fixture(scope="session", params=[8, 4], ids=["kv8", "kv4"])
def kv_server(request: pytest.FixtureRequest, model_store: Path) -> Iterator[LiveServer]:
    """The same server as `model_server`, its key/value caches quantized (--kv-bits 8, then 4)."""
    server = start_server(model_store, model_store.parent / f"kv{request.param}-server.log", "smollm2",
                          "--kv-bits", str(request.param))
    yield server
    server.stop()


WHISPER_ID = "openai/whisper-tiny.en"


@pytest.fixture(scope="session")
def speech_store(tmp_path_factory: pytest.TempPathFactory, whisper_tiny_dir: Path, tiny_model_dir: Path) -> Path:
    """A store with Whisper tiny.en (converted from its wheel) and the tiny random language model."""
    return make_store(tmp_path_factory, "speech-store", {WHISPER_ID: whisper_tiny_dir, TINY_ID: tiny_model_dir})


# Model fixtures (SmolLM2 from its PyPI wheel, the tiny random model) live in their own module.
from model_fixtures import *  # noqa: E402,F403
