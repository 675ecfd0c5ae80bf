"""Text generation shared by chat completions and responses.

`generate(model, request, cancel)` runs on a worker thread and yields events: text deltas, whole
tool calls, then one `Finished`. Stop sequences and tool-call markers are held back until decided,
so no client ever sees half a stop string or half a call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from swama.engine.adapters.bank import selected
from swama.engine.errors import BadInput, Cancelled, ContextTooLong
from swama.engine.kinds.tasks import IMAGES_NEED_VISION
from swama.engine.kinds.vision import MULTIMODAL_CONTEXT_LIMIT, Prefill, network, vision_of
from swama.engine.model import LoadedModel
from swama.engine.settings import default_of
from swama.engine.text.chat_prompt import Prompt, TemplateOptions, build_prompt, template_renders_tools
from swama.engine.text.grammar import Constraint, enforcer
from swama.engine.text.kv_policy import kv_quant_of
from swama.engine.text.logprobs import MAX_TOP_LOGPROBS, Recorder, TokenLogprob, token_bytes
from swama.engine.text.prompt_cache import PromptCache, cacheable, prompt_cache_of
from swama.engine.text.reasoning import ReasoningSplitter, ThinkingBudget, markers, prompt_opens
from swama.engine.text.sampler import Sampler, shared_sampler
from swama.engine.text.tool_calls import DEFAULT_FORMAT, ToolCall, ToolCallSplitter, tool_format

# The one place sampling defaults live: every route and the CLI leave unset options to these.
DEFAULT_TEMPERATURE = 0.6
DEFAULT_TOP_P = 1.0
OUT_OF_RANGE = "Generation options are outside their supported ranges."
THINKING_AND_GRAMMAR = ("Thinking and a structured answer (a JSON format or forced tool calls) cannot both hold: the "
                        "answer is held to its grammar from the first token. Turn thinking off or drop the format.")


@dataclass(frozen=True)
class Sampling:
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None

    def check(self) -> None:
        ok = (self.temperature >= 0 and 0 <= self.top_p <= 1 and self.top_k >= 0 and 0 <= self.min_p <= 1
              and (self.repetition_penalty is None or self.repetition_penalty >= 0)
              and self.repetition_context_size > 0
              and all(p is None or -2 <= p <= 2 for p in (self.presence_penalty, self.frequency_penalty)))
        if not ok:
            raise BadInput(OUT_OF_RANGE)


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    context_limit: int = field(default_factory=lambda: default_of("context_limit"))
    images: list[Any] = field(default_factory=list)  # PIL images for the messages' image parts, in order
    # A raw prompt in place of `messages` (/v1/completions): text the model's tokenizer encodes as it
    # does by default (special tokens included), or token ids; no chat template is used.
    prompt: str | list[int] | None = None
    constraint: Constraint | None = None  # structured output: what the generated text must be
    # Log probabilities: None for none; k (0-20) for each generated token's, with its k most probable
    # alternatives (`Logprobs` events).
    logprobs: int | None = None
    parallel_tool_calls: bool = True  # False: the output ends after its first tool call
    # Models that think (text/reasoning.py): None keeps the template's default, True/False is passed
    # as its thinking switch; a budget closes the think block after that many tokens.
    thinking: bool | None = None
    thinking_budget: int | None = None
    # The last message is the start of the answer, which the model continues (Anthropic's prefill).
    continue_final: bool = False
    # The prompt's prefix is worth keeping (prompt_cache_key, cache_control): its cache is evicted last.
    keep_prompt: bool = False
    batch: bool = False  # a batch job's line: admitted after live requests (engine/priority.py)
    # A LoRA adapter on the model (engine/adapters/): its id (the prompt cache keeps its rows apart) and
    # its slot in the model's adapter bank; set by the engine from the model the request names.
    adapter: str | None = None
    adapter_slot: int = 0
    # One of a request's several choices: (the request's id, how many choices it has); they join the
    # batch in the same turn (serving/siblings.py).
    siblings: tuple[str, int] | None = None

    @property
    def effective_context_limit(self) -> int:
        """A prompt with images is held to the multimodal limit as well."""
        return min(self.context_limit, MULTIMODAL_CONTEXT_LIMIT) if self.images else self.context_limit


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Thinking text of a model that thinks, apart from the answer's `TextDelta`s."""

    text: str


@dataclass(frozen=True)
class Logprobs:
    """The log probabilities of generated tokens, sent before the text of those tokens (text held back
    for a stop sequence or a tool call comes later; a stop sequence's own tokens are included)."""

    entries: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class ToolCallEvent:
    call: ToolCall


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    prompt_seconds: float
    generation_seconds: float
    cached_tokens: int = 0  # prompt tokens resumed from the prompt cache instead of prefilled
    token_ids: tuple[int, ...] = ()  # the tokens generated, end-of-sequence token excluded
    draft_tokens: int = 0  # generated tokens that were drafted and accepted (engine/speculative/)
    reasoning_tokens: int = 0  # generated tokens that were thinking
    stop_sequence: str | None = None  # the request's stop sequence that ended the output, if one did
    disk_cached_tokens: int = 0  # of the cached tokens, those read back from the prompt cache's disk tier


Event = TextDelta | ReasoningDelta | Logprobs | ToolCallEvent | Finished


@dataclass(frozen=True)
class _NativeTools:
    """Kept beside a model: whether its chat template renders `tools` itself."""

    rendered: bool


def native_tools(model: LoadedModel) -> bool:
    return model.beside.setdefault(_NativeTools, lambda: _NativeTools(template_renders_tools(model.tokenizer))).rendered


def prepare(model: LoadedModel, request: ChatRequest) -> Prompt:
    request.sampling.check()
    if request.max_tokens is not None and request.max_tokens <= 0:
        raise BadInput(OUT_OF_RANGE)
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_TOP_LOGPROBS:
        raise BadInput(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}.")
    if request.thinking_budget is not None and request.thinking_budget < 1:
        raise BadInput("A thinking budget must be at least 1 token.")
    if request.prompt is not None:
        return _raw_prompt(model, request)
    if not model.has_chat_template:
        raise BadInput("This model has no chat template; it cannot serve chat requests.")
    if not request.messages:
        raise BadInput("Generation requires at least one message.")
    if request.images and vision_of(model) is None:
        raise BadInput(IMAGES_NEED_VISION, code="invalid_image")
    found = markers(model)
    thinking = request.thinking
    # A JSON answer or forced tool calls are held to a grammar from the first token: no room for a think
    # block (calls with strict arguments only constrain the call, so thinking may come before it).
    whole = request.constraint is not None and request.constraint.kind != "tool_arguments"
    if found is not None and whole:
        if thinking:
            raise BadInput(THINKING_AND_GRAMMAR)
        thinking = False
    options: dict[str, Any] = {}
    if found is not None and thinking is not None:
        options["enable_thinking"] = thinking
    if request.continue_final:
        if request.messages[-1].get("role") != "assistant":
            raise BadInput("Only an assistant message can be continued.")
        options.update(add_generation_prompt=False, continue_final_message=True)
    tokenizer = TemplateOptions(model.tokenizer, options) if options else model.tokenizer
    prompt = build_prompt(tokenizer, request.messages, request.tools, request.effective_context_limit,
                          native_tools(model))
    prompt.opens_thinking = prompt_opens(found, prompt.text)
    return prompt


def prompt_ids(model: LoadedModel, prompt: str | list[int]) -> list[int]:
    """A raw prompt's tokens: text as the model's tokenizer encodes it by default (special tokens
    included), or ids, each checked against the vocabulary."""
    if isinstance(prompt, str):
        ids = list(model.tokenizer.encode(prompt))
    else:
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < model.vocab_size]
        if bad:
            raise BadInput(f"Token id {bad[0]} is outside the model's vocabulary (0-{model.vocab_size - 1}).")
    if not ids:
        raise BadInput("The prompt is empty: it needs at least one token.")
    return ids


def _raw_prompt(model: LoadedModel, request: ChatRequest) -> Prompt:
    ids = prompt_ids(model, request.prompt)
    limit = request.effective_context_limit
    if len(ids) >= limit:
        raise ContextTooLong(f"The prompt ({len(ids)} tokens) leaves no room to generate in the context "
                             f"window of {limit} tokens.", code="context_limit_exceeded")
    text = request.prompt if isinstance(request.prompt, str) else model.tokenizer.decode(ids)
    return Prompt(ids, text)


def call_format(model: LoadedModel) -> tuple[str, str]:
    """The markers a tool call is written between, where the call inside is JSON with a name and
    arguments (the form a constraint can hold calls to); BadInput for other formats."""
    fmt = tool_format(model.tokenizer)
    if fmt is not DEFAULT_FORMAT and getattr(fmt.parse, "__module__", "").rsplit(".", 1)[-1] != "json_tools":
        raise BadInput("This model writes tool calls in a format that cannot be constrained; use tool_choice "
                       "\"auto\" and functions without strict.", code="unsupported_tool_choice")
    return fmt.start, fmt.end


def constraint_processors(model: LoadedModel, constraint: Constraint | None) -> list[Any]:
    """The structured-output mask of a constraint (none without one); BadInput when it cannot be held."""
    if constraint is None:
        return []
    fmt = call_format(model) if constraint.kind.startswith("tool") else ("", "")
    return [enforcer(model, constraint, fmt)]


def row_processors(model: LoadedModel, request: ChatRequest, prompt: Prompt) -> tuple[list[Any], Recorder | None]:
    """The logits processors a request adds to its sampling's: a recorder of log probabilities
    (first: it reads the model's own logits), a structured-output mask and a thinking budget (last:
    after penalties)."""
    recorder = Recorder(request.sampling.temperature, request.logprobs) if request.logprobs is not None else None
    processors: list[Any] = [recorder] if recorder is not None else []
    found = markers(model)
    budget = []
    if found is not None and request.thinking_budget is not None and request.thinking is not False:
        budget = [ThinkingBudget(model.tokenizer, found, prompt.opens_thinking, request.thinking_budget)]
    return processors + constraint_processors(model, request.constraint) + budget, recorder


def _multimodal(model: LoadedModel, prompt: Prompt, request: ChatRequest) -> Prefill:
    """The prompt's image placeholders expanded and encoded; held to the multimodal limit."""
    vision = vision_of(model)
    assert vision is not None  # prepare() refused images for any other model
    processed = vision.process(prompt.text, request.images)
    limit = request.effective_context_limit
    if len(processed.ids) >= limit:
        raise ContextTooLong(f"Prompt with images exceeds the context limit ({len(processed.ids)} >= {limit}).",
                             code="context_limit_exceeded")
    return vision.embed(processed)


class _StopMatcher:
    """Holds back text that may be the start of a stop sequence."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit: str | None = None  # the stop sequence found

    def feed(self, text: str) -> tuple[str, bool]:
        self.pending += text
        hits = [(self.pending.find(s), s) for s in self.stops if s in self.pending]
        if hits:
            pos, self.hit = min(hits)
            out, self.pending = self.pending[:pos], ""
            return out, True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if s.startswith(self.pending[-n:]):
                    keep = max(keep, n)
                    break
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def _resume(model: LoadedModel, net: Any, ids: list[int],
            salt: str | None = None) -> tuple[PromptCache | None, list[Any] | None, int]:
    """The model's prompt cache, the cache to run this prompt on, and how many of its tokens that
    cache already holds; (None, None, 0) where the model keeps no prompt cache."""
    from mlx_lm.models.cache import make_prompt_cache

    store = prompt_cache_of(model)
    if store is None:
        return None, None, 0
    cache, reused = store.take(ids, salt=salt)
    if cache is None:
        cache = make_prompt_cache(net)
        if not cacheable(cache):
            model.beside.set(PromptCache, None)  # sliding-window or recurrent layers: cannot be cut back
            return None, None, 0
    return store, cache, reused


def make_sampling(model: LoadedModel, s: Sampling) -> tuple[Sampler, list[Any]]:
    """The sampler and logits processors of one request (engine/text/sampler.py): a seeded request
    samples from its own random key, so its output depends on its seed alone, never on other requests
    batched with it; unseeded requests with the same settings share one sampler."""
    from mlx_lm.sample_utils import make_logits_processors

    # A top_k as large as the vocabulary filters nothing (and is more than the sampler can partition).
    top_k = s.top_k if s.top_k < model.vocab_size else 0
    top_p = s.top_p if s.top_p < 1 else 0.0
    processors = make_logits_processors(
        repetition_penalty=s.repetition_penalty, repetition_context_size=s.repetition_context_size,
        presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty)
    if s.seed is None or s.temperature == 0:
        return shared_sampler(s.temperature, top_p, s.min_p, top_k), processors
    return Sampler(s.temperature, top_p, s.min_p, top_k, seed=s.seed), processors


def _keep_leading_space(detok: Any) -> None:
    """mlx-lm's detokenizers drop the first token's leading space, as a chat answer wants; a raw
    prompt's continuation keeps it ("The capital of France is" goes on with " Paris")."""
    if hasattr(detok, "trim_space"):
        detok.trim_space = False  # SentencePiece
    if hasattr(detok, "_maybe_trim_space"):
        detok._maybe_trim_space = lambda text: text  # byte-level BPE


class Decoder:
    """One request's generated tokens turned into events: text deltas, whole tool calls, then one
    `Finished`. The same for a request generated alone and for one row of a batch."""

    def __init__(self, model: LoadedModel, request: ChatRequest, prompt_tokens: int,
                 recorder: Recorder | None = None, opens_thinking: bool = False) -> None:
        self.eos_ids = model.eos_ids
        self.recorder = recorder
        self.table = token_bytes(model) if recorder is not None else None
        self.detok = model.tokenizer.detokenizer
        if request.prompt is not None:
            _keep_leading_space(self.detok)
        self.splitter = ToolCallSplitter(tool_format(model.tokenizer), request.tools) if request.tools else None
        found = markers(model) if request.prompt is None else None
        self.reasoning = ReasoningSplitter(found, opens_thinking) if found is not None else None
        self.reasoning_tokens = 0
        self.stopper = _StopMatcher(request.stop)
        self.prompt_tokens = prompt_tokens
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self.tokens: list[int] = []
        self.finish_reason: str | None = None  # set once the request is done
        self.saw_call = False
        self.parallel = request.parallel_tool_calls
        self.stop_hit = False
        self.drafted = 0  # accepted draft tokens, set by the scheduler when the row leaves the batch

    @property
    def generated(self) -> int:
        return len(self.tokens)

    def _calls(self, calls: list[ToolCall]) -> list[Event]:
        """Tool-call events; with parallel calls off, the first call ends the output."""
        events: list[Event] = []
        for call in calls:
            if self.saw_call and not self.parallel:
                break
            self.saw_call = True
            events.append(ToolCallEvent(call))
        if self.saw_call and not self.parallel and self.finish_reason is None:
            self.finish_reason = "stop"
        return events

    def _emit(self, text: str, last: bool = False) -> list[Event]:
        events: list[Event] = []
        if self.saw_call and not self.parallel:
            return events  # the output ended with its call
        if self.reasoning is not None:
            thought, text = self.reasoning.feed(text)
            if last:
                more, rest = self.reasoning.finish()
                thought, text = thought + more, text + rest
            if thought:
                events.append(ReasoningDelta(thought))
        if self.splitter is not None:
            text, calls = self.splitter.feed(text)
            events += self._calls(calls)
        if text:
            events.append(TextDelta(text))
        return events

    def reading(self, token: int) -> TokenLogprob | None:
        """The log probabilities of `token`, on the thread that runs the model (None when not asked)."""
        return self.recorder.take(token, self.table) if self.recorder is not None else None

    def token(self, token: int, logprob: TokenLogprob | None = None) -> list[Event]:
        """Events of one sampled token; sets `finish_reason` on an end-of-sequence token or a stop
        sequence (whose text is never sent)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if token in self.eos_ids:
            self.finish_reason = "stop"
            return []
        self.tokens.append(token)
        self.detok.add_token(token)
        text, stopped = self.stopper.feed(self.detok.last_segment)
        if stopped:
            self.finish_reason, self.stop_hit = "stop", True
        events: list[Event] = [Logprobs((logprob,))] if logprob is not None else []
        events += self._emit(text)
        if self.reasoning is not None and self.reasoning.state in ("open", "inside", "closed"):
            self.reasoning_tokens += 1  # a token of the think block (or the blank line closing it)
        return events

    def step(self, token: int, finish_reason: str | None, logprob: TokenLogprob | None = None,
             cached_tokens: int = 0, disk_tokens: int = 0) -> tuple[list[Event], bool]:
        """The events of one token of a batch row, and whether the output ended with it: the batch's
        end (end of sequence, token budget) or one this decoder saw (a stop sequence, a lone tool call)."""
        events = self.token(token, logprob)
        reason = self.finish_reason or finish_reason
        if reason is None:
            return events, False
        return events + self.finish(reason, cached_tokens, disk_tokens), True

    def finish(self, reason: str, cached_tokens: int = 0, disk_tokens: int = 0) -> list[Event]:
        """The held-back text, the tool calls still open, and the `Finished` event."""
        self.detok.finalize()
        events: list[Event] = []
        if not self.stop_hit:
            tail, self.stop_hit = self.stopper.feed(self.detok.last_segment)
            events += self._emit(tail if self.stop_hit else tail + self.stopper.flush(), last=True)
        elif self.reasoning is not None:
            events += self._emit("", last=True)
        if self.splitter is not None and not (self.saw_call and not self.parallel):
            text, calls = self.splitter.finish()
            if text:
                events.append(TextDelta(text))
            events += self._calls(calls)
        end = time.perf_counter()
        first = self.first_token_at or end
        events.append(Finished("tool_calls" if self.saw_call else reason, self.prompt_tokens, self.generated,
                               first - self.started, end - first, cached_tokens, tuple(self.tokens),
                               self.drafted, self.reasoning_tokens, self.stopper.hit, disk_tokens))
        return events


def ordered(sampling: list[Any], extra: list[Any]) -> list[Any]:
    """A recorder before the sampling's penalties (it reads the model's own logits), a mask after."""
    first = [p for p in extra if isinstance(p, Recorder)]
    return first + list(sampling) + [p for p in extra if not isinstance(p, Recorder)]


QUICK_PROMPT_CHARS = 20_000  # a prompt this short renders and tokenizes in well under a millisecond


def quick_to_prepare(request: ChatRequest) -> bool:
    """Whether preparing the request (rendering and tokenizing its prompt, making its logits
    processors) is quick enough to run on the event loop: no grammar to compile, no images, a short
    prompt. Handing it to a thread would cost more: under one interpreter lock, a burst of requests
    each in its own thread take turns at the lock's switch interval, and the loop and the thread that
    drives the device wait with them."""
    if request.constraint is not None or request.images:
        return False
    if request.prompt is not None:
        return len(request.prompt) <= QUICK_PROMPT_CHARS
    chars = sum(len(str(m.get("content") or "")) for m in request.messages)
    return chars + (len(str(request.tools)) if request.tools else 0) <= QUICK_PROMPT_CHARS


def token_budget(request: ChatRequest, prompt_tokens: int) -> int:
    """Tokens the request may generate: its max_tokens, held to what the context window leaves."""
    left = request.effective_context_limit - prompt_tokens
    return min(request.max_tokens or left, left)


def generate(model: LoadedModel, request: ChatRequest, cancel: threading.Event) -> Iterator[Event]:
    """Run one generation alone; raises Cancelled when `cancel` is set before it finishes. Requests
    with images, and models the batch scheduler cannot batch, take this path."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    prompt = prepare(model, request)
    net = network(model)
    prefill = _multimodal(model, prompt, request) if request.images else None
    ids = prefill.ids if prefill is not None else prompt.ids
    max_tokens = token_budget(request, len(ids))
    sampler, processors = make_sampling(model, request.sampling)
    extra_processors, recorder = row_processors(model, request, prompt)
    processors = ordered(processors, extra_processors)
    decoder = Decoder(model, request, len(ids), recorder, prompt.opens_thinking)
    extra: dict[str, Any] = {}
    if prefill is not None:
        # One prefill call: the multimodal inputs (positions, masks) cover the whole prompt.
        net.expect(prefill)
        extra = {"input_embeddings": prefill.embeddings[0], "prefill_step_size": len(ids)}
    store, cache, reused = _resume(model, net, ids, request.adapter) if prefill is None else (None, None, 0)
    if cache is not None:
        extra["prompt_cache"] = cache
    kv = kv_quant_of(model) if prefill is None else None  # vision models' caches stay full precision
    if kv is not None:
        from mlx_lm.models.cache import make_prompt_cache

        # Growing caches (a window's rotating ones cannot be quantized); the prompt is within the context.
        extra.setdefault("prompt_cache", make_prompt_cache(net))
        extra.update(kv_bits=kv.bits, kv_group_size=kv.group_size, quantized_kv_start=kv.after)
    seen: list[int] = []
    finish = "length"
    steps = generate_step(mx.array(ids[reused:]), net, max_tokens=max_tokens, sampler=sampler,
                          logits_processors=processors, max_kv_size=request.context_limit, **extra)
    # The adapter's rows for every forward this generation runs (its thread runs nothing else meanwhile).
    with selected(model, request.adapter_slot):
        try:
            for token, _ in steps:
                if cancel.is_set():
                    raise Cancelled()
                token = int(token)
                seen.append(token)
                yield from decoder.token(token, decoder.reading(token))
                if decoder.finish_reason is not None:
                    finish = decoder.finish_reason
                    break
            else:
                finish = "length" if decoder.generated >= max_tokens else "stop"
        finally:
            steps.close()
    if cancel.is_set():
        raise Cancelled()
    if store is not None:
        # Every token the cache holds: the prompt, then what was generated and fed back.
        store.put((list(ids) + seen)[: cache[0].offset], cache, request.adapter)
    yield from decoder.finish(finish, reused, store.from_disk if store is not None else 0)
