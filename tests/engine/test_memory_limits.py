"""Memory-aware loads: a model that would not fit evicts idle models first (least recently used),
and is refused with a 503 saying how much it needs when the models in the way are busy. The limit
is simulated with --memory-limit; the estimate reads the safetensors headers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlx.core as mx
import pytest
from conftest import TINY_ID, make_store

from live_server import LiveServer, start_server
from swama.engine.errors import EngineError
from swama.engine.files.store import ModelStore
from swama.engine.serving.memory import model_bytes
from swama.engine.serving.pool import ModelPool
from swama.engine.settings import EngineSettings

OTHER = "test/tiny-qwen3-copy"
THIRD = "test/tiny-qwen3-third"


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return make_store(tmp_path_factory, "memory-store", {TINY_ID: tiny_model_dir, OTHER: tiny_model_dir,
                                                         THIRD: tiny_model_dir})


def test_the_estimate_counts_weights_at_the_dtype_they_are_computed_in(smollm2_dir: Path) -> None:
    stored = sum(p.stat().st_size for p in smollm2_dir.glob("*.safetensors"))
    as_stored, as_float32 = model_bytes(smollm2_dir, None), model_bytes(smollm2_dir, 4)
    assert 0.99 * stored < as_stored <= stored  # the header is all that is not counted
    # The folder holds one floating dtype (float32 on the CPU, bfloat16 on a GPU); cast to float32,
    # each weight takes 4 bytes.
    [dtype] = {w.dtype for w in mx.load(str(next(smollm2_dir.glob("*.safetensors")))).values()}
    # Every tensor is of that dtype: the byte counts scale exactly (whole numbers times 1/2, 1 or 2).
    assert as_float32 == 4 / dtype.size * as_stored
    assert model_bytes(smollm2_dir, 2) == 2 / dtype.size * as_stored


def test_a_load_that_does_not_fit_evicts_idle_models_first(store_root: Path, tiny_model_dir: Path) -> None:
    need = model_bytes(tiny_model_dir, 4)

    async def scenario() -> None:
        pool = ModelPool(ModelStore(store_root), EngineSettings(memory_limit=int(2.5 * need)), float_bytes=4)
        for name in (TINY_ID, OTHER):
            async with pool.use(name):
                pass
        assert sorted(pool.loaded()) == sorted([TINY_ID, OTHER])
        async with pool.use(OTHER):
            pass  # OTHER is now the most recently used
        async with pool.use(THIRD):
            assert sorted(pool.loaded()) == sorted([OTHER, THIRD])  # the least recently used went
        await pool.close()

    asyncio.run(scenario())


def test_a_load_blocked_by_busy_models_is_a_503_naming_the_need(store_root: Path, tiny_model_dir: Path) -> None:
    need = model_bytes(tiny_model_dir, 4)

    async def scenario() -> None:
        pool = ModelPool(ModelStore(store_root), EngineSettings(memory_limit=int(1.5 * need)), float_bytes=4)
        async with pool.use(TINY_ID):
            with pytest.raises(EngineError) as refused:
                async with pool.use(OTHER):
                    pass
        error = refused.value
        assert error.status == 503 and error.code == "insufficient_memory" and error.headers == {"Retry-After": "1"}
        assert f"Not enough memory to load model '{OTHER}'" in error.message
        assert f"the loaded models ({TINY_ID}) are busy" in error.message
        assert pool.loaded() == [TINY_ID]  # nothing half loaded
        async with pool.use(OTHER):  # once TINY_ID is idle it makes room
            assert pool.loaded() == [OTHER]
        await pool.close()

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def small_server(store_root: Path) -> Iterator[LiveServer]:
    live = start_server(store_root, store_root.parent / "memory-server.log", "--memory-limit", "100000")
    yield live
    live.stop()


@pytest.mark.parametrize("path", ["/chat/completions", "/decisions"])
def test_a_model_larger_than_the_limit_gets_a_clear_503(small_server: LiveServer, path: str) -> None:
    body = ({"model": TINY_ID, "messages": [{"role": "user", "content": "hi"}]} if path == "/chat/completions" else
            {"model": TINY_ID, "input": "x", "questions": [{"type": "predicate", "name": "q", "instructions": "Is it?"}]})
    r = httpx.post(small_server.v1 + path, json=body, timeout=60)
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    message = r.json()["error"]["message"]
    assert message.startswith(f"Not enough memory to load model '{TINY_ID}'")
    assert "of the --memory-limit" in message and "use a smaller (quantized) model" in message


def test_the_messages_route_calls_it_overloaded(small_server: LiveServer) -> None:
    r = httpx.post(small_server.v1 + "/messages", timeout=60, json={
        "model": TINY_ID, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "overloaded_error"
    assert r.json()["error"]["message"].startswith(f"Not enough memory to load model '{TINY_ID}'")


@pytest.mark.parametrize(("args", "env", "flag"), [(["--batch-rows", "0"], {}, "--batch-rows"),
                                                   ([], {"SWAMA_PREFILL_STEP": "0"}, "--prefill-step"),
                                                   (["--memory-limit", "-5"], {}, "--memory-limit")])
def test_serve_refuses_limits_that_could_never_serve(tmp_path: Path, args: list[str], env: dict, flag: str) -> None:
    out = subprocess.run([sys.executable, "-m", "swama.handlers.cli", "serve", "--port", "1", *args],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SWAMA_MODELS": str(tmp_path), **env})
    assert out.returncode == 2 and f"error: {flag} must be at least 1" in out.stderr


def test_running_out_of_memory_is_a_503_and_nothing_else_is() -> None:
    """What NumPy raises for an allocation past the host's memory, and the way MLX's and CUDA's
    allocators word it (the engine process hands those over as Failed), answer 503 with what ran out;
    other failures stay what they are."""
    import numpy as np

    from swama.engine.errors import Failed, out_of_memory

    with pytest.raises(MemoryError) as raised:
        np.empty(1 << 60, dtype=np.uint8)  # an exbibyte: no host has it
    for exc in (raised.value, RuntimeError("[cuda::malloc] Failed to allocate 8589934592 bytes"),
                Failed("RuntimeError: CUDA error: out of memory", code="engine_error")):
        oom = out_of_memory(exc)
        assert oom is not None and oom.status == 503 and oom.code == "insufficient_memory", exc
        assert "ran out of memory" in oom.message and "goes on serving" in oom.message
    for exc in (RuntimeError("shape mismatch"), ValueError("out of memory"), Failed("ZeroDivisionError: x")):
        assert out_of_memory(exc) is None, exc
