"""Helpers for handlers that stream: stop work when the client goes, and fail before the first byte."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import Request

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
