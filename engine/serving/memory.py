"""How much memory a model will take once loaded (what the machine has free is `runtime.available_bytes`).

The estimate reads the safetensors headers (no weights): each floating tensor counts at the dtype
it is computed in (float32 on the CPU, where 16-bit weights are cast up at load), every other
tensor at its stored size. Folders without safetensors count their files' sizes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_FLOATING = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}


def _tensor_bytes(path: Path, float_bytes: int | None) -> int:
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        size = end - start
        stored = _FLOATING.get(info["dtype"])
        if float_bytes is not None and stored is not None:
            size = size // stored * float_bytes
        total += size
    return total


def model_bytes(folder: Path, float_bytes: int | None) -> int:
    """Bytes the model's weights take in memory; `float_bytes` is the size floating weights are cast
    to at load (None: kept as stored)."""
    files = sorted(folder.rglob("*.safetensors"))
    if not files:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    total = 0
    for path in files:
        try:
            total += _tensor_bytes(path, float_bytes)
        except (OSError, ValueError, KeyError, struct.error):
            total += path.stat().st_size  # unreadable header: the load will say what is wrong
    return total


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
