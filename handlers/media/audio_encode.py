"""Audio bytes in the formats the speech route answers with, from float samples in [-1, 1].

WAV and PCM are written as the samples arrive, so they can be streamed: a streamed WAV cannot know
its length up front, so its RIFF and data sizes hold 0xFFFFFFFF ("unknown"), as streaming servers
write them (readers then take the data to the end of the file). FLAC and MP3 are encoded whole, by
the libsndfile that soundfile bundles, once the last sample is in.
"""

from __future__ import annotations

import io
import struct

import numpy as np

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg"}
FORMATS = tuple(MEDIA_TYPES)
UNKNOWN_SIZE = 0xFFFFFFFF
_SOUNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III")}


def pcm16(samples: np.ndarray) -> bytes:
    """16-bit little-endian PCM; out-of-range samples are clipped, NaN becomes silence."""
    clean = np.nan_to_num(np.asarray(samples, dtype=np.float32).reshape(-1), nan=0.0, posinf=1.0, neginf=-1.0)
    return (np.clip(clean, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """A 44-byte RIFF/WAVE header for mono 16-bit PCM; `data_bytes` None: a stream of unknown length."""
    riff_size = UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    data_size = UNKNOWN_SIZE if data_bytes is None else data_bytes
    return (b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data_size))


class Encoder:
    """Bytes of one audio file: `feed` each chunk of samples, then `finish`; concatenated, the
    returned pieces are the file."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        if fmt not in MEDIA_TYPES:
            raise ValueError(f"no encoder for {fmt!r}")
        self.format = fmt
        self.sample_rate = sample_rate
        self.samples = 0
        self._started = False
        self._held: list[np.ndarray] = []

    @property
    def streams(self) -> bool:
        return self.format not in _SOUNDFILE

    def feed(self, samples: np.ndarray) -> bytes:
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        self.samples += samples.size
        if not self.streams:
            self._held.append(samples)
            return b""
        head = b""
        if not self._started and self.format == "wav":
            head = wav_header(self.sample_rate)
        self._started = True
        return head + pcm16(samples)

    def finish(self) -> bytes:
        if self.streams:
            return b"" if self._started or self.format == "pcm" else wav_header(self.sample_rate)
        return encode_whole(self.format, np.concatenate(self._held or [np.zeros(0, np.float32)]),
                            self.sample_rate)


def encode_whole(fmt: str, samples: np.ndarray, sample_rate: int) -> bytes:
    """One complete file (a WAV with its exact sizes)."""
    if fmt == "pcm":
        return pcm16(samples)
    if fmt == "wav":
        data = pcm16(samples)
        return wav_header(sample_rate, len(data)) + data
    import soundfile

    container, subtype = _SOUNDFILE[fmt]
    clean = np.clip(np.nan_to_num(np.asarray(samples, dtype=np.float32).reshape(-1)), -1.0, 1.0)
    out = io.BytesIO()
    soundfile.write(out, clean, sample_rate, format=container, subtype=subtype)
    return out.getvalue()
