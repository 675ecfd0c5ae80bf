"""Convert a GGUF model file into an MLX model folder that mlx-lm loads.

llama.cpp's own `gguf` package reads the file and dequantizes its tensors, whatever their type
(the legacy, K- and I-quants, BF16, F16, F32). What is ours: mapping names and metadata onto an
mlx-lm model (gguf_arch.py), rebuilding the tokenizer (gguf_tokenizer.py), and
writing the weights one tensor at a time (safetensors_stream.py), so memory holds about one
tensor, not the model twice.

The folder holds ``config.json``, ``model.safetensors`` (float32 on the CPU, bfloat16 on a GPU,
or MLX's affine quantization), ``tokenizer.json``/``tokenizer_config.json``,
``chat_template.jinja`` and ``generation_config.json``.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, LlamaFileType
from gguf.gguf_reader import ReaderTensor
from gguf.quants import dequantize

from swama.engine.errors import GGUFImportError
from swama.engine.files.gguf_arch import ArchSpec, arch_spec, build_config
from swama.engine.files.gguf_tokenizer import build_generation_config, build_tokenizer, build_tokenizer_config
from swama.engine.files.safetensors_stream import SafetensorsStream, TensorPlan

__all__ = ["GGUFImportError", "ImportOptions", "ImportSummary", "import_gguf", "read_gguf"]

QUANTIZE_BITS = (4, 8)
NOT_WEIGHTS = ("I8", "I16", "I32", "I64", "F64")  # integer and float64 tensors hold no model weights
GROUP_SIZE = 64  # MLX's default group for affine quantization, as mlx_lm.convert uses


@dataclass(frozen=True)
class ImportOptions:
    dtype: mx.Dtype | None = None  # floating weights; None: the engine's compute dtype on this machine
    quantize_bits: int | None = None  # re-quantize the matrices with MLX's affine quantization
    progress: bool = False  # a progress bar on stderr


@dataclass(frozen=True)
class ImportSummary:
    """What was converted into what, for the model card."""

    file: str
    architecture: str
    file_type: str | None  # the quantization the file declares, e.g. Q4_K_M
    tensor_types: dict[str, int]  # tensor type -> how many tensors of it
    converted_to: str

    def card(self) -> dict[str, Any]:
        return {"gguf": {"file": self.file, "architecture": self.architecture, "file_type": self.file_type,
                         "tensor_types": self.tensor_types}, "converted_to": self.converted_to}


@dataclass(frozen=True)
class GGUFFile:
    metadata: dict[str, Any]
    tensors: list[ReaderTensor]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.name: numpy_shape(t) for t in self.tensors}


def numpy_shape(tensor: ReaderTensor) -> tuple[int, ...]:
    """Element shape in numpy order (GGUF lists the innermost dimension first)."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _field_value(field: Any) -> Any:
    value = field.contents()
    if field.types == [GGUFValueType.FLOAT32]:  # shortest decimal that round-trips: 1e-05, not 9.99999974e-06
        value = float(str(np.float32(value)))
    return value


def read_gguf(path: Path) -> GGUFFile:
    """The file's metadata and tensor table; tensor data stays on disk (memory-mapped)."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise GGUFImportError(f"{path} is not a GGUF file ({'empty' if path.is_file() else 'not a file'})")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFImportError(f"{path} is not a GGUF file (bad magic {magic!r})")
    try:
        reader = GGUFReader(path)
        metadata = {name: _field_value(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, TypeError) as exc:
        raise GGUFImportError(f"GGUF file {path} is truncated or damaged: {exc}") from None
    return GGUFFile(metadata, list(reader.tensors))


@functools.cache
def can_dequantize(qtype: GGMLQuantizationType) -> bool:
    """Whether the gguf package decodes this tensor type (tried on one zero block)."""
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return True
    try:
        dequantize(np.zeros(size, dtype=np.uint8), qtype)
    except (NotImplementedError, ValueError, KeyError):
        return False
    return True


def supported_types() -> list[str]:
    return [t.name for t in GGMLQuantizationType if t.name not in NOT_WEIGHTS and can_dequantize(t)]


def check_tensor_types(gguf: GGUFFile) -> None:
    """Refuse tensor types that cannot be decoded, naming them and their tensors."""
    unsupported: dict[str, list[str]] = {}
    for t in gguf.tensors:
        if t.tensor_type.name in NOT_WEIGHTS or not can_dequantize(t.tensor_type):
            unsupported.setdefault(t.tensor_type.name, []).append(t.name)
    if not unsupported:
        return

    def listing(names: list[str]) -> str:
        return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")

    if len(unsupported) == 1:
        [(type_name, names)] = unsupported.items()
        problem = f"type {type_name} is not supported (tensors: {listing(names)})"
    else:
        each = ", ".join(f"{t} (tensors: {listing(names)})" for t, names in unsupported.items())
        problem = f"types {each} are not supported"
    raise GGUFImportError(f"GGUF tensor {problem}; supported: {', '.join(supported_types())}")


def tensor_values(tensor: ReaderTensor) -> np.ndarray:
    """One tensor as float32 in numpy order, decoded from the memory-mapped file."""
    values = dequantize(tensor.data, tensor.tensor_type)
    return np.asarray(values, dtype=np.float32).reshape(numpy_shape(tensor))


CHUNK_VALUES = 1 << 22  # decode big tensors 4M values (16 MiB of float32) at a time


def tensor_row_blocks(tensor: ReaderTensor) -> Iterator[np.ndarray]:
    """The tensor as float32 blocks of whole rows (the data's first axis), decoded one at a time."""
    shape = numpy_shape(tensor)
    if len(shape) < 2:
        yield tensor_values(tensor)
        return
    step = max(1, CHUNK_VALUES // int(np.prod(shape[1:])))
    for start in range(0, shape[0], step):
        block = dequantize(tensor.data[start:start + step], tensor.tensor_type)
        yield np.asarray(block, dtype=np.float32).reshape(-1, *shape[1:])


def _quantizable(shape: tuple[int, ...], bits: int | None) -> bool:
    # What mlx-lm's loader quantizes: the matrices of linear and embedding layers whose rows split
    # into whole groups (it quantizes exactly the modules that have .scales in the file).
    return bits is not None and len(shape) == 2 and shape[-1] % GROUP_SIZE == 0


def _plans(name: str, shape: tuple[int, ...], dtype: mx.Dtype, bits: int | None) -> list[TensorPlan]:
    if not _quantizable(shape, bits):
        return [TensorPlan(name, dtype, shape)]
    assert bits is not None
    rows, cols = shape
    base = name.removesuffix(".weight")
    return [TensorPlan(name, mx.uint32, (rows, cols * bits // 32)),
            TensorPlan(f"{base}.scales", dtype, (rows, cols // GROUP_SIZE)),
            TensorPlan(f"{base}.biases", dtype, (rows, cols // GROUP_SIZE))]


# Output dtypes numpy has: written straight from the decoded array, without a copy through MLX.
_NUMPY_DTYPES = {mx.float32: np.float32, mx.float16: np.float16}


def _cast(values: np.ndarray, dtype: mx.Dtype) -> np.ndarray | mx.array:
    if dtype in _NUMPY_DTYPES:
        return values.astype(_NUMPY_DTYPES[dtype], copy=False)
    return mx.array(values).astype(dtype)


def _output_arrays(name: str, values: np.ndarray, dtype: mx.Dtype,
                   bits: int | None) -> list[tuple[str, mx.array | np.ndarray]]:
    if not _quantizable(values.shape, bits):
        return [(name, _cast(values, dtype))]
    array = mx.array(values).astype(dtype)
    weight, scales, biases = mx.quantize(array, group_size=GROUP_SIZE, bits=bits)
    base = name.removesuffix(".weight")
    return [(name, weight), (f"{base}.scales", scales), (f"{base}.biases", biases)]


def _file_type(metadata: dict[str, Any]) -> str | None:
    value = metadata.get("general.file_type")
    try:
        return LlamaFileType(int(value)).name.removeprefix("MOSTLY_") if value is not None else None
    except ValueError:
        return f"file type {value}"


def _weight_tensors(gguf: GGUFFile, spec: ArchSpec) -> list[tuple[ReaderTensor, str]]:
    pairs = [(t, spec.mlx_name(t.name)) for t in gguf.tensors if t.name not in spec.config_tensors]
    unknown = [t.name for t, name in pairs if name is None]
    if unknown:
        shown = ", ".join(unknown[:6]) + (", ..." if len(unknown) > 6 else "")
        raise GGUFImportError(f"GGUF tensors not understood for {spec.model_type}: {shown}")
    return [(t, name) for t, name in pairs if name is not None]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def import_gguf(gguf_path: Path, dest: Path, options: ImportOptions | None = None) -> ImportSummary:
    """Convert ``gguf_path`` into an MLX model folder at ``dest``.

    Raises GGUFImportError for anything unsupported, before any weight is written. Writes only
    inside ``dest`` (created if needed); on failure the caller removes the partial folder.
    """
    from swama.engine.runtime import compute_dtype

    options = options or ImportOptions()
    if options.quantize_bits not in (None, *QUANTIZE_BITS):
        raise GGUFImportError(f"--quantize takes {' or '.join(map(str, QUANTIZE_BITS))} bits, not {options.quantize_bits}")
    gguf_path, dest = Path(gguf_path), Path(dest)
    gguf = read_gguf(gguf_path)
    check_tensor_types(gguf)
    md = gguf.metadata
    spec = arch_spec(md)
    config_tensors = {t.name: tensor_values(t).reshape(-1) for t in gguf.tensors if t.name in spec.config_tensors}
    config = build_config(md, spec, gguf.shapes(), config_tensors)
    weights = _weight_tensors(gguf, spec)
    if "tokenizer.ggml.tokens" not in md:
        raise GGUFImportError("GGUF file has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    tokenizer = build_tokenizer(md)

    dtype = options.dtype or compute_dtype()
    bits = options.quantize_bits
    dtype_name = str(dtype).removeprefix("mlx.core.")
    converted_to = (f"MLX affine {bits}-bit (group {GROUP_SIZE}, {dtype_name} scales)" if bits else dtype_name)
    config["torch_dtype"] = dtype_name
    if bits:
        config["quantization"] = config["quantization_config"] = {"group_size": GROUP_SIZE, "bits": bits}

    dest.mkdir(parents=True, exist_ok=True)
    plans = [plan for t, name in weights for plan in _plans(name, numpy_shape(t), dtype, bits)]
    from tqdm import tqdm

    with (SafetensorsStream(dest / "model.safetensors", plans, metadata={"format": "mlx"}) as out,
          tqdm(total=sum(int(t.n_bytes) for t, _ in weights), unit="B", unit_scale=True, desc="converting",
               disable=not options.progress, leave=False) as bar):
        for tensor, name in weights:
            if spec.changes(name) or _quantizable(numpy_shape(tensor), bits):
                # Whole tensors: un-permuting and quantizing need all their rows.
                values = spec.transform(name, tensor_values(tensor), config)
                for out_name, array in _output_arrays(name, values, dtype, bits):
                    out.write(out_name, array)
                del values, array
            else:
                out.write_rows(name, (_cast(block, dtype) for block in tensor_row_blocks(tensor)))
            bar.update(int(tensor.n_bytes))

    _write_json(dest / "config.json", config)
    tokenizer.save(str(dest / "tokenizer.json"))
    _write_json(dest / "tokenizer_config.json", build_tokenizer_config(md, config["max_position_embeddings"]))
    if template := md.get("tokenizer.chat_template"):
        (dest / "chat_template.jinja").write_text(template, encoding="utf-8")
    _write_json(dest / "generation_config.json", build_generation_config(md))
    types = Counter(t.tensor_type.name for t in gguf.tensors)
    return ImportSummary(gguf_path.name, md["general.architecture"], _file_type(md), dict(types.most_common()),
                         converted_to)
