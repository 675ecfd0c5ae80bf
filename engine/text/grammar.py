"""Structured outputs: what a request's generated text must be, enforced token by token.

The grammar engine is llguidance: its matcher, given the tokens so far, fills a bitmask of the tokens
that may come next; a per-row logits processor (`Enforcer`) turns the mask into -inf on every other
token before sampling, inside the batch step, so constrained rows and free rows decode together.
llguidance was picked over xgrammar by measurement (docs/benchmarks.md): both fill a 16-row mask in
well under a millisecond, llguidance compiles a large schema lazily in about a millisecond where
xgrammar takes 12-15 ms up front, and llguidance has no dependencies (xgrammar needs PyTorch).

A `Constraint` says what the text must be:
- `json_object`: one JSON object;
- `json_schema`: one JSON document valid against `schema`;
- `tool_calls`: only tool calls in the model's call format (one, or several when `parallel`), each
  naming one of `tools`; a strict function's arguments valid against its parameters;
- `tool_arguments`: free text, but every tool call the model opens is held to the same rules.

Schema keywords llguidance cannot enforce are refused (`BadInput` naming them), never ignored.
Compiled grammars are kept per model and schema (`Grammars`); each request gets its own matcher,
which lives in its row's processor, so it goes wherever the row goes (cancelled, finished, resumed
from the prompt cache: the prompt's tokens are never fed to it).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from swama.engine.errors import BadInput
from swama.engine.model import LoadedModel

CONSTRAINT_KINDS = ("json_object", "json_schema", "tool_calls", "tool_arguments")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    parameters: str = '{"type": "object"}'  # JSON text of the parameters schema
    strict: bool = False


@dataclass(frozen=True)
class Constraint:
    kind: Literal["json_object", "json_schema", "tool_calls", "tool_arguments"]
    schema: str | None = None  # JSON text of the schema (json_schema)
    tools: tuple[ToolSpec, ...] = ()
    parallel: bool = True  # tool calls: several calls allowed, not only one


_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*)\]')


# Grammars compile in a pool of their own: a schema that compiles slowly holds at most these threads
# while every other request goes on, and each compile has a time budget (CompileBudget), past which
# its request is refused. A compile past its budget cannot be stopped (llguidance runs it in native
# code): it finishes in its thread, bounded by llguidance's own fuel limits, and no one waits for it.
COMPILE_THREADS = 2
_COMPILES = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="swama-grammar")


@dataclass(frozen=True)
class CompileBudget:
    """How long one request's grammar may take to compile (--grammar-compile-seconds), kept beside the model."""

    seconds: float = 10.0


class Grammars:
    """One model's llguidance tokenizer and compiled grammars, by constraint (the most recent `capacity`)."""

    def __init__(self, tokenizer: Any, width: int, eos: list[int], capacity: int = 64,
                 budget: CompileBudget = CompileBudget()) -> None:
        import llguidance.hf

        # Made once per model: it walks the vocabulary. Sized to the logits' width, which may exceed
        # the tokenizer's vocabulary (padded embeddings): those extra ids are never allowed.
        self.ll = llguidance.hf.from_tokenizer(getattr(tokenizer, "_tokenizer", tokenizer), n_vocab=width,
                                               eos_token=eos[0] if eos else None)
        self.width = width
        self.eos = eos[0] if eos else self.ll.eos_token
        self.capacity = capacity
        self.budget = budget
        self._compiled: OrderedDict[tuple[Constraint, tuple[str, str]], str] = OrderedDict()
        self._lock = threading.Lock()  # compiles of several requests run at once

    def compile(self, constraint: Constraint, call_format: tuple[str, str]) -> str:
        """The llguidance grammar of `constraint` (cached); BadInput when it cannot be enforced."""
        key = (constraint, call_format)
        with self._lock:
            grammar = self._compiled.get(key)
            if grammar is not None:
                self._compiled.move_to_end(key)
                return grammar
        grammar = _grammar(constraint, call_format)
        with self._lock:
            self._compiled[key] = grammar
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return grammar

    def matcher(self, constraint: Constraint, call_format: tuple[str, str]) -> Any:
        """A fresh matcher for one request, compiled in the grammar pool within the budget (BadInput past it)."""
        compiling = _COMPILES.submit(self._matcher, constraint, call_format)
        try:
            return compiling.result(timeout=self.budget.seconds)
        except TimeoutError:
            compiling.cancel()  # one still queued never runs
            raise BadInput(f"The output format did not compile within {self.budget.seconds:g} s "
                           "(--grammar-compile-seconds): simplify its schema (fewer or simpler patterns, "
                           "fewer alternatives).", code="schema_too_complex") from None

    def _matcher(self, constraint: Constraint, call_format: tuple[str, str]) -> Any:
        from llguidance import LLMatcher

        matcher = LLMatcher(self.ll, self.compile(constraint, call_format), log_level=0)
        if matcher.is_error():
            raise BadInput(f"The output format cannot be enforced: {_first_line(matcher.get_error())}",
                           code="unsupported_schema")
        return matcher


def grammars(model: LoadedModel) -> Grammars:
    """The model's grammars; its tokenizer's own end-of-sequence token ends a constrained output."""
    def make() -> Grammars:
        tokenizer = model.tokenizer
        first = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        return Grammars(tokenizer, model.vocab_size, first + sorted(model.eos_ids - set(first)),
                        budget=model.beside.get(CompileBudget) or CompileBudget())

    return model.beside.setdefault(Grammars, make)


def enforcer(model: Any, constraint: Constraint, call_format: tuple[str, str]) -> Enforcer:
    """A request's logits processor (BadInput when its constraint cannot be enforced)."""
    g = grammars(model)
    return Enforcer(g.matcher(constraint, call_format), g.width, g.eos)


# Compact JSON, as OpenAI's structured outputs write it: unbounded whitespace lets a small model
# loop on newlines instead of finishing the document.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _checked_schema(schema: Any, where: str) -> str:
    """The JSON grammar of one schema, refused with the keywords llguidance cannot enforce."""
    from llguidance import LLMatcher

    if not isinstance(schema, dict):
        raise BadInput(f"{where} must be a JSON object.", code="invalid_schema")
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    except ValueError as exc:
        raise BadInput(f"{where} is not a valid JSON schema: {exc}", code="invalid_schema") from None
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    for message in messages:
        hit = _UNIMPLEMENTED.search(message)
        if hit:
            keys = ", ".join(json.loads(f"[{hit.group(1)}]"))
            raise BadInput(f"{where} uses JSON schema keywords structured outputs cannot enforce: {keys}.",
                           code="unsupported_schema")
        if message.startswith("Unknown format"):
            raise BadInput(f"{where} uses a string format structured outputs cannot enforce: "
                           f"{message.split(':', 1)[1].strip()}.", code="unsupported_schema")
    if failed or messages:
        detail = _first_line(messages[0]) if messages else "the grammar engine refused it"
        raise BadInput(f"{where} cannot be enforced: {detail}", code="unsupported_schema")
    return grammar


def _call_schema(tools: tuple[ToolSpec, ...]) -> dict[str, Any]:
    """One call's JSON: a tool's name, then its arguments (held to its parameters when strict)."""
    options = []
    for tool in tools:
        arguments = json.loads(tool.parameters) if tool.strict else {"type": "object"}
        options.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                        "properties": {"name": {"const": tool.name}, "arguments": arguments}})
    return options[0] if len(options) == 1 else {"anyOf": options}


def _lark_string(text: str) -> str:
    return json.dumps(text)


def _grammar(constraint: Constraint, call_format: tuple[str, str]) -> str:
    from llguidance import LLMatcher

    if constraint.kind == "json_object":
        return _checked_schema({"type": "object"}, "The JSON object format")
    if constraint.kind == "json_schema":
        schema = json.loads(constraint.schema or "{}")
        return _checked_schema(schema, "The response format's schema")
    for tool in constraint.tools:
        if tool.strict:
            _checked_schema(json.loads(tool.parameters), f"The parameters of strict function '{tool.name}'")
    start, end = call_format
    # llguidance's %json embeds the call's schema; compact separators as above.
    body = json.dumps({**_call_schema(constraint.tools), "x-guidance": _JSON_OPTIONS})
    close = f" {_lark_string(end)}" if end else ""
    if constraint.kind == "tool_calls":
        call = f'{_lark_string(start)} "\\n"? body "\\n"?{close}'
        calls = "call" if not constraint.parallel else 'call ("\\n" call)*'
        lark = f"start: {calls}\ncall: {call}\nbody: %json {body}\n"
    else:  # tool_arguments: free text; a call opened by its start marker is held to the schema
        lark = (f"start: (text \"\\n\"? body \"\\n\"?{close})* tail\n"
                f"text[stop={_lark_string(start)}]: /(.|\\n)*/\n"
                "tail: /(.|\\n)*/\n"
                f"body: %json {body}\n")
    return LLMatcher.grammar_from_lark(lark)


class Enforcer:
    """The logits processor of one constrained row: every token the grammar does not allow next gets
    -inf. mlx-lm calls it once per step with the row's tokens so far; the first call is for the
    prompt's last token, later ones for the token sampled last, which advances the matcher first."""

    once_per_token = True  # keeps state per call: speculative steps do not draft for its row

    def __init__(self, matcher: Any, width: int, eos: int) -> None:
        import numpy as np

        self.matcher = matcher
        self.width = width  # the logits' width (at least the tokenizer's vocabulary)
        self.eos = eos
        self._words = np.zeros((1, (width + 31) // 32), dtype=np.int32)
        self._started = False

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx
        import numpy as np
        from llguidance.numpy import fill_next_token_bitmask

        if self._started:
            # The next forward pass needs only the token sampled last, not the mask: start it, then
            # wait for that token and advance the grammar on the host while the pass runs.
            mx.async_eval(logits)
            self.matcher.consume_token(int(tokens[-1].item()))
        self._started = True
        if self.matcher.is_error() or self.matcher.is_stopped():
            allowed = np.zeros(self.width, dtype=np.bool_)
            allowed[self.eos] = True
        else:
            self._words.fill(0)
            fill_next_token_bitmask(self.matcher, self._words)
            bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
            allowed = bits[: self.width].astype(np.bool_)
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))
