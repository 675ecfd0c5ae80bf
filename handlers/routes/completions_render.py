"""POST /v1/completions: the `text_completion` object, its stream of chunks, and each choice's
legacy `logprobs` (tokens, token_logprobs, top_logprobs as {token: logprob}, text_offset).

A choice is made of `Piece`s, one per stretch of text (the echoed prompt, each text delta, the
finish), so the streamed chunks and the whole object are built from the same parts."""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from swama.engine.client import TokenLogprob
from swama.handlers.routes.turns import with_draft_tokens

WireLogprobs = dict[str, list[Any]]


def empty_logprobs() -> WireLogprobs:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def _number(value: float) -> float | None:
    """JSON has no infinities: a token the model rules out (-inf) is sent as the lowest float."""
    if math.isnan(value):
        return None
    return value if math.isfinite(value) else -3.4028234663852886e38


def top_dict(entry: TokenLogprob) -> dict[str, float | None]:
    """The alternatives, most probable first, then the chosen token when it is not among them
    (OpenAI: "up to logprobs+1 elements"); tokens with the same text keep the likelier value."""
    top: dict[str, float | None] = {}
    for alt in (*entry.top, entry):
        top.setdefault(alt.token, _number(alt.logprob))
    return top


@dataclass
class Track:
    """One choice's log probabilities: each token's character offset is counted from its exact bytes
    (a character split across tokens belongs to the token where it starts), and a token is released
    once the text it starts in has been sent, so tokens of a stop sequence, which is never sent, are
    dropped."""

    offset: int  # characters before the first token: the prompt's length when it is not echoed
    _chars: int = field(init=False, default=0)
    _pending: list[tuple[int, str, float | None, dict[str, float | None] | None]] = field(
        init=False, default_factory=list)

    def __post_init__(self) -> None:
        self._chars = self.offset
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _at(self, raw: Sequence[int]) -> int:
        at = self._chars
        self._chars += len(self._decoder.decode(bytes(raw)))
        return at

    def prompt(self, first: TokenLogprob | None, scored: Sequence[TokenLogprob]) -> WireLogprobs:
        """The echoed prompt's tokens, all at once: the first has no log probability (nothing comes
        before it), as in OpenAI's and vLLM's echo."""
        out = empty_logprobs()
        for i, entry in enumerate(scored):
            entry = first if i == 0 else entry
            if entry is None:
                continue
            out["text_offset"].append(self._at(entry.bytes))
            out["tokens"].append(entry.token)
            out["token_logprobs"].append(None if i == 0 else _number(entry.logprob))
            out["top_logprobs"].append(None if i == 0 else top_dict(entry))
        self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return out

    def add(self, entries: Sequence[TokenLogprob]) -> None:
        for entry in entries:
            self._pending.append((self._at(entry.bytes), entry.token, _number(entry.logprob), top_dict(entry)))

    def release(self, sent: int) -> WireLogprobs:
        """The tokens that start within the first `sent` characters (prompt offset included)."""
        out = empty_logprobs()
        keep = 0
        for at, token, logprob, top in self._pending:
            if at >= sent:
                break
            out["text_offset"].append(at)
            out["tokens"].append(token)
            out["token_logprobs"].append(logprob)
            out["top_logprobs"].append(top)
            keep += 1
        del self._pending[:keep]
        return out


@dataclass
class Piece:
    """A stretch of one choice: text (maybe empty), the logprobs of its tokens (None when not asked
    for), and on the last one the finish reason and token counts."""

    index: int
    text: str
    logprobs: WireLogprobs | None = None
    finish_reason: str | None = None
    prompt: int = 0  # which prompt the choice continues
    prompt_tokens: int = 0
    completion_tokens: int = 0
    draft_tokens: int = 0  # generated tokens that were drafted and accepted (speculative decoding)


def usage(prompt_tokens: int, completion_tokens: int, draft_tokens: int = 0) -> dict[str, int]:
    return with_draft_tokens({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens}, draft_tokens)


class Usage:
    """Usage over every choice: a prompt's tokens count once however many choices continue it."""

    def __init__(self) -> None:
        self.prompts: dict[int, int] = {}
        self.completion_tokens = 0
        self.draft_tokens = 0

    def add(self, piece: Piece) -> None:
        if piece.finish_reason is not None:
            self.prompts.setdefault(piece.prompt, piece.prompt_tokens)
            self.completion_tokens += piece.completion_tokens
            self.draft_tokens += piece.draft_tokens

    def wire(self) -> dict[str, int]:
        return usage(sum(self.prompts.values()), self.completion_tokens, self.draft_tokens)


def _choice(piece: Piece) -> dict[str, Any]:
    return {"text": piece.text, "index": piece.index, "logprobs": piece.logprobs,
            "finish_reason": piece.finish_reason}


def completion(ident: str, created: int, model: str, pieces: list[Piece], choices: int,
               logprobs: bool) -> dict[str, Any]:
    """The non-streaming text_completion object, choices in index order."""
    texts: list[list[str]] = [[] for _ in range(choices)]
    lps = [empty_logprobs() for _ in range(choices)]
    finish: list[str | None] = [None] * choices
    total = Usage()
    for piece in pieces:
        texts[piece.index].append(piece.text)
        for key, values in (piece.logprobs or {}).items():
            lps[piece.index][key].extend(values)
        finish[piece.index] = piece.finish_reason or finish[piece.index]
        total.add(piece)
    return {"id": ident, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": "".join(texts[i]), "index": i, "logprobs": lps[i] if logprobs else None,
                         "finish_reason": finish[i]} for i in range(choices)],
            "usage": total.wire()}


def frame(body: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


async def chunks(pieces: AsyncIterator[Piece], ident: str, created: int, model: str, include_usage: bool,
                 failed: Any) -> AsyncIterator[bytes]:
    """Each piece as a text_completion chunk (the same object, one choice each), then the usage when
    asked for (`stream_options.include_usage`, choices empty), then [DONE]. An error after the
    first chunk ends the stream with an `error` event, as OpenAI's and vLLM's streams do; `failed`
    turns the exception into its body."""
    head = {"id": ident, "object": "text_completion", "created": created, "model": model}
    total = Usage()
    try:
        async for piece in pieces:
            total.add(piece)
            yield frame({**head, "choices": [_choice(piece)]})
        if include_usage:
            yield frame({**head, "choices": [], "usage": total.wire()})
    except Exception as exc:  # noqa: BLE001 - the status line is sent: an error event is all that is left
        yield frame({"error": failed(exc)})
    finally:
        aclose = getattr(pieces, "aclose", None)
        if aclose is not None:
            await aclose()
    yield DONE
