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
MAGIC = b"SWAMAKV1"
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
    layers: list[tuple[Any, Any]]  # each layer's keys and values for the block: MLX arrays, evaluated
    dtype: str


@dataclass
class DiskTier:
    root: Path  # the folder of this model's blocks
    model: str  # the fingerprint
    budget: int  # bytes
    stats: DiskStats = field(default_factory=DiskStats)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
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

        parts: list[list[tuple[Any, Any]]] = []
        parent, shapes, dtype = self.model, None, None
        for b, name in enumerate(names):
            found = self._load(name, parent, ids[b * BLOCK:(b + 1) * BLOCK], layers, dtype, shapes)
            if found is None:
                break
            shapes = [list(k.shape) for k, _ in found]  # every block of a prompt has the first one's layout
            dtype = found[0][0].dtype
            parts.append(found)
            parent = name
        if not parts:
            return None
        caches = []
        for layer in range(layers):
            cache = KVCache()
            keys = mx.concatenate([p[layer][0] for p in parts], axis=2)
            values = mx.concatenate([p[layer][1] for p in parts], axis=2)
            cache.update_and_fetch(keys, values)
            caches.append(cache)
        mx.eval([c.state for c in caches])
        self.stats.read_tokens += len(parts) * BLOCK
        return caches

    def _load(self, name: str, parent: str, tokens: list[int], layers: int, dtype: Any,
              shapes: list[list[int]] | None) -> list[tuple[Any, Any]] | None:
        import mlx.core as mx
        import numpy as np

        path = self._path(name)
        try:
            data = path.read_bytes()
            magic, size = _HEADER.unpack_from(data)
            header = json.loads(data[_HEADER.size:_HEADER.size + size])
            payload = memoryview(data)[_HEADER.size + size:]
            dtype = dtype or getattr(mx, _DTYPES[header["dtype"]])
            stored = _storage(dtype)
            found = header["shapes"]
            if (magic != MAGIC or header["name"] != name or header["parent"] != parent
                    or header["tokens"] != tokens or header["dtype"] != str(dtype) or len(found) != layers
                    or any(len(s) != 4 or s[2] != BLOCK for s in found) or (shapes is not None and found != shapes)
                    or len(payload) != header["bytes"]
                    or header["bytes"] != 2 * sum(int(np.prod(s)) for s in found) * np.dtype(stored).itemsize
                    or zlib.crc32(payload) != header["crc"]):
                raise ValueError("it is not this block")
            pairs, at = [], 0
            for shape in found:
                pair = []
                for _ in range(2):
                    raw = np.frombuffer(payload, dtype=stored, count=int(np.prod(shape)), offset=at).reshape(shape)
                    at += raw.nbytes
                    pair.append(mx.array(raw).view(dtype) if dtype == mx.bfloat16 else mx.array(raw))
                pairs.append((pair[0], pair[1]))
        except FileNotFoundError:
            return None
        except Exception as exc:  # truncated, corrupt, foreign: never trusted, never a crash
            log.warning("prompt cache: removed %s (%s)", path.name, exc)
            self.stats.rejected += 1
            self._remove(path)
            return None
        os.utime(path)  # recently used: evicted last
        return pairs

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
                layers = [(_stored(c.keys[..., s:e, :]), _stored(c.values[..., s:e, :])) for c in cache]
                mx.eval(layers)
                self._queue.put(_Write(name, parent, list(tokens[s:e]), layers, str(cache[0].keys.dtype)))
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

        payload = b"".join(np.asarray(a).tobytes() for pair in item.layers for a in pair)
        header = json.dumps({
            "name": item.name, "parent": item.parent, "tokens": item.tokens, "bytes": len(payload),
            "shapes": [list(k.shape) for k, _ in item.layers], "dtype": item.dtype, "crc": zlib.crc32(payload),
        }).encode()
        path = self._path(item.name)
        tmp = path.with_name(f".{path.name}.{threading.get_ident()}.part")
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


_DTYPES = {"mlx.core.bfloat16": "bfloat16", "mlx.core.float16": "float16", "mlx.core.float32": "float32"}


def _storage(dtype: Any) -> Any:
    """The numpy type a block's values are stored as: bfloat16 as its 16 bits."""
    import mlx.core as mx
    import numpy as np

    return {mx.bfloat16: np.uint16, mx.float16: np.float16, mx.float32: np.float32}[dtype]


def _stored(array: Any) -> Any:
    import mlx.core as mx

    return array.view(mx.uint16) if array.dtype == mx.bfloat16 else array

