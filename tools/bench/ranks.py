"""One model split across ranks against one process, on this machine: throughput and capacity.

    python -m tools.bench.ranks [--shape qwen3-0.6b] [--ranks 2] [--clients 8] [--max-tokens 32] [--rounds 3]

Throughput: `--clients` closed-loop chat streams of `--max-tokens` tokens, against one process and
against `--ranks N` serving the same random-weight model of a real shape (tools.bench.gpu), each
`--rounds` times; reported as the median aggregate tokens/s and the spread of the rounds.
Capacity: both started with a --memory-limit of 60% of the model's weights. One process refuses to
load it (503); each rank holds half of it, so the ranks load it and answer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import httpx

from tools.bench.common import Server, build_store, free_port, server_env, temp_dir
from tools.bench.serving import run_level


def serve(store: Path, repo_id: str, *flags: str) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "swama.handlers.cli", "serve", repo_id, "--port", str(port), "--log-level",
            "warning", "--max-model-queue", "1024", *flags]
    env = server_env({"SWAMA_MODELS": str(store), "SWAMA_IDLE_SECONDS": "3600", "HF_HUB_OFFLINE": "1"})
    return Server(" ".join(flags) or "one process", argv, port, "/v1/models", env=env, start_timeout=900)


def throughput(server: Server, repo_id: str, clients: int, max_tokens: int, rounds: int) -> list[float]:
    from tools.bench.chat import Target

    target = Target(server.name, "", repo_id, lambda port: server)
    run_level(target, server, clients, 1, 4, 10_000, 600)  # every batch shape once
    return [run_level(target, server, clients, 2, max_tokens, r * 1000, 600).tokens_per_second
            for r in range(rounds)]


def capacity(store: Path, repo_id: str, limit: int, *flags: str) -> str:
    with serve(store, repo_id, "--memory-limit", str(limit), *flags) as server:
        r = httpx.post(server.base_url + "/v1/chat/completions", timeout=600, json={
            "model": repo_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
        if r.status_code == 200:
            return "200, answered"
        return f"{r.status_code}, {r.json()['error']['message'][:120]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models-dir", type=Path, default=Path("/tmp/swama-bench/shaped"))
    args = parser.parse_args(argv)

    from swama.engine.serving.memory import model_bytes
    from tools.bench.gpu import REPO_IDS, build_shape, find_donor

    folder = build_shape(args.shape, args.models_dir, find_donor(None, args.models_dir))
    repo_id = REPO_IDS[args.shape]
    weights = model_bytes(folder, 4)
    ranks = ("--ranks", str(args.ranks))
    print(f"{args.shape} ({weights / 2**30:.2f} GiB of float32 weights), {args.clients} chat streams of "
          f"{args.max_tokens} tokens, {args.rounds} rounds\n")
    print("| server | aggregate tok/s (median) | rounds |\n| --- | --- | --- |")
    with temp_dir("bench-ranks-store-") as root:
        store = build_store(Path(root), folder, repo_id)
        for flags in ((), ranks):
            with serve(store, repo_id, *flags) as server:
                rates = throughput(server, repo_id, args.clients, args.max_tokens, args.rounds)
            print(f"| {server.name} | {statistics.median(rates):.1f} | {', '.join(f'{r:.1f}' for r in rates)} |",
                  flush=True)
        limit = int(weights * 0.6)
        print(f"\nCapacity, --memory-limit {limit} (60% of the weights):\n")
        print("| server | first request |\n| --- | --- |")
        for flags in ((), ranks):
            print(f"| {' '.join(flags) or 'one process'} | {capacity(store, repo_id, limit, *flags)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
