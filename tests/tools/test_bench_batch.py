"""tools.bench.batch on the SmolLM2 test model with tiny settings: a real server, a decision job against
the same requests live, live chat beside a chat job, and the section with both tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench import batch

pytestmark = pytest.mark.slow


def test_both_parts_print_their_tables(smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    written = tmp_path / "benchmarks.md"
    assert batch.main(["--model-dir", str(smollm2_dir), "--lines", "4", "--clients", "2", "--chat-streams", "2",
                       "--chat-lines", "48", "--chat-max-tokens", "8", "--data", str(tmp_path / "data"),
                       "--timeout", "120", "--phase-timeout", "120", "--write", str(written)]) == 0
    out = capsys.readouterr().out
    assert f"## {batch.TITLE}" in out
    assert "| live, 2 clients |" in out and "| batch / live |" in out
    [job] = [line for line in out.splitlines() if line.startswith("| batch job |")]
    assert "4 of 4 completed, 0 failed; output checked" in job
    assert "| idle |" in out and "| beside a job of 48 chat lines |" in out
    assert "`cancelled`" in out or "`completed`" in out  # the chat job ended, cancelled or (if fast) done
    assert "- mlx: " in out and "- swama commit: " in out
    section = written.read_text()
    assert f"## {batch.TITLE}" in section and "| batch job |" in section
