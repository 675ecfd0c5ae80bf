"""The prompt cache's disk tier: key/value state in blocks of `BLOCK` tokens that outlive the process.

A block is named by a chained hash: the model's fingerprint (its config, its weight files, the compute
dtype and, on a split model, its rank), then each block's tokens in turn, so a name stands for the
whole prefix up to the block's end, and two prompts that share their first blocks share those files
whichever session or process wrote them. A request whose prompt the memory tier cannot serve far
enough reads the longest run of its blocks back from disk before it prefills the rest.

Safety, since the files outlive the process that wrote them:

- writes go to a writer thread (the scheduler thread only hands it arrays it already holds) and each
  file is written to a temporary name, synced, then renamed, so a reader sees whole files or none;
- every file carries its name's hash, its parent's, its tokens, the layout and a CRC of its bytes; a
  file that is truncated, corrupt, of another model or another layout is skipped and removed, and
  the request prefills from there;
- the tier keeps within its byte budget by removing the least recently used files (a read touches).

A quantized cache (--kv-bits, engine/text/kv_quant.py) is stored as it is held, packed values,
scales and biases, and read back quantized; its fingerprint names the quantization, so its blocks
live in a folder of their own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("swama.prompt_cache")

BLOCK = 256  # tokens per block: a multiple of the GPU's cache step (serving/admission.py's ALIGN)
MAGIC = b"SWAMAKV2"  # 2: a layout of any arrays per layer (quantized caches keep theirs)
SUFFIX = ".kv"
KEEP = ".keep"  # the marker of a block a request asked to keep
_HEADER = struct.Struct("<8sI")  # magic, header length


def fingerprint(model_path: Path, dtype: str, extra: str = "") -> str:
    """What a block's keys and values depend on besides its tokens: the model's config and weight files
    (names, sizes and their first 64 KiB, which hold the safetensors headers), the dtype, `extra`."""
    digest = hashlib.sha256()
    for name in sorted(p.name for p in model_path.iterdir() if p.suffix in (".json", ".safetensors")):
        path = model_path / name
        digest.update(f"{name}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as f:
            digest.update(f.read(1 << 16))
    digest.update(f"{dtype}\0{extra}".encode())
    return digest.hexdigest()[:32]


def chain(model: str, ids: list[int], blocks: int) -> list[str]:
    """The names of the first `blocks` whole blocks of `ids`."""
    names, parent = [], model
    for b in range(blocks):
        digest = hashlib.sha256(parent.encode())
        digest.update(struct.pack(f"<{BLOCK}q", *ids[b * BLOCK:(b + 1) * BLOCK]))
        parent = digest.hexdigest()
        names.append(parent)
    return names


@dataclass
class DiskStats:
    hits: int = 0  # prompts that read blocks from disk
    misses: int = 0  # prompts with whole blocks that found none beyond the memory tier
    read_tokens: int = 0
    written_bytes: int = 0
    evicted: int = 0  # files removed for the budget
    rejected: int = 0  # files skipped and removed: truncated, corrupt, foreign


@dataclass
class _Write:
    name: str
    parent: str
    tokens: list[int]
    # Each layer's arrays for the block, MLX arrays evaluated: keys and values, or for a quantized cache
    # (engine/text/kv_quant.py) the keys' packed values, scales and biases, then the values'.
    layers: list[tuple[Any, ...]]
    dtypes: list[str]  # each array's dtype (the same for every layer)
    quant: list[int] | None  # [group size, bits] of a quantized cache


def _parts(cache: Any) -> tuple[Any, ...]:
    """A layer cache's arrays in the order a block stores them."""
    return (*cache.keys, *cache.values) if hasattr(cache, "bits") else (cache.keys, cache.values)


@dataclass
class DiskTier:
    root: Path  # the folder of this model's blocks
    model: str  # the fingerprint
    budget: int  # bytes
    stats: DiskStats = field(default_factory=DiskStats)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # Blocks hold the conversations' keys and values: readable by this user only, the cache
        # folder and the model's folder in it (files inside a 0700 folder are out of others' reach).
        for folder in (self.root.parent, self.root):
            os.chmod(folder, 0o700)
        self._queue: queue.Queue[_Write | list[str] | None] = queue.Queue()
        self._pending: set[str] = set()  # names queued, not yet on disk
        self._lock = threading.Lock()
        files = list(self._files())
        self._bytes = sum(p.stat().st_size for p in files)
        # Names on disk, so handing a finished row's blocks to the writer costs the device's thread no stat.
        self._known = {p.stem for p in files}
        # Blocks of prompts a request asked to keep (a marker file beside each): evicted after the others.
        self._kept = {p.name.removesuffix(KEEP) for p in self.root.glob(f"*{KEEP}")}
        self._writer = threading.Thread(target=self._write_forever, name="swama-prompt-disk", daemon=True)
        self._writer.start()

    # -- reading (the scheduler's thread) ----------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.root / f"{name}{SUFFIX}"

    def _files(self) -> Iterator[Path]:
        return (p for p in self.root.glob(f"*{SUFFIX}") if p.is_file())

    def present(self, ids: list[int], most: int) -> list[str]:
        """Names of the longest run of `ids`' first blocks on disk, within `most` tokens."""
        names = chain(self.model, ids, min(len(ids), most) // BLOCK)
        found = []
        for name in names:
            if not self._path(name).is_file():
                break
            found.append(name)
        return found

    def read(self, ids: list[int], names: list[str], layers: int) -> list[Any] | None:
        """Key/value caches of `layers` layers holding the blocks `names` (the first blocks of `ids`), or
        as many leading ones as read back whole; None when not even the first does. The blocks of one
        prompt must agree on their layout and dtype (the folder's fingerprint names the compute dtype)."""
        import mlx.core as mx
        from mlx_lm.models.cache import KVCache

        from swama.engine.text.kv_cache import QuantizedRow

        parts: list[list[tuple[Any, ...]]] = []
        parent, layout = self.model, None
        for b, name in enumerate(names):
            found = self._load(name, parent, ids[b * BLOCK:(b + 1) * BLOCK], layers, layout)
            if found is None:
                break
            arrays, layout = found  # every block of a prompt has the first one's layout
            parts.append(arrays)
            parent = name
        if not parts or layout is None:
            return None
        quant = layout[2]
        caches: list[Any] = []
        for layer in range(layers):
            joined = [mx.concatenate([p[layer][i] for p in parts], axis=2) for i in range(len(parts[0][layer]))]
            if quant is not None:
                cache = QuantizedRow(quant[0], quant[1])
                cache.keys, cache.values, cache.offset = tuple(joined[:3]), tuple(joined[3:]), len(parts) * BLOCK
            else:
                cache = KVCache()
                cache.update_and_fetch(joined[0], joined[1])
            caches.append(cache)
        mx.eval([_parts(c) for c in caches])
        self.stats.read_tokens += len(parts) * BLOCK
        return caches

    def _load(self, name: str, parent: str, tokens: list[int], layers: int,
              layout: tuple[Any, ...] | None) -> tuple[list[tuple[Any, ...]], tuple[Any, ...]] | None:
        """Block `name`'s arrays per layer and its layout (shapes, dtypes, quantization), when the file
        is whole, is this block and has `layout` (the prompt's first block's; None: any valid one)."""
        import mlx.core as mx
        import numpy as np

        path = self._path(name)
        try:
            data = path.read_bytes()
            magic, size = _HEADER.unpack_from(data)
            header = json.loads(data[_HEADER.size:_HEADER.size + size])
            payload = memoryview(data)[_HEADER.size + size:]
            shapes, dtypes, quant = header["shapes"], header["dtypes"], header["quant"]
            found = (shapes, dtypes, quant)
            per_layer = 2 if quant is None else 6
            stored = [_storage(d) for d in dtypes]  # KeyError for a dtype no block holds
            if (magic != MAGIC or header["name"] != name or header["parent"] != parent
                    or header["tokens"] != tokens or len(shapes) != layers or len(dtypes) != per_layer
                    or (layout is not None and found != layout)
                    or any(len(layer) != per_layer or any(len(s) != 4 or s[2] != BLOCK for s in layer)
                           for layer in shapes)
                    or len(payload) != header["bytes"]
                    or header["bytes"] != sum(int(np.prod(s)) * np.dtype(t).itemsize
                                              for layer in shapes for s, t in zip(layer, stored, strict=True))
                    or zlib.crc32(payload) != header["crc"]):
                raise ValueError("it is not this block")
            arrays, at = [], 0
            for layer in shapes:
                row = []
                for shape, kind, dtype in zip(layer, stored, dtypes, strict=True):
                    raw = np.frombuffer(payload, dtype=kind, count=int(np.prod(shape)), offset=at).reshape(shape)
                    at += raw.nbytes
                    row.append(mx.array(raw).view(mx.bfloat16) if dtype == "mlx.core.bfloat16" else mx.array(raw))
                arrays.append(tuple(row))
        except FileNotFoundError:
            return None
        except Exception as exc:  # truncated, corrupt, foreign: never trusted, never a crash
            log.warning("prompt cache: removed %s (%s)", path.name, exc)
            self.stats.rejected += 1
            self._remove(path)
            return None
        os.utime(path)  # recently used: evicted last
        return arrays, found

    # -- writing (the writer thread) ---------------------------------------------------------------

    def write(self, tokens: list[int], cache: list[Any]) -> None:
        """Hand the whole blocks of `cache` (holding `tokens`) that are not on disk to the writer."""
        import mlx.core as mx

        count = min(len(tokens), cache[0].offset) // BLOCK
        names = chain(self.model, tokens, count)
        parent = self.model
        for b, name in enumerate(names):
            with self._lock:
                fresh = name not in self._pending and name not in self._known
                if fresh:
                    self._pending.add(name)
            if fresh:
                s, e = b * BLOCK, (b + 1) * BLOCK
                # Views of arrays already evaluated: the writer thread reads their bytes, runs nothing.
                layers = [tuple(_stored(x[..., s:e, :]) for x in _parts(c)) for c in cache]
                mx.eval(layers)
                first = cache[0]
                quant = [first.group_size, first.bits] if hasattr(first, "bits") else None
                self._queue.put(_Write(name, parent, list(tokens[s:e]), layers,
                                       [str(x.dtype) for x in _parts(first)], quant))
            parent = name

    def keep(self, ids: list[int]) -> None:
        """Mark the whole blocks of `ids` as kept (the writer thread writes the markers)."""
        self._queue.put(chain(self.model, ids, len(ids) // BLOCK))

    def flush(self, timeout: float = 60.0) -> None:
        """Until every block handed over is on disk (tests, and before a model goes)."""
        done = threading.Event()
        self._queue.put(None)
        self._flushed = done
        done.wait(timeout)

    def _write_forever(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                flushed = getattr(self, "_flushed", None)
                if flushed is not None:
                    flushed.set()
                continue
            if isinstance(item, list):  # names to keep
                for name in item:
                    if name not in self._kept:
                        self._kept.add(name)
                        self.root.joinpath(f"{name}{KEEP}").touch()
                continue
            try:
                self._write(item)
            except Exception:  # a full disk, a removed folder: the block is simply not kept
                log.exception("prompt cache: could not write a block")
            finally:
                with self._lock:
                    self._pending.discard(item.name)

    def _write(self, item: _Write) -> None:
        import numpy as np

        payload = b"".join(np.asarray(a).tobytes() for layer in item.layers for a in layer)
        header = json.dumps({
            "name": item.name, "parent": item.parent, "tokens": item.tokens, "bytes": len(payload),
            "shapes": [[list(x.shape) for x in layer] for layer in item.layers], "dtypes": item.dtypes,
            "quant": item.quant, "crc": zlib.crc32(payload),
        }).encode()
        path = self._path(item.name)
        # Named by process and thread: replicas on one machine share the folder.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.part")
        with open(tmp, "wb") as f:
            f.write(_HEADER.pack(MAGIC, len(header)) + header + payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        with self._lock:
            self._known.add(item.name)
        size = path.stat().st_size
        self.stats.written_bytes += size
        with self._lock:
            self._bytes += size
        self._keep_within_budget()

    def _keep_within_budget(self) -> None:
        with self._lock:
            over = self._bytes > self.budget
        if not over:
            return
        # Blocks no request asked to keep go first, each group least recently used first.
        by_age = sorted(self._files(), key=lambda p: (p.stem in self._kept, p.stat().st_mtime_ns))
        for path in by_age:
            with self._lock:
                if self._bytes <= self.budget:
                    return
            self._remove(path)
            self.stats.evicted += 1

    def _remove(self, path: Path) -> None:
        if path.stem in self._kept:
            self._kept.discard(path.stem)
            path.with_name(f"{path.stem}{KEEP}").unlink(missing_ok=True)
        with self._lock:
            self._known.discard(path.stem)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return
        with self._lock:
            self._bytes -= size

    @property
    def nbytes(self) -> int:
        return self._bytes


def _storage(dtype: str) -> Any:
    """The numpy type an array of MLX dtype `dtype` (its name) is stored as: bfloat16 as its 16 bits."""
    import numpy as np

    return {"mlx.core.bfloat16": np.uint16, "mlx.core.float16": np.float16, "mlx.core.float32": np.float32,
            "mlx.core.uint32": np.uint32}[dtype]


def _stored(array: Any) -> Any:
    import mlx.core as mx

    return array.view(mx.uint16) if array.dtype == mx.bfloat16 else array

