"""The tuned BLAS swama preloads on a Linux CPU: MKL from its wheel when installed (no root needed),
else the system OpenBLAS, and the note a user on MLX's bundled reference BLAS gets at start. A server that
computes on a GPU needs none of it: it neither restarts to preload a BLAS nor prints the note."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TINY_ID, make_store
from precision import ON_GPU

from live_server import LiveServer, start_server
from swama.engine import runtime

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="BLAS preloading is a Linux CPU matter"),
              pytest.mark.slow]
needs_mkl = pytest.mark.skipif(runtime.pip_mkl() is None, reason="the mkl wheel is not installed")


def test_the_choice_follows_swama_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAMA_BLAS", "bundled")
    assert runtime.fast_blas() is None
    monkeypatch.setenv("SWAMA_BLAS", "openblas")
    assert runtime.fast_blas() == runtime.system_openblas()
    monkeypatch.setenv("SWAMA_BLAS", "auto")
    assert runtime.fast_blas() == (runtime.pip_mkl() or runtime.system_openblas())


@needs_mkl
def test_mkl_from_its_wheel_brings_what_it_loads_by_name() -> None:
    blas = runtime.pip_mkl()
    assert blas is not None and Path(blas.library).name.startswith("libmkl_rt.so.")
    folder = str(Path(blas.library).parent)
    assert blas.env["LD_LIBRARY_PATH"].split(":")[0] == folder
    assert (Path(folder) / "libmkl_core.so.3").exists() or any(Path(folder).glob("libmkl_core.so.*"))
    assert blas.env["MKL_THREADING_LAYER"] in ("INTEL", "GNU", "SEQUENTIAL")


def _mapped(server: LiveServer) -> str:
    return Path(f"/proc/{server.process.pid}/maps").read_text()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return make_store(tmp_path_factory, "blas-store", {TINY_ID: tiny_model_dir})


# A server started as a user starts it: nothing preloaded, so it re-executes itself with the BLAS
# SWAMA_BLAS names (the test process itself runs with the system OpenBLAS preloaded).
CLEAN = {"LD_PRELOAD": "", "SWAMA_OPENBLAS": "1", runtime.REEXEC_MARK: ""}


@contextlib.contextmanager
def _serve(store: Path, choice: str, **extra: str) -> Iterator[LiveServer]:
    server = start_server(store, store.parent / f"blas-{choice}.log", env={**CLEAN, "SWAMA_BLAS": choice, **extra})
    try:
        yield server
    finally:
        server.stop()


def _assert_no_blas_work(server: LiveServer) -> None:
    """On a GPU (which the servers here choose as this process did, from the same environment) the
    BLAS serves nothing the model computes: no restart with a preload, no MKL mapped, no note."""
    environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
    assert f"{runtime.REEXEC_MARK}=1".encode() not in environ
    assert "libmkl_rt" not in _mapped(server)
    assert "bundled reference BLAS" not in server.log.read_text(errors="replace")


def _reply(server: LiveServer) -> str:
    r = httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": TINY_ID, "messages": [{"role": "user", "content": "Say something."}],
        "temperature": 0, "max_tokens": 8})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@needs_mkl
def test_a_server_without_system_openblas_preloads_mkl_and_answers_alike(store: Path) -> None:
    replies = {}
    for choice in ("mkl", "bundled"):
        with _serve(store, choice) as server:
            mapped = _mapped(server)
            log = server.log.read_text(errors="replace")
            if ON_GPU:
                _assert_no_blas_work(server)
            elif choice == "mkl":
                assert "libmkl_rt" in mapped and "libopenblas" not in mapped
                assert "bundled reference BLAS" not in log
            else:
                assert "libmkl_rt" not in mapped and "libopenblas" not in mapped
                # Said once, at start, with the commands that fix it.
                assert log.count("bundled reference BLAS") == 1
                assert "pip install mkl" in log and "apt-get install libopenblas0-pthread" in log
            replies[choice] = _reply(server)
    assert replies["mkl"] == replies["bundled"]


@pytest.mark.parametrize("choice", ["auto", "openblas"])
def test_auto_prefers_mkl_and_openblas_can_be_asked_for(store: Path, choice: str) -> None:
    """auto: MKL's wheel when installed (faster decode steps), else the system OpenBLAS."""
    if runtime.system_openblas() is None:
        pytest.skip("no system OpenBLAS here")
    with _serve(store, choice) as server:
        if ON_GPU:
            _assert_no_blas_work(server)
        else:
            mapped = _mapped(server)
            mkl = choice == "auto" and runtime.pip_mkl() is not None
            assert ("libmkl_rt" in mapped) == mkl and ("libopenblas" in mapped) == (not mkl)
            assert "bundled reference BLAS" not in server.log.read_text(errors="replace")
        assert _reply(server)


def test_swama_openblas_0_keeps_the_process_as_started(store: Path) -> None:
    with _serve(store, "auto", SWAMA_OPENBLAS="0") as server:
        if ON_GPU:
            _assert_no_blas_work(server)
            return
        mapped = _mapped(server)
        assert "libmkl_rt" not in mapped and "libopenblas" not in mapped
        assert server.log.read_text(errors="replace").count("bundled reference BLAS") == 1
