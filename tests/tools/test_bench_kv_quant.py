"""tools.bench.kv_quant on the SmolLM2 test model with tiny settings: its three tables, full precision
against itself exact, 8 bits close and 4 bits further, and the bytes a token takes as the admission
counts them and as the arrays hold them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools.bench import kv_quant

pytestmark = pytest.mark.slow


def test_the_tables_show_quality_speed_and_memory(smollm2_dir: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    written = tmp_path / "benchmarks.md"
    assert kv_quant.main(["--model-dir", str(smollm2_dir), "--document", "300", "--generate", "8", "--repeats", "1",
                          "--speed-prompt", "200", "--speed-generate", "8", "--write", str(written)]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in out.splitlines()
            if re.match(r"\| (full precision|8 bits|4 bits) \|", line)}
    quality = [r for r in out.splitlines() if r.startswith("| 8 bits | 0.")]
    # Mean log-prob drift: 8 bits measured 0.014, 4 bits 0.26 (docs/benchmarks.md).
    assert len(quality) == 1 and float(quality[0].split(" | ")[1]) < 0.1
    assert "| full precision | 0.0000 | 0.0000 | 100.0% | 8, 8, 8, 8 | 100.0% | 8/8 |" in out
    assert "| full precision | 46,080 | 46,080 | 5 |" in out and "| 8 bits | 14,400 | 14,400 | 18 |" in out
    assert "| 4 bits | 8,640 | 8,640 | 31 |" in out and "**Recommendation.**" in out
    assert rows and "## Quantized key/value caches (CPU)" in written.read_text()
