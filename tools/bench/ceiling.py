"""The engine alone: mlx-lm's own batch loop and a raw forward on a model folder, no server around them.

    python -m tools.bench.ceiling --model-dir DIR [--rows 1,8,64] [--max-tokens 128] [--rounds 3]
                                  [--json OUT]

The ceiling a live server is held against (`python -m tools.bench.load` runs this in its own process
before it starts the server, so both see the same model and the same machine in one run):

- **batch loop**: one wave of N prompts (the same chat messages `tools.bench.load` streams, rendered
  with the model's chat template) inserted together into mlx-lm's `BatchGenerator` (completion and
  prefill batch sizes N, greedy, the model's end tokens as stops), stepped until every row has
  `--max-tokens` tokens. Reported: tokens/s over the wave's wall time (prefill included) and the
  median and largest time to a row's first token.
- **raw forward**: N rows decoding one token each against a ~64-token key/value cache: the model's
  forward and a greedy pick, evaluated, per step (no sampling machinery, no per-row bookkeeping):
  what the device and MLX's graph building allow at that batch size.
- **scheduler alone** (`--scheduler MODES`, compiled-step modes, `auto` by default, `none` to skip):
  the same wave through swama's own batch scheduler (engine/serving/scheduler.py) in this process,
  its tokens taken straight from the scheduler thread: what the live server could reach with no
  HTTP, templates, text or process hop around it. Reported beside tokens/s and time to first token:
  where the scheduler thread spent the wave, per decode step (the parts of engine/serving/timing.py).

Medians over `--rounds`; each round uses fresh prompts (no cache shares a prefix).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tools.bench.chat import Scenario, messages
from tools.bench.serving import TASK


@dataclass
class Wave:
    rows: int
    tokens_per_second: list[float] = field(default_factory=list)
    median_ttft: list[float] = field(default_factory=list)
    max_ttft: list[float] = field(default_factory=list)
    forward_tokens_per_second: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    scheduler: dict[str, dict[str, Any]] = field(default_factory=dict)  # by compiled-step mode

    def summary(self) -> dict[str, Any]:
        med = {k: statistics.median(v) if v else float("nan") for k, v in asdict(self).items() if isinstance(v, list)}
        return {"rows": self.rows, "prompt_tokens": self.prompt_tokens, **med, "scheduler": self.scheduler,
                "spread": {k: [min(v), max(v)] for k, v in asdict(self).items() if isinstance(v, list) and v}}


def wave_prompts(tokenizer: Any, rows: int, max_tokens: int, base: int) -> list[list[int]]:
    """The prompts `tools.bench.load` sends at a level of `rows` streams, from request index `base`."""
    scenario = Scenario(f"{rows} clients", TASK, max_tokens)
    return [list(tokenizer.apply_chat_template(messages(scenario, base + i), add_generation_prompt=True))
            for i in range(rows)]


def batch_loop(model: Any, eos: set[int], prompts: list[list[int]], max_tokens: int) -> tuple[float, float, float]:
    """One wave through mlx-lm's BatchGenerator: (tokens/s, median TTFT s, largest TTFT s)."""
    from mlx_lm.generate import BatchGenerator

    rows = len(prompts)
    gen = BatchGenerator(model, max_tokens=max_tokens, stop_tokens=[[t] for t in sorted(eos)],
                         completion_batch_size=rows, prefill_batch_size=rows)
    start = time.perf_counter()
    gen.insert(prompts)
    first: dict[int, float] = {}
    tokens = done = 0
    while done < rows:
        _, responses = gen.next()
        now = time.perf_counter()
        for r in responses:
            tokens += 1
            first.setdefault(r.uid, now - start)
            done += r.finish_reason is not None
    wall = time.perf_counter() - start
    gen.close()
    ttfts = sorted(first.values())
    return tokens / wall, statistics.median(ttfts), ttfts[-1]


def raw_forward(model: Any, rows: int, steps: int = 20, context: int = 64) -> float:
    """Tokens/s of `rows` rows decoding one token a step: forward plus argmax, evaluated each step."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    prompt = mx.random.randint(0, 1000, (rows, context))
    mx.eval(model(prompt, cache=cache))
    token = mx.zeros((rows, 1), dtype=mx.int32)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        token = mx.argmax(model(token, cache=cache)[:, -1, :], axis=-1, keepdims=True)
        mx.eval(token)
        times.append(time.perf_counter() - started)
    return rows / statistics.median(times[2:])


class WaveSink:
    """The scheduler's sink for one wave (engine/serving/scheduler.py `Sink`): counts the tokens, times
    each row's first and sees the last row finish. No text is made, as the batch loop makes none."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.start = time.perf_counter()
        self.first: dict[int, float] = {}
        self.tokens = self.finished = 0
        self.error: BaseException | None = None
        self.done = threading.Event()

    def post(self, job: Any, item: Any) -> None:
        if isinstance(item, BaseException):
            self.error = item
            self.done.set()

    def deliver(self, tokens: list[tuple[Any, int, str | None, Any, int]]) -> None:
        now = time.perf_counter()
        for job, _, finish, _, _ in tokens:
            self.tokens += 1
            self.first.setdefault(job.cid, now - self.start)
            self.finished += finish is not None
        if self.finished == self.rows:
            self.done.set()


def scheduler_wave(scheduler: Any, prompts: list[list[int]], max_tokens: int,
                   timeout: float = 600.0) -> tuple[float, float, float, dict[str, float]]:
    """One wave through swama's scheduler: (tokens/s, median TTFT s, largest TTFT s, the scheduler
    thread's seconds by part over the wave, with its decode steps)."""
    from swama.engine.text.generator import ChatRequest, Sampling

    request = ChatRequest([], sampling=Sampling(temperature=0), max_tokens=max_tokens)
    before = scheduler.clock.reading()
    sink = WaveSink(len(prompts))
    for i, ids in enumerate(prompts):
        scheduler.submit_tokens(ids, request, False, sink, i)
    if not sink.done.wait(timeout):
        raise TimeoutError(f"the scheduler's wave of {len(prompts)} rows did not finish in {timeout:.0f} s")
    if sink.error is not None:
        raise sink.error
    wall = time.perf_counter() - sink.start
    after = scheduler.clock.reading()
    ttfts = sorted(sink.first.values())
    return sink.tokens / wall, statistics.median(ttfts), ttfts[-1], {k: after[k] - before[k] for k in after}


def scheduler_side(model_dir: Path, rows: list[int], max_tokens: int, rounds: int, mode: str) -> dict[int, dict]:
    """Waves through swama's scheduler with the compiled step in `mode`: by rows, the medians."""
    import mlx.core as mx

    from swama.engine.serving.scheduler import Scheduler
    from swama.engine.text.language import load_language_model

    loaded = load_language_model("bench", model_dir)
    scheduler = Scheduler(loaded, prompt_cache=None, rows=max(rows), compiled_step=mode)
    out: dict[int, dict] = {}
    try:
        scheduler_wave(scheduler, wave_prompts(loaded.tokenizer, max(rows), 8, 90_000), 8)  # every shape once
        for n in rows:
            waves = []
            for r in range(rounds):
                waves.append(scheduler_wave(scheduler, wave_prompts(loaded.tokenizer, n, max_tokens, 100_000 * (r + 1)),
                                            max_tokens))
                mx.clear_cache()
            parts = {k: statistics.median(w[3][k] for w in waves) for k in waves[0][3]}
            steps = parts.pop("steps") or 1.0
            parts.pop("turns", None)
            out[n] = {"tokens_per_second": statistics.median(w[0] for w in waves),
                      "spread": [min(w[0] for w in waves), max(w[0] for w in waves)],
                      "median_ttft": statistics.median(w[1] for w in waves),
                      "max_ttft": statistics.median(w[2] for w in waves), "steps": steps,
                      "ms_per_step": {k: 1000 * v / steps for k, v in parts.items() if k != "idle"}}
            busy = " ".join(f"{k} {v:.2f}" for k, v in out[n]["ms_per_step"].items() if v >= 0.005)
            print(f"{n} rows: {out[n]['tokens_per_second']:,.0f} tok/s (scheduler, compiled step {mode}), median "
                  f"TTFT {out[n]['median_ttft'] * 1000:,.0f} ms, largest {out[n]['max_ttft'] * 1000:,.0f} ms, "
                  f"{steps:.0f} steps; ms a step: {busy}", flush=True)
    finally:
        scheduler.close()
        del loaded
        mx.clear_cache()
    return out


def measure(model_dir: Path, rows: list[int], max_tokens: int, rounds: int,
            modes: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    import mlx.core as mx
    from mlx_lm import load

    from swama.engine.runtime import compute_dtype

    model, tokenizer = load(str(model_dir))
    model.set_dtype(compute_dtype())  # the dtype swama serves the folder in on this device
    mx.eval(model.parameters())
    eos = set(tokenizer.eos_token_ids or []) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    batch_loop(model, eos, wave_prompts(tokenizer, max(rows), 8, 90_000), 8)  # every shape once
    waves = []
    for n in rows:
        wave = Wave(n)
        for r in range(rounds):
            prompts = wave_prompts(tokenizer, n, max_tokens, 100_000 * (r + 1))
            wave.prompt_tokens = round(statistics.mean(len(p) for p in prompts))
            tps, ttft, worst = batch_loop(model, eos, prompts, max_tokens)
            wave.tokens_per_second.append(tps)
            wave.median_ttft.append(ttft)
            wave.max_ttft.append(worst)
            wave.forward_tokens_per_second.append(raw_forward(model, n))
            mx.clear_cache()
        waves.append(wave)
        summary = wave.summary()
        print(f"{n} rows: {summary['tokens_per_second']:,.0f} tok/s (batch loop), median TTFT "
              f"{summary['median_ttft'] * 1000:,.0f} ms, raw forward {summary['forward_tokens_per_second']:,.0f} "
              "tok/s", flush=True)
    del model
    mx.clear_cache()
    for mode in modes:
        for wave, side in zip(waves, scheduler_side(model_dir, rows, max_tokens, rounds, mode).values(), strict=True):
            wave.scheduler[mode] = side
    return [w.summary() for w in waves]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True, help="an MLX model folder")
    parser.add_argument("--rows", default="1,8,64", help="batch sizes: one wave of this many prompts each")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens each row generates")
    parser.add_argument("--rounds", type=int, default=3, help="waves per batch size (medians are reported)")
    parser.add_argument("--scheduler", default="auto",
                        help="compiled-step modes (auto, on, off; comma-separated) to run swama's scheduler "
                             "with on the same waves, or 'none'")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from swama.engine.runtime import activate_device

    activate_device()
    modes = tuple(m.strip() for m in args.scheduler.split(",") if m.strip() and m.strip() != "none")
    waves = measure(args.model_dir, [int(x) for x in args.rows.split(",") if x.strip()], args.max_tokens,
                    args.rounds, modes)
    if args.json is not None:
        args.json.write_text(json.dumps(waves))
    return 0


if __name__ == "__main__":
    sys.exit(main())
