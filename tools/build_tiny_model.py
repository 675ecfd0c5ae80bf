"""Build a tiny random-weight chat model of a real mlx-lm architecture.

The weights are random (seeded) so the output is gibberish, but the folder exercises the whole
serving path: config, safetensors, a real tokenizer and chat template copied from a donor
model folder (for example a converted SmolLM2).

Usage: python -m swama.tools.build_tiny_model DONOR_DIR DEST_DIR [--arch qwen3|llama|qwen3_5|gemma3_text]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes
from tokenizers import Tokenizer

# Architecture-specific shape of the tiny model; vocab and special ids come from the donor.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
    },
    "llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
    },
    # Qwen3.5's hybrid text stack: gated linear-attention (recurrent) layers with a full-attention
    # layer every second one, so its cache cannot be trimmed back to a shared prefix.
    "qwen3_5": {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
        "rope_parameters": {"type": "default", "rope_theta": 100000, "partial_rotary_factor": 0.25},
    },
    # Gemma 3's text stack: sliding-window layers (a rotating cache of 32 tokens here) with a global
    # layer every second one; past the window its cache cannot be trimmed either.
    "gemma3_text": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 32,
        "sliding_window_pattern": 2,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
    },
}

REQUIRED_DONOR_FILES = ("tokenizer.json", "tokenizer_config.json")
OPTIONAL_DONOR_FILES = ("chat_template.jinja", "generation_config.json")


def _donor_token_ids(donor_dir: Path) -> dict[str, Any]:
    """vocab_size and bos/eos ids as the donor's tokenizer defines them."""
    tokenizer = Tokenizer.from_file(str(donor_dir / "tokenizer.json"))
    tok_config = json.loads((donor_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    ids: dict[str, Any] = {"vocab_size": tokenizer.get_vocab_size(with_added_tokens=True)}
    for key in ("bos", "eos"):
        token = tok_config.get(f"{key}_token")
        if isinstance(token, dict):  # serialized AddedToken
            token = token.get("content")
        if token is not None and (token_id := tokenizer.token_to_id(token)) is not None:
            ids[f"{key}_token_id"] = token_id
    return ids


def build_tiny_model(donor_dir: Path, dest: Path, arch: str = "qwen3") -> Path:
    """Write a tiny random model of ``arch`` with the donor's tokenizer into ``dest``."""
    donor_dir, dest = Path(donor_dir), Path(dest)
    if arch not in TINY_CONFIGS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose from {', '.join(TINY_CONFIGS)}")
    missing = [name for name in REQUIRED_DONOR_FILES if not (donor_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"donor folder {donor_dir} lacks {', '.join(missing)}")

    config = {**TINY_CONFIGS[arch], **_donor_token_ids(donor_dir)}
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))

    dest.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in REQUIRED_DONOR_FILES + OPTIONAL_DONOR_FILES:
        if (donor_dir / name).is_file():
            shutil.copyfile(donor_dir / name, dest / name)
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("donor", type=Path, help="model folder whose tokenizer and chat template are copied")
    parser.add_argument("dest", type=Path, help="folder to write the tiny model into")
    parser.add_argument("--arch", default="qwen3", choices=sorted(TINY_CONFIGS))
    args = parser.parse_args(argv)
    print(build_tiny_model(args.donor, args.dest, args.arch))


if __name__ == "__main__":
    main()
