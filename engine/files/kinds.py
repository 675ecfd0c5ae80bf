"""Model kinds: their names, and what kind of model a folder holds, read from its config the way
the MLX libraries tell them apart. The store records it at install; what each kind can do and the
kinds beyond language models live in engine/kinds/.

mlx-vlm models carry a `vision_config` (or an image token) beside the text model; decision checkpoints
(Clef, PPLX-Decider) name an mlx-vlm architecture with its own decision head; speech models name
an audio architecture; embedding models are encoder architectures or sentence-transformers folders,
and rerankers encoder architectures with a sequence-classification head (cross-encoders).
Everything else with a config is a language model for mlx-lm.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LANGUAGE = "language"
VISION = "vision"
DECISION = "decision"  # a decision checkpoint: answers typed questions through its own head
EMBEDDING = "embedding"
RERANKER = "reranker"  # a cross-encoder: a query and a document in, one relevance logit out
SPEECH_TO_TEXT = "speech-to-text"
TEXT_TO_SPEECH = "text-to-speech"
KINDS = (LANGUAGE, VISION, DECISION, EMBEDDING, RERANKER, SPEECH_TO_TEXT, TEXT_TO_SPEECH)

# model_type values of mlx-audio's speech-to-text and text-to-speech architectures (and their aliases there).
_SPEECH_TO_TEXT = {"whisper", "parakeet", "parakeet_tdt", "qwen3_asr", "funasr", "fun_asr_nano", "nemotron_asr",
                   "voxtral", "voxtral_realtime", "moonshine", "glmasr", "sensevoice", "cohere_asr", "fireredasr2",
                   "canary", "mms", "wav2vec2", "granite_speech", "moss_transcribe_diarize", "lasr_ctc"}
_TEXT_TO_SPEECH = {"kokoro", "kitten_tts", "kitten", "csm", "dia", "outetts", "spark", "marvis", "qwen3_tts",
                   "sesame", "chatterbox", "chatterbox_turbo", "bark", "vibevoice", "soprano", "pocket_tts",
                   "echo_tts", "irodori_tts", "omnivoice", "moss_tts", "moss_tts_delay", "moss_tts_local",
                   "fish_qwen3_omni", "voxcpm", "voxcpm2"}
_DECISION_CHECKPOINTS = {"clef", "decider2"}  # mlx-vlm architectures with their own decision head
_ENCODERS = {"bert", "roberta", "xlm-roberta", "modernbert", "nomic_bert", "distilbert", "mpnet"}
_VISION_KEYS = ("vision_config", "image_token_id", "image_token_index", "vision_tower")


def kind_from_config(config: dict[str, Any], files: set[str] = frozenset()) -> str:
    model_type = str(config.get("model_type", "")).lower()
    if model_type in _SPEECH_TO_TEXT:
        return SPEECH_TO_TEXT
    if model_type in _TEXT_TO_SPEECH:
        return TEXT_TO_SPEECH
    if model_type in _DECISION_CHECKPOINTS:
        return DECISION
    if any(key in config for key in _VISION_KEYS):
        return VISION
    architectures = config.get("architectures") or []
    if model_type in _ENCODERS and any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return RERANKER
    if model_type in _ENCODERS or "modules.json" in files or "sentence_bert_config.json" in files:
        return EMBEDDING
    return LANGUAGE


def kind_of(folder: Path) -> str:
    """The kind of the model in `folder` (a language model when its config says nothing else)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    files = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    return kind_from_config(config if isinstance(config, dict) else {}, files)
