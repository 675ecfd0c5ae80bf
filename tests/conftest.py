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

