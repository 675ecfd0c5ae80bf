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
# Defaults of --max-audio-seconds and --max-audio-sample-rate (handlers/http/settings.py). An upload's
# header states both; they bound the decoded samples (an hour at 96 kHz: 1.4 GB of float32 before
# resampling) whatever the file's size, and a rate is read before any sample is.
MAX_AUDIO_SECONDS = 3600.0
MAX_SAMPLE_RATE = 96000
MIN_SAMPLE_RATE = 1000
MAX_CHANNELS = 8
BLOCK_FRAMES = 1 << 16
# resample_poly's filter grows with the reduced ratio's terms (2,000,003 Hz to 16 kHz: 16000/2000003,
# 15 s for 52 bytes of WAV); past this term an FFT resample, linear in the samples, is taken instead.
MAX_POLYPHASE_TERM = 4096


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
    """Polyphase resampling (scipy) where the rates' reduced ratio is small (every common rate), else
    an FFT resample, whose cost does not grow with the ratio's terms."""
    if rate == target:
        return samples
    from scipy.signal import resample as fft_resample
    from scipy.signal import resample_poly

    g = gcd(rate, target)
    up, down = target // g, rate // g
    if max(up, down) <= MAX_POLYPHASE_TERM:
        return resample_poly(samples, up, down).astype(np.float32)
    return fft_resample(samples, max(1, round(len(samples) * target / rate))).astype(np.float32)


def _check_header(data: bytes, label: str, max_seconds: float, max_rate: int) -> None:
    """Rate, channels and length as the header states them, refused past the limits before any sample is read."""
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError):
        return  # not readable: the read below says why
    if not MIN_SAMPLE_RATE <= info.samplerate <= max_rate:
        raise AudioDecodeError(f"{label} is sampled at {info.samplerate:,} Hz; this server reads {MIN_SAMPLE_RATE:,} "
                               f"to {max_rate:,} Hz (--max-audio-sample-rate).")
    if not 1 <= info.channels <= MAX_CHANNELS:
        raise AudioDecodeError(f"{label} has {info.channels} channels; this server reads 1 to {MAX_CHANNELS}.")
    if info.frames > max_seconds * info.samplerate:
        raise AudioDecodeError(f"{label} is {info.frames / info.samplerate:,.0f} seconds long; this server reads at "
                               f"most {max_seconds:,.0f} (--max-audio-seconds).")


def decode_audio(data: bytes, filename: str | None = None, *, max_seconds: float = MAX_AUDIO_SECONDS,
                 max_rate: int = MAX_SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples at 16 kHz; AudioDecodeError for anything that is not readable audio, or
    longer than `max_seconds`, or sampled faster than `max_rate` (read in blocks, mixed down as they
    come, and stopped at the limit where a header understates the length)."""
    import soundfile as sf

    label = f"'{filename}'" if filename else "The file"
    if not data:
        raise AudioDecodeError("The audio file is empty.")
    missing = _needs_ffmpeg(data)
    if missing is not None:
        raise AudioDecodeError(f"{missing} needs ffmpeg, which swama does not use; convert the audio to "
                               f"{READABLE}.")
    _check_wav(data)
    _check_header(data, label, max_seconds, max_rate)
    try:
        with sf.SoundFile(io.BytesIO(data)) as audio:
            rate, most = audio.samplerate, int(max_seconds * audio.samplerate)
            blocks, frames = [], 0
            for block in audio.blocks(BLOCK_FRAMES, dtype="float32", always_2d=True):
                blocks.append(_to_mono(block))
                frames += len(block)
                if frames > most:
                    raise AudioDecodeError(f"{label} is longer than {max_seconds:,.0f} seconds, the most this "
                                           "server reads (--max-audio-seconds).")
    except sf.LibsndfileError as exc:
        detail = str(getattr(exc, "error_string", "") or exc).strip().rstrip(".")
        raise AudioDecodeError(f"{label} is not audio swama can read ({detail}); send {READABLE}.") from None
    except (RuntimeError, TypeError, ValueError) as exc:
        raise AudioDecodeError(f"{label} is not audio swama can read ({exc}); send {READABLE}.") from None
    samples = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)
    if samples.size == 0:
        raise AudioDecodeError("The audio file holds no samples.")
    if not np.isfinite(samples).all():
        raise AudioDecodeError("The audio file holds samples that are not finite numbers.")
    return np.ascontiguousarray(resample(samples, int(rate)), dtype=np.float32)
