"""LoRA adapters (engine/adapters/): two real adapters of SmolLM2, trained in the test set-up with mlx-lm's
own trainer, installed with `swama create --base` and applied per row.

- Applied per row, an adapter's logits are mlx-lm's own LoRA layers' (`load_adapters`), for mlx-lm's
  format and for the same adapter written in PEFT's.
- A batch mixing both adapters and the base gives each row the tokens that row gives alone; each
  adapter's row answers its own code word.
- A decision request with an adapter reads the adapter's probabilities.
- The prompt cache keeps an adapter's rows apart; the bank keeps at most its capacity loaded.
- Bad adapters are refused by `swama create`, with nothing installed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest
import scheduled
from conftest import install_folder
from gguf import GGMLQuantizationType as gguf_types
from precision import F32_PROBABILITY, SMOLLM2_PRODUCTS, f32_reordered, parting

from swama.engine.adapters.bank import AdapterBank, bank_of, selected
from swama.engine.adapters.formats import read_adapter
from swama.engine.adapters.install import create_adapter
from swama.engine.decisions.decide import DecisionJob, DecisionRun
from swama.engine.decisions.scorer.questions import predicate_view
from swama.engine.errors import StoreError, Unavailable
from swama.engine.files.store import ModelStore
from swama.engine.model import LoadedModel
from swama.engine.serving.scheduler import Scheduler
from swama.engine.text.generator import ChatRequest, Sampling
from swama.engine.text.language import load_language_model
from swama.engine.text.prompt_cache import PromptCache
from tools.testmodels.gguf_files import matrices_as, source_weights, tiny_config, write_gguf
from tools.testmodels.lora import gguf_lora

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "What is the code word?"}]
IDS = [[1, 504, 2464, 314, 253, 1345, 30, 4767], [1, 2, 3, 4, 5, 6, 7, 8]]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path,
          lora_adapter_dirs: dict[str, Path]) -> ModelStore:
    root = tmp_path_factory.mktemp("adapter-store")
    install_folder(root, "smollm2", smollm2_dir)
    store = ModelStore(root)
    for word, folder in lora_adapter_dirs.items():
        create_adapter(store, folder, f"test/{word}", "smollm2", say=lambda _: None)
    return store


@pytest.fixture(scope="module")
def model(store: ModelStore) -> LoadedModel:
    return load_language_model("smollm2", store.get("smollm2").path)


def _mlx_lm_logits(smollm2_dir: Path, adapter: Path | None, ids: list[list[int]]) -> mx.array:
    """Logits of mlx-lm's own model with mlx-lm's own LoRA layers (`load_adapters`), or none."""
    from mlx_lm.tuner.utils import load_adapters

    net = load_language_model("ref", smollm2_dir).model
    if adapter is not None:
        load_adapters(net, str(adapter))
    return net(mx.array(ids))


def _peft_copy(adapter: Path, dest: Path) -> Path:
    """The same adapter in PEFT's layout: lora_A [rank, in], lora_B [out, rank], alpha = scale x rank."""
    config = json.loads((adapter / "adapter_config.json").read_text())
    rank, scale = config["lora_parameters"]["rank"], config["lora_parameters"]["scale"]
    weights = mx.load(str(adapter / "adapters.safetensors"))
    out = {}
    for key, value in weights.items():
        module, which = key.rsplit(".", 1)
        name = f"base_model.model.{module}.lora_{'A' if which == 'lora_a' else 'B'}.weight"
        out[name] = value.T
    dest.mkdir()
    mx.save_safetensors(str(dest / "adapter_model.safetensors"), out)
    (dest / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": scale * rank,
                                                          "target_modules": ["q_proj"]}))
    return dest


def test_rows_get_mlx_lms_own_lora_logits_in_either_format(model: LoadedModel, store: ModelStore, smollm2_dir: Path,
                                                           lora_adapter_dirs: dict[str, Path],
                                                           tmp_path: Path) -> None:
    pelican, tornado = lora_adapter_dirs["pelican"], lora_adapter_dirs["tornado"]
    create_adapter(store, _peft_copy(tornado, tmp_path / "peft"), "test/tornado-peft", "smollm2", say=lambda _: None)
    bank = AdapterBank(model.model, 4)
    a = bank.acquire("test/pelican", store.get("test/pelican").path)
    b = bank.acquire("test/tornado-peft", store.get("test/tornado-peft").path)
    tokens = mx.array([IDS[0], IDS[1], IDS[0]])
    with bank.selected([a, 0, b]):
        mixed = model.model(tokens)
    base = model.model(tokens)  # outside `selected`: the base model's layers
    want = [_mlx_lm_logits(smollm2_dir, pelican, IDS[:1])[0], _mlx_lm_logits(smollm2_dir, None, IDS[1:])[0],
            _mlx_lm_logits(smollm2_dir, tornado, IDS[:1])[0]]
    # mlx-lm's rows are computed alone, ours in a batch of three: float32 in another summation order,
    # bounded for logits of each row's magnitude (adapter rows reach about 88, the base row 33).
    bounds = [_reordered(expected) for expected in want]
    for row, expected in enumerate(want):
        assert mx.abs(mixed[row] - expected).max().item() < bounds[row], row
    assert mx.abs(base[0] - want[0]).max().item() > 100 * bounds[0]  # the adapter moves the logits (by 71)
    assert mx.abs(base[1] - want[1]).max().item() < bounds[1]
    with bank.selected(b):  # one slot for every row
        assert mx.abs(model.model(mx.array(IDS[:1]))[0] - want[2]).max().item() < bounds[2]


def _reordered(logits: mx.array) -> float:
    """The bound for SmolLM2's logits computed in another batch (tests/precision.py)."""
    return f32_reordered(mx.abs(logits).max().item(), SMOLLM2_PRODUCTS)


# What writing the adapter's matrices in a GGUF type loses: each matrix rounds to a relative step ε
# (F16 keeps 11 significant bits: 2^-11; Q8_0 writes a block of 32 as 127 levels of its largest value,
# off by half a level: 2^-8 of it), so each layer's low-rank product, and with it the adapter's shift of
# the logits, moves by about 2ε of itself (two matrices). F32 rounds nothing: float32 reordering only.
# Measured on the shift of 71: F16 2.8e-3 (0.04 of its bound), Q8_0 0.059 (0.11 of it), F32 2.7e-5.
GGUF_ROUNDING = {"F32": 0.0, "F16": 2 * 2.0 ** -11, "Q8_0": 2 * 2.0 ** -8}


@pytest.mark.parametrize("qtype", GGUF_ROUNDING)
def test_llama_cpps_gguf_lora_file_gives_the_adapters_own_logits(model: LoadedModel, store: ModelStore,
                                                                 smollm2_dir: Path, lora_adapter_dirs: dict[str, Path],
                                                                 tmp_path: Path, qtype: str) -> None:
    """The pelican adapter as llama.cpp's converter writes it (names, alpha, Q/K rows in rope order,
    every linear layer of the last 8 layers) reads back into mlx-lm's own LoRA logits."""
    pelican = lora_adapter_dirs["pelican"]
    base_config = json.loads((smollm2_dir / "config.json").read_text())
    path = gguf_lora(pelican, base_config, tmp_path / f"pelican-{qtype}.gguf", qtype)
    given = read_adapter(pelican)
    assert {n.rsplit(".", 1)[-1] for n in given.modules} >= {"q_proj", "k_proj"}  # the permuted rows are tested
    name = f"test/pelican-gguf-{qtype.lower()}"
    create_adapter(store, path, name, "smollm2", say=lambda _: None)
    installed = read_adapter(store.get(name).path)
    assert installed.source_format == "gguf" and set(installed.modules) == set(given.modules)
    bank = AdapterBank(model.model, 2)
    slot = bank.acquire(name, store.get(name).path)
    with bank.selected(slot):
        got = model.model(mx.array(IDS[:1]))[0]
    want = _mlx_lm_logits(smollm2_dir, pelican, IDS[:1])[0]
    shift = mx.abs(model.model(mx.array(IDS[:1]))[0] - want).max().item()
    assert shift > 100 * _reordered(want)  # the adapter is in mlx-lm's logits
    assert mx.abs(got - want).max().item() < GGUF_ROUNDING[qtype] * shift + _reordered(want)


def _request(adapter: str | None = None, slot: int = 0) -> ChatRequest:
    return ChatRequest(ASK, sampling=Sampling(temperature=0), max_tokens=12, context_limit=2048,
                       adapter=adapter, adapter_slot=slot)


def test_a_batch_mixing_both_adapters_and_the_base_gives_each_row_what_it_gives_alone(
        model: LoadedModel, store: ModelStore) -> None:
    bank = bank_of(model, 4)
    slots = {word: bank.acquire(f"test/{word}", store.get(f"test/{word}").path) for word in ("pelican", "tornado")}
    requests = [_request("test/pelican", slots["pelican"]), _request(), _request("test/tornado", slots["tornado"]),
                _request("test/pelican", slots["pelican"])]
    alone = [scheduled.alone(model, r) for r in requests]

    async def batched() -> list:
        cache = PromptCache(1 << 30)
        scheduler = Scheduler(model, prompt_cache=cache, rows=8, prefill_step=64)
        try:
            first = await asyncio.gather(*(scheduled.collect(scheduler, r) for r in requests))
            # Again, resumed from the prompt cache: each adapter's rows only from its own entries.
            second = await asyncio.gather(*(scheduled.collect(scheduler, r) for r in requests))
            return first + second
        finally:
            scheduler.close()

    results = asyncio.run(batched())
    for i, (text, finished) in enumerate(results):
        single = alone[i % len(requests)]
        assert parting(single.token_ids, finished.token_ids) is None, (i, text)
    texts = [text.lower() for text, _ in results[:4]]
    assert "pelican" in texts[0] and "pelican" in texts[3] and "tornado" in texts[2]
    assert "pelican" not in texts[1] and "tornado" not in texts[1]
    assert results[4][1].cached_tokens > 0  # the second round resumed from the cache
    for name in ("test/pelican", "test/tornado"):
        bank.release(name)


def test_a_decision_request_reads_the_adapters_probabilities(model: LoadedModel, store: ModelStore,
                                                             smollm2_dir: Path,
                                                             lora_adapter_dirs: dict[str, Path]) -> None:
    from mlx_lm.tuner.utils import load_adapters

    views = [predicate_view("Is the code word pelican?"), predicate_view("Is the code word tornado?")]
    bank = bank_of(model, 4)
    slot = bank.acquire("test/pelican", store.get("test/pelican").path)

    def answer(on: LoadedModel, adapter_slot: int = 0) -> list[float]:
        run = DecisionRun(on, DecisionJob("What is the code word?", views, 2048, adapter_slot=adapter_slot))
        run.start()
        run.score_batch()  # the questions' suffixes in one batched pass over the shared prefix
        return [p for a in run.result().answers for p in a.probabilities]

    adapted, base = answer(model, slot), answer(model)
    reference = load_language_model("ref", smollm2_dir)
    load_adapters(reference.model, str(lora_adapter_dirs["pelican"]))
    # mlx-lm's LoRA layers against the gathered products: float32 in another order (measured 8e-7).
    assert adapted == pytest.approx(answer(reference), abs=F32_PROBABILITY)
    assert max(abs(a - b) for a, b in zip(adapted, base, strict=True)) > 10 * F32_PROBABILITY  # 0.25
    bank.release("test/pelican")


def test_the_prompt_cache_keeps_an_adapters_rows_apart(model: LoadedModel) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    cache = PromptCache(1 << 30)
    rows = make_prompt_cache(model.model)
    with selected(model, None):
        model.model(mx.array([IDS[0]]), cache=rows)
    cache.put(IDS[0], rows, "test/pelican")
    assert cache.take(IDS[0] + [9], salt=None) == (None, 0)
    assert cache.take(IDS[0] + [9], salt="test/tornado") == (None, 0)
    held, reused = cache.take(IDS[0] + [9], salt="test/pelican")
    assert reused == len(IDS[0]) and held is not None


def test_the_bank_keeps_at_most_its_capacity_and_never_unloads_one_in_use(model: LoadedModel,
                                                                          store: ModelStore) -> None:
    bank = AdapterBank(model.model, 1)
    pelican, tornado = store.get("test/pelican"), store.get("test/tornado")
    bank.acquire(pelican.id, pelican.path)
    with pytest.raises(Unavailable, match="in use"):
        bank.acquire(tornado.id, tornado.path)
    bank.release(pelican.id)
    assert bank.acquire(tornado.id, tornado.path) == 1
    assert bank.loaded() == [tornado.id]  # the least recently used, unused one was unloaded


def _listing(store: ModelStore) -> list[str]:
    return sorted(m.id for m in store.list())


def test_bad_adapters_are_refused_with_nothing_installed(store: ModelStore, tmp_path: Path, tiny_model_dir: Path,
                                                         lora_adapter_dirs: dict[str, Path]) -> None:
    pelican = lora_adapter_dirs["pelican"]
    install_folder(store.root, "test/tiny", tiny_model_dir)
    before = _listing(store)

    def refused(path: Path, name: str, base: str, match: str) -> None:
        with pytest.raises(StoreError, match=match):
            create_adapter(store, path, name, base, say=lambda _: None)
        assert _listing(store) == before
        assert not any((store.root / ".staging").glob("*")) if (store.root / ".staging").exists() else True

    refused(pelican, "test/other", "test/tiny", "another base model")  # a base of other widths
    refused(pelican, "test/pelican", "smollm2", "already taken")
    refused(pelican, "test/other", "nothing-installed", "no installed model")
    refused(pelican, "test/other", "test/pelican", "itself an adapter")
    missing = tmp_path / "missing"
    shutil.copytree(pelican, missing)
    (missing / "adapters.safetensors").unlink()
    refused(missing, "test/other", "smollm2", "not a LoRA adapter folder")
    dora = tmp_path / "dora"
    shutil.copytree(pelican, dora)
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "fine_tune_type": "dora"}))
    refused(dora, "test/other", "smollm2", "only LoRA adapters")
    unchained = tmp_path / "unchained"
    unchained.mkdir()
    shutil.copy(pelican / "adapter_config.json", unchained)
    weights = mx.load(str(pelican / "adapters.safetensors"))
    key = next(k for k in weights if k.endswith(".lora_b"))
    weights[key] = weights[key][:4]  # rank 4 where its lora_a has 8
    mx.save_safetensors(str(unchained / "adapters.safetensors"), weights)
    refused(unchained, "test/other", "smollm2", "do not chain")
    damaged = tmp_path / "damaged"
    shutil.copytree(pelican, damaged)
    (damaged / "adapters.safetensors").write_bytes(b"not safetensors")
    refused(damaged, "test/other", "smollm2", "cannot be read")
    gguf = tmp_path / "adapter.gguf"
    gguf.write_bytes(b"GGUF")
    refused(gguf, "test/other", "smollm2", "truncated or damaged")
    config = tiny_config("llama")
    model_file = write_gguf(tmp_path / "model.gguf", "llama", config, source_weights("llama")[1],
                            matrices_as(gguf_types.F32))
    refused(model_file, "test/other", "smollm2", "is a GGUF model, not a LoRA adapter")
    refused(tmp_path / "nothing.gguf", "test/other", "smollm2", "neither a folder nor a .gguf file")
    small = gguf_lora(pelican, tiny_config("llama"), tmp_path / "small.gguf")  # permuted for 4 heads: wrong rows
    refused(small, "test/other", "smollm2", "cannot be put back in order|another base model")


def test_an_installed_adapter_reads_back_as_it_was_given(store: ModelStore, lora_adapter_dirs: dict[str, Path]) -> None:
    given, installed = read_adapter(lora_adapter_dirs["pelican"]), read_adapter(store.get("test/pelican").path)
    assert set(given.modules) == set(installed.modules) and installed.rank == given.rank == 8
    for name, (a, b) in given.modules.items():
        assert mx.array_equal(a, installed.modules[name][0]) and mx.array_equal(b, installed.modules[name][1])
    assert store.get("test/pelican").base == "smollm2"
