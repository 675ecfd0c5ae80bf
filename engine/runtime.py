"""Facts about the machine MLX runs on, and the choices that follow from them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# MLX's Linux CPU wheel links a slow reference BLAS; its sgemm calls resolve by symbol name, so a
# preloaded OpenBLAS replaces it (about 10x faster float32 matmuls on CPU).
OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
)
REEXEC_MARK = "SWAMA_OPENBLAS_PRELOADED"


def openblas_library() -> str | None:
    for path in OPENBLAS_CANDIDATES:
        if Path(path).exists():
            return path
    return None


def reexec_with_openblas(argv: list[str], module: str = "swama.handlers.cli") -> None:
    """Restart this process once with OpenBLAS preloaded, when it helps and is available.

    Only on Linux with the CPU backend; `SWAMA_OPENBLAS=0` turns it off.
    """
    if sys.platform != "linux" or os.environ.get("SWAMA_OPENBLAS", "1") == "0" or os.environ.get(REEXEC_MARK):
        return
    lib = openblas_library()
    if lib is None or "openblas" in os.environ.get("LD_PRELOAD", ""):
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    env[REEXEC_MARK] = "1"
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


def on_gpu() -> bool:
    import mlx.core as mx

    return mx.default_device() == mx.gpu


def compute_dtype():
    """float32 on the CPU (the fastest there by far); the model's own dtype on a GPU."""
    import mlx.core as mx

    return None if on_gpu() else mx.float32
