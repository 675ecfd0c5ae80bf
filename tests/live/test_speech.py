"""POST /v1/audio/speech on a live server with a tiny random-weight KittenTTS (mlx-audio), through the
official openai SDK: every format decodes to the samples the engine makes, speed and streaming do
what they say, and every refusal has its message."""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile
from conftest import make_store
from openai import OpenAI

from live_server import LiveServer, start_server
from swama.engine.kinds.speech import ESPEAK_MISSING, load_text_to_speech_model, synthesize, voices_of
from swama.handlers.media.audio_encode import UNKNOWN_SIZE, encode_whole

TTS = "test/tiny-kitten"
LM = "test/tiny-qwen3"
RATE = 24000
SHORT = "Hello from swama. This is a test."
# Over KittenTTS's 400-character limit for one segment, so the model splits it at sentence ends.
LONG = " ".join(f"Sentence number {n} is here so that the text runs past one segment." for n in range(9))
VOICES = ["Bella", "Leo", "expr-voice-2-f", "expr-voice-5-m"]


@pytest.fixture(scope="module")
def tts_store(tmp_path_factory: pytest.TempPathFactory, tiny_tts_dir: Path, tiny_model_dir: Path) -> Path:
    return make_store(tmp_path_factory, "tts-store", {TTS: tiny_tts_dir, LM: tiny_model_dir})


@pytest.fixture(scope="module")
def server(tts_store: Path) -> Iterator[LiveServer]:
    live = start_server(tts_store, tts_store.parent / "tts-server.log")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.v1, api_key="sk-local", max_retries=0)


@pytest.fixture(scope="module")
def engine_model(tiny_tts_dir: Path):
    return load_text_to_speech_model(TTS, tiny_tts_dir)


def engine_audio(model, text: str, voice: str = "Bella", speed: float = 1.0) -> list[np.ndarray]:
    return [s.audio for s in synthesize(model, text, voice, speed, threading.Event())]


def engine_samples(model, text: str, voice: str = "Bella", speed: float = 1.0) -> int:
    return sum(a.size for a in engine_audio(model, text, voice, speed))


def refusal(client: OpenAI, **fields) -> str:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(**{"model": TTS, "input": SHORT, "voice": "Bella", **fields})
    return caught.value.response.json()["error"]["message"]


def test_engine_output_is_finite_float32_audio_at_24_khz(engine_model) -> None:
    chunks = engine_audio(engine_model, SHORT)
    assert chunks and all(c.dtype == np.float32 and c.ndim == 1 and c.size > 0 for c in chunks)
    assert all(np.isfinite(c).all() for c in chunks)
    assert max(float(np.abs(c).max()) for c in chunks) > 0  # not silence
    assert len(engine_audio(engine_model, LONG)) > 1  # the long input really comes in several segments


def test_wav_holds_the_engines_samples_behind_a_streaming_header(client: OpenAI, engine_model) -> None:
    body = client.audio.speech.create(model=TTS, input=SHORT, voice="Bella", response_format="wav").content
    # A streamed WAV cannot know its length: RIFF and data sizes say "unknown", readers read to the end.
    assert struct.unpack_from("<I", body, 4)[0] == UNKNOWN_SIZE
    assert struct.unpack_from("<I", body, 40)[0] == UNKNOWN_SIZE
    with wave.open(io.BytesIO(body)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2)
        frames = w.readframes(w.getnframes())
    assert len(frames) // 2 == engine_samples(engine_model, SHORT)
    pcm = np.frombuffer(frames, "<i2")
    assert np.abs(pcm).max() > 0


def test_voice_defaults_to_bella_and_the_voice_keys_work_too(server: LiveServer, engine_model) -> None:
    r = httpx.post(server.v1 + "/audio/speech", json={"model": TTS, "input": SHORT}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
    assert (len(r.content) - 44) // 2 == engine_samples(engine_model, SHORT, "Bella")
    r = httpx.post(server.v1 + "/audio/speech", json={"model": TTS, "input": SHORT, "voice": {"id": "expr-voice-5-m"},
                                                       "response_format": "pcm"}, timeout=60)
    assert r.status_code == 200 and len(r.content) // 2 == engine_samples(engine_model, SHORT, "expr-voice-5-m")


def test_pcm_is_raw_16_bit_mono_with_its_rate_in_a_header(client: OpenAI, engine_model) -> None:
    raw = client.audio.speech.with_raw_response.create(model=TTS, input=SHORT, voice="Leo", response_format="pcm")
    assert raw.headers["x-sample-rate"] == str(RATE)
    assert raw.headers["content-type"] == "audio/pcm"
    assert len(raw.content) == 2 * engine_samples(engine_model, SHORT, "Leo")


@pytest.mark.parametrize("fmt", ["flac", "mp3"])
def test_flac_and_mp3_decode_back_to_the_audio(client: OpenAI, engine_model, fmt: str) -> None:
    raw = client.audio.speech.with_raw_response.create(model=TTS, input=SHORT, voice="Bella", response_format=fmt)
    assert raw.headers["content-type"] == {"flac": "audio/flac", "mp3": "audio/mpeg"}[fmt]
    audio, rate = soundfile.read(io.BytesIO(raw.content), dtype="float32")
    expected = engine_samples(engine_model, SHORT)
    assert rate == RATE and audio.ndim == 1 and np.isfinite(audio).all()
    if fmt == "flac":
        assert audio.size == expected  # lossless, exact length
    else:
        assert abs(audio.size - expected) <= 2 * 1152  # MP3 pads to whole frames of 576 or 1152 samples


def test_speed_changes_the_length_the_right_way(client: OpenAI) -> None:
    def samples(speed: float) -> int:
        return len(client.audio.speech.create(model=TTS, input=SHORT, voice="Bella", response_format="pcm",
                                              speed=speed).content) // 2

    slow, normal, fast = samples(0.5), samples(1.0), samples(2.0)
    assert slow > normal > fast


def test_a_long_input_streams_in_several_chunks_as_segments_are_made(client: OpenAI, engine_model) -> None:
    chunks = []
    with client.audio.speech.with_streaming_response.create(model=TTS, input=LONG, voice="Bella",
                                                            response_format="pcm") as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        for chunk in response.iter_bytes():
            chunks.append(chunk)
    assert len(chunks) > 1
    assert len(b"".join(chunks)) == 2 * engine_samples(engine_model, LONG)


def test_sse_sends_base64_audio_deltas_then_done_with_usage(server: LiveServer, engine_model) -> None:
    body = {"model": TTS, "input": SHORT, "voice": "Bella", "response_format": "pcm", "stream_format": "sse"}
    r = httpx.post(server.v1 + "/audio/speech", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line.removeprefix("data: ")) for line in r.text.splitlines() if line.startswith("data: ")]
    *deltas, done = events
    assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert len(audio) == 2 * engine_samples(engine_model, SHORT)
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_a_client_leaving_mid_stream_frees_the_model(server: LiveServer) -> None:
    with httpx.stream("POST", server.v1 + "/audio/speech", json={"model": TTS, "input": LONG * 3}, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_raw())
    # The model is held for one operation at a time: the next request is answered once the first stopped.
    r = httpx.post(server.v1 + "/audio/speech", json={"model": TTS, "input": "Next.", "response_format": "pcm"},
                   timeout=60)
    assert r.status_code == 200 and len(r.content) > 0


def test_text_the_number_speller_trips_on_is_still_spoken(client: OpenAI) -> None:
    """mlx-audio's KittenTTS text cleaner raises on a lone currency sign; the raw text is spoken then."""
    for text in ("\u00a5", "Price: \u00a5."):
        audio = client.audio.speech.create(model=TTS, input=text, voice="Bella", response_format="pcm").content
        assert len(audio) > 0 and len(audio) % 2 == 0


def test_refusals_have_the_documented_messages(client: OpenAI) -> None:
    assert refusal(client, input="") == "Input text is required"
    assert refusal(client, input=" \n\t") == "Input text is required"
    assert refusal(client, speed=4.5) == "Speed must be between 0.25 and 4.0"
    assert refusal(client, speed=0.1) == "Speed must be between 0.25 and 4.0"
    assert refusal(client, model=LM) == f"Model '{LM}' is not supported for TTS"
    assert refusal(client, response_format="opus") == "Unsupported response_format 'opus'"
    assert refusal(client, response_format="aac") == "Unsupported response_format 'aac'"
    assert refusal(client, response_format="ogg") == "Unsupported response_format 'ogg'"
    message = refusal(client, voice="alloy")
    assert message.startswith("Voice 'alloy' is not available for this model")
    assert all(name in message for name in VOICES)
    assert refusal(client, instructions="Speak softly.").startswith("'instructions' is not supported")
    assert refusal(client, input="...").startswith("The input text gives no speech")


def test_refusals_come_in_the_documented_order(client: OpenAI) -> None:
    assert refusal(client, input="", speed=9.0, model=LM, response_format="opus") == "Input text is required"
    assert refusal(client, speed=9.0, model=LM, response_format="opus") == "Speed must be between 0.25 and 4.0"
    assert refusal(client, model=LM, response_format="opus") == f"Model '{LM}' is not supported for TTS"
    assert refusal(client, response_format="opus", voice="alloy") == "Unsupported response_format 'opus'"


def test_an_uninstalled_model_is_a_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.audio.speech.create(model="test/not-here", input=SHORT, voice="Bella")
    assert caught.value.response.json()["error"]["code"] == "model_not_found"


def test_voices_come_from_the_folder_else_the_family(tiny_tts_dir: Path, tmp_path: Path) -> None:
    voices = voices_of(TTS, tiny_tts_dir)
    assert voices.default == "Bella" and list(voices.names) == VOICES
    for model_type, model_id, default, names in [
            ("kokoro", "mlx-community/Kokoro-82M-bf16", "af_heart", ["af_heart"]),
            ("qwen3_tts", "mlx-community/Qwen3-TTS-12Hz-0.6B-Base-8bit", "en-us-1", ["en-us-1"]),
            ("csm", "Marvis-AI/marvis-tts-250m-v0.2-MLX-8bit", "conversational_a",
             ["conversational_a", "conversational_b"])]:
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        found = voices_of(model_id, folder)
        assert (found.default, list(found.names)) == (default, names)
    kokoro = tmp_path / "kokoro"
    (kokoro / "voices").mkdir()
    for name in ("am_adam", "af_heart", "bf_emma"):
        (kokoro / "voices" / f"{name}.safetensors").write_bytes(b"")
    found = voices_of("mlx-community/Kokoro-82M-bf16", kokoro)
    assert (found.default, list(found.names)) == ("af_heart", ["af_heart", "am_adam", "bf_emma"])


def test_whole_wav_files_carry_their_exact_length() -> None:
    samples = np.sin(np.linspace(0, 200, 4800, dtype=np.float32))
    with wave.open(io.BytesIO(encode_whole("wav", samples, RATE))) as w:
        assert (w.getnframes(), w.getframerate()) == (4800, RATE)


def test_a_missing_espeak_is_a_clear_error(tts_store: Path) -> None:
    live = start_server(tts_store, tts_store.parent / "no-espeak.log",
                        env={"PHONEMIZER_ESPEAK_LIBRARY": str(tts_store / "no-such-libespeak-ng.so")})
    try:
        r = httpx.post(live.v1 + "/audio/speech", json={"model": TTS, "input": SHORT}, timeout=60)
    finally:
        live.stop()
    assert r.status_code == 500
    assert r.json()["error"]["message"] == ESPEAK_MISSING and "apt-get install espeak-ng" in ESPEAK_MISSING


def test_real_time_factor_of_the_tiny_model(engine_model, record_property) -> None:
    """Measured and reported (run with -s to see it), not asserted: the machine's load varies."""
    engine_audio(engine_model, SHORT)  # warm: the phonemizer starts espeak on first use
    start = time.perf_counter()
    samples = engine_samples(engine_model, LONG)
    elapsed = time.perf_counter() - start
    rtf = elapsed / (samples / RATE)
    record_property("real_time_factor", rtf)
    print(f"\ntiny KittenTTS: {samples / RATE:.2f} s of audio in {elapsed:.2f} s, real-time factor {rtf:.3f}")
    assert samples > 0
