"""The local model store: where installed models live, and installing them atomically.

Layout: {root}/{org}/{model}/ (or {root}/{model}/). A model counts as installed only once its
`.swama-meta.json` exists, and that file is written inside a staging folder that is renamed into
place as the very last step: an interrupted or failed install leaves no model behind.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swama.engine.errors import ModelNotInstalled, StoreError
from swama.engine.files import aliases
from swama.engine.files.kinds import kind_of

META = ".swama-meta.json"
STAGING = ".staging"
CONVERSION_KEYS = ("gguf", "converted_to")  # what ImportSummary.card() records
DOWNLOADS = ".downloads"


@dataclass(frozen=True)
class InstalledModel:
    id: str
    path: Path
    size_in_bytes: int
    created: int
    source: str = ""
    kind: str = "language"  # files/kinds.py: language, vision, embedding, speech-to-text, ...
    # What a conversion recorded: the GGUF file's architecture, quantization and tensor types, and
    # what they were converted to (empty for models installed as they were published).
    conversion: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    base: str | None = None  # a LoRA adapter's base model (engine/adapters/); None for a model


def _read_meta(folder: Path) -> InstalledModel | None:
    try:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
        # Models installed before kinds were recorded get theirs from their config.
        kind = str(meta.get("kind") or kind_of(folder))
        return InstalledModel(id=str(meta["id"]), path=folder, size_in_bytes=int(meta.get("size_in_bytes", 0)),
                              created=int(meta.get("created", 0)), source=str(meta.get("source", "")), kind=kind,
                              conversion={k: meta[k] for k in CONVERSION_KEYS if k in meta},
                              base=str(meta["base"]) if meta.get("base") else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != META)


def list_installed(root: Path) -> list[InstalledModel]:
    """Installed models under `root`, sorted by id; half-written and unreadable folders are skipped."""
    found: dict[str, InstalledModel] = {}
    if not root.is_dir():
        return []
    for meta in sorted([*root.glob(f"*/{META}"), *root.glob(f"*/*/{META}")]):
        if any(part.startswith(".") for part in meta.relative_to(root).parts[:-1]):
            continue  # staging and download folders
        model = _read_meta(meta.parent)
        if model is not None:
            found.setdefault(model.id, model)
    return sorted(found.values(), key=lambda m: m.id.lower())


def _signature(root: Path) -> tuple[tuple[str, int], ...]:
    """What changes when a model is installed or removed under `root`: the modification times of the
    root and of its folders two levels down (a model folder appears, goes, or gets its metadata)."""
    seen = []
    try:
        with os.scandir(root) as top:
            seen.append((str(root), root.stat().st_mtime_ns))
            for entry in top:
                if entry.is_dir(follow_symlinks=False):
                    seen.append((entry.path, entry.stat().st_mtime_ns))
                    with os.scandir(entry.path) as inner:
                        seen += [(e.path, e.stat().st_mtime_ns) for e in inner if e.is_dir(follow_symlinks=False)]
    except OSError:
        return ()
    return tuple(seen)


class ModelStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        # The last listing and the signature it was read at: a server asks for a model several times
        # a request, and the store changes only when a model is installed or removed.
        self._listed: tuple[tuple[tuple[str, int], ...], list[InstalledModel], dict[str, InstalledModel]] | None = None

    def folder_for(self, repo_id: str) -> Path:
        parts = [p for p in repo_id.split("/") if p]
        if not parts or len(parts) > 2 or any(p in (".", "..") or p.startswith(".") for p in parts):
            raise StoreError(f"'{repo_id}' is not a valid model id (expected 'org/model' or 'model').")
        return self.root.joinpath(*parts)

    def _listing(self) -> tuple[list[InstalledModel], dict[str, InstalledModel]]:
        signature = _signature(self.root)
        listed = self._listed
        if listed is None or listed[0] != signature or not signature:
            models = list_installed(self.root)
            listed = self._listed = (signature, models, {m.id.lower(): m for m in reversed(models)})
        return listed[1], listed[2]

    def list(self) -> list[InstalledModel]:
        return list(self._listing()[0])

    def find(self, name: str) -> InstalledModel | None:
        """An installed model by alias or id, case-insensitively."""
        installed = self._listing()[1]
        for wanted in aliases.installed_ids(name):
            if wanted in installed:
                return installed[wanted]
        return None

    def get(self, name: str) -> InstalledModel:
        model = self.find(name)
        if model is None:
            raise ModelNotInstalled(name)
        return model

    def staging_folder(self) -> Path:
        folder = self.root / STAGING / uuid.uuid4().hex
        folder.mkdir(parents=True)
        return folder

    def download_folder(self, repo_id: str) -> Path:
        """A stable per-model folder for resumable downloads (kept across interrupted pulls)."""
        folder = self.root / DOWNLOADS / repo_id.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def install(self, repo_id: str, build: Callable[[Path], None], source: str,
                card: dict[str, Any] | None = None) -> InstalledModel:
        """Run `build(staging)` and move the result into place atomically; `card` (filled in by
        `build`, e.g. what a conversion turned into what) joins the stored model card."""
        target = self.folder_for(repo_id)
        staging = self.staging_folder()
        try:
            build(staging)
            meta = {"id": repo_id, "object": "model", "created": int(time.time()), "owned_by": "swama",
                    "size_in_bytes": folder_size(staging), "path": str(target), "source": source,
                    "kind": kind_of(staging), **(card or {})}
            (staging / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            target.parent.mkdir(parents=True, exist_ok=True)
            old = None
            if target.exists():
                old = self.root / STAGING / f"old-{uuid.uuid4().hex}"
                os.replace(target, old)
            os.replace(staging, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        installed = _read_meta(target)
        assert installed is not None
        return installed

    def remove(self, name: str) -> InstalledModel:
        model = self.get(name)
        # Un-install first (the meta file goes), then delete: a crash midway leaves no half model listed.
        trash = self.root / STAGING / f"rm-{uuid.uuid4().hex}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.replace(model.path, trash)
        shutil.rmtree(trash, ignore_errors=True)
        parent = model.path.parent
        if parent != self.root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
        return model
