"""Reading a request's body: within its route's size limit, decoded from zstd or gzip, before anything
parses it; a body past the limit is refused unread when its length is declared."""

from __future__ import annotations

from fastapi import Request

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


def _decode(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "zstd":
        import zstandard

        try:
            # Bounded so a small compressed body cannot expand past the route's limit.
            return zstandard.ZstdDecompressor().decompress(body, max_output_size=DEFAULT_BODY_LIMIT + 1)
        except zstandard.ZstdError as exc:
            raise bad_request(f"Malformed request: the zstd body does not decode ({exc})",
                              code="invalid_encoding") from None
    if encoding == "gzip":
        import gzip
        import zlib

        try:
            return gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as exc:
            raise bad_request(f"Malformed request: the gzip body does not decode ({exc})",
                              code="invalid_encoding") from None
    raise ApiError(415, f"Content-Encoding '{encoding}' is not supported; send zstd, gzip or no encoding.",
                   code="unsupported_encoding")


async def read_body(request: Request, path: str) -> bytes:
    path = _limit_key(path)
    limit = BODY_LIMITS.get(path, DEFAULT_BODY_LIMIT)
    too_large = ApiError(413, TOO_LARGE.get(path, f"The request body is larger than {limit // MiB} MiB."),
                         code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    body = _decode(b"".join(chunks), request.headers.get("content-encoding", ""))
    if len(body) > limit:
        raise too_large
    return body
