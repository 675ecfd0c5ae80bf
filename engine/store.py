"""The local model store: where installed models live and how they are listed.

Layout: {root}/{org}/{model}/ (or {root}/{model}/), each installed model carrying a
`.swama-meta.json` written last, so a folder without it is not (yet) a model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

META = ".swama-meta.json"


@dataclass(frozen=True)
class InstalledModel:
    id: str
    path: Path
    size_in_bytes: int
    created: int


def _read_meta(folder: Path) -> InstalledModel | None:
    try:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
        return InstalledModel(id=str(meta["id"]), path=folder, size_in_bytes=int(meta.get("size_in_bytes", 0)),
                              created=int(meta.get("created", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def list_installed(root: Path) -> list[InstalledModel]:
    """Installed models under `root`, sorted by id; unreadable or half-written folders are skipped."""
    found: dict[str, InstalledModel] = {}
    if not root.is_dir():
        return []
    for meta in sorted([*root.glob(f"*/{META}"), *root.glob(f"*/*/{META}")]):
        model = _read_meta(meta.parent)
        if model is not None:
            found.setdefault(model.id, model)
    return sorted(found.values(), key=lambda m: m.id.lower())
