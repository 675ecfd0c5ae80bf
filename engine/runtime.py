"""Facts about the machine MLX runs on, and the choices that follow from them."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from swama.engine.settings import RuntimeSettings, read

# MLX's Linux CPU wheel links a slow reference BLAS; its sgemm calls resolve by symbol name, so a
# preloaded BLAS with the standard cblas symbols replaces it (10-30x faster float32 matmuls on CPU):
# Intel's MKL from its PyPI wheel (`pip install mkl`, no root needed), else the system's OpenBLAS.
OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
)
REEXEC_MARK = "SWAMA_BLAS_PRELOADED"
SLOW_BLAS_NOTE = (
    "note: MLX is using its bundled reference BLAS, about 10x slower on the CPU than a tuned one. "
    "Fix: pip install mkl (no root needed, and the faster one), or sudo apt-get install libopenblas0-pthread "
    "(Debian/Ubuntu); swama preloads either automatically at the next start."
)


def _settings() -> RuntimeSettings:
    """The process-wide choices, read from the environment each time (flags are put there)."""
    return read(RuntimeSettings)


@dataclass(frozen=True)
class Blas:
    name: str  # "openblas" or "mkl"
    library: str  # the shared library to preload
    env: dict[str, str] = field(default_factory=dict)  # what it needs beside LD_PRELOAD


def openblas_library() -> str | None:
    for path in OPENBLAS_CANDIDATES:
        if Path(path).exists():
            return path
    return None


def system_openblas() -> Blas | None:
    lib = openblas_library()
    return Blas("openblas", lib) if lib else None


def pip_mkl() -> Blas | None:
    """MKL from the `mkl` wheel, when it is installed in this environment."""
    import ctypes.util
    import importlib.metadata

    try:
        files = importlib.metadata.distribution("mkl").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if re.fullmatch(r"libmkl_rt\.so\.\d+", file.name):
            lib = Path(str(file.locate())).resolve()
            if lib.is_file():
                break
    else:
        return None
    # libmkl_rt loads its kernels and threading layer by name from its own folder; the threading
    # layer follows the OpenMP runtime at hand (intel-openmp's beside it, else the GNU one).
    if (lib.parent / "libiomp5.so").exists():
        layer = "INTEL"
    elif ctypes.util.find_library("gomp"):
        layer = "GNU"
    else:
        layer = "SEQUENTIAL"
    paths = ":".join(p for p in (str(lib.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    return Blas("mkl", str(lib), {"LD_LIBRARY_PATH": paths, "MKL_THREADING_LAYER": layer})


def fast_blas() -> Blas | None:
    """The BLAS to preload: `SWAMA_BLAS` picks one. auto: MKL's wheel when it is installed, else the
    system OpenBLAS. MKL goes first because it serves a model faster: its small-row matmuls, which
    every decode step is made of, decode 1.3-2.0x faster than OpenBLAS's (`tools.bench.blas`)."""
    choice = _settings().blas
    if choice == "bundled":
        return None
    if choice == "openblas":
        return system_openblas()
    if choice == "mkl":
        return pip_mkl()
    return pip_mkl() or system_openblas()


def loaded_blas() -> str | None:
    """The tuned BLAS mapped into this process ("openblas", "mkl"), or None (MLX's bundled one)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for name, marker in (("mkl", "libmkl_rt"), ("openblas", "libopenblas")):
        if marker in maps:
            return name
    return None


def slow_blas_note() -> str | None:
    """What to tell a Linux CPU user whose MLX runs on its bundled reference BLAS (None otherwise)."""
    if sys.platform != "linux" or on_gpu() or loaded_blas() is not None:
        return None
    return SLOW_BLAS_NOTE


def keep_torch_out() -> None:
    """Have transformers take PyTorch as not installed in this process, as in swama's own install (no
    dependency of swama's needs it). transformers imports PyTorch whenever it is installed, from the
    configuration and tokenizer modules every model load reads: where it happens to be installed (a
    machine-learning environment, the test environment) that was 4-5 s of imports in each server,
    engine and rank process, and image processors other than those a plain install runs.

    While transformers first asks whether PyTorch is installed (its answer is cached for the process),
    PyTorch is marked missing; the mark then goes, since other libraries read sys.modules["torch"] as
    the module itself (SciPy's array-API checks). Called first by each process entry point; a process
    that has imported PyTorch already keeps it."""
    if "torch" in sys.modules:
        return
    sys.modules["torch"] = None  # what importlib reads as "not installed"
    try:
        from transformers.utils.import_utils import is_torch_available

        is_torch_available()
    except ImportError:  # no transformers: nothing imports PyTorch for swama
        pass
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


def reexec_with_fast_blas(argv: list[str], module: str = "swama.handlers.cli") -> None:
    """Restart this process once with a tuned BLAS preloaded, when it helps and one is available.

    Only on Linux; `SWAMA_OPENBLAS=0` turns it off, `SWAMA_BLAS` picks which one.
    """
    if sys.platform != "linux" or not _settings().openblas or os.environ.get(REEXEC_MARK):
        return
    if will_use_gpu():  # the BLAS serves the CPU backend only
        return
    blas = fast_blas()
    if blas is None or loaded_blas() is not None or blas.library in os.environ.get("LD_PRELOAD", ""):
        return
    env = {**os.environ, **blas.env}
    env["LD_PRELOAD"] = ":".join(p for p in (blas.library, env.get("LD_PRELOAD", "")) if p)
    env[REEXEC_MARK] = "1"
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


# Distributions that ship a GPU build of libmlx (one MLX backend per environment).
GPU_BUILDS = ("mlx-cuda-13", "mlx-cuda-12", "mlx-metal")


def requested_device() -> str:
    """The device asked for: `SWAMA_DEVICE` (what `--device` sets: auto, gpu, cpu), else
    `SWAMA_BACKEND` (cuda or cpu, the install-time name), else auto."""
    return _settings().requested_device


def gpu_build() -> str | None:
    """The installed GPU build of MLX (for example "mlx-cuda-13"), without importing MLX."""
    import importlib.metadata

    for name in GPU_BUILDS:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return name
    return None


def gpu_available() -> bool:
    """Whether MLX has a GPU to run on here (a GPU build and a device it can open)."""
    if gpu_build() is None:
        return False
    import mlx.core as mx

    try:
        return bool(mx.is_available(mx.gpu))
    except Exception:  # a GPU build without a usable driver
        return False


def gpu_count() -> int:
    """How many GPUs MLX can open here (those CUDA_VISIBLE_DEVICES leaves visible); 0 without a GPU build."""
    if gpu_build() is None:
        return 0
    import mlx.core as mx

    try:
        return int(mx.device_count(mx.gpu))
    except Exception:  # a GPU build without a usable driver
        return 0


def no_gpu_message() -> str:
    if gpu_build() is None:
        return ("no GPU backend is installed: MLX here is the CPU build. On an NVIDIA machine install "
                "the CUDA build: pip install -e \".[cuda]\" (it replaces mlx[cpu]).")
    return f"{gpu_build()} is installed but MLX finds no usable GPU (is the NVIDIA driver loaded?)."


def will_use_gpu() -> bool:
    """Whether this process computes on the GPU, decided from the request and the machine."""
    choice = requested_device()
    if choice == "cpu":
        return False
    return gpu_available()


def requested_dtype() -> str:
    return _settings().dtype


_ACTIVE: str | None = None


def activate_device() -> str:
    """Make the chosen device MLX's default, once per process ("gpu" or "cpu"). Asking for the GPU
    where there is none is an error that says how to get one."""
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    import mlx.core as mx

    choice = requested_device()
    requested_dtype()
    if choice == "gpu" and not gpu_available():
        raise RuntimeError(no_gpu_message())
    device = "gpu" if choice != "cpu" and gpu_available() else "cpu"
    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    _ACTIVE = device
    return device


def on_gpu() -> bool:
    return activate_device() == "gpu"


def compute_dtype():
    """The dtype floating weights are cast to at load: bfloat16 on a GPU (half the memory traffic of
    float32, with float32's range), float32 on the CPU (the fastest there by far: its 16-bit matmuls
    have no tuned kernels). `SWAMA_DTYPE` (float32, bfloat16, float16) overrides; "auto" is the default."""
    import mlx.core as mx

    choice = requested_dtype()
    if choice == "auto":
        choice = "bfloat16" if on_gpu() else "float32"
    return getattr(mx, choice)


def available_bytes() -> int | None:
    """Memory free for a model: the GPU's free memory when models compute there, else what the
    system can give without swapping (MemAvailable); None where it is not known."""
    if on_gpu():
        return _gpu_free_bytes()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _gpu_free_bytes() -> int | None:
    import mlx.core as mx

    info = mx.device_info()
    free = info.get("free_memory")
    if isinstance(free, int):
        return free
    total = info.get("total_memory", info.get("memory_size"))
    return total - mx.get_active_memory() if isinstance(total, int) else None
