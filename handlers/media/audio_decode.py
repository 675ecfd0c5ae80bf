"""Uploaded audio bytes to the mono float32 16 kHz samples Whisper listens to.

libsndfile (through soundfile) reads WAV, FLAC, OGG (Vorbis, Opus) and MP3 from memory; swama
does not use ffmpeg, so containers only ffmpeg opens (M4A/AAC, WebM, ...) are named and refused.
"""

from __future__ import annotations

import io
import struct
from math import gcd

import numpy as np

SAMPLE_RATE = 16000
READABLE = "WAV, FLAC, OGG or MP3"


class AudioDecodeError(Exception):
    """The upload is not audio swama can read; the message says why (a client error)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _needs_ffmpeg(data: bytes) -> str | None:
    """The name of a format libsndfile cannot read, from its magic bytes."""
    if data[4:8] == b"ftyp":
        return "M4A/AAC (MP4 audio)"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "WebM/Matroska"
    if len(data) > 1 and data[0] == 0xFF and data[1] & 0xF6 == 0xF0:
        return "AAC (ADTS)"
    if data[:6] == b"#!AMR\n":
        return "AMR"
    if data[:4] == b"FORM" and data[8:12] in (b"AIFF", b"AIFC"):
        return None  # libsndfile reads AIFF
    if data[:4] == b"\x30\x26\xb2\x75":
        return "WMA/ASF"
    return None


def _check_wav(data: bytes) -> None:
    """A RIFF/WAVE file whose data chunk promises more bytes than arrived is truncated; libsndfile
    would quietly return the part that is there."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return
    pos = 12
    while pos + 8 <= len(data):
        chunk, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        if chunk == b"data":
            have = len(data) - pos - 8
            # 0 and 0xFFFFFFFF are what streaming writers put there before they know the size.
            if size not in (0, 0xFFFFFFFF) and have < size:
                raise AudioDecodeError(f"The WAV file is truncated: its data chunk declares {size} bytes "
                                       f"but only {have} are present.")
            return
        pos += 8 + size + (size & 1)
    raise AudioDecodeError("The WAV file is truncated: it ends before its data chunk.")


def _to_mono(samples: np.ndarray) -> np.ndarray:
    return samples.mean(axis=1) if samples.ndim == 2 else samples


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Polyphase resampling (scipy), exact for any pair of integer rates."""
    if rate == target:
        return samples
    from scipy.signal import resample_poly

    g = gcd(rate, target)
    return resample_poly(samples, target // g, rate // g).astype(np.float32)


def decode_audio(data: bytes, filename: str | None = None) -> np.ndarray:
    """Mono float32 samples at 16 kHz; AudioDecodeError for anything that is not readable audio."""
    import soundfile as sf

    label = f"'{filename}'" if filename else "The file"
    if not data:
        raise AudioDecodeError("The audio file is empty.")
    missing = _needs_ffmpeg(data)
    if missing is not None:
        raise AudioDecodeError(f"{missing} needs ffmpeg, which swama does not use; convert the audio to "
                               f"{READABLE}.")
    _check_wav(data)
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
    except sf.LibsndfileError as exc:
        detail = str(getattr(exc, "error_string", "") or exc).strip().rstrip(".")
        raise AudioDecodeError(f"{label} is not audio swama can read ({detail}); send {READABLE}.") from None
    except (RuntimeError, TypeError, ValueError) as exc:
        raise AudioDecodeError(f"{label} is not audio swama can read ({exc}); send {READABLE}.") from None
    samples = _to_mono(np.asarray(samples, dtype=np.float32))
    if samples.size == 0:
        raise AudioDecodeError("The audio file holds no samples.")
    if not np.isfinite(samples).all():
        raise AudioDecodeError("The audio file holds samples that are not finite numbers.")
    return np.ascontiguousarray(resample(samples, int(rate)), dtype=np.float32)
