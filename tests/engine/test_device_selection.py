"""Which device and dtype the engine computes in, as flags and environment pick them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from swama.engine import runtime


def _serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swama.handlers.cli", "serve", "--port", "1", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SWAMA_MODELS": str(tmp_path), **env})


@pytest.mark.skipif(runtime.gpu_available(), reason="this machine has a GPU for MLX")
def test_asking_for_a_gpu_without_one_says_how_to_get_it(tmp_path: Path) -> None:
    for out in (_serve(tmp_path, "--device", "gpu"), _serve(tmp_path, SWAMA_BACKEND="cuda")):
        assert out.returncode == 2, out.stderr
        assert "error:" in out.stderr and ('pip install -e ".[cuda]"' in out.stderr or "no usable GPU" in out.stderr)


def test_an_unknown_dtype_or_device_is_refused_at_start(tmp_path: Path) -> None:
    out = _serve(tmp_path, SWAMA_DTYPE="fp8")
    assert out.returncode == 2 and "unknown dtype 'fp8'" in out.stderr
    out = _serve(tmp_path, SWAMA_DEVICE="tpu")
    assert out.returncode == 2 and "unknown device 'tpu'" in out.stderr
    out = _serve(tmp_path, "--dtype", "fp8")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_the_device_request_reads_flag_then_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWAMA_DEVICE", raising=False)
    monkeypatch.setenv("SWAMA_BACKEND", "cpu")
    assert runtime.requested_device() == "cpu"
    monkeypatch.setenv("SWAMA_BACKEND", "cuda")
    assert runtime.requested_device() == "gpu"
    monkeypatch.setenv("SWAMA_DEVICE", "cpu")  # --device wins over the install-time name
    assert runtime.requested_device() == "cpu" and not runtime.will_use_gpu()


def test_dtype_follows_the_device_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWAMA_DTYPE", raising=False)
    assert runtime.compute_dtype() == (mx.bfloat16 if runtime.on_gpu() else mx.float32)
    monkeypatch.setenv("SWAMA_DTYPE", "float16")
    assert runtime.compute_dtype() == mx.float16


def test_no_blas_restart_when_the_gpu_computes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The BLAS preload serves the CPU backend only: with the GPU chosen there is no restart."""
    calls: list[object] = []
    monkeypatch.setattr(runtime.os, "execve", lambda *a: calls.append(a))
    monkeypatch.delenv(runtime.REEXEC_MARK, raising=False)
    monkeypatch.setenv("SWAMA_OPENBLAS", "1")
    monkeypatch.setattr(runtime, "will_use_gpu", lambda: True)
    monkeypatch.setattr(runtime, "loaded_blas", lambda: None)
    monkeypatch.setattr(runtime, "fast_blas", lambda: runtime.Blas("openblas", "/lib/libopenblas.so.0"))
    runtime.reexec_with_fast_blas(["serve"])
    assert calls == []
    monkeypatch.setattr(runtime, "will_use_gpu", lambda: False)
    monkeypatch.setenv("LD_PRELOAD", "")
    runtime.reexec_with_fast_blas(["serve"])
    assert len(calls) == 1 and "libopenblas" in calls[0][2]["LD_PRELOAD"]
