"""Speech to text, side by side: Whisper tiny.en through swama's engine against a direct mlx-audio
call on the same audio, in one process, one after the other.

- swama engine: `Engine.transcribe` (the pool loads the model and casts it to float32 on the CPU;
  the work runs on a worker thread, as for a request);
- mlx-audio, float32: `mlx_audio.stt.load` then `model.generate` after the same float32 cast;
- mlx-audio, float16 (`--fp16`): the folder's dtype, as mlx-audio loads it (slow on a CPU).

All get language "en" and temperature 0 with Whisper's fallback temperatures (mlx-audio's default).
Each gets one warm-up, then `--runs` timed transcriptions; the table gives the median wall time and
the real-time factor (seconds of audio per second of wall time: above 1 is faster than real time).
The default audio is about 36 s of espeak-ng speech (two 30 s windows).

Usage: python -m tools.bench.transcription [--model-dir DIR] [--audio FILE] [--runs N] [--fp16] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from swama.engine.runtime import REEXEC_MARK, reexec_with_fast_blas
from tools.bench.common import (
    add_write_option,
    publish,
    test_cache_dir,
    today,
)

TITLE = "Transcription: Whisper tiny.en through swama vs mlx-audio directly"

TEXT = ("The quick brown fox jumps over the lazy dog. Please call me tomorrow morning. The weather is nice "
        "today. I would like a cup of coffee. Open the door and turn on the light. We are going to the market "
        "to buy some bread. The children are playing in the garden. My brother lives in a small house near the "
        "river. She reads a book every night before bed. The train leaves the station at noon. We walked along "
        "the beach and watched the sunset. Please close the window because it is cold outside.")
MODEL_ID = "openai/whisper-tiny.en"


def default_model_dir() -> Path | None:
    cache = test_cache_dir()
    for folder in (cache / "whisper-tiny-en-mlx", Path.home() / ".swama" / "models" / MODEL_ID):
        if (folder / "config.json").is_file():
            return folder
    return None


def speech(path: Path) -> Path:
    subprocess.run(["espeak-ng", "-v", "en-us+f2", "-s", "140", "-w", str(path), TEXT], check=True)
    return path


def timed(runs: int, step: Callable[[], str]) -> tuple[list[float], str]:
    text = step()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        text = step()
        times.append(time.perf_counter() - start)
    return times, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None, help="an mlx-audio Whisper folder "
                        "(default: the test cache's converted tiny.en, else ~/.swama/models/openai/whisper-tiny.en)")
    parser.add_argument("--audio", type=Path, default=None, help="an audio file (default: espeak-ng speech)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--fp16", action="store_true", help="also time mlx-audio in float16")
    add_write_option(parser)
    args = parser.parse_args(argv)
    model_dir = args.model_dir or default_model_dir()
    if model_dir is None:
        print("No Whisper folder found: run `swama pull whisper-tiny.en` or pass --model-dir.", file=sys.stderr)
        return 1

    import mlx.core as mx
    from mlx_audio.stt.utils import load

    from swama.engine.client import EngineSettings, Task, open_engine
    from swama.engine.files.sources import create
    from swama.engine.files.store import ModelStore
    from swama.engine.kinds.transcription import _cast_whisper
    from swama.handlers.media.audio_decode import decode_audio

    work = Path(tempfile.mkdtemp(prefix="swama-bench-stt-"))
    try:
        audio_file = args.audio or speech(work / "speech.wav")
        audio = decode_audio(audio_file.read_bytes())
        seconds = len(audio) / 16000
        create(ModelStore(work / "models"), model_dir, MODEL_ID, say=lambda _: None)
        rows = []

        async def through_engine() -> tuple[list[float], str]:
            engine = open_engine(EngineSettings(models_root=work / "models"))
            model_id = engine.model_for(MODEL_ID, Task.TRANSCRIBE).id
            try:
                result = await engine.transcribe(model_id, audio, language="en")  # loads, then warm-up
                times = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    result = await engine.transcribe(model_id, audio, language="en")
                    times.append(time.perf_counter() - start)
                return times, result.text
            finally:
                await engine.close()

        rows.append(("swama engine", "float32", *asyncio.run(through_engine())))

        def direct(dtype) -> tuple[list[float], str]:
            model = load(str(model_dir))
            if dtype != model.dtype:
                _cast_whisper(model, dtype)
            samples = mx.array(audio)
            return timed(args.runs, lambda: model.generate(samples, language="en", fp16=dtype == mx.float16,
                                                           verbose=None).text.strip())

        rows.append(("mlx-audio generate", "float32", *direct(mx.float32)))
        if args.fp16:
            rows.append(("mlx-audio generate", "float16", *direct(mx.float16)))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    blas = "OpenBLAS preloaded" if "openblas" in os.environ.get("LD_PRELOAD", "") else "MLX's bundled BLAS"
    lines = [f"Measured {today()} with `python -m tools.bench.transcription`: Whisper tiny.en on the CPU "
             f"({blas}, {os.cpu_count()} CPUs); {seconds:.1f} s of audio, median of {args.runs} runs after a "
             "warm-up.", "", "| path | dtype | wall s | real-time factor |", "|---|---|---|---|"]
    for name, dtype, times, _ in rows:
        wall = statistics.median(times)
        lines.append(f"| {name} | {dtype} | {wall:.2f} | {seconds / wall:.1f}x |")
    ratio = statistics.median(rows[0][2]) / statistics.median(rows[1][2])
    lines += ["", f"swama engine / direct mlx-audio (float32) wall time: {ratio:.2f}."]
    body = "\n".join(lines)
    publish(TITLE, body, args.write)
    for name, dtype, _, text in rows:
        print(f"\n{name} ({dtype}): {text[:160]}{'...' if len(text) > 160 else ''}")
    sys.stdout.flush()
    # MLX aborts at interpreter exit once a finished worker thread (the engine's) has run it.
    os._exit(0)


if __name__ == "__main__":
    if not os.environ.get(REEXEC_MARK):
        reexec_with_fast_blas(sys.argv[1:], module="tools.bench.transcription")
    sys.exit(main())
