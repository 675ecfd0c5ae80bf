"""Replicas on Ray Serve against one process, on this machine: aggregate chat throughput.

    python -m tools.bench.replicas [--model-dir DIR] [--replicas 2] [--clients 8] [--max-tokens 128]
                                   [--rounds 3] [--write [docs/benchmarks.md]]

`--clients` chat streams start together, each streaming `--max-tokens` tokens (temperature 0, every
request with its own first line, so no prompt cache answers it), against `swama serve MODEL` and
against `swama serve MODEL --replicas N` (a local Ray started by the server). Every round starts
each server afresh, in reversed order every other round, warms it with one level of short streams
(which loads the model on every replica) and measures one level. Reported: the median of the
rounds' aggregate tokens/s (completion tokens over the level's wall time), their spread, and the
median time to the first token.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
from pathlib import Path

from tools.bench.chat import Target, exit_on_sigterm, load_average, resolve_model_dir
from tools.bench.common import (
    SMOLLM2_ID,
    Server,
    add_write_option,
    build_store,
    facts_lines,
    free_port,
    machine_facts,
    markdown_table,
    package_version,
    publish,
    server_env,
    temp_dir,
    today,
)
from tools.bench.serving import Level, run_level

SECTION = "Replicas on Ray Serve vs one process (CPU)"


def serve(store: Path, label: str, flags: list[str]) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "swama.handlers.cli", "serve", SMOLLM2_ID, "--port", str(port), "--log-level",
            "warning", *flags]
    env = server_env({"SWAMA_MODELS": str(store), "SWAMA_IDLE_SECONDS": "3600", "HF_HUB_OFFLINE": "1"})
    # Stopping replicas stops Serve and then Ray: give it the time, never a kill that orphans Ray.
    return Server(label, argv, port, "/v1/models", env=env, start_timeout=600, stop_timeout=120)


def measure(store: Path, label: str, flags: list[str], args: argparse.Namespace, base: int) -> Level:
    with serve(store, label, flags) as server:
        target = Target(label, "", SMOLLM2_ID, lambda port: server)
        # Short streams from every client: loads the model on each replica, every batch shape once.
        run_level(target, server, args.clients, 1, 8, base, args.timeout)
        level = run_level(target, server, args.clients, 1, args.max_tokens, base + args.clients, args.timeout)
    print(f"  {label}: {level.tokens_per_second:.1f} tok/s, median TTFT {level.median_ttft * 1000:.0f} ms"
          + (f", {len(level.errors)} errors: {level.errors[0]}" if level.errors else ""), flush=True)
    return level


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None, help="an MLX folder of SmolLM2 (default: the "
                                                                      "test cache's)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    add_write_option(parser)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    model_dir = resolve_model_dir(args.model_dir)
    command = shlex.join(["python", "-m", "tools.bench.replicas", *(sys.argv[1:] if argv is None else argv)])
    configs = [("one process", []), (f"--replicas {args.replicas}", ["--replicas", str(args.replicas)])]
    results: dict[str, list[Level]] = {label: [] for label, _ in configs}
    load = load_average()
    with temp_dir("bench-replicas-store-") as root:
        store = build_store(Path(root), model_dir)
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", flush=True)
            for label, flags in configs if r % 2 == 0 else configs[::-1]:
                results[label].append(measure(store, label, flags, args, 1 + r * 1000))
    rows = []
    for label, levels in results.items():
        rates = [lv.tokens_per_second for lv in levels]
        ttft = statistics.median(s.ttft for lv in levels for s in lv.samples) if any(lv.samples for lv in levels) \
            else float("nan")
        rows.append([label, f"{statistics.median(rates):.1f}", f"{min(rates):.1f}-{max(rates):.1f}",
                     ", ".join(f"{x:.1f}" for x in rates), f"{ttft * 1000:.0f}",
                     str(sum(len(lv.errors) for lv in levels))])
    single, replicated = (statistics.median(lv.tokens_per_second for lv in results[label]) for label, _ in configs)
    facts = {**machine_facts(), "ray": package_version("ray")}
    cores = os.cpu_count() or 1
    body = "\n".join([
        f"{args.clients} streamed chat clients, {args.max_tokens} tokens each, on SmolLM2-135M-Instruct (float32 "
        f"on the CPU). Measured {today()} with:", "", "```", command, "```", "",
        markdown_table(["server", "aggregate tok/s (median)", "spread (min-max)", "rounds", "median TTFT ms",
                        "errors"], rows), "",
        f"`--replicas {args.replicas}` / one process: {replicated / single:.2f}x (medians).", "",
        "Notes:", "",
        f"- {args.rounds} rounds; every round starts each server afresh, the order reversed every other round, "
        "warms it with one short stream per client (which loads the model on every replica), then measures one "
        "level: completion tokens of all streams over the level's wall time; TTFT: request sent to first content "
        "delta, the median over all rounds' requests",
        f"- `--replicas {args.replicas}` runs on a local Ray the server starts: two engine processes, each "
        f"reserving {max(1, cores // args.replicas)} of the {cores} cores (so one BLAS thread each where one "
        "process uses every core), beside Ray's own processes (Serve's controller and HTTP proxy, the ingress, "
        "the raylet, the GCS, Ray's agents)",
        f"- load average (1/5/15 min): {load} at the start, {load_average()} at the end", "",
        "Machine:", "", facts_lines(facts)])
    publish(SECTION, body, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
