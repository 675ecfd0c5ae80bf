"""The prompt cache's disk tier on a real (tiny) model: blocks written by one cache are read back by a
new one (a restart) and continue the prompt as a fresh prefill does; a corrupt, truncated or foreign
block is skipped and removed; the tier keeps its byte budget; blocks are shared by prefix."""

from __future__ import annotations

import stat
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache
from precision import f32_reordered, forward_products

from swama.engine.model import LoadedModel
from swama.engine.text.kv_cache import QuantizedRow
from swama.engine.text.kv_policy import KVQuant, use_kv_quant
from swama.engine.text.kv_quant import as_quantized
from swama.engine.text.language import load_language_model
from swama.engine.text.prompt_cache import PromptCache, prompt_cache_for
from swama.engine.text.prompt_disk import BLOCK, DiskTier, chain, fingerprint

pytestmark = pytest.mark.slow

# Blocks read back against a fresh prefill: float32 sums in another order (tests/precision.py) through the
# tiny model (2 layers, H 64, I 128, heads of 16) over prompts under 1,024 tokens, logits under 16.
RESUMED = f32_reordered(16, forward_products(2, 64, 128, 16, 1024))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> LoadedModel:
    return load_language_model("tiny", tiny_model_dir)


@pytest.fixture(scope="module")
def smol(smollm2_dir: Path) -> LoadedModel:
    """SmolLM2: heads of 64, which MLX's quantization groups (the tiny model's 16 it cannot)."""
    return load_language_model("smollm2", smollm2_dir)


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 7919 + i * 31) % 900 + 20 for i in range(n)]


def filled(model: LoadedModel, ids: list[int]) -> list:
    cache = make_prompt_cache(model.model)
    model.model(mx.array(ids)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def next_logits(model: LoadedModel, ids: list[int], cache: list | None = None) -> mx.array:
    cache = cache if cache is not None else make_prompt_cache(model.model)
    done = cache[0].offset
    logits = model.model(mx.array(ids[done:])[None], cache=cache)[0, -1]
    mx.eval(logits)
    return logits


def restarted(model: LoadedModel, root: Path, budget: int = 1 << 30) -> PromptCache:
    """A new prompt cache on the same folder: what the next process finds."""
    cache = prompt_cache_for(model, 1 << 30, root, budget)
    assert cache is not None and cache.disk is not None
    return cache


def written(model: LoadedModel, root: Path, ids: list[int], budget: int = 1 << 30) -> PromptCache:
    cache = restarted(model, root, budget)
    cache.put(ids, filled(model, ids))
    cache.close()  # the writer has put every block on disk
    return cache


def test_blocks_written_before_a_restart_continue_the_prompt(tiny: LoadedModel, tmp_path: Path) -> None:
    ids = prompt(3 * BLOCK + 40)
    written(tiny, tmp_path, ids)
    fresh = restarted(tiny, tmp_path)
    assert len(fresh) == 0  # nothing in memory: a new process
    longer = ids + prompt(30, seed=1)
    cache, reused = fresh.take(longer)
    assert reused == 3 * BLOCK and fresh.from_disk == 3 * BLOCK and fresh.disk.stats.hits == 1
    assert mx.allclose(next_logits(tiny, longer, cache), next_logits(tiny, longer), rtol=0, atol=RESUMED).item()


def test_the_blocks_folders_are_this_users_only(tiny: LoadedModel, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    written(tiny, root, prompt(BLOCK + 1))
    folders = [root, *(p for p in root.iterdir() if p.is_dir())]
    assert len(folders) == 2 and all(stat.S_IMODE(f.stat().st_mode) == 0o700 for f in folders)


def test_prompts_share_blocks_by_prefix_and_part_where_they_differ(tiny: LoadedModel, tmp_path: Path) -> None:
    system = prompt(2 * BLOCK, seed=2)
    written(tiny, tmp_path, system + prompt(BLOCK + 5, seed=3))  # one session
    other = system + prompt(BLOCK + 9, seed=4)  # another session, the same system prompt
    cache, reused = restarted(tiny, tmp_path).take(other)
    assert reused == 2 * BLOCK  # the shared blocks only
    assert mx.allclose(next_logits(tiny, other, cache), next_logits(tiny, other), rtol=0, atol=RESUMED).item()
    # The same blocks are written once, whoever writes them.
    files = sorted(p.name for p in (tmp_path).rglob("*.kv"))
    written(tiny, tmp_path, other)
    assert len(sorted(p.name for p in tmp_path.rglob("*.kv"))) == len(files) + 1


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "foreign", "garbage"])
def test_a_damaged_block_is_skipped_and_removed(tiny: LoadedModel, tmp_path: Path, damage: str) -> None:
    ids = prompt(3 * BLOCK + 1)
    cache = written(tiny, tmp_path, ids)
    names = chain(cache.disk.model, ids, 3)
    second = cache.disk.root / f"{names[1]}.kv"
    data = bytearray(second.read_bytes())
    if damage == "corrupt":
        data[-100] ^= 0xFF
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "foreign":  # a whole, valid block of another prompt under this name
        data = bytearray((cache.disk.root / f"{names[2]}.kv").read_bytes())
    else:
        data = bytearray(b"not a block at all")
    second.write_bytes(bytes(data))
    fresh = restarted(tiny, tmp_path)
    got, reused = fresh.take(ids)
    assert reused == BLOCK  # the first block only; the request prefills the rest
    assert not second.exists() and fresh.disk.stats.rejected == 1
    assert mx.allclose(next_logits(tiny, ids, got), next_logits(tiny, ids), rtol=0, atol=RESUMED).item()


def test_another_model_never_reads_these_blocks(tiny: LoadedModel, tmp_path: Path) -> None:
    ids = prompt(2 * BLOCK + 1)
    written(tiny, tmp_path, ids)
    name = fingerprint(tiny.path, "mlx.core.float16")  # the same weights in another dtype
    other = PromptCache(1 << 30, DiskTier(tmp_path / name, name, 1 << 30), layers=len(make_prompt_cache(tiny.model)))
    assert other.take(ids) == (None, 0)


def test_the_disk_tier_keeps_its_budget(tiny: LoadedModel, tmp_path: Path) -> None:
    ids = prompt(4 * BLOCK + 1)
    one_block = 2 * sum(c.keys[..., :BLOCK, :].nbytes for c in filled(tiny, ids[:BLOCK]))
    cache = written(tiny, tmp_path, ids, budget=int(2.5 * one_block))
    kept = list(cache.disk.root.glob("*.kv"))
    assert len(kept) == 2 and cache.disk.stats.evicted == 2 and cache.disk.nbytes <= 2.5 * one_block
    # The oldest (the first blocks) went: the chain breaks at its start, so nothing reads back.
    assert restarted(tiny, tmp_path, budget=int(2.5 * one_block)).take(ids) == (None, 0)


def test_memory_keeps_its_budget_with_a_disk_tier(tiny: LoadedModel, tmp_path: Path) -> None:
    ids = prompt(BLOCK + 10)
    kv = filled(tiny, ids)
    cache = PromptCache(sum(c.nbytes for c in kv) - 1, *_disk(tiny, tmp_path))
    cache.put(ids, kv)
    cache.close()
    assert len(cache) == 0 and cache.nbytes == 0  # over the memory budget: on disk only
    got, reused = cache.take(ids + [5])
    assert reused == BLOCK and cache.from_disk == BLOCK


def _disk(model: LoadedModel, root: Path) -> tuple[DiskTier, int]:
    name = fingerprint(model.path, str(mx.float32))
    return DiskTier(root / name, name, 1 << 30), len(make_prompt_cache(model.model))


def test_kept_prompts_are_evicted_last_in_memory_and_on_disk(tiny: LoadedModel, tmp_path: Path) -> None:
    kept_ids, other_ids = prompt(BLOCK + 10, seed=5), prompt(BLOCK + 10, seed=6)
    one = filled(tiny, kept_ids)
    budget = int(1.5 * sum(c.nbytes for c in one))
    disk_budget = int(1.5 * 2 * sum(c.keys[..., :BLOCK, :].nbytes for c in one))  # one block and a half
    name = fingerprint(tiny.path, str(mx.float32))
    cache = PromptCache(budget, DiskTier(tmp_path / name, name, disk_budget), len(one))
    cache.keep(kept_ids + [1])  # a request with prompt_cache_key or cache_control
    cache.put(kept_ids, one)
    cache.put(other_ids, filled(tiny, other_ids))  # newer, but not kept: it goes, in memory and on disk
    cache.close()
    assert len(cache) == 1 and cache.take(kept_ids + [1])[1] == len(kept_ids)
    on_disk = [p.stem for p in (tmp_path / name).glob("*.kv")]
    assert on_disk == chain(name, kept_ids, 1) and cache.disk.stats.evicted == 1


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_blocks_stay_quantized(smol: LoadedModel, tmp_path: Path, bits: int) -> None:
    """With --kv-bits the blocks hold the packed values, scales and biases as the batch held them: read
    back they are the same arrays, in a folder apart from the full-precision blocks of the same prompt."""
    ids = prompt(2 * BLOCK + 7)
    plain_dir = written(smol, tmp_path, ids).disk.root
    use_kv_quant(smol, KVQuant(bits))
    try:
        held = as_quantized(filled(smol, ids), KVQuant(bits))
        cache = restarted(smol, tmp_path)
        assert cache.disk.root != plain_dir
        cache.put(ids, held)
        cache.close()
        got, reused = restarted(smol, tmp_path).take(ids)
        assert reused == 2 * BLOCK and all(isinstance(c, QuantizedRow) and c.bits == bits for c in got)
        for a, b in zip(held, got, strict=True):
            for x, y in zip((*a.keys, *a.values), (*b.keys, *b.values), strict=True):
                assert mx.array_equal(x[..., :reused, :], y).item()
        expected = next_logits(smol, ids, [c.prefix(reused) for c in held])
        assert mx.array_equal(next_logits(smol, ids, got), expected).item()
    finally:
        use_kv_quant(smol, None)
