"""Text-to-speech on mlx-audio: load a model, name its voices, synthesize audio segment by segment.

The model's own `generate` splits long text into segments and yields one result per segment; each
is handed on as soon as it exists, so a client hears the first sentence while the rest is made.
Voices are read from the model folder (a voices file, the display names its config maps onto it, a
voices/ folder); families that keep them elsewhere get the names they are known to offer.
"""

from __future__ import annotations

import inspect
import json
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from swama.engine.errors import BadInput, Cancelled, EngineError, MissingDependency, OutOfMemory
from swama.engine.files.kinds import TEXT_TO_SPEECH
from swama.engine.model import LoadedModel, cast_for_device

ESPEAK_MISSING = ("This model turns text into phonemes with espeak-ng, which is not installed: install it "
                  "(Debian/Ubuntu: sudo apt-get install espeak-ng; macOS: brew install espeak-ng) and retry.")
PHONEMIZER_MISSING = ("This model turns text into phonemes with the phonemizer-fork package, which is not "
                      "installed: pip install phonemizer-fork (it also needs espeak-ng).")
NO_SPEECH = "The input text gives no speech: it has nothing the model can pronounce."
SEED = 0
OUT_OF_MEMORY = "Not enough memory to synthesize this speech; try a shorter input or a smaller model."


@dataclass(frozen=True)
class Family:
    default: str
    voices: tuple[str, ...] = ()  # used when the folder names none


# Keyed by a word of the model_type or the model id.
FAMILIES: dict[str, Family] = {
    "orpheus": Family("tara", ("dan", "jess", "leo", "mia", "tara", "zac", "zoe")),
    "marvis": Family("conversational_a", ("conversational_a", "conversational_b")),
    "qwen3_tts": Family("en-us-1", ("en-us-1",)),
    "qwen3-tts": Family("en-us-1", ("en-us-1",)),
    "vyvo": Family("en-us-1", ("en-us-1",)),
    "kokoro": Family("af_heart", ("af_heart",)),
    "kitten": Family("Bella"),
}


@dataclass(frozen=True)
class Voices:
    """The voice names a request may use, and the one used when it names none (None: the model's own)."""

    default: str | None
    names: tuple[str, ...]

    def pick(self, requested: str | None) -> str | None:
        """The voice to synthesize with; a name the model does not offer is refused, naming those it has."""
        if requested is None:
            return self.default
        if not self.names or requested in self.names:
            return requested
        raise BadInput(f"Voice '{requested}' is not available for this model; it offers: "
                       f"{', '.join(self.names)}.", code="invalid_voice", param="voice")


@dataclass(frozen=True)
class Segment:
    audio: np.ndarray  # float32, mono
    sample_rate: int
    tokens: int  # the text (phoneme) tokens the model read for it


def _config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _voices_file_keys(path: Path) -> list[str]:
    """The arrays a voices.npz holds, read from its zip directory without loading them."""
    try:
        with zipfile.ZipFile(path) as archive:
            return [name.removesuffix(".npy") for name in archive.namelist() if name.endswith(".npy")]
    except (OSError, zipfile.BadZipFile):
        return []


def _family(model_id: str, config: dict[str, Any]) -> Family | None:
    words = (str(config.get("model_type", "")).lower(), model_id.lower())
    return next((family for key, family in FAMILIES.items() if any(key in word for word in words)), None)


def voices_of(model_id: str, path: Path) -> Voices:
    """The voices the model in `path` offers (its display names first), and its default."""
    config = _config(path)
    keys = _voices_file_keys(path / str(config.get("voices_path") or "voices.npz"))
    folder = path / "voices"
    if folder.is_dir():
        keys += sorted(p.stem for p in folder.iterdir() if p.suffix in (".safetensors", ".pt", ".npy"))
    aliases = config.get("voice_aliases") if isinstance(config.get("voice_aliases"), dict) else {}
    names = [name for name, key in aliases.items() if key in keys] + sorted(set(keys))
    family = _family(model_id, config)
    if not names and family is not None:
        names = list(family.voices)
    default = family.default if family is not None and family.default in names else (names[0] if names else None)
    return Voices(default, tuple(dict.fromkeys(names)))


def _evaluate_everything(model: Any) -> None:
    """Evaluate every array the model holds, parameters or not. mlx-audio builds some constants at
    construction (KittenTTS's upsampling scale, on a plain Python object), and a lazy array can only
    be evaluated on the thread whose stream made it: requests run on other threads than the load."""
    import mlx.core as mx

    arrays, seen, stack = [], set(), [model]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, mx.array):
            arrays.append(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
        if hasattr(node, "__dict__") and type(node).__module__.startswith(("mlx_audio", "mlx.nn")):
            stack.extend(vars(node).values())
    mx.eval(arrays)


def load_text_to_speech_model(model_id: str, path: Path) -> LoadedModel:
    from mlx_audio.tts.utils import load_model

    try:
        model = load_model(Path(path))
        cast_for_device(model)
        _evaluate_everything(model)
    except ImportError as exc:
        raise MissingDependency(f"The model's text-to-speech code needs a package that is missing: {exc}") from None
    return LoadedModel(model_id, Path(path), model, None, _config(path), set(), kind=TEXT_TO_SPEECH)


def sample_rate(model: LoadedModel) -> int:
    return int(getattr(model.model, "sample_rate", None) or model.config.get("sample_rate") or 24000)


def _frames(exc: BaseException) -> Iterator[Any]:
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _raised_in(exc: BaseException, function: str) -> bool:
    return any(frame.f_code.co_name == function for frame in _frames(exc))


def _raised_in_module(exc: BaseException, module: str) -> bool:
    return any(Path(frame.f_code.co_filename).stem == module for frame in _frames(exc))


def _engine_error(exc: BaseException) -> EngineError | None:
    """The failures a user can act on, worded for them; None for anything else (a bug)."""
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and ("out of memory" in text
                                                                           or "unable to allocate" in text)):
        return OutOfMemory(OUT_OF_MEMORY)
    if isinstance(exc, ImportError) and "phonemizer" in text:
        return MissingDependency(PHONEMIZER_MISSING)
    if isinstance(exc, RuntimeError) and "espeak" in text:
        return MissingDependency(ESPEAK_MISSING)
    if isinstance(exc, IndexError) and _raised_in(exc, "_prepare_inputs"):
        return BadInput(NO_SPEECH, code="no_speech", param="input")  # the phonemizer returned nothing for it
    if isinstance(exc, ValueError) and "voice" in text:
        return BadInput(str(exc), code="invalid_voice")
    return None


def synthesize(model: LoadedModel, text: str, voice: str | None, speed: float,
               cancel: threading.Event) -> Iterator[Segment]:
    """Audio for `text`, one segment at a time as the model makes it; stops when `cancel` is set.

    The same text, voice and speed give the same audio: the vocoder's noise source (its phases,
    and with them where the trailing silence is trimmed) is seeded for every request, on MLX's one
    global generator, as a chat request's `seed` is.
    """
    import mlx.core as mx

    mx.random.seed(SEED)
    rate = sample_rate(model)
    options: dict[str, Any] = {"speed": speed}
    if voice is not None:
        options["voice"] = voice
    produced = False
    try:
        try:
            for segment in _segments(model, text, rate, options, cancel):
                produced = True
                yield segment
        except Exception as exc:
            # KittenTTS spells out numbers and currency before phonemizing, and that step fails on
            # some text (a lone "¥" in mlx-audio 0.6.2); espeak reads the raw text well enough.
            if produced or not _raised_in_module(exc, "preprocess") or not _takes(model, "clean_text"):
                raise
            mx.random.seed(SEED)
            yield from _segments(model, text, rate, {**options, "clean_text": False}, cancel)
    except (Cancelled, EngineError):
        raise
    except Exception as exc:
        worded = _engine_error(exc)
        if worded is None:
            raise
        raise worded from None


def _segments(model: LoadedModel, text: str, rate: int, options: dict[str, Any],
              cancel: threading.Event) -> Iterator[Segment]:
    for result in model.model.generate(text, **options):
        if cancel.is_set():
            raise Cancelled
        audio = np.asarray(result.audio, dtype=np.float32).reshape(-1)
        yield Segment(audio, rate, int(getattr(result, "token_count", 0) or 0))
        if cancel.is_set():
            raise Cancelled


def _takes(model: LoadedModel, option: str) -> bool:
    try:
        return option in inspect.signature(model.model.generate).parameters
    except (TypeError, ValueError):
        return False
