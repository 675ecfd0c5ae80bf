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

Medians over `--rounds`; each round uses fresh prompts (no cache shares a prefix).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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

    def summary(self) -> dict[str, Any]:
        med = {k: statistics.median(v) if v else float("nan") for k, v in asdict(self).items() if isinstance(v, list)}
        return {"rows": self.rows, "prompt_tokens": self.prompt_tokens, **med,
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


def measure(model_dir: Path, rows: list[int], max_tokens: int, rounds: int) -> list[dict[str, Any]]:
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
        waves.append(wave.summary())
        print(f"{n} rows: {waves[-1]['tokens_per_second']:,.0f} tok/s (batch loop), median TTFT "
              f"{waves[-1]['median_ttft'] * 1000:,.0f} ms, raw forward {waves[-1]['forward_tokens_per_second']:,.0f} "
              "tok/s", flush=True)
    return waves


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True, help="an MLX model folder")
    parser.add_argument("--rows", default="1,8,64", help="batch sizes: one wave of this many prompts each")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens each row generates")
    parser.add_argument("--rounds", type=int, default=3, help="waves per batch size (medians are reported)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from swama.engine.runtime import activate_device

    activate_device()
    waves = measure(args.model_dir, [int(x) for x in args.rows.split(",") if x.strip()], args.max_tokens,
                    args.rounds)
    if args.json is not None:
        args.json.write_text(json.dumps(waves))
    return 0


if __name__ == "__main__":
    sys.exit(main())
