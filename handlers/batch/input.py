"""A batch's input file, checked as it is uploaded and again as a job is made of it.

The file-level rules are OpenAI's: JSON lines, each an object with a unique `custom_id`, `method`
POST, the job's `url` and a `body` object. The body itself is not judged here: each line goes through
its route's own model and rules when the job runs, and a refusal is that line's answer in the error
file, worded as the live route words it.
"""

from __future__ import annotations

import json
from typing import Any

from swama.handlers.batch.store import Line
from swama.handlers.http.body import BODY_LIMITS, DEFAULT_BODY_LIMIT
from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.strict_json import StrictJSONError, parse_strict_json

MAX_LINES = 50_000  # OpenAI's limit on the requests of one batch


def _object_lines(data: bytes, name: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line; a line that is not a JSON object is refused."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"A batch input file must be JSON lines (.jsonl) in UTF-8: {name} is not UTF-8 "
                          f"(byte {exc.start}).", code="invalid_file") from None
    out = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = parse_strict_json(raw.encode())
        except StrictJSONError as exc:
            raise bad_request(f"A batch input file must be JSON lines (.jsonl): line {number} of {name} is not "
                              f"valid JSON ({exc}).", code="invalid_file") from None
        if not isinstance(value, dict):
            raise bad_request(f"A batch input file must be JSON lines (.jsonl): line {number} of {name} is not "
                              "a JSON object.", code="invalid_file")
        out.append((number, value))
    return out


def check_upload(data: bytes, filename: str) -> None:
    """What an upload of purpose `batch` must be: not empty, JSON lines."""
    if not data.strip():
        raise bad_request("The file is empty.", code="invalid_file", param="file")
    _object_lines(data, repr(filename))


def batch_lines(data: bytes, file_id: str, endpoint: str) -> tuple[list[Line], str | None]:
    """The job's lines from its input file, and the model they all name (None when they differ)."""
    lines: list[Line] = []
    seen: dict[str, int] = {}
    models: set[str | None] = set()
    limit = BODY_LIMITS.get(endpoint, DEFAULT_BODY_LIMIT)
    for number, value in _object_lines(data, f"file '{file_id}'"):
        def refuse(why: str, param: str | None = None, number: int = number) -> ApiError:
            return bad_request(f"Line {number} of file '{file_id}': {why}", code="invalid_file", param=param)

        custom_id = value.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise refuse("'custom_id' must be a non-empty string.", "custom_id")
        if custom_id in seen:
            raise refuse(f"'custom_id' {custom_id!r} is used by line {seen[custom_id]} already; each request needs "
                         "its own.", "custom_id")
        seen[custom_id] = number
        if value.get("method") != "POST":
            raise refuse(f"'method' must be 'POST' (got {value.get('method')!r}).", "method")
        if value.get("url") != endpoint:
            raise refuse(f"'url' {value.get('url')!r} is not the batch's endpoint '{endpoint}'.", "url")
        body = value.get("body")
        if not isinstance(body, dict):
            raise refuse("'body' must be a JSON object: the request the endpoint takes.", "body")
        unknown = sorted(set(value) - {"custom_id", "method", "url", "body"})
        if unknown:
            raise refuse(f"unknown field '{unknown[0]}' (a line holds custom_id, method, url and body).", unknown[0])
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        if len(text.encode()) > limit:
            raise refuse(f"the body is larger than the {limit // (1024 * 1024)} MiB the route takes.", "body")
        model = body.get("model")  # any JSON: the line's own route refuses what is not a model's name
        models.add(model if isinstance(model, str) else None)
        lines.append(Line(number, custom_id, text))
        if len(lines) > MAX_LINES:
            raise bad_request(f"File '{file_id}' holds more than {MAX_LINES} requests, the most one batch takes.",
                              code="invalid_file")
    if not lines:
        raise bad_request(f"File '{file_id}' holds no requests.", code="invalid_file")
    return lines, next(iter(models)) if len(models) == 1 else None
