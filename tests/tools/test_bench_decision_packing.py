"""tools.bench.decision_packing on the tiny model: every part runs and prints its rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from precision import F32_TINY_LOGIT

from tools.bench import decision_packing

pytestmark = pytest.mark.slow


def test_every_part_prints_its_rows(smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert decision_packing.main(["--shape", "tiny", "--models-dir", str(tmp_path), "--donor", str(smollm2_dir),
                                  "--runs", "1", "--requests", "2"]) == 0
    out = capsys.readouterr().out
    for row in ("| attention, 1000 tokens, causal, warm |", "| one forward, 64 tokens |",
                "| prefixes of 2: packed, right-padded, causal |", "| prefixes of 2: packed, left-padded, mask array |",
                "| pass over 40 questions of 2: in place, one fused call a layer |", "| one request's preparation alone |"):
        assert row in out
    # the two ways of a pass score the same rows to the same label logits (float32 on the CPU, summed in
    # another order on the tiny model)
    [passed] = [line for line in out.splitlines() if "in place, one fused call" in line]
    assert float(passed.rstrip(" |").split("|")[-1]) < F32_TINY_LOGIT
