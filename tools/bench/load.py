"""Closed-loop load on a live `swama serve`: decision clients and chat streams at rising concurrency.

    python -m tools.bench.load [--shape qwen3-0.6b | --model-dir DIR] [--decisions 1,8,32,64]
                               [--chat 1,8,32,64,128] [--seconds 15] [--max-tokens 128] [--batch-rows 64]
                               [--profile DIR] [--swama-src DIR] [--label NAME] [--write [docs/benchmarks.md]]

Decisions: every client sends requests back to back, each 20 questions (10 predicates, 10 four-way
choices) over its own ~1,000-token input (the client's number leads it, so no request shares a
prefix with another client's). A level runs `--seconds`; reported: questions/s (questions answered
over the level's wall time), median and p95 request latency. Chat: every client streams one
request of `--max-tokens` tokens (temperature 0, its own first line); reported: aggregate tokens/s
and median time to the first token. On an NVIDIA machine the GPU's utilisation is sampled
(nvidia-smi, every 100 ms) during each level, and a physical limit is printed beside each figure:
decisions from the model's FLOPs at the measured matmul rate, chat from one read of the weights
per step at `--bandwidth` GB/s.

`--profile DIR` starts the server with `--profile-dir DIR`: the scheduler thread's cProfile is
written when it stops, and its top entries are printed. `--swama-src DIR` runs the server from
another checkout's package layout (DIR/swama/...), to compare two versions on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shlex
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tools.bench.chat import Scenario, Target, request_body, stream_chat
from tools.bench.common import Server, build_store, free_port, server_env, temp_dir
from tools.bench.serving import TASK, run_level

QUESTIONS = 20


def decision_body(model: str, text: str, client: int, n: int) -> dict:
    questions = []
    for i in range(QUESTIONS):
        if i % 2 == 0:
            questions.append({"type": "predicate", "name": f"p{i}",
                              "instructions": f"Is the customer's message {i} about a billing problem?"})
        else:
            questions.append({"type": "choice", "name": f"c{i}", "instructions": f"Which team should take item {i}?",
                              "choices": [{"value": v} for v in ("billing", "technical", "sales", "legal")]})
    return {"model": model, "input": f"Client {client}, request {n}.\n{text}", "questions": questions}


def ticket_text(tokens: int) -> str:
    lines = [f"Message {i}: the customer says the invoice for order {1000 + i} was charged twice and asks for "
             f"a refund to the original card before the end of the month." for i in range(1, tokens // 30 + 1)]
    return "\n".join(lines)


@dataclass
class DecisionLevel:
    clients: int
    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0
    errors: list[str] = field(default_factory=list)
    gpu: float | None = None

    @property
    def qps(self) -> float:
        return QUESTIONS * len(self.latencies) / self.wall if self.wall else 0.0

    def quantile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class GpuSampler:
    """nvidia-smi's utilisation, every 100 ms, while the `with` block runs (None without nvidia-smi)."""

    def __enter__(self) -> GpuSampler:
        self.samples: list[float] = []
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          "-lms", "100"], stdout=subprocess.PIPE, text=True)
        except OSError:
            self.proc = None
            return self
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.samples.append(float(line.strip().split(",")[0]))
            except ValueError:
                pass

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


def decision_level(server: Server, model: str, text: str, clients: int, seconds: float, timeout: float) -> DecisionLevel:
    level = DecisionLevel(clients)
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client(c: int) -> None:
        with httpx.Client(timeout=timeout) as http:
            barrier.wait()
            n = 0
            while time.perf_counter() < deadline[0]:
                start = time.perf_counter()
                try:
                    r = http.post(server.base_url + "/v1/decisions", json=decision_body(model, text, c, n))
                    r.raise_for_status()
                    assert len(r.json()["answers"]) == QUESTIONS
                except Exception as exc:  # reported with the level
                    with lock:
                        level.errors.append(str(exc)[:200])
                    continue
                finally:
                    n += 1
                with lock:
                    level.latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    with GpuSampler() as gpu:
        start = time.perf_counter()
        deadline[0] = start + seconds
        barrier.wait()
        for t in threads:
            t.join()
        level.wall = time.perf_counter() - start
    level.gpu = gpu.mean
    return level


def model_facts(folder: Path) -> dict:
    config = json.loads((folder / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    per_layer = hidden * head_dim * (2 * heads + 2 * kv) + 3 * hidden * inter
    body = layers * per_layer
    return {"body": body, "head": hidden * config["vocab_size"], "bytes": 2 * (body + hidden * config["vocab_size"]),
            "kv_per_token": 2 * layers * kv * head_dim * 2}


def matmul_tflops() -> float | None:
    """MLX's bfloat16 matmul rate on this machine's GPU (None on a CPU)."""
    try:
        import mlx.core as mx
        if mx.default_device() != mx.gpu:
            return None
        a = mx.random.normal((8192, 8192)).astype(mx.bfloat16)
        mx.eval(a @ a)
        start = time.perf_counter()
        for _ in range(10):
            mx.eval(a @ a)
        return 10 * 2 * 8192**3 / (time.perf_counter() - start) / 1e12
    except Exception:
        return None


def profile_summary(folder: Path, top: int = 25) -> str:
    files = sorted(folder.glob("scheduler-*.prof"))
    if not files:
        return "(no scheduler profile was written)"
    stats = pstats.Stats(*map(str, files))
    total = stats.total_tt
    rows = ["| function | own s | own % | with callees s |", "| --- | ---: | ---: | ---: |"]
    entries = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    for (path, line, name), (_, _, own, cumulative, _) in entries:
        where = f"{Path(path).name}:{line}" if path != "~" else "builtin"
        rows.append(f"| `{name}` ({where}) | {own:.2f} | {100 * own / total:.1f} | {cumulative:.2f} |")
    # Python 3.12's cProfile records every thread of the process; 3.11's the scheduler thread alone.
    scope = "every thread of the server" if sys.version_info >= (3, 12) else "the scheduler thread"
    return f"Profile of {scope}, {total:.1f} s of Python time:\n\n" + "\n".join(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--shape", default=None, help="a random-weight model of a real shape (tools.bench.gpu)")
    where.add_argument("--model-dir", type=Path, default=None, help="a model folder to serve")
    parser.add_argument("--models-dir", type=Path, default=Path("/tmp/swama-gpu/shaped"))
    parser.add_argument("--decisions", default="1,8,32,64", help="decision client counts ('' for none)")
    parser.add_argument("--chat", default="1,8,32,64,128", help="chat stream counts ('' for none)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-rows", type=int, default=64)
    parser.add_argument("--input-tokens", type=int, default=1000)
    parser.add_argument("--bandwidth", type=float, default=4300.0, help="GB/s for the decode limit")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--swama-src", type=Path, default=None)
    parser.add_argument("--label", default="swama")
    parser.add_argument("--out", type=Path, default=None, help="also write the report to this file")
    return parser.parse_args(argv)


def counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def model_folder(args: argparse.Namespace) -> tuple[Path, str]:
    if args.model_dir is not None:
        return args.model_dir, "bench/model"
    from tools.bench.gpu import REPO_IDS, build_shape, find_donor

    shape = args.shape or "qwen3-0.6b"
    return build_shape(shape, args.models_dir, find_donor(None, args.models_dir)), REPO_IDS[shape]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder, repo_id = model_folder(args)
    facts = model_facts(folder)
    tflops = matmul_tflops()
    lines = [f"## {args.label}: closed-loop load, {folder.name}", "",
             f"Command: `python -m tools.bench.load {shlex.join(argv if argv is not None else sys.argv[1:])}`", ""]
    with temp_dir("bench-load-store-") as root:
        store = build_store(Path(root), folder, repo_id)
        # Every client of the largest level may wait for the model at once.
        flags = ["--batch-rows", str(args.batch_rows), "--max-model-queue", "1024"]
        if args.profile is not None:
            flags += ["--profile-dir", str(args.profile)]
        extra = {"SWAMA_MODELS": str(store), "SWAMA_IDLE_SECONDS": "3600", "HF_HUB_OFFLINE": "1"}
        if args.swama_src is not None:
            extra["PYTHONPATH"] = os.pathsep.join([str(args.swama_src), os.environ.get("PYTHONPATH", "")])
        argv_server = [sys.executable, "-m", "swama.handlers.cli", "serve", "--port", "{port}", "--log-level",
                       "warning", *flags]

        def start(port: int) -> Server:
            cmd = [a.replace("{port}", str(port)) for a in argv_server]
            return Server(args.label, cmd, port, "/v1/models", env=server_env(extra), start_timeout=900)

        target = Target(args.label, "", repo_id, start)
        text = ticket_text(args.input_tokens)
        with target.start(free_port()) as server:
            with httpx.Client(timeout=args.timeout) as http:  # loads the model, compiles the shapes once
                http.post(server.base_url + "/v1/decisions", json=decision_body(repo_id, text, -1, 0)).raise_for_status()
                stream_chat(http, server, request_body(repo_id, Scenario("warm-up", TASK, 8), 0))
            lines += decision_lines(server, repo_id, text, args, facts, tflops)
            lines += chat_lines(target, server, args, facts)
    if args.profile is not None:
        lines += ["", profile_summary(args.profile)]
    report = "\n".join(lines) + "\n"
    print(report, flush=True)
    if args.out is not None:
        args.out.write_text(report)
    return 0


def decision_lines(server: Server, model: str, text: str, args: argparse.Namespace, facts: dict,
                   tflops: float | None) -> list[str]:
    levels = counts(args.decisions)
    if not levels:
        return []
    decision_level(server, model, text, max(levels), min(args.seconds, 5.0), args.timeout)  # every batch shape once
    tokens = args.input_tokens + 60 + QUESTIONS * 40  # the shared prompt, then each question's own part
    limit = f"{QUESTIONS / (2 * (facts['body'] * tokens + facts['head'] * QUESTIONS) / (tflops * 1e12)):,.0f}" \
        if tflops else "n/a"
    out = ["### Decisions: 20 questions over a ~1,000-token input per request", "",
           f"Physical limit at the measured matmul rate ({tflops or 0:.0f} TFLOP/s): about {limit} questions/s.", "",
           "| clients | questions/s | median latency ms | p95 latency ms | GPU busy % | requests | errors |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for clients in levels:
        level = decision_level(server, model, text, clients, args.seconds, args.timeout)
        gpu = f"{level.gpu:.0f}" if level.gpu is not None else "n/a"
        out.append(f"| {clients} | {level.qps:,.0f} | {level.quantile(0.5) * 1000:,.0f} | "
                   f"{level.quantile(0.95) * 1000:,.0f} | {gpu} | {len(level.latencies)} | {len(level.errors)} |")
        print(out[-1] + (f"  first error: {level.errors[0]}" if level.errors else ""), flush=True)
    return out + [""]


def chat_lines(target: Target, server: Server, args: argparse.Namespace, facts: dict) -> list[str]:
    levels = counts(args.chat)
    if not levels:
        return []
    run_level(target, server, max(levels), 1, 8, 10_000, args.timeout)  # every batch shape once
    out = [f"### Chat: streaming clients, {args.max_tokens} tokens each", "",
           "| streams | tokens/s | median TTFT ms | bandwidth limit tokens/s | GPU busy % | errors |",
           "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    base = 20_000
    for streams in levels:
        with GpuSampler() as gpu:
            level = run_level(target, server, streams, 1, args.max_tokens, base, args.timeout)
        base += streams
        limit = streams * args.bandwidth * 1e9 / (facts["bytes"] + streams * 600 * facts["kv_per_token"])
        busy = f"{gpu.mean:.0f}" if gpu.mean is not None else "n/a"
        out.append(f"| {streams} | {level.tokens_per_second:,.0f} | {level.median_ttft * 1000:,.0f} | {limit:,.0f} | "
                   f"{busy} | {len(level.errors)} |")
        print(out[-1] + (f"  first error: {level.errors[0]}" if level.errors else ""), flush=True)
    return out + [""]


if __name__ == "__main__":
    sys.exit(main())
