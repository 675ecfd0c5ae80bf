"""Convert a CTranslate2 Whisper model (model.bin, config.json, tokenizer.json) into a folder that
mlx-audio's speech-to-text Whisper loads: MLX weight names in `weights.safetensors`, the model
dimensions in `config.json`, and the Hugging Face tokenizer and feature-extractor files its
WhisperProcessor reads.

The model.bin layout (format version 6, little-endian): u32 version, string spec name, u32 revision,
u32 variable count, then per variable {string name, u8 rank, u32 dims[rank], u8 dtype, u32 nbytes,
data}, then u32 alias count and {string alias, string target} pairs. A string is a u16 length that
counts a trailing NUL, then its bytes. Tensors are read through a memory map and written one by one,
so the conversion never holds the whole model twice.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from swama.engine.errors import WhisperConversionError

FORMAT_VERSION = 6
SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
# CTranslate2 dtype codes; bfloat16 (5) has no numpy type and is widened to float32.
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}
_SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
# Whisper's time tokens <|0.00|> ... <|30.00|> follow <|notimestamps|>; CTranslate2's tokenizer.json
# leaves them out, its vocabulary.txt lists them.
TIME_TOKENS = 1501


@dataclass(frozen=True)
class Variable:
    name: str
    shape: tuple[int, ...]
    dtype: int
    offset: int
    nbytes: int


class ModelBin:
    """The variables of a CTranslate2 model.bin, indexed without reading their data."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file = path.open("rb")
        except OSError as exc:
            raise WhisperConversionError(f"cannot read {path.name}: {exc.strerror}") from None
        size = path.stat().st_size
        if size == 0:
            self._file.close()
            raise WhisperConversionError(f"{path.name} is empty")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        self.variables: dict[str, Variable] = {}
        self.aliases: dict[str, str] = {}
        try:
            self._index()
        except WhisperConversionError:
            self.close()
            raise

    def close(self) -> None:
        self._map.close()
        self._file.close()

    def __enter__(self) -> ModelBin:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _take(self, n: int) -> bytes:
        end = self._pos + n
        if end > len(self._map):
            raise WhisperConversionError(f"{self.path.name} is truncated: it ends at byte {len(self._map)}, "
                                         f"inside a record that needs {end}")
        data = self._map[self._pos:end]
        self._pos = end
        return data

    def _u8(self) -> int:
        return self._take(1)[0]

    def _u16(self) -> int:
        return struct.unpack("<H", self._take(2))[0]

    def _u32(self) -> int:
        return struct.unpack("<I", self._take(4))[0]

    def _string(self) -> str:
        raw = self._take(self._u16())
        try:
            return raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            raise WhisperConversionError(f"{self.path.name} is not a CTranslate2 model (a name is not text)") from None

    def _index(self) -> None:
        version = self._u32()
        if version != FORMAT_VERSION:
            raise WhisperConversionError(f"{self.path.name} is not a CTranslate2 model of format version "
                                         f"{FORMAT_VERSION} (it starts with {version})")
        spec = self._string()
        if spec != "WhisperSpec":
            raise WhisperConversionError(f"{self.path.name} holds a {spec or 'nameless'} model, not a Whisper model")
        self._u32()  # spec revision
        for _ in range(self._u32()):
            name = self._string()
            rank = self._u8()
            shape = struct.unpack(f"<{rank}I", self._take(4 * rank))
            dtype = self._u8()
            nbytes = self._u32()
            if dtype not in _DTYPES:
                raise WhisperConversionError(f"{name} has an unknown dtype code {dtype}")
            if int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize != nbytes:
                raise WhisperConversionError(f"{name}: {nbytes} bytes do not fit the shape {list(shape)}")
            self.variables[name] = Variable(name, tuple(shape), dtype, self._pos, nbytes)
            self._take(nbytes)
        for _ in range(self._u32()):
            alias = self._string()
            self.aliases[alias] = self._string()
        if self._pos != len(self._map):
            raise WhisperConversionError(f"{self.path.name} has {len(self._map) - self._pos} unexpected bytes "
                                         "after its last record")

    def array(self, name: str) -> np.ndarray:
        """The variable's data, a view into the file (float32 for bfloat16 data)."""
        var = self.variables.get(name) or self.variables.get(self.aliases.get(name, ""))
        if var is None:
            raise WhisperConversionError(f"{self.path.name} has no variable {name}")
        data = np.frombuffer(self._map, dtype=_DTYPES[var.dtype], count=var.nbytes // np.dtype(
            _DTYPES[var.dtype]).itemsize, offset=var.offset).reshape(var.shape)
        if var.dtype == 5:
            data = (data.astype(np.uint32) << 16).view(np.float32)
        return data

    def scalar(self, name: str) -> int:
        return int(self.array(name).reshape(()))

    def layers(self, prefix: str) -> int:
        found = {int(m.group(1)) for n in self.variables if (m := re.match(rf"{prefix}/layer_(\d+)/", n))}
        if found != set(range(len(found))):
            raise WhisperConversionError(f"{self.path.name}: the {prefix} layers are not numbered 0..n-1")
        return len(found)


def _linear(out: dict[str, Any], key: str, src: ModelBin, name: str, rows: slice | None = None,
            bias: bool = True) -> None:
    weight = src.array(f"{name}/weight")
    out[f"{key}.weight"] = weight if rows is None else weight[rows]
    if bias:
        b = src.array(f"{name}/bias")
        out[f"{key}.bias"] = b if rows is None else b[rows]


def _norm(out: dict[str, Any], key: str, src: ModelBin, name: str) -> None:
    out[f"{key}.weight"] = src.array(f"{name}/gamma")
    out[f"{key}.bias"] = src.array(f"{name}/beta")


def _block(out: dict[str, Any], key: str, src: ModelBin, name: str, d: int, cross: bool) -> None:
    fused = f"{name}/self_attention/linear_0"
    _linear(out, f"{key}.attn.query", src, fused, slice(0, d))
    _linear(out, f"{key}.attn.key", src, fused, slice(d, 2 * d), bias=False)  # Whisper's key has no bias
    _linear(out, f"{key}.attn.value", src, fused, slice(2 * d, 3 * d))
    _linear(out, f"{key}.attn.out", src, f"{name}/self_attention/linear_1")
    _norm(out, f"{key}.attn_ln", src, f"{name}/self_attention/layer_norm")
    if cross:
        _linear(out, f"{key}.cross_attn.query", src, f"{name}/attention/linear_0")
        kv = f"{name}/attention/linear_1"
        _linear(out, f"{key}.cross_attn.key", src, kv, slice(0, d), bias=False)
        _linear(out, f"{key}.cross_attn.value", src, kv, slice(d, 2 * d))
        _linear(out, f"{key}.cross_attn.out", src, f"{name}/attention/linear_2")
        _norm(out, f"{key}.cross_attn_ln", src, f"{name}/attention/layer_norm")
    _linear(out, f"{key}.mlp1", src, f"{name}/ffn/linear_0")
    _linear(out, f"{key}.mlp2", src, f"{name}/ffn/linear_1")
    _norm(out, f"{key}.mlp_ln", src, f"{name}/ffn/layer_norm")


def mlx_tensors(src: ModelBin) -> dict[str, np.ndarray]:
    """mlx-audio Whisper weight names for the CTranslate2 variables (views into the file)."""
    out: dict[str, Any] = {}
    d = src.array("encoder/conv1/weight").shape[0]
    for conv in ("conv1", "conv2"):
        out[f"encoder.{conv}.weight"] = src.array(f"encoder/{conv}/weight").transpose(0, 2, 1)  # (out, k, in)
        out[f"encoder.{conv}.bias"] = src.array(f"encoder/{conv}/bias")
    for i in range(src.layers("encoder")):
        _block(out, f"encoder.blocks.{i}", src, f"encoder/layer_{i}", d, cross=False)
    _norm(out, "encoder.ln_post", src, "encoder/layer_norm")  # positions are recomputed sinusoids
    out["decoder.token_embedding.weight"] = src.array("decoder/embeddings/weight")
    out["decoder.positional_embedding"] = src.array("decoder/position_encodings/encodings")
    for i in range(src.layers("decoder")):
        _block(out, f"decoder.blocks.{i}", src, f"decoder/layer_{i}", d, cross=True)
    _norm(out, "decoder.ln", src, "decoder/layer_norm")
    return out


def model_config(src: ModelBin) -> dict[str, Any]:
    conv1 = src.array("encoder/conv1/weight")
    d = conv1.shape[0]
    return {
        "model_type": "whisper",
        "n_mels": conv1.shape[1],
        "n_audio_ctx": src.array("encoder/position_encodings/encodings").shape[0],
        "n_audio_state": d,
        "n_audio_head": src.scalar("encoder/num_heads"),
        "n_audio_layer": src.layers("encoder"),
        "n_vocab": src.array("decoder/embeddings/weight").shape[0],
        "n_text_ctx": src.array("decoder/position_encodings/encodings").shape[0],
        "n_text_state": d,
        "n_text_head": src.scalar("decoder/num_heads"),
        "n_text_layer": src.layers("decoder"),
    }


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write tensors in the safetensors layout, one tensor at a time."""
    header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, array in tensors.items():
        dtype = _SAFETENSORS_DTYPES.get(array.dtype)
        if dtype is None:
            raise WhisperConversionError(f"{name} has dtype {array.dtype}, expected float16 or float32")
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for array in tensors.values():
            f.write(np.ascontiguousarray(array).tobytes())


def _time_tokens(first_id: int) -> list[dict[str, Any]]:
    return [{"id": first_id + i, "content": f"<|{i * 0.02:.2f}|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": False} for i in range(TIME_TOKENS)]


def write_tokenizer(src: Path, dest: Path, n_vocab: int) -> None:
    """tokenizer.json with the time tokens added, plus vocab.json and merges.txt and the configs
    transformers' WhisperTokenizer reads."""
    try:
        tokenizer = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
        vocab, merges = tokenizer["model"]["vocab"], tokenizer["model"]["merges"]
        added = tokenizer["added_tokens"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WhisperConversionError(f"tokenizer.json is missing or unreadable ({exc})") from None
    ids = {t["content"]: t["id"] for t in added}
    if "<|notimestamps|>" not in ids or "<|endoftext|>" not in ids:
        raise WhisperConversionError("tokenizer.json lacks Whisper's special tokens")
    if "<|0.00|>" not in ids:
        first = ids["<|notimestamps|>"] + 1
        if first + TIME_TOKENS != n_vocab:
            raise WhisperConversionError(f"the tokenizer's {first} tokens and {TIME_TOKENS} time tokens do not "
                                         f"make the model's vocabulary of {n_vocab}")
        added.extend(_time_tokens(first))
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    (dest / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = [m if isinstance(m, str) else " ".join(m) for m in merges]
    (dest / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n", encoding="utf-8")
    end = "<|endoftext|>"
    config = {"tokenizer_class": "WhisperTokenizer", "processor_class": "WhisperProcessor", "bos_token": end,
              "eos_token": end, "unk_token": end, "pad_token": end, "model_max_length": 1024,
              "add_prefix_space": False, "errors": "replace", "clean_up_tokenization_spaces": False}
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    special = {"bos_token": end, "eos_token": end, "unk_token": end, "pad_token": end}
    (dest / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")


def write_preprocessor(dest: Path, n_mels: int) -> None:
    config = {"feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "WhisperProcessor",
              "feature_size": n_mels, "sampling_rate": SAMPLE_RATE, "hop_length": HOP_LENGTH, "n_fft": N_FFT,
              "chunk_length": CHUNK_SECONDS, "n_samples": CHUNK_SECONDS * SAMPLE_RATE,
              "nb_max_frames": CHUNK_SECONDS * SAMPLE_RATE // HOP_LENGTH, "padding_side": "right",
              "padding_value": 0.0, "return_attention_mask": False}
    (dest / "preprocessor_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _generation_config(src: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Alignment heads (for word timing) from CTranslate2's config.json, when it names them."""
    generation: dict[str, Any] = {"eos_token_id": 50256, "decoder_start_token_id": 50257}
    try:
        ct2 = json.loads((src / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return generation
    heads = ct2.get("alignment_heads") if isinstance(ct2, dict) else None
    if isinstance(heads, list) and all(
            isinstance(h, list) and len(h) == 2 and 0 <= h[0] < config["n_text_layer"]
            and 0 <= h[1] < config["n_text_head"] for h in heads):
        generation["alignment_heads"] = heads
    return generation


def convert_ctranslate2_whisper(src: Path, dest: Path) -> None:
    """Write into `dest` an mlx-audio Whisper folder made from the CTranslate2 model in `src`."""
    dest.mkdir(parents=True, exist_ok=True)
    with ModelBin(src / "model.bin") as model:
        config = model_config(model)
        tensors = mlx_tensors(model)
        write_safetensors(dest / "weights.safetensors", tensors)
        del tensors  # views into the memory map, which closes next
    write_tokenizer(src, dest, config["n_vocab"])
    write_preprocessor(dest, config["n_mels"])
    (dest / "generation_config.json").write_text(json.dumps(_generation_config(src, config), indent=2) + "\n",
                                                 encoding="utf-8")
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
