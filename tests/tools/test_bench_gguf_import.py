"""The GGUF import benchmark on a tiny file: both importers run, and the table says what they did."""

from __future__ import annotations

from pathlib import Path

from gguf import GGMLQuantizationType as Q

from tools.bench import gguf_import as bench_gguf_import
from tools.testmodels.gguf_files import matrices_as, source_weights, write_gguf


def test_before_and_after_are_measured(tmp_path: Path) -> None:
    # F32 matrices: a type the old importer also read, so both sides convert the same file.
    config, weights = source_weights("llama", hidden=64)
    gguf = write_gguf(tmp_path / "tiny.gguf", "llama", config, weights, matrices_as(Q.F32))
    rows = bench_gguf_import.measure(gguf, bench_gguf_import.BASELINE)
    assert [label.split(":")[0] for label, _ in rows] == [f"before ({bench_gguf_import.BASELINE})", "after",
                                                          "after", "after"]
    before, f32, bf16, q4 = (r for _, r in rows)
    assert all(r["seconds"] > 0 and r["rss_peak_kib"] >= r["rss_start_kib"] > 0 for _, r in rows)
    # float16 before, float32 and bfloat16 after, 4-bit smallest: the sizes tell the dtypes apart.
    assert f32["bytes"] > before["bytes"] and q4["bytes"] < bf16["bytes"] < f32["bytes"]
    text = bench_gguf_import.report(gguf, rows)
    assert "| importer | seconds |" in text and "tiny.gguf" in text
