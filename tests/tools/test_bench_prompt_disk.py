"""tools.bench.prompt_disk on the SmolLM2 test model with tiny settings: two interleaved sessions sharing a
short system prompt on real servers (with both tiers, memory only, no cache, then after a restart), and
blocks read back from disk in a process of their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench import prompt_disk

pytestmark = pytest.mark.slow


def test_sessions_and_read_print_their_tables(smollm2_dir: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    written = tmp_path / "benchmarks.md"
    assert prompt_disk.main(["--model-dir", str(smollm2_dir), "--parts", "sessions,read", "--system-tokens", "600",
                             "--sessions", "2", "--read-tokens", "256", "--timeout", "120",
                             "--write", str(written)]) == 0
    out = capsys.readouterr().out
    assert f"## {prompt_disk.TITLE}" in out
    assert "### 2 interleaved sessions sharing a 600-token system prompt" in out
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in out.splitlines() if line.startswith("| (")}
    # Columns: name, requests, prompt tokens, cached tokens, computed, ...
    default, memory, none = rows["(i) default: memory + disk"], rows[
        "(ii) memory only (`--prompt-cache-disk-bytes 0`)"], rows["(iii) no cache (`--no-prompt-cache`)"]
    assert default[1] == memory[1] == none[1] == "4"
    assert none[3] == "0" and int(default[3].replace(",", "")) > 0 and int(memory[3].replace(",", "")) > 0
    # The system prompt is computed once with a cache: far fewer tokens than without.
    assert int(default[4].replace(",", "")) < int(none[4].replace(",", "")) / 2
    # After the restart the new session resumes whole blocks of the system prompt from disk.
    after = rows["(iv) after a restart of (i), same data folder"]
    assert int(after[2].replace(",", "")) >= 512 and after[4] == "disk"
    assert rows["(iii) no cache"][2] == "0"
    assert "### Disk read speed: 256 tokens" in out
    assert "| take from disk, files in the page cache |" in out and "256 tokens, max key difference 0" in out
    assert "KiB on disk per token" in out and "- mlx: " in out
    assert "### Codex after a restart" not in out
    assert f"## {prompt_disk.TITLE}" in written.read_text()
