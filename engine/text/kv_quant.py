"""Quantized key/value caches (--kv-bits): keys and values kept as MLX's affine quantization (packed
integers, a scale and a bias per group of `group_size` values), read by mlx-lm's quantized attention.

mlx-lm quantizes the cache of one prompt (`QuantizedKVCache`); a batch of rows needs what its plain
`BatchKVCache` does over three arrays per tensor: merging rows left-padded, growing in steps,
rolling right padding out after a chunked prefill, filtering, extending and extracting rows. That
is `BatchQuantizedKVCache` (engine/text/kv_cache.py, which imports mlx-lm: this module imports it
only when a cache is made), and `QuantizedRow` is one row of it (mlx-lm's single cache, which
merges into a batch).

A cache is quantized once it holds `after` tokens (`KVQuant.after`, 0: from the first), and caches
joined to a quantized one are quantized with it: one batch cache per layer holds every row, so a
batch is quantized whole. Quantizing is lossy once: a cache stays quantized as it moves between the
batch, the prompt cache and its disk tier.
"""

from __future__ import annotations

from typing import Any

from swama.engine.text.kv_policy import KVQuant, quantized


def _attention_layers(net: Any) -> list[tuple[Any, Any]]:
    """Each attention layer's module beside its fresh cache, for layers whose cache grows with the
    context (mlx-lm's KVCache); empty when the model's layout is not the usual one."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    layers = getattr(net, "layers", None)
    caches = make_prompt_cache(net)
    if layers is None or len(layers) != len(caches):
        return []
    found = []
    for layer, cache in zip(layers, caches, strict=True):
        if type(cache) is not KVCache:
            continue
        attn = getattr(layer, "self_attn", None)
        if attn is None or not hasattr(attn, "k_proj") or not hasattr(attn, "v_proj"):
            return []
        found.append((attn, cache))
    return found


def kv_token_bytes(net: Any, dtype_bytes: int, kv: KVQuant | None) -> int | None:
    """Key/value bytes one token of context takes over all layers (this process's share of a split
    model: its projections' own widths), quantized as `kv` says; None where the layout is unusual."""
    layers = _attention_layers(net)
    if not layers:
        return None
    width = sum(a.k_proj.weight.shape[0] + a.v_proj.weight.shape[0] for a, _ in layers)
    per = kv.element_bytes(dtype_bytes) if kv is not None else dtype_bytes
    return int(width * per + 0.5)


def as_quantized(caches: list[Any], kv: KVQuant | None, force: bool = False, rows: bool = False) -> list[Any]:
    """`caches` (one per layer, of a row or a batch) quantized where due: plain attention layers once
    they hold `kv.after` tokens (or at once with `force`), mlx-lm's quantized rows as `QuantizedRow`s
    (all that `rows` asks, with no `kv`). Other layers (sliding windows, recurrent state) stay as they
    are. The same list when nothing changes."""
    if kv is None and not rows:
        return caches
    from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

    from swama.engine.text.kv_cache import BatchQuantizedKVCache, QuantizedRow

    out = []
    for c in caches:
        if kv is not None and type(c) is KVCache and (force or kv.due(c.offset)):
            c = QuantizedRow.of(c, kv)
        elif type(c) is QuantizedKVCache:
            c = QuantizedRow.of(c)
        elif kv is not None and type(c) is BatchKVCache and (force or kv.due(c._idx)):
            c = BatchQuantizedKVCache.of(c, kv)
        out.append(c)
    return out


def any_quantized(caches: list[Any]) -> bool:
    return any(quantized(c) for c in caches)


def merged(caches: list[Any]) -> Any:
    """One layer's row caches merged into a batch cache: a quantized one when any row is quantized."""
    return next((c for c in caches if quantized(c)), caches[0]).merge(caches)


def joined(ours: list[Any], theirs: list[Any], kv: KVQuant | None) -> tuple[list[Any], list[Any]]:
    """Two batches' caches made one kind before one extends the other: both quantized when either is."""
    if not ours or not theirs or any_quantized(ours) == any_quantized(theirs):
        return ours, theirs
    kv = kv or next(KVQuant(c.bits, c.group_size) for c in (*ours, *theirs) if quantized(c))
    return as_quantized(ours, kv, force=True), as_quantized(theirs, kv, force=True)
