"""Chat completions, side by side: swama against mlx-lm's own server on the same model folder.

Each server runs alone (never two at once), in the same environment, on a free loopback port. It
gets one warm-up request per prompt, then `--runs` streamed requests per prompt at temperature 0
(`--rounds` repeats that, starting every server afresh, in alternating order):

- generation: a prompt that makes the model write until `--max-tokens`;
- prefill: a prompt of about 500 tokens, for the time to the first token.

Every request starts with its own system line, so mlx_lm.server's prompt cache cannot reuse an
earlier prompt (swama keeps none for chat); both servers get exactly the same requests.
Measured on the client, with httpx: time to the first content token (TTFT), decode throughput
(tokens after the first over the time after the first, tokens from the usage chunk), wall time,
and the CPU time the server process spent on the request.

On a CPU swama casts the weights to float32 while mlx_lm.server keeps the folder's dtype; when
that is not float32 the tool also runs mlx_lm.server on a float32 copy, so the table shows the
default comparison and the like-for-like one.

Usage: python -m tools.bench.chat [--model-dir DIR] [--runs N] [--rounds R] [--max-tokens N]
                                         [--write [docs/benchmarks.md]]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.bench.common import (
    BENCHMARKS_MD,
    SMOLLM2_ID,
    Server,
    build_store,
    default_model_dir,
    facts_lines,
    floating_dtype,
    free_port,
    machine_facts,
    markdown_table,
    median,
    missing_model_message,
    publish,
    ratio,
    server_env,
    temp_dir,
    today,
    write_float32_copy,
)

SECTION = "Chat: swama vs mlx_lm.server"
GENERATION_TASK = ("Write a long, detailed story about a lighthouse keeper who finds a message in a bottle. "
                   "Describe every scene, every sound and every thought at great length.")
PREFILL_TASK = "Summarize every note above in detail, one paragraph per note."
_WHO = ("keeper", "fisher", "baker", "pilot", "teacher", "miner", "weaver", "doctor", "sailor", "farmer")
_WHAT = ("lantern", "compass", "letter", "basket", "map", "violin", "ladder", "kettle", "rope", "clock")
_WHERE = ("harbor", "valley", "market", "tower", "forest", "bridge", "island", "library", "mill", "cave")


# ---------------------------------------------------------------------------------------------
# Prompts


@dataclass(frozen=True)
class Scenario:
    name: str
    user: str
    max_tokens: int


def prefill_text(notes: int = 15) -> str:
    """A deterministic block of varied notes, about 500 tokens for SmolLM2's tokenizer."""
    lines = []
    for i in range(notes):
        who, what, where = _WHO[i % 10], _WHAT[(i * 3) % 10], _WHERE[(i * 7) % 10]
        lines.append(f"Note {i + 1}: the {who} carried a {what} to the {where} on day {3 * i + 2} "
                     f"and counted {17 * i % 50 + 4} steps on the way back.")
    return "\n".join(lines) + "\n\n" + PREFILL_TASK


def scenarios(max_tokens: int) -> list[Scenario]:
    return [Scenario("generation", GENERATION_TASK, max_tokens),
            Scenario("prefill ~500 tokens", prefill_text(), max_tokens)]


def messages(scenario: Scenario, index: int) -> list[dict[str, str]]:
    # A distinct first line per request: no server may answer from a cached prompt.
    system = f"Request {index} ({scenario.name}). You are a helpful assistant."
    return [{"role": "system", "content": system}, {"role": "user", "content": scenario.user}]


# ---------------------------------------------------------------------------------------------
# One streamed request


@dataclass
class Sample:
    ttft: float
    decode_seconds: float
    wall: float
    completion_tokens: int
    content_deltas: int
    prompt_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None
    from_usage: bool
    server_cpu: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return ratio(self.completion_tokens - 1, self.decode_seconds)


@dataclass
class _Stream:
    start: float
    first: float | None = None
    end: float | None = None
    deltas: int = 0
    usage: dict[str, Any] | None = None
    finish: str | None = None

    def feed(self, chunk: dict[str, Any], now: float) -> None:
        if chunk.get("error"):
            raise RuntimeError(f"the server reported an error: {chunk['error']}")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                self.deltas += 1
                self.first = self.first or now
            if choice.get("finish_reason"):
                self.finish, self.end = choice["finish_reason"], now

    def sample(self, done: float) -> Sample:
        if self.first is None:
            raise RuntimeError("the stream carried no content")
        usage = self.usage or {}
        tokens = usage.get("completion_tokens")
        end = self.end or done
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return Sample(ttft=self.first - self.start, decode_seconds=end - self.first, wall=done - self.start,
                      completion_tokens=int(tokens if tokens is not None else self.deltas),
                      content_deltas=self.deltas, prompt_tokens=usage.get("prompt_tokens"),
                      cached_tokens=cached, finish_reason=self.finish, from_usage=tokens is not None)


def sse_data(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        if line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield data


def stream_chat(client: httpx.Client, server: Server, body: dict[str, Any]) -> Sample:
    cpu_before = server.cpu_seconds()
    state = _Stream(start=time.perf_counter())
    with client.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:500]}")
        for data in sse_data(response.iter_lines()):
            state.feed(json.loads(data), time.perf_counter())
    sample = state.sample(time.perf_counter())
    cpu_after = server.cpu_seconds()
    if cpu_before is not None and cpu_after is not None:
        sample.server_cpu = cpu_after - cpu_before
    return sample


def request_body(model: str, scenario: Scenario, index: int) -> dict[str, Any]:
    return {"model": model, "messages": messages(scenario, index), "temperature": 0,
            "max_tokens": scenario.max_tokens, "stream": True, "stream_options": {"include_usage": True}}


# ---------------------------------------------------------------------------------------------
# Servers under test


@dataclass
class Target:
    label: str
    weights: str  # the dtype the server computes in, and where it comes from
    model: str  # the "model" field of a request
    start: Callable[[int], Server]
    results: dict[str, list[Sample]] = field(default_factory=dict)


def swama_target(store: Path, compute: str, label: str = "swama", env: dict[str, str] | None = None) -> Target:
    """`swama serve` on `store`; `env` adds settings (e.g. SWAMA_BATCHING=0) to the shared environment."""
    def start(port: int) -> Server:
        argv = [sys.executable, "-m", "swama.handlers.cli", "serve", "--port", str(port), "--log-level", "warning"]
        full = server_env({"SWAMA_MODELS": str(store), "SWAMA_IDLE_SECONDS": "3600", "HF_HUB_OFFLINE": "1",
                           **(env or {})})
        return Server(label, argv, port, "/v1/models", env=full)

    return Target(label, compute, SMOLLM2_ID, start)


def mlx_lm_target(label: str, model_dir: Path, weights: str) -> Target:
    def start(port: int) -> Server:
        argv = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_dir), "--port", str(port),
                "--log-level", "WARNING"]
        return Server(label, argv, port, "/health", env=server_env({"HF_HUB_OFFLINE": "1"}))

    return Target(label, weights, "default_model", start)


def swama_compute_dtype(weights: str) -> str:
    from swama.engine.runtime import compute_dtype

    dtype = str(compute_dtype()).removeprefix("mlx.core.")
    return f"{weights} (as stored)" if dtype == weights else f"{dtype} (cast at load)"


def run_target(target: Target, plan: list[Scenario], runs: int, timeout: float) -> None:
    print(f"\n== {target.label} ({target.weights}), load average {load_average()}", flush=True)
    with target.start(free_port()) as server, httpx.Client(timeout=timeout) as client:
        for scenario in plan:  # warm-up: loads the model and runs each prompt shape once
            stream_chat(client, server, request_body(target.model, scenario, 0))
        for scenario in plan:
            samples = target.results.setdefault(scenario.name, [])
            for _ in range(runs):
                samples.append(stream_chat(client, server, request_body(target.model, scenario, len(samples) + 1)))
                s = samples[-1]
                print(f"  {scenario.name:<20} run {len(samples)}: ttft {s.ttft * 1000:7.1f} ms  "
                      f"{s.tokens_per_second:6.1f} tok/s  wall {s.wall:6.2f} s  "
                      f"cpu {_fmt(math.nan if s.server_cpu is None else s.server_cpu, '{:6.2f}')} s  "
                      f"tokens {s.completion_tokens} ({s.content_deltas} deltas, {s.finish_reason})", flush=True)


# ---------------------------------------------------------------------------------------------
# Report


def _med(samples: list[Sample], metric: Callable[[Sample], float | None]) -> float:
    return median(v for v in map(metric, samples) if v is not None)


def _fmt(value: float, pattern: str) -> str:
    return "n/a" if math.isnan(value) else pattern.format(value)


METRICS: dict[str, Callable[[Sample], float | None]] = {
    "ttft": lambda x: x.ttft,
    "tok/s": lambda x: x.tokens_per_second,
    "wall": lambda x: x.wall,
    "cpu": lambda x: x.server_cpu,
}


def figures_table(targets: list[Target], plan: list[Scenario]) -> str:
    rows = []
    for scenario in plan:
        for t in targets:
            s = t.results[scenario.name]
            rows.append([scenario.name, t.label, t.weights, _fmt(_med(s, lambda x: x.prompt_tokens), "{:.0f}"),
                         _fmt(_med(s, METRICS["ttft"]) * 1000, "{:.0f}"), _fmt(_med(s, METRICS["tok/s"]), "{:.1f}"),
                         _fmt(_med(s, METRICS["wall"]), "{:.2f}"), _fmt(_med(s, METRICS["cpu"]), "{:.2f}"),
                         _fmt(_med(s, lambda x: x.completion_tokens), "{:.0f}")])
    header = ["prompt", "server", "computes in", "prompt tokens", "TTFT ms", "decode tok/s", "wall s",
              "server CPU s", "completion tokens"]
    return markdown_table(header, rows)


def ratios_table(swama: Target, others: list[Target], plan: list[Scenario]) -> str:
    rows = []
    for other in others:
        for scenario in plan:
            a, b = swama.results[scenario.name], other.results[scenario.name]
            rows.append([f"{other.label} ({other.weights})", scenario.name,
                         *(_fmt(ratio(_med(a, METRICS[k]), _med(b, METRICS[k])), "{:.2f}x") for k in METRICS)])
    header = ["swama vs", "prompt", "TTFT ratio (lower is better)", "throughput ratio (higher is better)",
              "wall ratio (lower is better)", "server CPU ratio (lower is better)"]
    return markdown_table(header, rows)


def consistency_notes(targets: list[Target], plan: list[Scenario]) -> list[str]:
    notes = []
    for scenario in plan:
        counts = {t.label: sorted({x.completion_tokens for x in t.results[scenario.name]}) for t in targets}
        if len({tuple(c) for c in counts.values()}) > 1:
            notes.append(f"completion token counts differ on '{scenario.name}': {counts}")
        if not all(x.from_usage for t in targets for x in t.results[scenario.name]):
            notes.append(f"'{scenario.name}': some streams had no usage chunk; content deltas were counted")
    cached = [x.cached_tokens or 0 for t in targets for s in t.results.values() for x in s]
    notes.append(f"prompt tokens served from a server's prompt cache: at most {max(cached, default=0)} per request")
    return notes


def notes_and_machine(notes: list[str], load: str) -> list[str]:
    """A report's closing sections: its notes, then the machine it ran on and the load meanwhile."""
    return ["Notes:\n\n" + "\n".join(f"- {n}" for n in notes),
            "Machine:\n\n" + facts_lines({**machine_facts(), "load average (1/5/15 min)": load})]


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def dtype_note(others: list[Target]) -> str:
    note = "swama casts the weights to float32 on a CPU; mlx_lm.server keeps the folder's dtype (the default comparison)"
    if len(others) > 1:
        note += "; mlx_lm.server f32 serves a float32 copy of the folder (the like-for-like comparison)"
    return note


def report(targets: list[Target], plan: list[Scenario], args: argparse.Namespace, command: str,
           load: str, model_dir: Path) -> str:
    swama, others = targets[0], targets[1:]
    notes = [
        f"median of {args.runs * args.rounds} streamed requests per prompt and server ({args.rounds} round(s) "
        f"of {args.runs}, each round starting the server afresh and warming it up with one request per prompt, "
        "the order of the servers reversed every other round); temperature 0, "
        f"max_tokens {args.max_tokens}; one server at a time, on loopback",
        "TTFT: request sent to first content delta; decode tok/s: (completion tokens - 1) / (time from the "
        "first content delta to the finish chunk); completion tokens from the usage chunk; server CPU s: user "
        "plus system CPU time of the server process during the request (steadier than wall time when other "
        "work shares the machine)",
        "both servers run with the same environment: OpenBLAS preloaded explicitly when present "
        "(LD_PRELOAD), swama's own re-exec off (SWAMA_OPENBLAS=0)",
        dtype_note(others),
        *consistency_notes(targets, plan),
    ]
    return "\n\n".join([
        f"Streamed `POST /v1/chat/completions` on the model folder `{model_dir.name}` (weights stored as "
        f"{floating_dtype(model_dir)}); every ratio is swama's median over mlx_lm.server's. Measured {today()} "
        f"with:\n\n```\n{command}\n```",
        ratios_table(swama, others, plan),
        figures_table(targets, plan),
        *notes_and_machine(notes, load),
    ])


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.chat", description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="an MLX model folder (default: the test cache's smollm2-mlx)")
    parser.add_argument("--runs", type=int, default=5, help="measured requests per prompt and server (default 5)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="start every server this many times, in alternating order (default 1)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (default 64)")
    parser.add_argument("--write", nargs="?", type=Path, const=BENCHMARKS_MD, default=None, metavar="MD",
                        help=f"write the results as the '{SECTION}' section of MD (default docs/{BENCHMARKS_MD.name})")
    parser.add_argument("--no-float32-copy", action="store_true",
                        help="skip mlx_lm.server on a float32 copy of the model folder")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per request (default 600)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.rounds < 1 or args.max_tokens < 2:
        parser.error("--runs and --rounds must be at least 1, --max-tokens at least 2")
    return args


def resolve_model_dir(given: Path | None) -> Path:
    folder = given.expanduser() if given is not None else default_model_dir()
    if folder is None:
        raise SystemExit(missing_model_message())
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{folder} is not an MLX model folder (no config.json).")
    return folder.resolve()


def build_targets(stack: ExitStack, model_dir: Path, float32_copy: bool) -> list[Target]:
    weights = floating_dtype(model_dir)
    store = build_store(Path(stack.enter_context(temp_dir("bench-chat-store-"))), model_dir)
    targets = [swama_target(store, swama_compute_dtype(weights))]
    if float32_copy and weights != "float32":
        print("writing a float32 copy of the model folder for mlx_lm.server ...", flush=True)
        copy = write_float32_copy(model_dir, Path(stack.enter_context(temp_dir("bench-chat-f32-"))) / "model")
        # Next to swama in every round: the like-for-like pair runs back to back.
        targets.append(mlx_lm_target("mlx_lm.server f32", copy, "float32 (converted copy)"))
    targets.append(mlx_lm_target("mlx_lm.server", model_dir, f"{weights} (as stored)"))
    return targets


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that the running server is stopped on the way out."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    model_dir = resolve_model_dir(args.model_dir)
    command = shlex.join(["python", "-m", "tools.bench.chat", *(sys.argv[1:] if argv is None else argv)])
    plan = scenarios(args.max_tokens)
    with ExitStack() as stack:
        targets = build_targets(stack, model_dir, not args.no_float32_copy)
        load_before = load_average()
        for round_ in range(args.rounds):
            # Alternate the order, so that a slow drift of the machine's load favours no server.
            for target in targets if round_ % 2 == 0 else reversed(targets):
                run_target(target, plan, args.runs, args.timeout)
        load = f"{load_before} at the start, {load_average()} at the end"
    publish(SECTION, report(targets, plan, args, command, load, model_dir), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
