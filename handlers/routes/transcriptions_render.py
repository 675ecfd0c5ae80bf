"""POST /v1/audio/transcriptions: a transcript in the response format asked for (JSON, verbose JSON,
text, SubRip or WebVTT); `swama transcribe` prints the same."""

from __future__ import annotations

from fastapi import Response

from swama.engine.client import Transcript, TranscriptSegment

CONTENT_TYPES = {"text": "text/plain; charset=utf-8", "srt": "application/x-subrip; charset=utf-8",
                 "vtt": "text/vtt; charset=utf-8"}


def _timestamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _cues(segments: list[TranscriptSegment], separator: str) -> list[str]:
    return [f"{_timestamp(s.start, separator)} --> {_timestamp(s.end, separator)}\n{s.text.strip()}\n"
            for s in segments]


def to_srt(transcript: Transcript) -> str:
    """SubRip: numbered cues, comma before the milliseconds."""
    return "\n".join(f"{i}\n{cue}" for i, cue in enumerate(_cues(transcript.segments, ","), start=1))


def to_vtt(transcript: Transcript) -> str:
    """WebVTT: a header, then cues with a dot before the milliseconds."""
    return "\n".join(["WEBVTT\n", *_cues(transcript.segments, ".")])


def render(transcript: Transcript, response_format: str) -> Response | dict:
    if response_format == "verbose_json":
        return {"task": "transcribe", **transcript.to_dict()}
    if response_format == "text":
        return Response(transcript.text + "\n", media_type=CONTENT_TYPES["text"])
    if response_format == "srt":
        return Response(to_srt(transcript), media_type=CONTENT_TYPES["srt"])
    if response_format == "vtt":
        return Response(to_vtt(transcript), media_type=CONTENT_TYPES["vtt"])
    return {"text": transcript.text}
