"""tools.bench.adapters on the tiny model with tiny settings: every run of its table, each against the base
and the merged weights, recorded where --write says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from swama.engine.runtime import REEXEC_MARK
from tools.bench import adapters


def test_the_table_has_every_run(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REEXEC_MARK, "1")  # in this process: no restart with another BLAS
    written = tmp_path / "benchmarks.md"
    assert adapters.main(["--model-dir", str(tiny_model_dir), "--rows", "8", "--context", "8", "--steps", "2",
                          "--repeats", "1", "--rank", "4", "--write", str(written)]) == 0
    out = capsys.readouterr().out
    names = ["base, no adapters", "base rows beside 4 loaded adapters", "1 adapter (every row)",
             "4 adapters (2 rows each)", "merged: 1 adapter fused into the weights (mlx-lm's fuse)"]
    for name in names:
        assert re.search(rf"^\| {re.escape(name)} \| [0-9,.]+ \| [0-9,.]+-[0-9,.]+ \| [0-9.]+x \| [0-9.]+x \|$", out, re.M), name
    assert "| base, no adapters | " in out and "1.00x" in out
    assert f"## {adapters.TITLE}" in written.read_text()
