"""POST /v1/completions: OpenAI's legacy completions on a raw prompt (no chat template).

Each prompt of the request (a string, strings, token ids or lists of them) gets `n` choices, prompt
i's at indices i*n .. i*n+n-1 as OpenAI numbers them. Every choice is its own generation; they run
side by side, at most a batch's worth at a time so a long list of prompts queues here instead of
being refused by the engine's admission (429). `echo` puts the prompt before the completion, with
its tokens' log probabilities (a forward pass over the prompt) when `logprobs` is asked for;
`max_tokens: 0` with `echo` scores the prompt alone, which is how evaluation harnesses read a
text's log-likelihood. completions_wording words the refusals, completions_render the shapes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import pydantic
from fastapi import Response
from fastapi.responses import StreamingResponse

from swama.engine.client import (
    CLIENT_CLOSED,
    Cancelled,
    ChatRequest,
    EngineClient,
    EngineError,
    Finished,
    Logprobs,
    Sampling,
    Task,
    TextDelta,
    TokenLogprob,
)
from swama.generated.openai_models import CreateCompletionRequest
from swama.handlers.http.errors import ApiError, bad_request, engine_error
from swama.handlers.http.pipeline import Call, route
from swama.handlers.http.streaming import collect_or_cancel, start_stream
from swama.handlers.routes.completions_render import Piece, Track, chunks, completion, empty_logprobs
from swama.handlers.routes.completions_wording import (
    DEFAULT_MAX_TOKENS,
    RULES,
    best_of_differs,
    zero_tokens_need_echo,
)
from swama.handlers.routes.turns import sampling

log = logging.getLogger("swama")

Prompt = str | list[int]


def _value(node: Any) -> Any:
    """A generated RootModel's value (the generator wraps `X | null` fields in one)."""
    while isinstance(node, pydantic.RootModel):
        node = node.root
    return node


def prompts_of(prompt: Any) -> list[Prompt]:
    """The request's prompts: one string, strings, one list of ids, or lists of ids."""
    prompt = _value(prompt)
    if isinstance(prompt, str):
        return [prompt]
    items = [_value(p) for p in prompt]
    if all(isinstance(p, int) for p in items):
        return [list(items)]
    return [p if isinstance(p, str) else [int(_value(t)) for t in p] for p in items]


@dataclass(frozen=True)
class CompletionJob:
    """What the request asks for, read from its typed model."""

    model: str
    prompts: list[Prompt]
    n: int
    max_tokens: int
    echo: bool
    logprobs: int | None
    stream: bool
    include_usage: bool
    stop: list[str]
    sampling: Sampling

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n


def completion_job(request: CreateCompletionRequest) -> CompletionJob:
    """The typed request read, with the rules no schema can say (in this order): `max_tokens` 0 only
    with `echo`, `best_of` only equal to `n`, no `logit_bias`."""
    n = _value(request.n) or 1
    echo = bool(_value(request.echo))
    max_tokens = _value(request.max_tokens)
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if max_tokens == 0 and not echo:
        raise zero_tokens_need_echo()
    best_of = _value(request.best_of)
    if best_of is not None and best_of != n:
        raise best_of_differs(best_of, n)
    if _value(request.logit_bias):  # the schema's maxProperties 0 does not reach the generated model
        raise RULES.unhandled("logit_bias")
    stop = _value(request.stop)
    stop = [stop] if isinstance(stop, str) else [_value(s) for s in (stop or [])]
    options = sampling(temperature=_value(request.temperature), top_p=_value(request.top_p),
                       presence_penalty=_value(request.presence_penalty),
                       frequency_penalty=_value(request.frequency_penalty), seed=_value(request.seed))
    stream_options = _value(request.stream_options)
    return CompletionJob(
        model=str(_value(request.model)), prompts=prompts_of(request.prompt), n=n, max_tokens=max_tokens,
        echo=echo, logprobs=_value(request.logprobs), stream=bool(_value(request.stream)),
        include_usage=bool(stream_options is not None and _value(stream_options.include_usage)),
        stop=[s for s in stop if isinstance(s, str)], sampling=options)


@dataclass(frozen=True)
class Echo:
    """A prompt as echoed: its text, and its tokens' log probabilities when asked for."""

    text: str
    tokens: int
    first: TokenLogprob | None = None  # the first token as text (it has no log probability)
    scored: tuple[TokenLogprob, ...] = ()


async def read_echo(engine: EngineClient, model_id: str, prompt: Prompt, top: int | None) -> Echo:
    ids = await engine.tokenize_prompt(model_id, prompt)
    if top is None and isinstance(prompt, str):
        return Echo(prompt, len(ids))
    # Token ids have no text of their own: the scoring pass gives each token's bytes (the first
    # token's too, with no log probability).
    scored = await engine.score_prompt(model_id, ids, top or 0)
    text = prompt if isinstance(prompt, str) else b"".join(bytes(e.bytes) for e in scored).decode(
        "utf-8", errors="replace")
    return Echo(text, len(ids), scored[0], tuple(scored))


class Echoes:
    """Each prompt's echo, read once however many choices continue it."""

    def __init__(self, read: Callable[[int], Awaitable[Echo]]) -> None:
        self._read = read
        self._tasks: dict[int, asyncio.Future[Echo]] = {}

    async def of(self, prompt: int) -> Echo:
        task = self._tasks.get(prompt)
        if task is None:
            task = self._tasks[prompt] = asyncio.ensure_future(self._read(prompt))
        return await asyncio.shield(task)  # one choice going away does not cancel the others' read

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
            if task.done() and not task.cancelled():
                task.exception()  # read, so a failure that nobody awaited is not logged as lost


@dataclass
class Choices:
    """The generations behind one request's choices."""

    engine: EngineClient
    model_id: str
    job: CompletionJob
    context_limit: int
    rows: int  # the batch's rows: at most this many choices generate at once

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.rows)
        top = self.job.logprobs
        self.echoes = Echoes(lambda i: read_echo(self.engine, self.model_id, self.job.prompts[i], top))
        # The choices join the batch together, so a seeded request samples alike each time it runs alone
        # (when they all fit in the batch's rows at once: `slots`).
        together = 1 < self.job.choices <= self.rows
        self.siblings = (uuid.uuid4().hex, self.job.choices) if together else None

    def request(self, prompt: Prompt, j: int) -> ChatRequest:
        options = self.job.sampling
        if options.seed is not None:  # a seed names the first choice; the others follow it, so they differ
            options = replace(options, seed=options.seed + j)
        return ChatRequest(messages=[], prompt=prompt, sampling=options, max_tokens=self.job.max_tokens,
                           stop=self.job.stop, logprobs=self.job.logprobs, context_limit=self.context_limit,
                           siblings=self.siblings)

    async def choice(self, index: int) -> AsyncIterator[Piece]:
        """One choice's pieces: the echoed prompt, each text delta, the finish."""
        i, j = divmod(index, self.job.n)
        asked = self.job.logprobs is not None
        none = empty_logprobs() if asked else None  # the finish carries no tokens
        async with self.slots:
            echo = await self.echoes.of(i) if self.job.echo else None
            prompt = self.job.prompts[i]
            # Offsets count from the start of the prompt (OpenAI's convention) where its text is known.
            start = len(prompt) if isinstance(prompt, str) else 0
            if echo is not None:
                lps = Track(0).prompt(echo.first, echo.scored) if asked else None
                yield Piece(index, echo.text, lps, prompt=i)
                start = len(echo.text)
                if self.job.max_tokens == 0:
                    yield Piece(index, "", none, "length", prompt=i, prompt_tokens=echo.tokens)
                    return
            track, sent = Track(start), start
            events = self.engine.chat(self.model_id, self.request(prompt, j))
            try:
                async for event in events:
                    if isinstance(event, Logprobs):
                        track.add(event.entries)
                    elif isinstance(event, TextDelta):
                        sent += len(event.text)
                        yield Piece(index, event.text, track.release(sent) if asked else None, prompt=i)
                    elif isinstance(event, Finished):
                        # Tokens not released by now belong to a stop sequence, which is not sent.
                        yield Piece(index, "", none, event.finish_reason, prompt=i,
                                    prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                                    draft_tokens=event.draft_tokens)
            finally:
                await events.aclose()

    async def all(self) -> AsyncIterator[Piece]:
        """Every choice's pieces as they come; the first failure ends them all."""
        queue: asyncio.Queue[Piece | BaseException | None] = asyncio.Queue()

        async def pump(index: int) -> None:
            try:
                async for piece in self.choice(index):
                    queue.put_nowait(piece)
                queue.put_nowait(None)
            except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
                queue.put_nowait(exc)

        tasks = [asyncio.ensure_future(pump(k)) for k in range(self.job.choices)]
        try:
            running = len(tasks)
            while running:
                item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.echoes.close()


def _stream_error(exc: BaseException) -> dict[str, Any]:
    """An error event's body, in the route's error shape."""
    if isinstance(exc, EngineError | ApiError):
        err = engine_error(exc) if isinstance(exc, EngineError) else exc
        return {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    log.error("completion stream failed", exc_info=exc)
    return {"message": "Internal server error.", "type": "server_error", "param": None, "code": "server_error"}


@route(RULES)
async def create_completion(call: Call, parsed: CreateCompletionRequest) -> Response | dict[str, Any]:
    job = completion_job(parsed)
    settings = call.settings
    if job.choices > settings.max_choices:
        raise bad_request(f"A request may ask for at most {settings.max_choices} completions (prompts times n, "
                          f"--max-choices); this one asks for {len(job.prompts)} x {job.n} = {job.choices}.",
                          param="prompt")
    engine = call.engine
    installed = engine.model_for(job.model, Task.GENERATE)
    rows = max(1, settings.batch_rows if settings.batching else 1)
    choices = Choices(engine, installed.id, job, settings.context_limit, rows)
    ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if job.stream:
        # Errors before the first piece are still a plain 4xx: every prompt is read first (a token
        # outside the vocabulary), then the first generation starts (a prompt too long); later
        # failures end the stream with an error event.
        read = await asyncio.gather(*(engine.tokenize_prompt(installed.id, p) for p in job.prompts),
                                    return_exceptions=True)
        for result in read:
            if isinstance(result, BaseException):
                raise result
        pieces = await start_stream(choices.all())
        return StreamingResponse(chunks(pieces, ident, created, job.model, job.include_usage, _stream_error),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    collected = []
    finished = 0
    async for piece in collect_or_cancel(call.request, choices.all()):
        collected.append(piece)
        finished += piece.finish_reason is not None
    if finished < job.choices:
        raise Cancelled(CLIENT_CLOSED)
    return completion(ident, created, job.model, collected, job.choices, job.logprobs is not None)
