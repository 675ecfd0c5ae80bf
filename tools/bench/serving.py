"""Concurrent clients, side by side: swama's continuous batching against swama serving one request
at a time and against mlx_lm.server, on the same model in float32 and the same machine, in one run.

    python -m tools.bench.serving [--model-dir DIR] [--clients 1,4,8,16] [--requests N]
                                        [--max-tokens N] [--rounds N] [--write [docs/benchmarks.md]]

Each server runs alone, on loopback, warmed up with one request. At every client count the clients
start together and each sends `--requests` streamed chat requests back to back (temperature 0, every
request with its own first line, so no prompt cache can answer it). Reported per server and client
count: aggregate throughput (completion tokens of all requests over the wall time from the first
request sent to the last one finished) and the median time to the first content token. With
`--rounds N` every server runs N times, in reversed order every other round; a figure is then the
median of the rounds' throughputs, and the TTFT the median over all their requests.

mlx_lm.server serves a float32 copy of the folder, the dtype swama computes in on a CPU.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tools.bench.chat import (
    Sample,
    Scenario,
    Target,
    exit_on_sigterm,
    load_average,
    mlx_lm_target,
    notes_and_machine,
    request_body,
    resolve_model_dir,
    stream_chat,
    swama_target,
)
from tools.bench.common import (
    BENCHMARKS_MD,
    Server,
    build_store,
    floating_dtype,
    free_port,
    markdown_table,
    publish,
    ratio,
    temp_dir,
    today,
    write_float32_copy,
)

SECTION = "Serving concurrent clients: continuous batching vs one at a time vs mlx_lm.server"
TASK = ("Write a long, detailed story about a lighthouse keeper who finds a message in a bottle. "
        "Describe every scene, every sound and every thought at great length.")


@dataclass
class Level:
    clients: int
    samples: list[Sample] = field(default_factory=list)
    wall: float = 0.0
    errors: list[str] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)  # each round's throughput, once rounds are merged

    @property
    def tokens_per_second(self) -> float:
        if self.rounds:
            return statistics.median(self.rounds)
        return ratio(sum(s.completion_tokens for s in self.samples), self.wall)

    @classmethod
    def merged(cls, levels: list[Level]) -> Level:
        """One level from the same client count measured in several rounds."""
        return cls(levels[0].clients, [s for lv in levels for s in lv.samples], sum(lv.wall for lv in levels),
                   [e for lv in levels for e in lv.errors], [lv.tokens_per_second for lv in levels])

    @property
    def median_ttft(self) -> float:
        return statistics.median(s.ttft for s in self.samples) if self.samples else float("nan")


def run_level(target: Target, server: Server, clients: int, requests: int, max_tokens: int, base: int,
              timeout: float) -> Level:
    level = Level(clients)
    scenario = Scenario(f"{clients} clients", TASK, max_tokens)
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def client(c: int) -> None:
        with httpx.Client(timeout=timeout) as http:
            barrier.wait()
            for r in range(requests):
                try:
                    sample = stream_chat(http, server, request_body(target.model, scenario, base + c * requests + r))
                except Exception as exc:  # reported, and the level is marked
                    with lock:
                        level.errors.append(str(exc)[:200])
                    continue
                with lock:
                    level.samples.append(sample)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    level.wall = time.perf_counter() - start
    return level


def run_target(target: Target, counts: list[int], requests: int, max_tokens: int, timeout: float) -> list[Level]:
    print(f"\n== {target.label}, load average {load_average()}", flush=True)
    levels = []
    with target.start(free_port()) as server, httpx.Client(timeout=timeout) as http:
        stream_chat(http, server, request_body(target.model, Scenario("warm-up", TASK, max_tokens), 0))
        base = 1
        for clients in counts:
            level = run_level(target, server, clients, requests, max_tokens, base, timeout)
            base += clients * requests
            levels.append(level)
            print(f"  {clients:>3} clients: {level.tokens_per_second:7.1f} tok/s aggregate, median TTFT "
                  f"{level.median_ttft * 1000:7.0f} ms, {len(level.samples)} requests in {level.wall:6.1f} s"
                  + (f", {len(level.errors)} errors: {level.errors[0]}" if level.errors else ""), flush=True)
    return levels


def report(labels: list[str], results: list[list[Level]], command: str, model_dir: Path, args: argparse.Namespace,
           load: str) -> str:
    batched, alone, peer = results
    rows = []
    for i, clients in enumerate(args.clients):
        b, a, p = batched[i], alone[i], peer[i]
        rows.append([str(clients), f"{b.tokens_per_second:.1f}", f"{a.tokens_per_second:.1f}",
                     f"{p.tokens_per_second:.1f}",
                     f"{ratio(b.tokens_per_second, p.tokens_per_second):.2f}x",
                     f"{ratio(b.tokens_per_second, a.tokens_per_second):.2f}x",
                     f"{b.median_ttft * 1000:.0f}", f"{a.median_ttft * 1000:.0f}", f"{p.median_ttft * 1000:.0f}"])
    table = markdown_table(
        ["clients", f"{labels[0]} tok/s", f"{labels[1]} tok/s", f"{labels[2]} tok/s", "vs mlx_lm.server",
         "vs one at a time", f"{labels[0]} TTFT ms", f"{labels[1]} TTFT ms", f"{labels[2]} TTFT ms"], rows)
    errors = sum(len(level.errors) for levels in results for level in levels)
    notes = [
        f"each client sends {args.requests} streamed chat request(s) back to back, max_tokens {args.max_tokens}, "
        "temperature 0, every request with its own first line; tok/s: completion tokens of all requests (from "
        "the usage chunk) over the wall time of the whole level; TTFT: request sent to first content delta",
        f"{labels[0]}: `swama serve` (continuous batching, --batch-rows 16, --prefill-step 512); {labels[1]}: "
        f"`swama serve --no-batching` (one request at a time per model, as before batching); {labels[2]}: "
        "`mlx_lm.server` (its defaults: decode concurrency 32, prompt concurrency 8) on a float32 copy of the folder",
        "servers run one at a time, with the same environment and the same BLAS (named under Machine)"
        + (f"; {args.rounds} rounds, the order of the servers reversed every other round: tok/s is the median "
           "of the rounds, TTFT the median over all their requests" if args.rounds > 1 else ""),
        f"request errors: {errors}",
    ]
    return "\n\n".join([
        f"Streamed `POST /v1/chat/completions` from 1 to {max(args.clients)} concurrent clients on "
        f"`{model_dir.name}` (stored as {floating_dtype(model_dir)}, served in float32 by all three). Measured "
        f"{today()} with:\n\n```\n{command}\n```",
        table,
        *notes_and_machine(notes, load),
    ])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.serving", description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="an MLX model folder (default: the test cache's smollm2-mlx)")
    parser.add_argument("--clients", type=lambda v: [int(x) for x in v.split(",")], default=[1, 4, 8, 16],
                        help="client counts, comma-separated (default 1,4,8,16)")
    parser.add_argument("--requests", type=int, default=2, help="requests per client at each count (default 2)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (default 64)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per request (default 900)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every server this many times, in alternating order (default 1)")
    parser.add_argument("--write", nargs="?", type=Path, const=BENCHMARKS_MD, default=None, metavar="MD",
                        help=f"write the results as a section of MD (default docs/{BENCHMARKS_MD.name})")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.requests < 1:
        parser.error("--rounds and --requests must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    model_dir = resolve_model_dir(args.model_dir)
    command = shlex.join(["python", "-m", "tools.bench.serving", *(sys.argv[1:] if argv is None else argv)])
    with ExitStack() as stack:
        store = build_store(Path(stack.enter_context(temp_dir("bench-serving-store-"))), model_dir)
        if floating_dtype(model_dir) == "float32":
            f32 = model_dir
        else:
            print("writing a float32 copy of the model folder for mlx_lm.server ...", flush=True)
            f32 = write_float32_copy(model_dir, Path(stack.enter_context(temp_dir("bench-serving-f32-"))) / "model")
        compute = "float32 (cast at load)"
        targets = [swama_target(store, compute),
                   swama_target(store, compute, "swama one at a time", {"SWAMA_BATCHING": "0"}),
                   mlx_lm_target("mlx_lm.server", f32, "float32 (converted copy)")]
        load_before = load_average()
        runs: list[list[list[Level]]] = [[] for _ in targets]
        for r in range(args.rounds):
            order = list(range(len(targets)))[:: -1 if r % 2 else 1]
            for i in order:
                runs[i].append(run_target(targets[i], args.clients, args.requests, args.max_tokens, args.timeout))
        results = [[Level.merged([levels[c] for levels in per_round]) for c in range(len(args.clients))]
                   for per_round in runs]
        load = f"{load_before} at the start, {load_average()} at the end"
    publish(SECTION, report([t.label for t in targets], results, command, model_dir, args, load), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
