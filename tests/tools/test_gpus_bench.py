"""tools.bench.gpus without servers: the scaling-efficiency table and its options (the live parts run
on GPU machines through tools/gpu.sh scale; a CPU smoke run: --shapes tiny --rank-backend ring)."""

from __future__ import annotations

import pytest

from tools.bench.gpus import RankRow, parse_args, rank_table


def test_efficiency_is_the_rate_over_n_times_one_gpu_s() -> None:
    one = RankRow("qwen3-4b", 1, prefill=[1000.0], decode={1: [100.0], 64: [600.0]})
    two = RankRow("qwen3-4b", 2, prefill=[1800.0], decode={1: [150.0], 64: [1080.0]}, note="4/4 equal")
    four = RankRow("qwen3-4b", 4, note="not run: 4 ranks take 4 GPUs, this machine has 2")
    lines = rank_table([one, two, four], [1, 64]).splitlines()
    assert lines[2].split(" | ")[-2:] == ["1.00 / 1.00", "baseline |"]
    assert lines[3].split(" | ")[-2:] == ["0.75 / 0.90", "4/4 equal |"]
    assert lines[4].split(" | ")[-2:] == ["- / -", "not run: 4 ranks take 4 GPUs, this machine has 2 |"]


def test_options_name_counts_shapes_and_parts() -> None:
    args = parse_args(["--ranks", "1,2", "--replicas", "0,2", "--shapes", "qwen3-14b", "--parts", "ranks,faults"])
    assert (args.ranks, args.replicas, args.shapes, args.parts) == ([1, 2], [0, 2], ["qwen3-14b"], ["ranks", "faults"])
    with pytest.raises(SystemExit):
        parse_args(["--parts", "speed"])
