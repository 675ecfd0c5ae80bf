"""The GPU benchmark (tools/bench_gpu.py) on the tiny shape, on the CPU, and the shaped models it builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from precision import BF16_TINY_PROBABILITY, DTYPE_NAME, f32_reordered, forward_products, tol

from tools.bench import gpu as bench_gpu
from tools.bench.common import write_section
from tools.testmodels.tiny import (
    parameter_count,
    parameter_shapes,
    shaped_config,
    write_random_safetensors,
)

# The published sizes of Qwen3-0.6B and Qwen3-4B: all parameters, and without the (tied) embeddings.
SIZES = {"qwen3-0.6b": (596_049_920, 440_467_456), "qwen3-4b": (4_022_468_096, 3_633_511_936)}


@pytest.mark.parametrize("arch", sorted(SIZES))
def test_shaped_configs_have_the_real_sizes(arch: str, smollm2_dir: Path) -> None:
    from transformers import Qwen3Config

    config = shaped_config(arch, smollm2_dir)
    assert (parameter_count(config), parameter_count(config, embeddings=False)) == SIZES[arch]
    assert config["vocab_size"] == 151936 and config["tie_word_embeddings"]
    assert config["torch_dtype"] == "bfloat16" and config["rope_theta"] == 1e6
    assert {"bos_token_id", "eos_token_id"} <= set(config) and 0 < config["tokenizer_vocab_size"] < 151936
    parsed = Qwen3Config.from_dict(config)  # transformers reads the same file
    assert (parsed.num_hidden_layers, parsed.num_key_value_heads, parsed.head_dim) == (
        config["num_hidden_layers"], 8, 128)
    assert parsed.rope_parameters["rope_theta"] == 1e6
    shapes = parameter_shapes(config)
    assert shapes["model.embed_tokens.weight"] == (151936, config["hidden_size"])
    assert "lm_head.weight" not in shapes


# Qwen3-14B and -32B: all parameters, and without the embedding table and the (untied) output head,
# as their model cards count them (14.8B / 13.2B, 32.8B / 31.2B).
UNTIED_SIZES = {"qwen3-14b": (14_768_307_200, 13_212_482_560), "qwen3-32b": (32_762_123_264, 31_206_298_624)}


@pytest.mark.parametrize("arch", sorted(UNTIED_SIZES))
def test_larger_shapes_have_the_real_sizes_and_their_own_output_head(arch: str) -> None:
    config = shaped_config(arch)
    shapes = parameter_shapes(config)
    head = shapes["lm_head.weight"][0] * shapes["lm_head.weight"][1]
    assert not config["tie_word_embeddings"] and shapes["lm_head.weight"] == shapes["model.embed_tokens.weight"]
    assert (parameter_count(config), parameter_count(config, embeddings=False) - head) == UNTIED_SIZES[arch]
    assert config["num_attention_heads"] % 8 == 0 or config["num_attention_heads"] == 40
    assert config["num_key_value_heads"] == 8  # tensor parallel splits up to 8 ranks


def test_random_safetensors_are_bfloat16_with_zero_rows_past_the_tokenizer(tmp_path: Path) -> None:
    import mlx.core as mx

    path = tmp_path / "model.safetensors"
    write_random_safetensors(path, {"embed.weight": (64, 32), "norm.weight": (32,)}, live_rows={"embed.weight": 40})
    weights = mx.load(str(path))
    embed = np.array(weights["embed.weight"].astype(mx.float32))
    assert weights["embed.weight"].dtype == mx.bfloat16
    # 1,280 draws of std 0.02 (SHAPED_WEIGHT_STD): their std is within 2% of it (its standard error).
    assert np.all(embed[40:] == 0) and 0.01 < embed[:40].std() < 0.03
    assert np.all(np.array(weights["norm.weight"].astype(mx.float32)) == 1)


def test_prefill_flops_counts_layers_attention_and_one_head_position() -> None:
    shape = bench_gpu.Shape("x", non_embedding=10, layers=2, heads=3, head_dim=4, hidden=5, vocab=7)
    assert shape.prefill_flops(6) == 2 * 10 * 6 + 2 * 2 * 3 * 4 * 6**2 + 2 * 5 * 7


def test_tiny_parts_make_their_tables(smollm2_dir: Path, tmp_path: Path) -> None:
    # A transformers Python that cannot start: its figures are reported as not measured, the rest goes on.
    args = bench_gpu.parse_args([
        "--shapes", "tiny", "--parts", "matmul,prefill,decisions", "--donor", str(smollm2_dir),
        "--models-dir", str(tmp_path / "models"), "--torch-python", str(tmp_path / "no-python"), "--runs", "1",
        "--prefill-tokens", "256", "--prefill-steps", "64,256", "--questions", "8", "--matmul-size", "256"])
    results = bench_gpu.collect(args, "python -m tools.bench.gpu --shapes tiny")

    assert results.matmul["MLX"].ok and results.ceiling > 0
    cell = results.prefill[("tiny", 256)]
    assert cell["swama, 64-token chunks"].ok and cell["swama, one chunk"].ok
    assert "could not start" in cell["transformers"].error
    decisions = results.decisions["tiny"]
    assert decisions.swama.ok and decisions.single.ok and decisions.questions == 8
    # Batched against one pass a question: float32 sums in another order through the tiny model over the
    # bench's 1,000-token ticket and its questions (under 2,048 tokens); a probability moves by half a
    # logit's bound.
    batched = f32_reordered(16, forward_products(2, 64, 128, 16, 2048)) / 2
    assert decisions.batched_vs_single[0] <= tol(batched, BF16_TINY_PROBABILITY)

    md = tmp_path / "benchmarks.md"
    write_section(md, bench_gpu.TITLE, bench_gpu.report(results))
    text = md.read_text()
    assert f"## {bench_gpu.TITLE}" in text
    assert f"| MLX | {DTYPE_NAME} | 256x256x256 |" in text  # the ceiling is measured in the compute dtype
    assert "| tiny Qwen3 | 256 | swama, 64-token chunks |" in text
    assert "| swama, suffixes in one batched pass (`score_batch`) |" in text
    assert "not measured: could not start" in text
    assert "python -m tools.bench.gpu --shapes tiny" in text


def test_gpu_bundle_names_every_glibc_up_to_the_target():
    """pip matches platform tags exactly: a wheel tagged manylinux_2_18 or _2_25 (NVIDIA's nccl and
    cupti, which torch pins) is found only when that exact tag is asked for."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "tools" / "gpu.sh"
    tags = subprocess.run(["bash", str(script), "platforms"], capture_output=True, text=True, check=True).stdout.split()
    for minor in range(5, 40):
        assert f"manylinux_2_{minor}_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64", "any"} <= set(tags)
