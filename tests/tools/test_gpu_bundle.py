"""What the offline GPU bundles carry (tools/gpu_bundle.py, used by tools/gpu.sh bundle)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tools.gpu_bundle import RUNTIME_LEAVES_OUT, Requirement, normalized, reach, requirements, runtime_wheels

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu.sh"
TEST_ONLY = {"openai", "anthropic", "schemathesis", "playwright", "cloudflare", "clef-evals",
             "datamodel-code-generator", "typesafe-sdk", "pytest", "build", "torch", "accelerate", "ray", "mkl",
             "ruff"}


def names(reqs: list[str]) -> set[str]:
    return {normalized(Requirement(r).name) for r in reqs}


def test_the_runtime_bundle_has_the_server_and_cuda_and_nothing_of_the_test_suite() -> None:
    runtime, full = requirements("runtime"), requirements("full")
    cuda = {Requirement(r).name for r in runtime if "cuda13" in Requirement(r).extras}
    assert cuda == {"mlx", "mlx-lm"} and {"fastapi", "uvicorn", "mlx-lm", "llguidance"} <= names(runtime)
    assert not names(runtime) & (TEST_ONLY | {"lm-eval"} | set(RUNTIME_LEAVES_OUT))
    assert set(runtime) < set(full)
    assert TEST_ONLY <= names(full) and "lm-eval" not in names(full)  # lm-eval is source only
    # tools/gpu.sh prints the same lists
    shown = subprocess.run(["bash", str(SCRIPT), "requirements", "runtime"], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHON": sys.executable}).stdout.splitlines()
    assert shown == runtime


def test_reach_follows_extras_and_markers_and_stops_at_what_is_left_out() -> None:
    requires = {
        "app": ["lib[gpu]>=1", "tts; extra == 'speech'", "old; python_version < '3.10'", "win; sys_platform == 'win32'"],
        "lib": ["core", "cuda-lib; extra == 'gpu'", "cpu-lib; extra == 'cpu'"],
        "core": [], "cuda-lib": ["core"],
        "server": ["heavy", "core"], "heavy": ["only-heavy", "core"], "only-heavy": [],
    }
    assert reach(requires, ["app", "server"], {"heavy"}) == {"app", "lib", "core", "cuda-lib", "server"}
    assert reach(requires, ["lib", "lib[gpu]"], ()) == {"lib", "core", "cuda-lib"}


def _wheel(folder: Path, name: str, requires: list[str]) -> Path:
    path = folder / f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
        wheel.writestr(f"{name.replace('-', '_')}-1.0.dist-info/METADATA",
                       f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{meta}\nRequires-Dist: in the body\n")
    return path


def test_runtime_wheels_leave_out_what_only_left_out_packages_need(tmp_path: Path, monkeypatch) -> None:
    import tools.gpu_bundle as gpu_bundle

    monkeypatch.setattr(gpu_bundle, "requirements", lambda kind: ["vlm", "Server_Kit"])
    vlm = _wheel(tmp_path, "vlm", ["datasets", "numpy"])
    server = _wheel(tmp_path, "server-kit", ["numpy"])
    numpy = _wheel(tmp_path, "numpy", [])
    datasets = _wheel(tmp_path, "datasets", ["dill", "numpy"])
    dill = _wheel(tmp_path, "dill", [])
    kept, left = runtime_wheels(tmp_path)
    assert sorted(kept) == sorted([vlm, server, numpy]) and sorted(left) == sorted([datasets, dill])
