"""The parts of `--ranks N` that need no group: which GPU each NCCL rank takes, the refusal when
there are fewer GPUs than ranks, what NCCL runs with, and how mlx.launch is run (tests/live/test_ranks.py
starts real groups)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from swama.engine.client import BadInput
from swama.handlers.http.settings import ServerSettings
from swama.handlers.scale.ranks import NCCL_DEFAULTS, launcher, rank_environment, rank_gpus


def test_each_rank_takes_the_next_gpu_this_process_sees() -> None:
    assert rank_gpus(4, None, 8) == ["0", "1", "2", "3"]
    assert rank_gpus(2, "2,3", 2) == ["2", "3"]  # the parent's restriction is kept, in its order
    assert rank_gpus(2, " 5, 1 ,", 2) == ["5", "1"]
    assert rank_gpus(2, "GPU-aaaa,GPU-bbbb", 2) == ["GPU-aaaa", "GPU-bbbb"]  # UUIDs pass through


@pytest.mark.parametrize(("size", "visible", "count", "says"), [
    (2, None, 1, "--ranks 2 puts each rank on a GPU of its own (NCCL), and this machine has 1 GPU: "
                 "ask for at most 1 rank,"),
    (4, "0,1", 8, "CUDA_VISIBLE_DEVICES=0,1 leaves 2 GPUs: ask for at most 2 ranks"),
    (2, None, 0, "this machine has 0 GPUs"),
])
def test_fewer_gpus_than_ranks_is_refused_before_any_rank_starts(size: int, visible: str | None, count: int,
                                                                 says: str) -> None:
    with pytest.raises(BadInput) as caught:
        rank_gpus(size, visible, count)
    assert says in str(caught.value) and "--hostfile" in str(caught.value)


def test_nvlink_multicast_is_off_unless_the_environment_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = ServerSettings(default_model="m", ranks=2)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    assert NCCL_DEFAULTS == {"NCCL_NVLS_ENABLE": "0"}
    assert rank_environment(settings, 1 << 20)["NCCL_NVLS_ENABLE"] == "0"
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the ranks inherit the environment's own choice
    assert "NCCL_NVLS_ENABLE" not in rank_environment(settings, 1 << 20)


def test_mlx_launch_runs_without_its_console_script(tmp_path: Path) -> None:
    beside = tmp_path / "mlx.launch"
    assert launcher(beside)[0] == sys.executable  # no script there: MLX's own main, run by this Python
    done = subprocess.run([*launcher(beside), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: mlx.launch" in done.stdout and "--hostfile" in done.stdout
    beside.write_text("#!/bin/sh\n")
    assert launcher(beside) == [str(beside)]
