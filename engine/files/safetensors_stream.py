"""Write a safetensors file one tensor at a time.

`mx.save_safetensors` takes every array at once, so converting a model through it holds the whole
output in memory. The format is a little-endian u64 header length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes in that order: with every shape known up
front (the GGUF header gives them) the header is written first and each tensor follows as soon as
it is converted, so memory holds one tensor at a time.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import mlx.core as mx
import numpy as np

# safetensors dtype names of the MLX dtypes a model folder holds, and their item sizes.
DTYPES: dict[mx.Dtype, tuple[str, int]] = {
    mx.float32: ("F32", 4), mx.float16: ("F16", 2), mx.bfloat16: ("BF16", 2), mx.uint32: ("U32", 4),
}  # fmt: skip


@dataclass(frozen=True)
class TensorPlan:
    name: str
    dtype: mx.Dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPES[self.dtype][1]


NUMPY_DTYPES = {np.dtype(np.float32): mx.float32, np.dtype(np.float16): mx.float16, np.dtype(np.uint32): mx.uint32}


def mlx_dtype(array: mx.array | np.ndarray) -> mx.Dtype:
    return array.dtype if isinstance(array, mx.array) else NUMPY_DTYPES[array.dtype]


def array_bytes(array: mx.array | np.ndarray) -> memoryview:
    """The array's bytes in row-major order (bfloat16 through its 16-bit pattern: numpy has no bf16)."""
    if isinstance(array, mx.array):
        if array.dtype == mx.bfloat16:
            array = array.view(mx.uint16)
        mx.eval(array)
        array = np.array(array, copy=False)
    return memoryview(np.ascontiguousarray(array))


class SafetensorsStream:
    """`with SafetensorsStream(path, plans) as out: out.write(name, array)` for each plan, in order."""

    def __init__(self, path: Path, plans: list[TensorPlan], metadata: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        self.plans = plans
        header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
        offset = 0
        for plan in plans:
            header[plan.name] = {"dtype": DTYPES[plan.dtype][0], "shape": list(plan.shape),
                                 "data_offsets": [offset, offset + plan.nbytes]}
            offset += plan.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._file.write(struct.pack("<Q", len(raw)) + raw)
        self._next = 0

    def write(self, name: str, array: mx.array | np.ndarray) -> None:
        self.write_rows(name, [array])

    def write_rows(self, name: str, parts: Iterable[mx.array | np.ndarray]) -> None:
        """Write the next tensor from consecutive blocks of its rows, each freed once written."""
        plan = self.plans[self._next]
        if name != plan.name:
            raise ValueError(f"expected {plan.name} next, got {name}")
        rows = 0
        for part in parts:
            if mlx_dtype(part) != plan.dtype or tuple(part.shape[1:]) != plan.shape[1:]:
                raise ValueError(f"{name}: expected {plan.dtype} rows of {plan.shape[1:]}, got {part.dtype} "
                                 f"{tuple(part.shape)}")
            rows += part.shape[0] if part.ndim else 1
            self._file.write(array_bytes(part))
        if rows != (plan.shape[0] if plan.shape else 1):
            raise ValueError(f"{name}: wrote {rows} rows of {plan.shape}")
        self._next += 1

    def close(self) -> None:
        self._file.close()
        if self._next != len(self.plans):
            raise ValueError(f"{len(self.plans) - self._next} tensors were never written to {self.path}")

    def __enter__(self) -> SafetensorsStream:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self._file.close()  # the caller's failure wins; the staging folder is removed
