"""Build a tiny random-weight model of a real mlx-lm, mlx-vlm or mlx-audio (text-to-speech) architecture.

The weights are random (seeded) so the output is gibberish, but the folder exercises the whole
serving path: config, safetensors, a real tokenizer and chat template copied from a donor
model folder (for example a converted SmolLM2).

Vision architectures (`qwen3_5_vl`, `gemma3_vl`) are mlx-vlm models: a tiny vision tower beside the
text stack, the processor configs their real checkpoints ship, the donor's tokenizer with the
architecture's image tokens added, and a chat template that renders image parts the way the
family's own template does.

Embedding architectures (`embeddinggemma`) are mlx-embeddings models in a sentence-transformers folder.

The text-to-speech architecture (`kitten_tts`) is an mlx-audio KittenTTS: it needs no donor (its
text goes through espeak-ng phonemes, not a tokenizer) and ships a voices file with two voices and
the display-name aliases the real checkpoint's config carries. Its weights are scaled down, since
unscaled random weights overflow in the vocoder and the audio comes out as NaN.

Shaped architectures (`qwen3-0.6b`, `qwen3-4b`, `qwen3.5-0.8b`, ...) are not tiny: they have the exact shapes of the real
checkpoints (layers, widths, heads, the 151,936-token vocabulary), random bfloat16 weights and a
config transformers loads as well as mlx-lm, for measuring speed at the sizes people serve. The
donor's tokenizer covers only the first rows of the vocabulary; the embedding rows past it are zero,
so (with tied embeddings) greedy decoding never picks a token that tokenizer cannot decode. They are
written one tensor at a time, so building one takes little more memory than its largest tensor, and
an existing folder with the same config is reused.

Usage: python -m tools.testmodels.tiny DONOR_DIR DEST_DIR [--arch NAME]
       python -m tools.testmodels.tiny [DONOR_DIR] DEST_DIR --arch kitten_tts
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

# Vision-language architectures (mlx-vlm). Each names its image tokens, its processor files and a
# chat template; vocab size and the image token ids are filled in from the extended tokenizer.
VISION_ARCHS: dict[str, dict[str, Any]] = {
    # Qwen3.5: the hybrid text stack above with multimodal rotary positions, and a Qwen3-VL vision
    # tower (16 px patches, 2x2 merge: one image token per 32x32 pixels).
    "qwen3_5_vl": {
        "special_tokens": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
        "config": lambda t: {
            "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
            "text_config": {**{k: v for k, v in TINY_CONFIGS["qwen3_5"].items() if k != "architectures"},
                            "model_type": "qwen3_5_text", "vocab_size": t["vocab_size"],
                            "rope_parameters": {"type": "default", "mrope_section": [2, 1, 1],
                                                "mrope_interleaved": True, "rope_theta": 100000,
                                                "partial_rotary_factor": 0.5}},
            "vision_config": {"model_type": "qwen3_5", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
                              "out_hidden_size": 64, "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2,
                              "temporal_patch_size": 2, "in_channels": 3, "num_position_embeddings": 64,
                              "deepstack_visual_indexes": []},
            "image_token_id": t["<|image_pad|>"], "video_token_id": t["<|video_pad|>"],
            "vision_start_token_id": t["<|vision_start|>"], "vision_end_token_id": t["<|vision_end|>"],
            "vocab_size": t["vocab_size"], "tie_word_embeddings": True},
        "files": {
            # Images are resized to between 64x64 and 1024x1024 pixels' worth of area (the real
            # checkpoints allow up to 1344x1344), in multiples of 32 pixels.
            "preprocessor_config.json": {
                "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
                "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "size": {"shortest_edge": 64 * 64, "longest_edge": 1024 * 1024}},
            "video_preprocessor_config.json": {
                "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                "size": {"shortest_edge": 64 * 64, "longest_edge": 1024 * 1024}},
            "processor_config.json": {"processor_class": "Qwen3VLProcessor"},
        },
        "tokenizer_config": {},
        "chat_template": (
            "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
            "{%- if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
            "{% if p.type == 'image' or p.type == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
            "{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
            "{% endif %}"),
    },
    # Gemma 3: the sliding-window text stack above and a SigLIP vision tower (32 px images in 8 px
    # patches, pooled to 4 image tokens per image).
    "gemma3_vl": {
        "special_tokens": ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                           "<image_soft_token>"],
        "config": lambda t: {
            "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
            "text_config": {**{k: v for k, v in TINY_CONFIGS["gemma3_text"].items() if k != "architectures"},
                            "vocab_size": t["vocab_size"], "mm_tokens_per_image": 4},
            "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 2, "hidden_size": 32,
                              "intermediate_size": 64, "num_attention_heads": 2, "patch_size": 8,
                              "image_size": 32, "num_channels": 3, "layer_norm_eps": 1e-6},
            "image_token_index": t["<image_soft_token>"], "boi_token_index": t["<start_of_image>"],
            "eoi_token_index": t["<end_of_image>"], "mm_tokens_per_image": 4, "hidden_size": 64,
            "vocab_size": t["vocab_size"], "pad_token_id": 0, "eos_token_id": [t["<end_of_turn>"]]},
        "files": {
            "preprocessor_config.json": {
                "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
                "size": {"height": 32, "width": 32}, "do_pan_and_scan": False, "resample": 2,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255,
                "do_normalize": True, "do_rescale": True, "do_resize": True, "do_convert_rgb": None},
            "processor_config.json": {"image_seq_length": 4, "processor_class": "Gemma3Processor"},
        },
        "tokenizer_config": {"eos_token": "<end_of_turn>",
                             "extra_special_tokens": {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                                      "image_token": "<image_soft_token>"}},
        "chat_template": (
            "{%- for m in messages -%}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
            "{%- if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
            "{% if p.type == 'image' or p.type == 'image_url' %}<start_of_image>"
            "{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n"
            "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
    },
}

def _untied(config: dict[str, Any]) -> dict[str, Any]:
    """Clef's head reads the option words through the output embedding, so it has its own."""
    config["text_config"] = {**config["text_config"], "tie_word_embeddings": False}
    config["tie_word_embeddings"] = False
    return config


# Decision checkpoints (mlx-vlm): Clef is the Qwen3.5 vision model above with a joint schema head
# that scores every question from one prefill; PPLX-Decider 2 is the Qwen3.5 text stack that answers
# with option codes at a calibrated temperature.
VISION_ARCHS["clef"] = {
    **VISION_ARCHS["qwen3_5_vl"],
    "config": lambda t: _untied({
        **VISION_ARCHS["qwen3_5_vl"]["config"](t), "model_type": "clef", "architectures": ["ClefModel"],
        "head_config": {"hidden_size": 64, "width": 32, "routing_layers": 1, "layers": 1, "heads": 2,
                        "feedforward": 64}}),
}
VISION_ARCHS["decider2"] = {
    "special_tokens": [],
    "config": lambda t: {
        **{k: v for k, v in TINY_CONFIGS["qwen3_5"].items() if k != "architectures"},
        "model_type": "decider2", "architectures": ["Decider2Model"], "vocab_size": t["vocab_size"],
        "rope_parameters": {"type": "default", "mrope_section": [1, 1, 0], "rope_theta": 100000,
                            "partial_rotary_factor": 0.25},
        "decision_config": {"temperature": 1.25, "temperature_by_type": {"noul": 1.1}}},
    "files": {}, "tokenizer_config": {}, "chat_template": VISION_ARCHS["qwen3_5_vl"]["chat_template"],
}

# Text-to-speech architectures (mlx-audio); they need no donor.
SPEECH_ARCHS: dict[str, dict[str, Any]] = {
    # KittenTTS: an ALBERT phoneme encoder, a prosody predictor and an iSTFTNet vocoder at 24 kHz.
    # mlx-audio slices the voice vector at 128, so style_dim cannot shrink below that.
    "kitten_tts": {
        "model_type": "kitten_tts", "hidden_dim": 16, "max_conv_dim": 16, "max_dur": 10, "n_layer": 1,
        "n_mels": 80, "n_token": 256, "style_dim": 128, "text_encoder_kernel_size": 3, "asr_res_dim": 8,
        "decoder_out_dim": 16, "sample_rate": 24000,
        "plbert": {"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 16, "intermediate_size": 32,
                   "max_position_embeddings": 512, "embedding_size": 16, "dropout": 0.0,
                   "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "type_vocab_size": 2,
                   "layer_norm_eps": 1e-12},
        "istftnet": {"resblock_kernel_sizes": [3, 3], "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
                     "upsample_rates": [2, 2], "upsample_kernel_sizes": [4, 4], "upsample_initial_channel": 16,
                     "gen_istft_n_fft": 16, "gen_istft_hop_size": 4},
        # The real checkpoint names its voices for people; the voices file keys them by recording.
        "voice_aliases": {"Bella": "expr-voice-2-f", "Leo": "expr-voice-5-m"},
    },
}
# One style vector per input length (up to 400 characters), 256 wide (acoustic and prosodic halves).
VOICE_SHAPE = (400, 256)
WEIGHT_SCALE = 0.1

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


# Embedding architectures (mlx-embeddings): EmbeddingGemma's bidirectional Gemma 3 stack with mean
# pooling and two dense projections, laid out as a sentence-transformers folder.
EMBEDDING_ARCHS: dict[str, dict[str, Any]] = {
    "embeddinggemma": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3TextModel"],
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "rms_norm_eps": 1e-6,
        "sliding_window": 512,
        "sliding_window_pattern": 2,
        "max_position_embeddings": 2048,
        "use_bidirectional_attention": True,
    },
}
SENTENCE_TRANSFORMERS_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
    {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"},
]

# The real shapes of released checkpoints (see the module docstring); bos/eos ids come from the donor.
SHAPED_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    },
}
SHAPED_CONFIGS["qwen3-4b"] = {
    **SHAPED_CONFIGS["qwen3-0.6b"],
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "max_window_layers": 36,
}
# The larger ones do not tie the output head to the embeddings.
SHAPED_CONFIGS["qwen3-14b"] = {
    **SHAPED_CONFIGS["qwen3-0.6b"],
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "max_window_layers": 40,
    "tie_word_embeddings": False,
}
SHAPED_CONFIGS["qwen3-32b"] = {
    **SHAPED_CONFIGS["qwen3-14b"],
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "max_window_layers": 64,
}
# Qwen3.5's small dense hybrid at the 0.8B's published shape: three gated delta net (linear
# attention) layers to each full-attention one, 16 heads of 128 in the linear layers, gated attention
# with 8 query heads of 256 over 2 key/value heads, the 248,320-token vocabulary. mlx-lm loads it;
# transformers' comparison in tools/bench/gpu.py does not take it.
SHAPED_CONFIGS["qwen3.5-0.8b"] = {
    "model_type": "qwen3_5",
    "architectures": ["Qwen3_5ForCausalLM"],
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "num_hidden_layers": 24,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_value_heads": 16,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
# Small enough that 36 random layers keep the logits finite and moderate in bfloat16.
SHAPED_WEIGHT_STD = 0.02

ARCHS = (*TINY_CONFIGS, *VISION_ARCHS, *EMBEDDING_ARCHS, *SPEECH_ARCHS, *SHAPED_CONFIGS)


def build_tiny_model(donor_dir: Path | None, dest: Path, arch: str = "qwen3") -> Path:
    """Write a tiny random model of ``arch`` with the donor's tokenizer into ``dest`` (text-to-speech
    architectures take no donor: pass None)."""
    dest = Path(dest)
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose from {', '.join(ARCHS)}")
    if arch in SPEECH_ARCHS:
        return _build_speech_model(dest, SPEECH_ARCHS[arch])
    if donor_dir is None:
        raise ValueError(f"the {arch} architecture copies its tokenizer from a donor model folder")
    donor_dir = Path(donor_dir)
    missing = [name for name in REQUIRED_DONOR_FILES if not (donor_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"donor folder {donor_dir} lacks {', '.join(missing)}")
    if arch in VISION_ARCHS:
        return _build_vision_model(donor_dir, dest, VISION_ARCHS[arch])
    if arch in EMBEDDING_ARCHS:
        return _build_embedding_model(donor_dir, dest, EMBEDDING_ARCHS[arch])
    if arch in SHAPED_CONFIGS:
        return _build_shaped_model(donor_dir, dest, arch)

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


def shaped_config(arch: str, donor_dir: Path | None = None) -> dict[str, Any]:
    """The config.json of a shaped architecture: its real shape, with the donor's bos/eos ids (and
    the size of its tokenizer's vocabulary, as `tokenizer_vocab_size`) when a donor is given."""
    config = dict(SHAPED_CONFIGS[arch])
    if donor_dir is not None:
        ids = _donor_token_ids(Path(donor_dir))
        config["tokenizer_vocab_size"] = min(ids.pop("vocab_size"), config["vocab_size"])
        config.update(ids)
    return config


def parameter_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, from mlx-lm's model class; MLX arrays are lazy, so nothing
    is allocated."""
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    return {name: tuple(value.shape) for name, value in tree_flatten(model.parameters())}


def parameter_count(config: dict[str, Any], embeddings: bool = True) -> int:
    """Parameters of the model `config` describes; without the embedding table when `embeddings`
    is false (with tied embeddings that also leaves out the output head, which shares it)."""
    total = 0
    for name, shape in parameter_shapes(config).items():
        if embeddings or "embed_tokens" not in name:
            n = 1
            for d in shape:
                n *= d
            total += n
    return total


def write_random_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], std: float = SHAPED_WEIGHT_STD,
                             live_rows: dict[str, int] | None = None, seed: int = 0) -> None:
    """A bfloat16 safetensors file of `shapes`, written one tensor at a time: vectors (norm scales)
    are ones, matrices random normal with `std`. A matrix named in `live_rows` keeps only that many
    random rows; the rest are zero."""
    import numpy as np

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the tensor data starts 8-byte aligned
    key = mx.random.key(seed)
    with Path(path).open("wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for name, shape in shapes.items():
            if len(shape) == 1:
                value = mx.ones(shape, dtype=mx.bfloat16)
            else:
                key, sub = mx.random.split(key)
                value = mx.random.normal(shape, dtype=mx.bfloat16, scale=std, key=sub)
                rows = (live_rows or {}).get(name)
                if rows is not None and rows < shape[0]:
                    value = mx.concatenate([value[:rows], mx.zeros((shape[0] - rows, *shape[1:]), mx.bfloat16)])
            f.write(np.array(mx.view(value, mx.uint16)).tobytes())
            del value


def _build_shaped_model(donor_dir: Path, dest: Path, arch: str) -> Path:
    config = shaped_config(arch, donor_dir)
    text = json.dumps(config, indent=2) + "\n"
    config_path = dest / "config.json"
    if (dest / "model.safetensors").is_file() and config_path.is_file() and config_path.read_text() == text:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    config_path.unlink(missing_ok=True)  # written last: a folder with a config is complete
    shapes = parameter_shapes(config)
    embeddings = next(name for name in shapes if name.endswith("embed_tokens.weight"))
    live = {embeddings: config["tokenizer_vocab_size"]} if config["tie_word_embeddings"] else {}
    write_random_safetensors(dest / "model.safetensors", shapes, live_rows=live)
    for name in REQUIRED_DONOR_FILES + OPTIONAL_DONOR_FILES:
        if (donor_dir / name).is_file():
            shutil.copyfile(donor_dir / name, dest / name)
    config_path.write_text(text, encoding="utf-8")
    return dest


def _build_vision_model(donor_dir: Path, dest: Path, spec: dict[str, Any]) -> Path:
    from mlx_vlm.utils import get_model_and_args, update_module_configs
    from tokenizers import AddedToken

    tokenizer = Tokenizer.from_file(str(donor_dir / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec["special_tokens"]])
    token_ids = {t: tokenizer.token_to_id(t) for t in spec["special_tokens"]}
    token_ids["vocab_size"] = tokenizer.get_vocab_size(with_added_tokens=True)
    config = spec["config"](token_ids)

    model_module, _ = get_model_and_args(config)
    model_config = model_module.ModelConfig.from_dict(config)
    if "text_config" in config:
        model_config = update_module_configs(model_config, model_module, config, ["text", "vision"])
    mx.random.seed(0)
    model = model_module.Model(model_config)

    dest.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(dest / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tokenizer.save(str(dest / "tokenizer.json"))
    tok_config = json.loads((donor_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_config.pop("chat_template", None)
    tok_config.update(spec["tokenizer_config"])
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
    for name, content in spec["files"].items():
        (dest / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    (dest / "chat_template.jinja").write_text(spec["chat_template"], encoding="utf-8")
    return dest


def _build_embedding_model(donor_dir: Path, dest: Path, spec: dict[str, Any]) -> Path:
    from mlx_embeddings.utils import _get_classes as embedding_classes

    config = {**spec, **_donor_token_ids(donor_dir)}
    model_cls, args_cls, _, _ = embedding_classes(config)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(config))
    dest.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(dest / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (dest / "modules.json").write_text(json.dumps(SENTENCE_TRANSFORMERS_MODULES, indent=2) + "\n", encoding="utf-8")
    (dest / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}) + "\n", encoding="utf-8")
    for name in REQUIRED_DONOR_FILES:
        shutil.copyfile(donor_dir / name, dest / name)
    return dest


def _build_speech_model(dest: Path, config: dict[str, Any]) -> Path:
    import numpy as np
    from mlx_audio.tts.utils import get_model_and_args

    module, _ = get_model_and_args(config["model_type"], [])
    mx.random.seed(0)
    model = module.Model(module.ModelConfig.from_dict(config))
    weights = {name: value * WEIGHT_SCALE if value.ndim > 1 else value
               for name, value in tree_flatten(model.parameters())}
    rng = np.random.default_rng(0)
    voices = {key: (rng.standard_normal(VOICE_SHAPE) * WEIGHT_SCALE).astype(np.float32)
              for key in sorted(set(config["voice_aliases"].values()))}

    dest.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    np.savez(dest / "voices.npz", **voices)
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", type=Path, nargs="+", metavar="[DONOR] DEST",
                        help="the donor model folder whose tokenizer and chat template are copied (not for "
                             "text-to-speech architectures), then the folder to write the tiny model into")
    parser.add_argument("--arch", default="qwen3", choices=sorted(ARCHS))
    args = parser.parse_args(argv)
    speech = args.arch in SPEECH_ARCHS
    if len(args.paths) not in ((1, 2) if speech else (2,)):
        parser.error(f"--arch {args.arch} takes {'[DONOR] DEST (a donor is not used)' if speech else 'DONOR DEST'}")
    donor, dest = (None, args.paths[-1]) if speech else args.paths
    print(build_tiny_model(donor, dest, args.arch))


if __name__ == "__main__":
    main()
