from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from live_server import LiveServer, start_server


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
    """Install a model folder into a store at `root` the way `swama create` does."""
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


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path, tiny_model_dir: Path) -> Path:
    """A store with SmolLM2 (real weights) and the tiny random model."""
    return make_store(tmp_path_factory, "store", {SMOLLM2_ID: smollm2_dir, TINY_ID: tiny_model_dir})


@pytest.fixture(scope="session")
def model_server(model_store: Path) -> Iterator[LiveServer]:
    """A real server over SmolLM2 and the tiny model."""
    server = start_server(model_store, model_store.parent / "model-server.log", "smollm2")
    yield server
    server.stop()

WHISPER_ID = "openai/whisper-tiny.en"


@pytest.fixture(scope="session")
def speech_store(tmp_path_factory: pytest.TempPathFactory, whisper_tiny_dir: Path, tiny_model_dir: Path) -> Path:
    """A store with Whisper tiny.en (converted from its wheel) and the tiny random language model."""
    return make_store(tmp_path_factory, "speech-store", {WHISPER_ID: whisper_tiny_dir, TINY_ID: tiny_model_dir})


# Model fixtures (SmolLM2 from its PyPI wheel, the tiny random model) live in their own module.
from model_fixtures import *  # noqa: E402,F403
