"""Helpers shared by the side-by-side benchmarks in tools/ (bench_*.py).

A benchmark starts each server in turn as a child process on a free loopback port, with one
explicit environment for all of them, measures it, and stops it before starting the next one.
The results go to docs/benchmarks.md, one `## ` section per benchmark.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

from swama.engine.runtime import fast_blas

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS_MD = REPO_ROOT / "docs" / "benchmarks.md"
BENCHMARKS_HEADER = (
    "# Benchmarks\n\n"
    "Every comparison here is a ratio measured side by side, in one run on one machine, by the tool "
    "named in its section; the absolute figures next to it only give the scale on that machine. "
    "Rerun the tool to refresh a section.\n"
)
SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The same candidates swama itself looks at (swama.engine.runtime).


# ---------------------------------------------------------------------------------------------
# Model folders


def test_cache_dir() -> Path:
    """Where the test suite caches its model folders (SWAMA_TEST_CACHE, else .cache/test-models)."""
    return Path(os.environ.get("SWAMA_TEST_CACHE") or REPO_ROOT / ".cache" / "test-models")


def default_model_dir() -> Path | None:
    """The SmolLM2 MLX folder the test suite caches, when it is there."""
    folder = test_cache_dir() / "smollm2-mlx"
    return folder if (folder / "config.json").is_file() else None


def missing_model_message() -> str:
    return ("No model folder given and no test cache found. Run `swama pull smollm2`, then pass "
            f"--model-dir ~/.swama/models/{SMOLLM2_ID}")


def _link_or_copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=False)
        return
    try:
        os.symlink(src.resolve(), dst)
    except OSError:
        shutil.copy2(src, dst)


def model_files(folder: Path) -> list[Path]:
    """The files of a model folder, without swama's own metadata."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".swama"))


def build_store(root: Path, model_dir: Path, repo_id: str = SMOLLM2_ID) -> Path:
    """A swama model store at `root` holding `model_dir` as `repo_id` (files linked, not copied)."""
    from swama.engine.files.store import ModelStore

    def build(staging: Path) -> None:
        for src in model_files(model_dir):
            _link_or_copy(src, staging / src.name)

    ModelStore(root).install(repo_id, build, source=f"local:{model_dir}")
    return root


def safetensors_dtype_bytes(folder: Path) -> dict[str, int]:
    """Bytes per tensor dtype in a folder's safetensors files, read from their headers only."""
    totals: dict[str, int] = {}
    for path in folder.glob("*.safetensors"):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for key, info in header.items():
            if key != "__metadata__":
                start, end = info["data_offsets"]
                totals[info["dtype"]] = totals.get(info["dtype"], 0) + end - start
    return totals


def floating_dtype(folder: Path) -> str:
    """The dtype of most floating weights, in MLX spelling ("float16", "bfloat16", "float32")."""
    names = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
    floating = {names[k]: v for k, v in safetensors_dtype_bytes(folder).items() if k in names}
    return max(floating, key=floating.__getitem__) if floating else "unknown"


def write_float32_copy(src: Path, dst: Path) -> Path:
    """A copy of the model folder `src` in `dst` whose floating weights are float32."""
    import mlx.core as mx

    dst.mkdir(parents=True, exist_ok=True)
    for path in model_files(src):
        if path.suffix != ".safetensors":
            _link_or_copy(path, dst / path.name)
            continue
        weights, metadata = mx.load(str(path), return_metadata=True)
        weights = {k: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v
                   for k, v in weights.items()}
        mx.save_safetensors(str(dst / path.name), weights, metadata=metadata)
        del weights
    config = dst / "config.json"
    if config.is_symlink() or config.exists():
        data = json.loads(config.read_text(encoding="utf-8"))
        data["torch_dtype"] = "float32"
        config.unlink()
        config.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return dst


def temp_dir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix=prefix)


# ---------------------------------------------------------------------------------------------
# Environment and machine facts


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """One environment for every server: a tuned BLAS (swama's own choice: MKL's wheel, else the system
    OpenBLAS) preloaded explicitly when present, and swama's own re-exec turned off so that nothing
    differs between the servers behind our back."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    blas = fast_blas()
    if blas is not None and sys.platform == "linux":
        env.update(blas.env)
        env["LD_PRELOAD"] = blas.library
    env["SWAMA_OPENBLAS"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def blas_name(blas: Any) -> str:
    """The preloaded BLAS by library and version, never by a path of this machine."""
    if blas.name == "mkl":
        return f"MKL {package_version('mkl')} (the mkl wheel)"
    import ctypes

    try:
        config = ctypes.CDLL(blas.library).openblas_get_config
        config.restype = ctypes.c_char_p
        return f"{config().decode().split()[0]} {config().decode().split()[1]} (the system's OpenBLAS)"
    except (OSError, AttributeError, IndexError):
        return "OpenBLAS (the system's)"


def machine_facts() -> dict[str, str]:
    from swama.engine.runtime import will_use_gpu

    chosen = fast_blas() if server_env().get("LD_PRELOAD") else None
    blas = f"yes: {blas_name(chosen)}" if chosen else "no (MLX's bundled reference BLAS)"
    if will_use_gpu():
        blas = "not in the path (models compute on the GPU)"
    return {
        "cpus": str(os.cpu_count()),
        "platform": platform.platform(),
        "processor": _cpu_model() or platform.machine(),
        "python": platform.python_version(),
        "mlx": package_version("mlx"),
        "mlx-lm": package_version("mlx-lm"),
        "blas preloaded": blas,
    }


def gpu_facts() -> dict[str, str]:
    """The GPU the models run on, as nvidia-smi names it (nothing when they run on the CPU)."""
    from swama.engine.runtime import gpu_build, will_use_gpu

    if not will_use_gpu():
        return {}
    name = "unknown"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30).stdout.strip().splitlines()
            name = f"{len(out)} x {out[0]}" if out else name
        except (OSError, subprocess.SubprocessError):
            pass
    return {"gpu": f"{name} ({gpu_build()})"}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------------------------
# Servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def on_cpus(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A child process's `preexec_fn` that keeps it (and whatever it starts) on `cpus`; None for all."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


@dataclass
class Server:
    """A server child process: started on enter, stopped (terminate, then kill) on exit."""

    name: str
    argv: Sequence[str]
    port: int
    health_path: str
    env: dict[str, str] = field(default_factory=server_env)
    start_timeout: float = 120.0
    stop_timeout: float = 15.0
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    cpus: frozenset[int] | None = None  # the CPUs it (and the processes it starts) may run on: all when None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{self.name}-", suffix=".log")
        self.proc = subprocess.Popen(list(self.argv), env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=REPO_ROOT, preexec_fn=on_cpus(self.cpus))
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + self.health_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} did not answer within {self.start_timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.close()
            self.log = None

    def cpu_seconds(self) -> float | None:
        """User plus system CPU time the server process has used so far (Linux only)."""
        if self.proc is None:
            return None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, lines: int = 30) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        text = Path(self.log.name).read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# Figures and reports


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def facts_lines(facts: dict[str, str]) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in facts.items())


def today() -> str:
    return dt.date.today().isoformat()


def replace_section(text: str, title: str, body: str) -> str:
    """`text` with its `## title` section (up to the next `## ` heading) replaced by `body`, or
    with the section appended when it is not there."""
    heading = f"## {title}"
    section = f"{heading}\n\n{body.strip()}\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        return text.rstrip() + "\n\n" + section
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    rest = "".join(lines[end:])
    return "".join(lines[:start]) + section + ("\n" + rest if rest else "")


def write_section(path: Path, title: str, body: str) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else BENCHMARKS_HEADER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_section(text, title, body), encoding="utf-8")


def add_write_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write", type=Path, nargs="?", const=BENCHMARKS_MD, default=None,
                        help="record the result in docs/benchmarks.md (or the file given)")


def publish(title: str, body: str, write: Path | None) -> None:
    """Print a benchmark's section, and record it in `write` (a benchmarks file) when given."""
    print(body)
    if write is not None:
        write_section(write, title, body)
        print(f"\nwrote the '{title}' section of {write}")


def resolve_model_dir(given: Path | None) -> tuple[Path, str]:
    """The model folder a bench serves (--model-dir, else the SmolLM2 test model) and the id it is installed as."""
    folder = given.expanduser() if given is not None else default_model_dir()
    if folder is None:
        raise SystemExit(missing_model_message())
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{folder} is not an MLX model folder (no config.json). " + missing_model_message())
    default = default_model_dir()
    same = default is not None and folder.resolve() == default.resolve()
    return folder.resolve(), SMOLLM2_ID if same or given is None else "bench/model"
