"""The shared prefixes of several decision requests read in one forward pass.

A forward pass of a small model costs about the same time for one 1,000-token prefix as for many
(on a GPU most of it is launching the layers' kernels), so the prefixes of the decision requests
waiting on a model are read together: one row per request, right-padded to the longest. Under the
causal mask no real token attends to the padding after it, so every row's keys and values up to its
own length are what a pass of that prefix alone computes, and no mask array is needed (MLX keeps
its fused attention for the causal mask). Each request's prefix cache is then a view of its row of
the pack's cache: nothing is copied.

`pick_pack` chooses a pack: the oldest waiting request, then every other one whose prefix keeps the
pack within a token budget and every row's padding within a quarter of the pack's width. A long
prefix therefore never pads the short ones: it goes with prefixes of its own length, or alone. On a GPU the padded
length is rounded up to `GPU_WIDTH_STEP` tokens, so the attention of a pack takes its shape from a
small set (MLX builds a cuDNN graph for every new shape, with the device idle).
"""

from __future__ import annotations

from collections.abc import Sequence

from swama.engine.decisions.decide import DecisionRun
from swama.engine.decisions.heads import fill_cache
from swama.engine.decisions.shared_prefix import GPU_PREFIX_STEP, round_up

GPU_PACK_TOKENS = 32768  # padded tokens in one packed prefill, at most (one prefix may take more alone)
CPU_PACK_TOKENS = 8192
GPU_WIDTH_STEP = GPU_PREFIX_STEP  # the passes read the pack's buffers at the same widths
PADDING = 0.25  # of a pack's width, at most, in any row


def pack_tokens() -> int:
    from swama.engine.runtime import on_gpu

    return GPU_PACK_TOKENS if on_gpu() else CPU_PACK_TOKENS


def width_step() -> int:
    from swama.engine.runtime import on_gpu

    return GPU_WIDTH_STEP if on_gpu() else 1


def packable(run: DecisionRun) -> bool:
    """Whether a prepared run's prefix can be read in a pack: text questions sharing a prefix, on a
    model whose fresh cache is plain key/value layers (recurrent and sliding-window layers would
    read the padding), and no adapter (its rows are its own)."""
    return (run.prefix_reuse and run.prefix > 0 and not run.job.images and run.state.plain_cache
            and not run.job.adapter_slot)


def pick_pack(runs: Sequence[DecisionRun], budget: int, step: int, powers: bool = False) -> list[DecisionRun]:
    """The runs of the next packed prefill, from prepared runs in arrival order (all packable): the
    first, then each later one that keeps the pack within `budget` padded tokens and every row's
    padding within `PADDING` of the pack's width; with `powers` (a GPU's), as many of those as the
    largest power of two allows (the others wait for the next pack), so a pack's shape comes from a
    small set."""
    pack = [runs[0]]
    shortest = longest = runs[0].prefix
    for run in runs[1:]:
        low, width = min(shortest, run.prefix), round_up(max(longest, run.prefix), step)
        if width * (len(pack) + 1) <= budget and low >= (1 - PADDING) * width:
            pack.append(run)
            shortest, longest = low, max(longest, run.prefix)
    return pack[: 1 << (len(pack).bit_length() - 1)] if powers else pack


def prefill_pack(runs: Sequence[DecisionRun], step: int = 1) -> None:
    """The shared prefixes of `runs` (prepared, packable, on one model) into their caches, in one
    forward pass; each run's `shared` is then a view of its row of the pack's cache."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    first = runs[0]
    _ = first.split  # the head split is settled before any pass (see serving/scheduler.py)
    if len(runs) == 1 and step == 1:
        first.prefill()  # exactly as a request alone reads it
        return
    width = round_up(max(run.prefix for run in runs), step)
    tokens = mx.array([run.prepared[0].ids[:run.prefix] + [0] * (width - run.prefix) for run in runs])
    cache = first._cache()
    fill_cache(first.net, tokens, cache)
    for i, run in enumerate(runs):
        shared = []
        for layer in cache:
            row = KVCache()
            row.state = (layer.keys[i:i + 1, :, :run.prefix], layer.values[i:i + 1, :, :run.prefix], run.prefix)
            row.pack = (layer.keys, layer.values, i)  # a pass reads a run of the pack's rows in one slice
            shared.append(row)
        run.shared = shared

