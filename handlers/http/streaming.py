"""Helpers for handlers that stream: stop work when the client goes, and fail before the first byte."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

from fastapi import Request

from swama.engine.client import EngineError

T = TypeVar("T")


async def _until_disconnected(request: Request, every: float = 0.1) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(every)


async def collect_or_cancel(request: Request, events: AsyncIterator[T]) -> AsyncIterator[T]:
    """Iterate `events` while watching the client: a disconnect stops (and so cancels) the work."""
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        iterator = events.__aiter__()
        while True:
            step = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        watcher.cancel()
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def start_stream(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """Wait for the first event so errors before it become plain HTTP errors, then stream the rest."""
    iterator = events.__aiter__()
    try:
        first = await iterator.__anext__()
    except StopAsyncIteration:
        return _empty()

    async def rest() -> AsyncIterator[T]:
        try:
            yield first
            async for item in iterator:
                yield item
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()

    return rest()


async def _empty() -> AsyncIterator[Any]:
    return
    yield


Frame = tuple[str, dict[str, Any]]


async def event_stream(events: AsyncIterator[Any], start: Callable[[], Iterable[Frame]],
                       feed: Callable[[Any], Iterable[Frame]], failed: Callable[[EngineError], Iterable[Frame]],
                       encode: Callable[[str, dict[str, Any]], bytes]) -> AsyncIterator[bytes]:
    """A route's typed SSE events for a generation: its opening frames, the frames of each engine event,
    and its error frames when the engine fails after the stream began; the generation is closed at the end."""
    for frame in start():
        yield encode(*frame)
    try:
        async for event in events:
            for frame in feed(event):
                yield encode(*frame)
    except EngineError as exc:
        for frame in failed(exc):
            yield encode(*frame)
    finally:
        await events.aclose()
