"""Speech to text on mlx-audio's Whisper: loading a model folder, and transcribing decoded audio.

mlx-audio's `generate` does the work Whisper's own transcribe loop does: 30 s windows over the mel
spectrogram, timestamp tokens splitting each window into segments, the previous window's text as
the next one's prompt, and the temperature fallback when a window decodes badly.
"""

from __future__ import annotations

import json
import threading
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from swama.engine.errors import BadInput, Cancelled, LoadFailed, WrongModel
from swama.engine.files.kinds import SPEECH_TO_TEXT
from swama.engine.model import LoadedModel
from swama.engine.runtime import compute_dtype

SAMPLE_RATE = 16000
# Temperature 0 means "greedy, then hotter when a window decodes badly" (too repetitive or too
# unlikely), as OpenAI documents for this route and Whisper's transcribe does.
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


@dataclass
class Transcript:
    text: str
    language: str  # the language's English name, as OpenAI's verbose_json gives it ("english")
    duration: float  # seconds of audio
    segments: list[Segment] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _whisper_languages() -> tuple[dict[str, str], dict[str, str]]:
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    return LANGUAGES, TO_LANGUAGE_CODE


def language_code(name: str) -> str | None:
    """The Whisper language code for an ISO-639-1 code or an English language name; None if unknown."""
    languages, codes = _whisper_languages()
    key = name.strip().lower()
    if key in languages:
        return key
    return codes.get(key)


def language_of(name: str | None) -> str | None:
    """The Whisper language code a request's `language` names (None: detect it); refused by name
    when Whisper knows no such language."""
    if name is None:
        return None
    code = language_code(name)
    if code is None:
        raise BadInput(f"Unsupported language '{name}'; give an ISO-639-1 code such as 'en' or 'de'.",
                       code="unsupported_language", param="language")
    return code


def check_language(model: LoadedModel, language: str | None) -> None:
    """An English-only model takes English or nothing."""
    if language is not None and language != "en" and not is_multilingual(model):
        raise BadInput(f"Model '{model.id}' transcribes English only; language '{language}' is not supported by it.")


def is_multilingual(model: LoadedModel) -> bool:
    return bool(model.model.is_multilingual)


def whisper_dtype() -> Any:
    """Whisper's decoder runs in float16 or float32 only (mlx-audio refuses other audio features),
    so where the engine computes in bfloat16 (a GPU) Whisper takes float16, the dtype it ships in."""
    import mlx.core as mx

    dtype = compute_dtype()
    return mx.float16 if dtype == mx.bfloat16 else dtype


def _cast_whisper(model: Any, dtype: Any) -> None:
    """Cast weights and the two buffers Whisper keeps beside them (sinusoid positions, causal mask);
    `generate` casts each window's mel to `model.dtype`."""
    import mlx.core as mx

    model.set_dtype(dtype)
    model.dtype = dtype
    model.encoder._positional_embedding = model.encoder._positional_embedding.astype(dtype)
    model.decoder._mask = model.decoder._mask.astype(dtype)
    mx.eval(model.parameters(), model.encoder._positional_embedding, model.decoder._mask)


def load_speech_to_text_model(model_id: str, path: Path) -> LoadedModel:
    """An mlx-audio speech-to-text model; Whisper runs in float32 on the CPU (about 7x faster there
    than float16 with OpenBLAS preloaded; the weights stay float16 on disk)."""
    from mlx_audio.stt.utils import load_model

    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if str(config.get("model_type", "")).lower() != "whisper":
        raise WrongModel(f"Model '{model_id}' is a speech-to-text model swama cannot run yet; "
                         "only Whisper models are supported.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_model(str(path))
    if getattr(model, "_processor", None) is None:
        detail = "; ".join(str(w.message) for w in caught) or "no tokenizer files"
        raise LoadFailed(f"Model '{model_id}' has no usable Whisper tokenizer ({detail}).", code="server_error")
    _cast_whisper(model, whisper_dtype())
    return LoadedModel(model_id, path, model, None, config, set(), kind=SPEECH_TO_TEXT)


class _CancellableDecode:
    """Stands in for the model's per-window decode: stops between windows once `cancel` is set."""

    def __init__(self, model: Any, cancel: threading.Event) -> None:
        self.decode = type(model).decode
        self.model = model
        self.cancel = cancel

    def __call__(self, mel: Any, options: Any) -> Any:
        if self.cancel.is_set():
            raise Cancelled()
        return self.decode(self.model, mel, options)


def transcribe(model: LoadedModel, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None,
               temperature: float = 0.0, cancel: threading.Event | None = None) -> Transcript:
    """Transcribe 16 kHz mono float32 samples. `language` is a Whisper language code (None: detected
    by a multilingual model, English for an English-only one)."""
    import mlx.core as mx

    whisper = model.model
    cancel = cancel or threading.Event()
    temperatures: float | tuple[float, ...] = FALLBACK_TEMPERATURES if temperature == 0 else float(temperature)
    mx.random.seed(0)  # the fallback temperatures sample: the same audio gives the same text
    whisper.decode = _CancellableDecode(whisper, cancel)  # the pool runs one request per model at a time
    try:
        result = whisper.generate(mx.array(audio), language=language, initial_prompt=prompt or None,
                                  temperature=temperatures, fp16=whisper.dtype == mx.float16, verbose=None)
    finally:
        del whisper.decode
    languages, _ = _whisper_languages()
    kept = [s for s in result.segments or [] if str(s["text"]).strip()]
    segments = [Segment(id=i, seek=int(s["seek"]), start=round(float(s["start"]), 2),
                        end=round(float(s["end"]), 2), text=str(s["text"]), tokens=[int(t) for t in s["tokens"]],
                        temperature=float(s["temperature"]), avg_logprob=float(s["avg_logprob"]),
                        compression_ratio=float(s["compression_ratio"]),
                        no_speech_prob=float(s["no_speech_prob"]))
                for i, s in enumerate(kept)]
    code = result.language or "en"
    return Transcript(text=str(result.text).strip(), language=languages.get(code, code),
                      duration=round(len(audio) / SAMPLE_RATE, 3), segments=segments)
