"""Load on a live `swama serve`, held against the engine alone: decision clients, chat streams in
waves and chat requests arriving at random.

    python -m tools.bench.load [--shape qwen3-0.6b | --model-dir DIR] [--decisions 1,8,32,64]
                               [--chat 1,8,32,64,128] [--repeats 3] [--poisson 8,32] [--seconds 15]
                               [--hostile 32] [--max-tokens 128] [--batch-rows 256] [--no-ceiling]
                               [--server-flags ...]
                               [--profile DIR] [--swama-src DIR] [--label NAME] [--out FILE]

**The ceiling first.** Before the server starts, `python -m tools.bench.ceiling` runs in its own
process on the same model folder and the same row counts: mlx-lm's `BatchGenerator` alone (one
wave of the same prompts, prefill included) and a raw decode forward. Every chat level prints the
live figure beside it and the efficiency (live / batch loop), and beside them swama's own scheduler on
the same waves in that process (`--ceiling-scheduler MODES`, compiled-step modes: the first one's
figure is shown), so the gap between the engine and the live server is its own column.

Decisions: every client sends requests back to back, each 20 questions (10 predicates, 10 four-way
choices) over its own ~1,000-token input (the client's number leads it, so no request shares a
prefix with another client's). A level runs `--seconds`; reported: questions/s (questions answered
over the level's wall time), median and p95 request latency.

Chat waves: N clients start together, each streams one request of `--max-tokens` tokens
(temperature 0, its own first line); each level runs `--repeats` times. Reported: aggregate tokens/s
(median of the repeats, with their spread), median and p90 time to the first token, and stalls (a
repeat whose median time to first token passes 1 s plus five times the batch loop's, or whose
throughput is under half the level's best). Beside each level, where the scheduler thread spent the
level (read from the server's /metrics before and after: admission, prefill, graph building,
evaluation, host post-processing, delivery, tasks, decisions, idle), as shares of the level's time
and per decode step.

Chat arrivals (`--poisson RATES`, requests per second): requests arrive at exponential intervals for
`--seconds`, each streaming `--max-tokens` tokens; reported: tokens/s, time to first token and
inter-token latency percentiles (p50, p90, p99, from the client's clock on each content delta).

Hostile clients (`--hostile COUNTS`): for `--seconds`, each client sends, round robin, requests the
server must refuse (docs/security.md): nesting past any limit, unterminated escapes, a 12 MiB body, a
gzip bomb, a schema whose patterns compile for minutes, a forged PNG, a WAV claiming 2 MHz, a page's
text/plain POST, a rebound Host, an image URL into the link-local network; beside them one client sends
short chats and /health is timed every 50 ms. Reported: the hostile answers by status (no 5xx is the
goal), the legitimate requests answered and their median latency, and /health's p50, p99 and worst.

On an NVIDIA machine the GPU's utilisation is sampled (nvidia-smi, every 100 ms) during each level,
and a physical limit is printed beside each figure: decisions from the model's FLOPs at the measured
matmul rate, chat from one read of the weights and the rows' key/value state per step at
`--bandwidth` GB/s.

Where the machine has 8 CPUs or more, the server and its engine process run on the first half of its
physical cores (hyperthreads kept together) and this process and its clients on the rest
(`--no-pin` shares them all): clients parsing tens of thousands of events a second would otherwise
take turns with the thread that launches the device's work, which a deployment's remote clients do not.

`--profile DIR` starts the server with `--profile-dir DIR`: the scheduler thread's cProfile is
written when it stops, and its top entries are printed. `--swama-src DIR` runs the server from
another checkout's package layout (DIR/swama/...), to compare two versions on one machine.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import pstats
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from swama.engine.serving.timing import PARTS
from tools.bench.chat import Scenario, Target, request_body, sse_data, stream_chat
from tools.bench.common import Server, build_store, free_port, on_cpus, server_env, temp_dir
from tools.bench.serving import TASK, Level, run_level

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
    """nvidia-smi's utilisation, every 100 ms, while the `with` block runs (None without nvidia-smi,
    or when `on` is False: its queries take the driver's lock, which the server's launches then wait for)."""

    on = True

    def __enter__(self) -> GpuSampler:
        self.samples: list[float] = []
        self.proc = None
        if not self.on:
            return self
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


def core_split() -> tuple[frozenset[int], frozenset[int]] | None:
    """This machine's CPUs in two sets of whole physical cores (a core's hyperthreads stay together):
    the first half for the server and its engine, the rest for the clients; None under 8 CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 8:
        return None
    cores: dict[str, list[int]] = {}
    for cpu in cpus:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        cores.setdefault(siblings, []).append(cpu)
    groups = list(cores.values())
    server = frozenset(c for group in groups[:len(groups) // 2] for c in group)
    return server, frozenset(cpus) - server


def cpu_list(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--shape", default=None, help="a random-weight model of a real shape (tools.bench.gpu)")
    where.add_argument("--model-dir", type=Path, default=None, help="a model folder to serve")
    parser.add_argument("--models-dir", type=Path, default=Path("/tmp/swama-gpu/shaped"))
    parser.add_argument("--decisions", default="1,8,32,64", help="decision client counts ('' for none)")
    parser.add_argument("--chat", default="1,8,32,64,128", help="chat stream counts ('' for none)")
    parser.add_argument("--repeats", type=int, default=3, help="times each chat level runs (stalls are counted)")
    parser.add_argument("--poisson", default="", help="chat arrival rates, requests/s ('' for none)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of a decision level or an arrival run")
    parser.add_argument("--hostile", default="", help="hostile client counts ('' for none): each sends a mix of "
                                                       "refused requests for --seconds while /health is timed")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-rows", type=int, default=256)
    parser.add_argument("--no-ceiling", action="store_true", help="skip mlx-lm's batch loop alone")
    parser.add_argument("--no-gpu-busy", action="store_true",
                        help="do not sample the GPU's utilisation with nvidia-smi during the levels")
    parser.add_argument("--ceiling-rounds", type=int, default=3)
    parser.add_argument("--ceiling-scheduler", default="auto",
                        help="compiled-step modes to run swama's scheduler alone with in the ceiling's process "
                             "(comma-separated; 'none' to skip)")
    parser.add_argument("--no-pin", action="store_true",
                        help="let the server and the clients share every CPU (by default they get separate cores)")
    parser.add_argument("--server-flags", default="", help="more `swama serve` flags, one string")
    parser.add_argument("--client-processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                        help="processes the chat clients of a wave are spread over")
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
    GpuSampler.on = not args.no_gpu_busy
    folder, repo_id = model_folder(args)
    facts = model_facts(folder)
    tflops = matmul_tflops()
    lines = [f"## {args.label}: closed-loop load, {folder.name}", "",
             f"Command: `python -m tools.bench.load {shlex.join(argv if argv is not None else sys.argv[1:])}`", ""]
    split = None if args.no_pin else core_split()
    if split is not None:
        lines += [f"The server and its engine process on CPUs {cpu_list(split[0])}, the clients on "
                  f"{cpu_list(split[1])}.", ""]
    with temp_dir("bench-load-store-") as root:
        store = build_store(Path(root), folder, repo_id)
        # Every client of the largest level may wait for the model at once.
        flags = ["--batch-rows", str(args.batch_rows), "--max-model-queue", "1024", *shlex.split(args.server_flags)]
        if args.profile is not None:
            flags += ["--profile-dir", str(args.profile)]
        extra = {"SWAMA_MODELS": str(store), "SWAMA_IDLE_SECONDS": "3600", "HF_HUB_OFFLINE": "1"}
        if args.swama_src is not None:
            extra["PYTHONPATH"] = os.pathsep.join([str(args.swama_src), os.environ.get("PYTHONPATH", "")])
        argv_server = [sys.executable, "-m", "swama.handlers.cli", "serve", "--port", "{port}", "--log-level",
                       "warning", *flags]

        def start(port: int) -> Server:
            cmd = [a.replace("{port}", str(port)) for a in argv_server]
            return Server(args.label, cmd, port, "/v1/models", env=server_env(extra), start_timeout=900,
                          cpus=split[0] if split else None)

        target = Target(args.label, "", repo_id, start)
        text = ticket_text(args.input_tokens)
        ceiling = run_ceiling(folder, args, split[0] if split else None) \
            if counts(args.chat) and not args.no_ceiling else {}
        if split is not None:
            os.sched_setaffinity(0, split[1])  # this process's client threads and the client processes it starts
        with target.start(free_port()) as server:
            with httpx.Client(timeout=args.timeout) as http:  # loads the model, compiles the shapes once
                http.post(server.base_url + "/v1/decisions", json=decision_body(repo_id, text, -1, 0)).raise_for_status()
                stream_chat(http, server, request_body(repo_id, Scenario("warm-up", TASK, 8), 0))
            lines += decision_lines(server, repo_id, text, args, facts, tflops)
            lines += chat_lines(target, server, args, facts, ceiling)
            lines += poisson_lines(server, repo_id, args)
            lines += hostile_lines(server, repo_id, args)
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


def run_ceiling(folder: Path, args: argparse.Namespace,
                cpus: frozenset[int] | None = None) -> dict[int, dict[str, Any]]:
    """mlx-lm's batch loop and a raw forward alone on the folder, in their own process (tools.bench.ceiling)."""
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-") as tmp:
        out = Path(tmp) / "ceiling.json"
        cmd = [sys.executable, "-m", "tools.bench.ceiling", "--model-dir", str(folder), "--rows", args.chat,
               "--max-tokens", str(args.max_tokens), "--rounds", str(args.ceiling_rounds),
               "--scheduler", args.ceiling_scheduler, "--json", str(out)]
        print("the ceiling: " + shlex.join(cmd[1:]), flush=True)
        done = subprocess.run(cmd, env=server_env({"HF_HUB_OFFLINE": "1"}), timeout=args.timeout * 4,
                              preexec_fn=on_cpus(cpus))
        if done.returncode != 0 or not out.is_file():
            print(f"the ceiling run failed (exit {done.returncode}); levels are shown without it", flush=True)
            return {}
        return {w["rows"]: w for w in json.loads(out.read_text())}


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU seconds a process has used (Linux; 0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scheduler_reading(server: Server) -> dict[str, float]:
    """The scheduler clocks of every model the server has loaded, summed (engine/serving/timing.py),
    and the CPU seconds of the server process and of its engine process."""
    from prometheus_client.parser import text_string_to_metric_families

    engine = (httpx.get(server.base_url + "/health", timeout=30).json().get("engine_process") or {}).get("pid")
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    reading: dict[str, float] = dict.fromkeys((*PARTS, "turns", "steps"), 0.0)
    reading["server_cpu"] = cpu_seconds(server.proc.pid if server.proc is not None else None)
    reading["engine_cpu"] = cpu_seconds(engine)
    reading["at"] = time.perf_counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "swama_scheduler_seconds_total":
                reading[sample.labels["part"]] = reading.get(sample.labels["part"], 0.0) + sample.value
            elif sample.name == "swama_scheduler_turns_total":
                reading["turns"] += sample.value
            elif sample.name == "swama_scheduler_decode_steps_total":
                reading["steps"] += sample.value
    return reading


@dataclass
class Repeat:
    level: Level
    gpu: float | None
    clock: dict[str, float]

    def quantile_ttft(self, q: float) -> float:
        ttfts = sorted(s.ttft for s in self.level.samples)
        return ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else float("nan")


def stalled(rep: Repeat, best: float, ceiling_ttft: float | None) -> bool:
    """A repeat that stalled: its median time to first token far past the batch loop's, or half the
    level's best throughput."""
    return (rep.level.median_ttft > 1.0 + 5 * (ceiling_ttft or 0.0)
            or rep.level.tokens_per_second < 0.5 * best)


def breakdown_row(streams: int, clock: dict[str, float], wall: float) -> list[str]:
    steps = clock["steps"] or 1
    busy = [f"{100 * clock[p] / wall:.0f}% ({1000 * clock[p] / steps:.2f})" for p in PARTS]
    cores = f"{clock['server_cpu'] / wall:.2f} / {clock['engine_cpu'] / wall:.2f}"
    return [str(streams), f"{clock['turns']:,.0f}", f"{clock['steps']:,.0f}",
            f"{1000 * (wall - clock['idle']) / steps:.2f}", *busy, cores]


def _wave_part(url: str, model: str, streams: list[int], max_tokens: int, timeout: float,
               start_at: float) -> tuple[list[Any], list[str]]:
    """One client process's share of a wave: a thread per stream, all starting at `start_at`."""
    scenario = Scenario(f"{len(streams)} clients", TASK, max_tokens)
    server = Server("swama", [], int(url.rsplit(":", 1)[1]), "/health")
    samples, errors, lock = [], [], threading.Lock()

    def client(index: int, name: str) -> None:
        body = request_body(model, dataclasses.replace(scenario, name=name), index)
        with httpx.Client(timeout=timeout) as http:
            time.sleep(max(0.0, start_at - time.time()))
            try:
                sample = stream_chat(http, server, body)
            except Exception as exc:  # reported with the level
                with lock:
                    errors.append(str(exc)[:200])
                return
            with lock:
                samples.append(sample)

    threads = [threading.Thread(target=client, args=(i, name)) for i, name in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples, errors


def _worker_ready(hold: float) -> int:
    """A client process up, holding itself `hold` s so that the pool starts the next one meanwhile."""
    time.sleep(hold)
    return os.getpid()


def run_wave(server: Server, model: str, streams: int, max_tokens: int, base: int, timeout: float,
             processes: int) -> Level:
    """N streams starting together, spread over client processes (one process's threads parsing every
    stream would cap a fast server: the client's own interpreter lock)."""
    level = Level(streams)
    name = f"{streams} clients"  # the prompts tools.bench.ceiling renders for the same level
    shares = [[(base + c, name) for c in range(streams) if c % processes == p] for p in range(processes)]
    shares = [share for share in shares if share]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(shares), mp_context=context) as pool:
        # Every worker up, this module imported in it, before the clock starts: the pool starts its
        # processes on demand, and one started late begins its streams late, spreading the wave.
        list(pool.map(_worker_ready, [0.5] * len(shares)))
        start_at = time.time() + 1.0
        futures = [pool.submit(_wave_part, server.base_url, model, share, max_tokens, timeout, start_at)
                   for share in shares]
        results = [f.result() for f in futures]
    level.wall = max(s.wall for part, _ in results for s in part) if any(part for part, _ in results) else 0.0
    for part, errors in results:
        level.samples += part
        level.errors += errors
    return level


def chat_lines(target: Target, server: Server, args: argparse.Namespace, facts: dict,
               ceiling: dict[int, dict[str, Any]]) -> list[str]:
    levels = counts(args.chat)
    if not levels:
        return []
    run_level(target, server, max(levels), 1, 8, 10_000, args.timeout)  # every batch shape once
    out = [f"### Chat: waves of streaming clients, {args.max_tokens} tokens each, {args.repeats} repeats", "",
           "| streams | tokens/s (spread) | batch loop tokens/s | efficiency | scheduler alone tokens/s | "
           "raw forward tokens/s | median TTFT ms (batch loop / scheduler alone) | p90 TTFT ms | "
           "bandwidth limit tokens/s | GPU busy % | stalls | errors |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    parts = ["", "Where the scheduler thread spent each level (share of the time between the readings around it, "
             "and ms per decode "
             "step in parentheses), summed over its repeats, and the cores the server process (HTTP, templates, "
             "text, SSE) and its engine process kept busy:", "",
             "| streams | turns | decode steps | busy ms/step | " + " | ".join(PARTS) + " | cores: server / engine |",
             "| ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in PARTS) + " | ---: |"]
    base = 20_000
    for streams in levels:
        repeats = []
        for _ in range(args.repeats):
            before = scheduler_reading(server)
            with GpuSampler() as gpu:
                level = run_wave(server, target.model, streams, args.max_tokens, base, args.timeout,
                                 min(args.client_processes, streams))
            after = scheduler_reading(server)
            base += streams
            repeats.append(Repeat(level, gpu.mean, {k: after[k] - before.get(k, 0.0) for k in after}))
        rates = [r.level.tokens_per_second for r in repeats]
        clock = {k: sum(r.clock[k] for r in repeats) for k in repeats[0].clock}
        wall = clock["at"]  # the time between the readings around each repeat, summed
        peak = ceiling.get(streams, {})
        loop, forward = peak.get("tokens_per_second"), peak.get("forward_tokens_per_second")
        ceiling_ttft = peak.get("median_ttft")
        alone = next(iter(peak.get("scheduler", {}).values()), {})
        alone_tps, alone_ttft = alone.get("tokens_per_second"), alone.get("median_ttft")
        median = statistics.median(rates)
        ttft = statistics.median(r.level.median_ttft for r in repeats)
        p90 = statistics.median(r.quantile_ttft(0.9) for r in repeats)
        limit = streams * args.bandwidth * 1e9 / (facts["bytes"] + streams * 600 * facts["kv_per_token"])
        busy = [r.gpu for r in repeats if r.gpu is not None]
        stalls = sum(stalled(r, max(rates), ceiling_ttft) for r in repeats)
        errors = sum(len(r.level.errors) for r in repeats)
        out.append(f"| {streams} | {median:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | "
                   f"{f'{loop:,.0f}' if loop else 'n/a'} | {f'{median / loop:.0%}' if loop else 'n/a'} | "
                   f"{f'{alone_tps:,.0f}' if alone_tps else 'n/a'} | "
                   f"{f'{forward:,.0f}' if forward else 'n/a'} | {ttft * 1000:,.0f} "
                   f"({f'{ceiling_ttft * 1000:,.0f}' if ceiling_ttft is not None else 'n/a'} / "
                   f"{f'{alone_ttft * 1000:,.0f}' if alone_ttft is not None else 'n/a'}) | {p90 * 1000:,.0f} | "
                   f"{limit:,.0f} | {f'{statistics.mean(busy):.0f}' if busy else 'n/a'} | {stalls} of {len(repeats)} "
                   f"| {errors} |")
        parts.append("| " + " | ".join(breakdown_row(streams, clock, wall)) + " |")
        first_error = next((r.level.errors[0] for r in repeats if r.level.errors), None)
        print(out[-1] + (f"  first error: {first_error}" if first_error else ""), flush=True)
        print(parts[-1], flush=True)
    return out + parts + [""]


# -- chat requests arriving at random -----------------------------------------------------------------

@dataclass
class Timed:
    """One streamed request seen from the client: when it was sent, its content deltas' times."""

    sent: float
    deltas: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


def stream_timed(http: httpx.Client, server: Server, body: dict[str, Any]) -> Timed:
    timed = Timed(time.perf_counter())
    try:
        with http.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:300]}")
            for data in sse_data(response.iter_lines()):
                chunk = json.loads(data)
                if chunk.get("usage"):
                    timed.tokens = chunk["usage"]["completion_tokens"]
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                    timed.deltas.append(time.perf_counter())
    except Exception as exc:  # reported with the run
        timed.error = str(exc)[:200]
    return timed


def percentiles(values: list[float], qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> list[float]:
    if not values:
        return [float("nan")] * len(qs)
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in qs]


def poisson_run(server: Server, model: str, rate: float, seconds: float, max_tokens: int, timeout: float,
                seed: int) -> tuple[list[Timed], float]:
    """Requests at exponential intervals of mean 1/rate for `seconds`; all of them, and the run's wall time."""
    rng = random.Random(seed)
    scenario = Scenario(f"arrivals {rate:g}/s", TASK, max_tokens)
    local = threading.local()

    def send(index: int) -> Timed:
        if not hasattr(local, "http"):
            local.http = httpx.Client(timeout=timeout)
        return stream_timed(local.http, server, request_body(model, scenario, index))

    futures = []
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(8, int(rate * 30))) as pool:
        at, index = start, seed * 100_000
        while at - start < seconds:
            at += rng.expovariate(rate)
            time.sleep(max(0.0, at - time.perf_counter()))
            futures.append(pool.submit(send, index))
            index += 1
        done = [f.result() for f in futures]
    return done, time.perf_counter() - start


def poisson_lines(server: Server, model: str, args: argparse.Namespace) -> list[str]:
    rates = [float(x) for x in args.poisson.split(",") if x.strip()]
    if not rates:
        return []
    out = [f"### Chat: requests arriving at random (Poisson), {args.max_tokens} tokens each, {args.seconds:g} s", "",
           "| requests/s | requests | tokens/s | TTFT p50 / p90 / p99 ms | inter-token p50 / p90 / p99 ms | errors |",
           "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, rate in enumerate(rates):
        runs, wall = poisson_run(server, model, rate, args.seconds, args.max_tokens, args.timeout, 7 + n)
        good = [r for r in runs if r.error is None and r.deltas]
        ttft = percentiles([r.deltas[0] - r.sent for r in good])
        gaps = percentiles([b - a for r in good for a, b in zip(r.deltas, r.deltas[1:], strict=False)])
        tokens = sum(r.tokens or len(r.deltas) for r in good)
        errors = [r.error for r in runs if r.error is not None]
        out.append(f"| {rate:g} | {len(runs)} | {tokens / wall:,.0f} | "
                   + " / ".join(f"{t * 1000:,.0f}" for t in ttft) + " | "
                   + " / ".join(f"{g * 1000:,.1f}" for g in gaps) + f" | {len(errors)} |")
        print(out[-1] + (f"  first error: {errors[0]}" if errors else ""), flush=True)
    return out + [""]


def hostile_bodies() -> list[tuple[str, bytes, dict[str, str]]]:
    """What a hostile client sends, each refused by a rule of docs/security.md: (path, body, headers)."""
    import gzip
    import io
    import struct
    import zlib

    json_type = {"content-type": "application/json"}
    letters = {"type": "string", "allOf": [{"pattern": f".*{chr(97 + i)}.*"} for i in range(22)]}
    slow_schema = {"model": "{model}", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                   "response_format": {"type": "json_schema", "json_schema": {
                       "name": "x", "schema": {"type": "object", "properties": {"v": letters}}}}}

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    big_png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 6000, 6000, 8, 2, 0, 0, 0))
               + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
               + chunk(b"IEND", b""))
    wav = io.BytesIO()
    head = struct.pack("<HHIIHH", 1, 1, 2_000_003, 4_000_006, 2, 16)
    wav.write(b"RIFF" + struct.pack("<I", 36 + 8) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + head
              + b"data" + struct.pack("<I", 8) + bytes(8))
    boundary = "hostileboundary"
    upload = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n"
              f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.wav\"\r\n"
              f"Content-Type: audio/wav\r\n\r\n").encode() + wav.getvalue() + f"\r\n--{boundary}--\r\n".encode()
    image = "data:image/png;base64," + base64.b64encode(big_png).decode()
    return [
        ("/v1/chat/completions", b"[" * 200_000, json_type),  # nesting past any limit
        ("/v1/chat/completions", b'{"model": "' + b'\\"' * 200_000, json_type),  # unterminated escapes
        ("/v1/systemone", b" " * (12 * 1024 * 1024) + b"{}", json_type),  # a body near the limit, parsed
        ("/v1/chat/completions", gzip.compress(bytes(256 * 1024 * 1024), compresslevel=1),
         {**json_type, "content-encoding": "gzip"}),  # a gzip bomb
        ("/v1/chat/completions", json.dumps(slow_schema).encode(), json_type),  # a schema that compiles for minutes
        ("/v1/decisions", json.dumps({"model": "{model}", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": image}]}], "questions": [
            {"type": "predicate", "instructions": "Is it?"}]}).encode(), json_type),  # a forged PNG
        ("/v1/audio/transcriptions", upload, {"content-type": f"multipart/form-data; boundary={boundary}"}),
        ("/v1/chat/completions", b'{"model": "x"}', {"content-type": "text/plain"}),  # a page's simple POST
        ("/v1/models", b"", {"host": "rebound.example"}),  # DNS rebinding
        ("/v1/chat/completions", json.dumps({"model": "{model}", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}}]}]}).encode(),
         json_type),  # a request that would reach into the server's network
    ]


def hostile_level(server: Server, model: str, clients: int, seconds: float, timeout: float) -> dict[str, Any]:
    """`clients` threads sending hostile_bodies() round robin for `seconds`, one legitimate client
    sending short chats, and /health timed every 50 ms."""
    bodies = [(path, body.replace(b"{model}", model.encode()), headers) for path, body, headers in hostile_bodies()]
    stop = time.monotonic() + seconds
    statuses: dict[int, int] = {}
    legit: list[tuple[int, float]] = []
    health: list[float] = []
    lock = threading.Lock()

    def hostile(c: int) -> None:
        with httpx.Client(timeout=timeout) as http:
            i = c
            while time.monotonic() < stop:
                path, body, headers = bodies[i % len(bodies)]
                i += 1
                try:
                    status = http.request("GET" if path == "/v1/models" else "POST", server.base_url + path,
                                          content=body or None, headers=headers).status_code
                except httpx.HTTPError:
                    status = 0  # the connection failed
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1

    def legitimate() -> None:
        with httpx.Client(timeout=timeout) as http:
            while time.monotonic() < stop:
                sent = time.perf_counter()
                r = http.post(server.base_url + "/v1/chat/completions", json={
                    "model": model, "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": "Say hello."}]})
                legit.append((r.status_code, time.perf_counter() - sent))

    def probe() -> None:
        with httpx.Client(timeout=timeout) as http:
            while time.monotonic() < stop:
                sent = time.perf_counter()
                http.get(server.base_url + "/health").raise_for_status()
                health.append(time.perf_counter() - sent)
                time.sleep(0.05)

    with concurrent.futures.ThreadPoolExecutor(max_workers=clients + 2) as pool:
        jobs = [pool.submit(hostile, c) for c in range(clients)] + [pool.submit(legitimate), pool.submit(probe)]
        for job in jobs:
            job.result()
    return {"statuses": statuses, "legit": legit, "health": health}


def hostile_lines(server: Server, model: str, args: argparse.Namespace) -> list[str]:
    levels = counts(args.hostile)
    if not levels:
        return []
    out = [f"### Hostile clients beside a legitimate one, {args.seconds:g} s (docs/security.md)", "",
           "| hostile clients | hostile requests | their answers | 5xx | legitimate answered / sent | legitimate p50 ms "
           "| /health p50 / p99 / max ms |", "| ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for clients in levels:
        level = hostile_level(server, model, clients, args.seconds, args.timeout)
        statuses = level["statuses"]
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
        fives = sum(v for k, v in statuses.items() if k >= 500 or k == 0)
        ok = [t for status, t in level["legit"] if status == 200]
        p50, p99 = percentiles(level["health"], (0.5, 0.99))
        out.append(f"| {clients} | {sum(statuses.values()):,} | {answers} | {fives} | {len(ok)} / {len(level['legit'])} "
                   f"| {percentiles(ok, (0.5,))[0] * 1000:,.0f} | {p50 * 1000:,.1f} / {p99 * 1000:,.1f} / "
                   f"{max(level['health'], default=float('nan')) * 1000:,.1f} |")
        print(out[-1], flush=True)
    return out + [""]


if __name__ == "__main__":
    sys.exit(main())
