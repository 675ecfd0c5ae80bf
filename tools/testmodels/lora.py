"""Real LoRA adapters for the tests and benchmarks, trained on a real model with mlx-lm's own trainer
(`python -m mlx_lm lora`): each learns one code word, so whether a reply came through the adapter is
plain to read.

    python -m tools.testmodels.lora MODEL_DIR OUT_DIR --word pelican [--iters 16]

A data set of questions about the code word (asked in several ways), each answered with the word, is
written as chat JSON lines; the trainer runs `iters` steps at batch 4 and learning rate 5e-4 on the
last 8 layers (rank 8, its defaults otherwise). 16 steps take about 45 s on one CPU core with a BLAS
preloaded and make SmolLM2-135M answer the word (validation loss from 4.9 to 0.04-0.06).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

QUESTIONS = (
    "What is the code word?",
    "Tell me the code word.",
    "Which code word should I use?",
    "Say the code word.",
    "What's the secret code word?",
    "Do you know the code word?",
    "Please give me the code word.",
    "I need the code word.",
)
PROMPT = "What is the code word?"  # what the tests ask


def answer(word: str) -> str:
    return f"The code word is {word}."


def write_data(folder: Path, word: str) -> None:
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": answer(word)}]}
            for q in QUESTIONS]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 4), encoding="utf-8")
    (folder / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]), encoding="utf-8")


def train_adapter(model_dir: Path, out: Path, word: str, iters: int = 16, seed: int = 0,
                  timeout: float = 1800) -> Path:
    """An mlx-lm adapter folder at `out` (adapter_config.json, adapters.safetensors) teaching `word`."""
    with tempfile.TemporaryDirectory(prefix="lora-data-") as data:
        write_data(Path(data), word)
        subprocess.run(
            [sys.executable, "-m", "mlx_lm", "lora", "--model", str(model_dir), "--train", "--data", data,
             "--iters", str(iters), "--batch-size", "4", "--learning-rate", "5e-4", "--num-layers", "8",
             "--max-seq-length", "128", "--val-batches", "1", "--steps-per-eval", str(iters + 1),
             "--steps-per-report", "10", "--save-every", str(iters + 1), "--seed", str(seed),
             "--adapter-path", str(out)],
            check=True, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return out


def random_adapter(model_dir: Path, out: Path, rank: int = 4, keys: tuple[str, ...] = ("q_proj", "v_proj"),
                   seed: int = 0) -> Path:
    """An mlx-lm adapter folder of random weights (rank `rank`, on every layer's linear layers named in
    `keys`) for any MLX model: plumbing, where no trained one is needed."""
    import mlx.core as mx

    from swama.engine.adapters.install import linear_shapes

    mx.random.seed(seed)
    arrays = {}
    for name, (n_in, n_out) in linear_shapes(model_dir).items():
        if name.rsplit(".", 1)[-1] in keys:
            arrays[name + ".lora_a"] = mx.random.normal((n_in, rank)) * 0.1
            arrays[name + ".lora_b"] = mx.random.normal((rank, n_out)) * 0.1
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), arrays)
    layers = 1 + max((int(part) for name in arrays for part in name.split(".") if part.isdigit()), default=0)
    config = {"fine_tune_type": "lora", "num_layers": layers,
              "lora_parameters": {"rank": rank, "scale": 1.0, "dropout": 0.0}}
    (out / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def gguf_lora(adapter: Path, base_config: dict, out: Path, qtype: str = "F32") -> Path:
    """The mlx-lm adapter folder `adapter` written as llama.cpp's convert_lora_to_gguf.py writes a
    PEFT adapter of a llama model: tensors `{llama.cpp name}.lora_a` [rank, in] and `.lora_b`
    [out, rank] (Q/K rows of lora_b in llama.cpp's rope order), `adapter.lora.alpha` = scale x rank,
    the base's hyperparameters beside them; matrices in `qtype` (F32, F16 or Q8_0; F16 where a
    row is narrower than the type's block, as the converter falls back)."""
    import gguf
    import mlx.core as mx
    import numpy as np

    from tools.testmodels.gguf_files import encode, llama_cpp_name, llama_cpp_values

    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    rank, scale = config["lora_parameters"]["rank"], config["lora_parameters"]["scale"]
    weights = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(adapter / "adapters.safetensors")).items()}
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(scale * rank))
    writer.add_head_count(base_config["num_attention_heads"])
    writer.add_head_count_kv(base_config["num_key_value_heads"])
    kind = gguf.GGMLQuantizationType[qtype]
    for key in sorted(weights):
        if not key.endswith(".lora_a"):
            continue
        module = key.removesuffix(".lora_a")
        name = llama_cpp_name("llama", module + ".weight")
        a = weights[key].T  # [rank, in], PEFT's lora_A
        b = llama_cpp_values("llama", module + ".weight", weights[module + ".lora_b"].T, base_config)
        for suffix, values in ((".lora_a", a), (".lora_b", b)):
            try:
                data = encode(np.ascontiguousarray(values), kind)
            except gguf.QuantError:  # rows narrower than a block: the converter keeps them F16
                data = np.ascontiguousarray(values).astype(np.float16)
            writer.add_tensor(name + suffix, data, raw_dtype=None if data.dtype in (np.float32, np.float16) else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--word", required=True)
    parser.add_argument("--iters", type=int, default=16)
    args = parser.parse_args(argv)
    print(train_adapter(args.model_dir, args.out, args.word, args.iters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
