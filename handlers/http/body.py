"""Reading a request's body: within its route's size limit, decoded from zstd or gzip (the decoded
size held to the same limit as it is decoded), before anything parses it; a body past the limit is
refused unread when its length is declared."""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from swama.handlers.http.errors import ApiError, bad_request

MiB = 1024 * 1024
# "100MB" for an uploaded audio file means 100,000,000 bytes of the file part; the body may add
# 64 KiB of multipart framing and other fields, so a larger declared body is refused unread.
TRANSCRIPTION_FILE_LIMIT = 100 * 1000 * 1000
# Route-specific body limits; everything else gets a generous default so a stray upload cannot
# exhaust memory.
# A batch input file may be as large as OpenAI's 200 MB.
FILE_LIMIT = 200 * 1000 * 1000
BODY_LIMITS = {"/v1/systemone": 13 * MiB, "/v1/audio/transcriptions": TRANSCRIPTION_FILE_LIMIT + 64 * 1024,
               "/v1/files": FILE_LIMIT + 64 * 1024}
DEFAULT_BODY_LIMIT = 64 * MiB
TOO_LARGE = {"/v1/systemone": "The request body is larger than 13 MiB.",
             "/v1/audio/transcriptions": "File size exceeds 100MB limit",
             "/v1/files": f"The file is larger than {FILE_LIMIT} bytes, the most one upload takes."}
# The Clef cards cap the whole request body at 13 MiB, as /v1/systemone does.
CLEF_RUN = "/ai/run/@cf/cloudflare/"


def _limit_key(path: str) -> str:
    return "/v1/systemone" if CLEF_RUN in path else path


def _decode(body: bytes, encoding: str, limit: int, too_large: ApiError) -> bytes:
    """The body decoded, stopping as soon as its output passes `limit`: a small compressed body never
    expands in memory past its route's limit, whatever size its frames claim."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "zstd":
        import zstandard

        try:
            # A stream reader decodes block by block; one-shot decompression allocates the size a
            # frame's header claims (1 TiB ended in a MemoryError) before reading anything.
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body), read_across_frames=True) as reader:
                return _bounded(iter(lambda: reader.read(MiB), b""), limit, too_large)
        except zstandard.ZstdError as exc:
            raise bad_request(f"Malformed request: the zstd body does not decode ({exc})",
                              code="invalid_encoding") from None
    if encoding == "gzip":
        try:
            return _bounded(_gunzip(body), limit, too_large)
        except zlib.error as exc:
            raise bad_request(f"Malformed request: the gzip body does not decode ({exc})",
                              code="invalid_encoding") from None
    raise ApiError(415, f"Content-Encoding '{encoding}' is not supported; send zstd, gzip or no encoding.",
                   code="unsupported_encoding")


def _gunzip(body: bytes) -> Iterator[bytes]:
    """The inflated bytes of every gzip member in turn, at most a MiB at a time."""
    data = body
    while data:
        member = zlib.decompressobj(wbits=31)
        while data and not member.eof:
            yield member.decompress(data, MiB)
            data = member.unconsumed_tail
        if not member.eof:
            raise zlib.error("the gzip body ends inside a member")
        data = member.unused_data


def _bounded(parts: Iterator[bytes], limit: int, too_large: ApiError) -> bytes:
    out, size = [], 0
    for part in parts:
        size += len(part)
        if size > limit:
            raise too_large
        out.append(part)
    return b"".join(out)


def _too_large(path: str) -> tuple[int, ApiError]:
    path = _limit_key(path)
    limit = BODY_LIMITS.get(path, DEFAULT_BODY_LIMIT)
    return limit, ApiError(413, TOO_LARGE.get(path, f"The request body is larger than {limit // MiB} MiB."),
                           code="request_too_large")


async def read_raw_body(request: Request, path: str) -> bytes:
    """The body as sent (still compressed, if it is), refused with a 413 once it passes the route's limit."""
    limit, too_large = _too_large(path)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: Request, path: str) -> bytes:
    raw = await read_raw_body(request, path)
    limit, too_large = _too_large(path)
    # Decoding is heavy work: it runs in Starlette's bounded thread pool, off the event loop.
    return await run_in_threadpool(_decode, raw, request.headers.get("content-encoding", ""), limit, too_large)
