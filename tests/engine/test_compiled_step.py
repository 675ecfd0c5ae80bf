"""The compiled decode step (engine/text/compiled_step) gives mlx-lm's logits.

Tiny random models of each family it serves (qwen3, qwen2, llama, and qwen3_5's hybrid of linear and
full attention; dense and quantized) decode the same tokens through mlx-lm's forward, one row alone over its own `KVCache`, and through the traced
step over fixed-capacity slots, while rows join and leave, the slots grow and shrink across their
power-of-two buckets and a row outgrows the storage's capacity. On the CPU in float32 the logits
agree to float32 rounding; in bfloat16 to a few of its rounding steps. Then the real engine: the
scheduler with the compiled step on and off gives the same generations (greedy, seeded, with log
probabilities and stop strings) on the tiny Qwen3, the tiny Qwen3.5 hybrid and SmolLM2 (a llama).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
import scheduled
from mlx_lm.models.cache import make_prompt_cache
from precision import (
    BF16_NEAR_TIE,
    DTYPE,
    F32_LOGIT,
    F32_TINY_LOGIT,
    f32_reordered,
    forward_products,
    parting,
    tol,
    top_two_gap,
)

from swama.engine.model import LoadedModel
from swama.engine.serving.scheduler import Scheduler
from swama.engine.settings import EngineSettings
from swama.engine.text.compiled_step.attention import kernel_agrees, kernel_available
from swama.engine.text.compiled_step.forward import Decoder, why_not
from swama.engine.text.compiled_step.policy import decoder_for
from swama.engine.text.compiled_step.slots import STEP
from swama.engine.text.generator import ChatRequest, Sampling, prepare
from swama.engine.text.grammar import Constraint
from swama.engine.text.language import load_language_model
from tools.testmodels.tiny import build_tiny_model

pytestmark = pytest.mark.slow  # about 80 s in one process (the scheduler's runs on SmolLM2)

# |logit difference|. float32: the models below (at most 4 layers, H 256, I 256, heads of 64) over fewer
# than 2 STEP tokens, logits under 8 (measured 5.4); bfloat16: four of its rounding steps near 8.
BOUND = tol(f32_reordered(8, forward_products(4, 256, 256, 64, 2 * STEP)), 0.25)
# Two logits, each off by its float32 bound, may swap where their gap is under twice it. The tiny hybrid
# has 4 layers where F32_TINY_LOGIT counts 2.
HYBRID_LOGIT = f32_reordered(16, forward_products(4, 64, 128, 16, 512))
NEAR_TIE = {name: tol(2 * bound, BF16_NEAR_TIE)
            for name, bound in (("tiny", F32_TINY_LOGIT), ("hybrid", HYBRID_LOGIT), ("smollm2", F32_LOGIT))}


def tiny(family: str, quantized: bool = False, seed: int = 0, experts: int = 0) -> nn.Module:
    from mlx_lm.models import llama, qwen2, qwen3, qwen3_5

    mx.random.seed(seed)
    common = dict(model_type=family, hidden_size=256, num_hidden_layers=2, intermediate_size=256,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=320,
                  rope_theta=10000.0)
    if family == "qwen3_5":  # linear, full, linear, full: a gated delta net and gated attention
        text = {**common, "num_hidden_layers": 4, "head_dim": 64, "full_attention_interval": 2,
                "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 32,
                "linear_value_head_dim": 32, "tie_word_embeddings": False, "max_position_embeddings": 4096,
                "num_experts": experts, "num_experts_per_tok": 2 if experts else 0,
                "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
                "rope_parameters": {"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}
        del text["rope_theta"]
        model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(text))
    elif family == "qwen3":
        model = qwen3.Model(qwen3.ModelArgs(**common, head_dim=64, max_position_embeddings=4096,
                                            tie_word_embeddings=False))
    elif family == "qwen2":
        model = qwen2.Model(qwen2.ModelArgs(**common, tie_word_embeddings=True))
    else:
        model = llama.Model(llama.ModelArgs(**common, tie_word_embeddings=False))
    model.set_dtype(DTYPE)
    if quantized:
        nn.quantize(model, group_size=32, bits=8)
    mx.eval(model.parameters())
    return model


class Reference:
    """Rows decoded by mlx-lm alone, one `KVCache` list each, and in the slots of a `SlotStore`."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.decoder = Decoder(model)
        self.store = self.decoder.new_store()
        self.rows: dict[int, tuple[list[object], int]] = {}  # slot -> (its own caches, next token)
        self.worst = 0.0

    def join(self, prompts: list[list[int]]) -> None:
        """Prompts prefilled together, left-padded as the batch prefills them, joining the slots."""
        width = max(len(p) - 1 for p in prompts)
        pads = [width - (len(p) - 1) for p in prompts]
        batch = self.decoder.batch_cache(pads)
        if width:
            mx.eval(self.model(mx.array([[0] * d + p[:-1] for d, p in zip(pads, prompts, strict=True)]), cache=batch))
        for slot, prompt in zip(self.store.adopt(batch), prompts, strict=True):
            own = make_prompt_cache(self.model)
            if len(prompt) > 1:
                self.model(mx.array([prompt[:-1]]), cache=own)
            self.rows[slot] = (own, prompt[-1])

    def leave(self, slots: list[int]) -> None:
        self.store.release(slots)
        for s in slots:
            del self.rows[s]

    def compact(self) -> None:
        order = sorted(self.rows)
        moved = self.store.compact(order)
        self.rows = {new: self.rows[old] for old, new in zip(order, moved, strict=True)}

    def step(self) -> None:
        s = self.store
        s.ensure(len(self.rows), max(s.ends[slot] for slot in self.rows) + 1)
        tokens = [0] * s.slots
        for slot, (_, token) in self.rows.items():
            tokens[slot] = token
        logits, s.keys, s.values, s.states = self.decoder.step(mx.array(tokens, dtype=mx.uint32), mx.array(s.starts),
                                                               mx.array(s.ends), s.keys, s.values, s.states)
        for slot, (own, token) in list(self.rows.items()):
            s.ends[slot] += 1
            alone = self.model(mx.array([[token]]), cache=own)[0, -1]
            got = logits[slot]
            self.worst = max(self.worst, mx.abs(got.astype(mx.float32) - alone.astype(mx.float32)).max().item())
            self.rows[slot] = (own, int(mx.argmax(alone).item()))


@pytest.mark.parametrize("family,quantized", [(f, q) for q in (False, True) for f in ("qwen3", "qwen2", "llama", "qwen3_5")])
def test_step_matches_mlx_lm_while_rows_come_and_go(family: str, quantized: bool) -> None:
    model = tiny(family, quantized)
    assert why_not(model) is None
    ref = Reference(model)
    ref.join([[1, 5, 9, 11, 4], [7, 3], [2, 2, 2, 8, 9, 10, 20]])  # 3 rows: a bucket of 4 slots
    assert ref.store.slots == 4
    for _ in range(3):
        ref.step()
    ref.join([[4, 4, 6], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39], [12]])  # 6 rows: the slots grow to 8
    assert ref.store.slots == 8
    for _ in range(3):
        ref.step()
    ref.leave([0, 2, 4, 5])  # rows leave mid-batch; the others keep their slots
    ref.step()
    ref.compact()  # 2 rows left: moved into a bucket of 2
    assert ref.store.slots == 2 and sorted(ref.rows) == [0, 1]
    for _ in range(2):
        ref.step()
    assert ref.worst <= BOUND, f"{family}: logits differ from mlx-lm's forward by {ref.worst}"


@pytest.mark.skipif(not kernel_available(64), reason="the span-attention kernel runs on MLX's CUDA backend")
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 2, 64), (16, 8, 128), (32, 8, 128)])
def test_the_span_attention_kernel_agrees_with_mlx(heads: int, kv_heads: int, dim: int) -> None:
    assert kernel_agrees(heads, kv_heads, dim, DTYPE) is None
    assert Decoder(tiny("qwen3")).kernel  # the models above decode through it on a GPU


def test_a_row_outgrows_the_capacity() -> None:
    model = tiny("qwen3")
    ref = Reference(model)
    ref.join([list(range(1, STEP - 2)), [5, 6, 7]])
    assert ref.store.capacity == STEP
    for _ in range(6):  # the long row passes STEP tokens: the storage grows by a step, in place
        ref.step()
    assert ref.store.capacity == 2 * STEP
    assert ref.worst <= BOUND, f"logits differ from mlx-lm's forward by {ref.worst}"


def test_fusion_leaves_the_plain_forward_as_it_was() -> None:
    model = tiny("qwen3")
    tokens = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    before = model(tokens)
    mx.eval(before)
    Decoder(model)
    attn = model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (256, 256) and attn.k_proj.weight.shape == (128, 256)
    assert mx.array_equal(model(tokens), before).item()


def test_models_it_does_not_cover_keep_mlx_lms_forward(smollm2_dir: Path, tiny_hybrid_dir: Path, tmp_path: Path) -> None:
    gemma = load_language_model("tiny-gemma3", build_tiny_model(smollm2_dir, tmp_path / "gemma3", arch="gemma3_text"))
    assert "gemma3" in (why_not(gemma.model) or "")
    assert decoder_for(gemma, "on", on_gpu=True) is None
    assert "mixture of experts" in (why_not(tiny("qwen3_5", experts=4)) or "")
    model = tiny("qwen3")
    model.layers[1].mlp.up_proj = nn.Linear(256, 256, bias=True)  # no longer fusable with the gate
    assert "projections" in (why_not(model) or "")
    hybrid = load_language_model("tiny-hybrid", tiny_hybrid_dir)  # as a store loads it: covered
    assert decoder_for(hybrid, "on", on_gpu=True) is not None


def test_the_mode_is_checked() -> None:
    assert EngineSettings(compiled_step="ON").compiled_step == "on"
    with pytest.raises(ValueError, match="compiled-step"):
        EngineSettings(compiled_step="sometimes")


# -- the real engine ----------------------------------------------------------------------------

PROMPTS = ["Write a haiku about rivers.", "List three prime numbers.", "What is the capital of France?",
           "Tell me a short story about a cat who learns to swim in the sea.", "Hi", "Explain rain to a child."]


@pytest.fixture(scope="module", params=["tiny", "hybrid", "smollm2"])
def model(request: pytest.FixtureRequest, tiny_model_dir: Path, tiny_hybrid_dir: Path, smollm2_dir: Path) -> LoadedModel:
    folder = {"tiny": tiny_model_dir, "hybrid": tiny_hybrid_dir, "smollm2": smollm2_dir}[request.param]
    return load_language_model(request.param, folder)


CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": False}


def _requests() -> list[ChatRequest]:
    """Greedy and seeded rows, with log probabilities, a stop string and a JSON schema among them."""
    out = []
    for i, prompt in enumerate(PROMPTS):
        sampling = Sampling(temperature=0.9, seed=7 + i) if i % 3 == 2 else Sampling(temperature=0)
        out.append(ChatRequest([{"role": "user", "content": prompt}], sampling=sampling, max_tokens=40 if i == 2 else 8 + 5 * i,
                               context_limit=2048, logprobs=2 if i % 2 else None,
                               stop=["\n\n"] if i == 3 else [],
                               constraint=Constraint("json_schema", json.dumps(CITY)) if i == 2 else None))
    return out


def _generate(model: LoadedModel, compiled: str) -> list[object]:
    async def run() -> list[object]:
        scheduler = Scheduler(model, prompt_cache=None, rows=4, prefill_step=16, compiled_step=compiled)
        try:  # 6 requests over 4 rows, prompts read 16 tokens a turn: rows join and leave mid-batch
            return await asyncio.gather(*(scheduled.collect(scheduler, r) for r in _requests()))
        finally:
            scheduler.close()

    return asyncio.run(run())


def test_the_scheduler_generates_the_same_on_either_step(model: LoadedModel) -> None:
    assert decoder_for(model, "on", on_gpu=False) is not None
    plain, compiled = _generate(model, "off"), _generate(model, "on")
    assert json.loads(compiled[2][0]).keys() == {"city"}  # the schema's row stayed in its grammar
    for request, (_, a), (_, b) in zip(_requests(), plain, compiled, strict=True):
        assert b.prompt_tokens == a.prompt_tokens
        parted = parting(a.token_ids, b.token_ids)
        if parted is None:
            assert b.finish_reason == a.finish_reason and b.stop_sequence == a.stop_sequence
            continue
        assert request.sampling.temperature == 0 or DTYPE != mx.float32, "seeded rows part in float32"
        gap = top_two_gap(model, prepare(model, request).ids + list(a.token_ids[:parted]))
        assert gap < NEAR_TIE[model.id], f"the steps part at token {parted} without a near-tie (gap {gap})"


def test_a_row_finished_beside_others_resumes_its_next_turn_from_the_prompt_cache(tiny_model_dir: Path) -> None:
    """A row that finishes while another still decodes leaves its cache, copied out of its slot and
    handed to the prompt cache a step later; the conversation's next turn resumes from it and decodes
    what it decodes alone."""
    from swama.engine.text.prompt_cache import PromptCache

    model = load_language_model("tiny", tiny_model_dir)
    cache = PromptCache(1 << 28)

    def ask(messages: list[dict], max_tokens: int) -> ChatRequest:
        return ChatRequest(messages, sampling=Sampling(temperature=0), max_tokens=max_tokens, context_limit=2048)

    async def turns(*requests: ChatRequest) -> list[tuple[str, object]]:
        scheduler = Scheduler(model, prompt_cache=cache, rows=4, prefill_step=64, compiled_step="on")
        try:
            return await asyncio.gather(*(scheduled.collect(scheduler, r) for r in requests))
        finally:
            scheduler.close()

    short = ask([{"role": "user", "content": "Hi"}], 6)
    (answer, first), (_, other) = asyncio.run(turns(short, ask([{"role": "user", "content": "Tell a story."}], 40)))
    assert len(first.token_ids) < len(other.token_ids)  # it finished while the other row decoded on
    follow = ask([*short.messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "More."}], 8)
    [(_, resumed)] = asyncio.run(turns(follow))
    assert resumed.cached_tokens >= len(prepare(model, short).ids)
    assert resumed.token_ids == scheduled.alone(model, follow).token_ids
