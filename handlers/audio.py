"""POST /v1/audio/transcriptions and POST /v1/audio/speech."""

from __future__ import annotations

from swama.handlers.dispatch import Call, not_implemented
from swama.handlers.errors import bad_request


async def create_transcription(call: Call) -> None:
    content_type = call.request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise bad_request("Content-Type must be multipart/form-data", code="invalid_content_type")
    form = await call.form()
    for field in ("file", "model"):
        if field not in form:
            raise bad_request(f"Missing required field '{field}'.", code="missing_required_parameter", param=field)
    if isinstance(form["file"], str):
        raise bad_request("'file' must be an uploaded file.", code="invalid_type", param="file")
    raise not_implemented(call, validate=False)


async def create_speech(call: Call) -> None:
    raise not_implemented(call)
