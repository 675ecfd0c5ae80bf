"""Batch jobs (`/v1/files`, `/v1/batches`) on a live `swama serve`: a decision job against the same
requests sent live, and live chat beside a running job, in one run on one server.

    python -m tools.bench.batch [--model-dir DIR] [--lines 200] [--clients 32] [--rounds 1] [--load-requests]
                                [--chat-streams 8] [--chat-lines 200] [--chat-max-tokens 32]
                                [--server-flags ...] [--data DIR] [--swama-src DIR] [--write [MD]]

One server (the SmolLM2 test model by default, `.cache/test-models/smollm2-mlx`) runs with its own
temporary data folder (`--data`), started with `server_env()` as tools.bench.load starts it, and is
warmed up (one decision and chat request, then `--clients` decision requests at once) before anything
is timed.

**Decisions, batch against live.** `--lines` requests to `/v1/decisions`, each 4 questions (2
predicates, 2 four-way choices; with `--load-requests` tools.bench.load's 20) over its own ~300-token input
(`--input-tokens`; tools.bench.load's ticket text, led by a
line naming the request and the run, so no request shares a prefix with another beyond the text every
request carries, and a later run reuses nothing of an earlier one). Live: `--clients` httpx clients
send them closed-loop until all are answered; reported: wall time, questions/s, requests/s, median and
p95 latency. Batch: the same requests as one JSON-lines file (purpose `batch`, uploaded with the
openai SDK), one job (`endpoint="/v1/decisions"`, `completion_window="24h"`), polled every 0.2 s until
it is final; reported: wall time from the create call to the first poll that sees it `completed`,
questions/s, and the checks: every line completed, none failed, an output file of `--lines` lines with
unique custom_ids, each a 200 with an answer per question. Live runs first, then the batch; `--rounds 2` runs a
second round batch first, and the table gives medians with the spread (min-max).

**Live chat beside a job.** `--chat-streams` streamed chat requests start together (max_tokens
`--chat-max-tokens`, temperature 0, each its own first line) with the server idle, then again
(new first lines) while a job of `--chat-lines` chat lines of the same max_tokens runs (from its first
completed line on); reported: median and p95 time to the first content delta, and the job's lines
completed during the live wave. The job is then cancelled and awaited until `cancelled`.

Every wait is bounded (`--timeout` per request, `--phase-timeout` per phase) and the server is stopped
on every way out.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.bench.chat import Scenario, messages, request_body, stream_chat
from tools.bench.common import (
    REPO_ROOT,
    Server,
    add_write_option,
    build_store,
    facts_lines,
    free_port,
    machine_facts,
    markdown_table,
    median,
    package_version,
    publish,
    ratio,
    resolve_model_dir,
    server_env,
    temp_dir,
    today,
)
from tools.bench.load import decision_body as load_decision_body
from tools.bench.load import ticket_text

TITLE = "Batch jobs: a decision job against the same requests live, and live chat beside a job"
FINAL = ("completed", "failed", "expired", "cancelled")
POLL_SECONDS = 0.2
CHAT_TASK = "Write a short note to a colleague about the weather today and what it means for the weekend."
TEAMS = ("billing", "technical", "sales", "legal")
URGENCY = ("low", "normal", "high", "critical")


# ---------------------------------------------------------------------------------------------
# Requests


def decision_body(model: str, text: str, index: int, run: int) -> dict[str, Any]:
    """A decision request of 4 questions (2 predicates, 2 four-way choices) over its own input: its
    first line names the request and the run, so nothing past the shared ticket text is common."""
    questions = [
        {"type": "predicate", "name": "billing", "instructions": "Is the customer's message about a billing problem?"},
        {"type": "choice", "name": "team", "instructions": "Which team should take this ticket?",
         "choices": [{"value": v} for v in TEAMS]},
        {"type": "predicate", "name": "refund", "instructions": "Does the customer ask for a refund?"},
        {"type": "choice", "name": "urgency", "instructions": "How urgent is this ticket?",
         "choices": [{"value": v} for v in URGENCY]},
    ]
    return {"model": model, "input": f"Ticket {index}, run {run}.\n{text}", "questions": questions}


def chat_scenario(max_tokens: int) -> Scenario:
    return Scenario("chat beside a batch job", CHAT_TASK, max_tokens)


def chat_line_body(model: str, max_tokens: int, index: int) -> dict[str, Any]:
    return {"model": model, "messages": messages(chat_scenario(max_tokens), index), "temperature": 0,
            "max_tokens": max_tokens}


def jsonl(url: str, bodies: list[tuple[str, dict[str, Any]]]) -> bytes:
    return "".join(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) + "\n"
                   for cid, body in bodies).encode()


# ---------------------------------------------------------------------------------------------
# Live decisions, closed loop


@dataclass
class LiveRun:
    requests: int
    questions: int
    wall: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def questions_per_second(self) -> float:
        return ratio(self.questions * len(self.latencies), self.wall)

    @property
    def requests_per_second(self) -> float:
        return ratio(len(self.latencies), self.wall)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_live_decisions(base_url: str, bodies: list[dict[str, Any]], clients: int, timeout: float,
                       phase_timeout: float) -> LiveRun:
    """`bodies` sent by `clients` threads, each taking the next one as soon as its last is answered."""
    run = LiveRun(len(bodies), len(bodies[0]["questions"]))
    work: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    for body in bodies:
        work.put(body)
    lock = threading.Lock()
    clients = min(clients, len(bodies))
    start_gate = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client() -> None:
        with httpx.Client(timeout=timeout) as http:
            start_gate.wait()
            while time.perf_counter() < deadline[0]:
                try:
                    body = work.get_nowait()
                except queue.Empty:
                    return
                sent = time.perf_counter()
                try:
                    r = http.post(base_url + "/v1/decisions", json=body)
                    if r.status_code != 200:
                        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                    answers = r.json().get("answers") or []
                    if len(answers) != len(body["questions"]):
                        raise RuntimeError(f"{len(answers)} answers, not {len(body['questions'])}")
                except Exception as exc:  # reported with the run
                    with lock:
                        run.errors.append(str(exc)[:200])
                    continue
                with lock:
                    run.latencies.append(time.perf_counter() - sent)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    deadline[0] = start + phase_timeout
    start_gate.wait()
    for t in threads:
        t.join(max(0.0, deadline[0] + timeout - time.perf_counter()))
    run.wall = time.perf_counter() - start
    if any(t.is_alive() for t in threads) or not work.empty():
        raise TimeoutError(f"the live decisions did not finish within {phase_timeout:.0f} s "
                           f"({len(run.latencies)} of {len(bodies)} answered)")
    return run


# ---------------------------------------------------------------------------------------------
# Batch jobs through the openai SDK


def wait_batch(client: Any, batch_id: str, timeout: float, until: tuple[str, ...] = FINAL,
               done: Callable[[Any], bool] | None = None) -> Any:
    """Poll the job every 0.2 s until its status is in `until` (or `done(batch)` holds); bounded."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until or (done is not None and done(batch)):
            return batch
        if time.monotonic() > deadline:
            counts = batch.request_counts
            raise TimeoutError(f"batch {batch_id} is still {batch.status} after {timeout:.0f} s "
                               f"({counts.completed if counts else '?'} lines completed)")
        time.sleep(POLL_SECONDS)


@dataclass
class BatchRun:
    lines: int
    questions: int
    wall: float = 0.0
    upload: float = 0.0
    status: str = ""
    completed: int = 0
    failed: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def questions_per_second(self) -> float:
        return ratio(self.questions * self.completed, self.wall)

    @property
    def requests_per_second(self) -> float:
        return ratio(self.completed, self.wall)


def check_output(client: Any, batch: Any, lines: int, questions: int) -> list[str]:
    """What is wrong with a decision job's result (empty when nothing is)."""
    problems = []
    counts = batch.request_counts
    if batch.status != "completed":
        problems.append(f"status {batch.status}")
    if counts is None or counts.completed != lines or counts.failed != 0:
        problems.append(f"request_counts {counts}")
    if batch.output_file_id is None:
        return problems + ["no output file"]
    text = client.files.content(batch.output_file_id).text
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if len(rows) != lines:
        problems.append(f"{len(rows)} output lines, not {lines}")
    ids = {row.get("custom_id") for row in rows}
    if len(ids) != len(rows):
        problems.append(f"{len(rows) - len(ids)} repeated custom_ids")
    bad = [row.get("custom_id") for row in rows if (row.get("response") or {}).get("status_code") != 200
           or len(((row.get("response") or {}).get("body") or {}).get("answers") or []) != questions]
    if bad:
        problems.append(f"{len(bad)} lines without a 200 of {questions} answers (first {bad[0]})")
    return problems


def run_batch_decisions(client: Any, bodies: list[dict[str, Any]], run: int, phase_timeout: float) -> BatchRun:
    result = BatchRun(len(bodies), len(bodies[0]["questions"]))
    start = time.perf_counter()
    upload = client.files.create(file=(f"decisions-{run}.jsonl", jsonl("/v1/decisions", [
        (f"ticket-{i}", body) for i, body in enumerate(bodies)])), purpose="batch")
    result.upload = time.perf_counter() - start
    start = time.perf_counter()
    job = client.batches.create(input_file_id=upload.id, endpoint="/v1/decisions", completion_window="24h")
    batch = wait_batch(client, job.id, phase_timeout)
    result.wall = time.perf_counter() - start
    counts = batch.request_counts
    result.status = batch.status
    result.completed, result.failed = (counts.completed, counts.failed) if counts else (0, 0)
    result.problems = check_output(client, batch, len(bodies), result.questions)
    return result


# ---------------------------------------------------------------------------------------------
# Live chat, idle and beside a job


@dataclass
class Wave:
    ttfts: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def chat_wave(server: Server, model: str, streams: int, max_tokens: int, first: int, timeout: float) -> Wave:
    """`streams` streamed chat requests started together, request numbers `first`, `first + 1`, ..."""
    wave, lock = Wave(), threading.Lock()
    gate = threading.Barrier(streams + 1)

    def one(index: int) -> None:
        body = request_body(model, chat_scenario(max_tokens), index)
        with httpx.Client(timeout=timeout) as http:
            gate.wait()
            try:
                sample = stream_chat(http, server, body)
            except Exception as exc:  # reported with the wave
                with lock:
                    wave.errors.append(str(exc)[:200])
                return
            with lock:
                wave.ttfts.append(sample.ttft)
                wave.walls.append(sample.wall)

    threads = [threading.Thread(target=one, args=(first + i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    gate.wait()
    for t in threads:
        t.join(max(0.0, start + timeout - time.perf_counter()))
    wave.seconds = time.perf_counter() - start
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"a chat stream did not end within {timeout:.0f} s")
    return wave


@dataclass
class Beside:
    idle: Wave
    busy: Wave
    lines: int
    before: int = 0  # the job's completed lines when the busy wave started
    after: int = 0  # ... and when it ended
    job_started: float = 0.0  # seconds from the job's creation to its first completed line
    cancel_seconds: float = 0.0
    final_status: str = ""
    final_completed: int = 0
    final_failed: int = 0


def chat_beside_job(server: Server, client: Any, model: str, args: argparse.Namespace) -> Beside:
    idle = chat_wave(server, model, args.chat_streams, args.chat_max_tokens, 30_000, args.timeout)
    print(f"chat, server idle: median TTFT {median(idle.ttfts) * 1000:,.0f} ms", flush=True)
    data = jsonl("/v1/chat/completions", [(f"chat-{i}", chat_line_body(model, args.chat_max_tokens, 40_000 + i))
                                          for i in range(args.chat_lines)])
    upload = client.files.create(file=("chat.jsonl", data), purpose="batch")
    created = time.perf_counter()
    job = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    running = wait_batch(client, job.id, args.phase_timeout,
                         done=lambda b: b.status == "in_progress" and bool(b.request_counts)
                         and b.request_counts.completed > 0)
    started = time.perf_counter() - created
    before = running.request_counts.completed if running.request_counts else 0
    busy = chat_wave(server, model, args.chat_streams, args.chat_max_tokens, 50_000, args.timeout)
    during = client.batches.retrieve(job.id)
    after = during.request_counts.completed if during.request_counts else 0
    print(f"chat beside the job: median TTFT {median(busy.ttfts) * 1000:,.0f} ms, job {before} -> {after} "
          f"of {args.chat_lines} lines ({during.status})", flush=True)
    result = Beside(idle, busy, args.chat_lines, before, after, started)
    asked = time.perf_counter()
    if during.status not in FINAL:
        client.batches.cancel(job.id)
    final = wait_batch(client, job.id, args.phase_timeout)
    result.cancel_seconds = time.perf_counter() - asked
    result.final_status = final.status
    counts = final.request_counts
    result.final_completed, result.final_failed = (counts.completed, counts.failed) if counts else (0, 0)
    print(f"the chat job: {final.status} after {result.cancel_seconds:.1f} s, {result.final_completed} lines "
          f"completed, {result.final_failed} failed", flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# The report


def spread(values: list[float], pattern: str) -> str:
    text = pattern.format(median(values))
    if len(values) > 1:
        text += f" ({pattern.format(min(values))}-{pattern.format(max(values))})"
    return text


def decision_table(lives: list[LiveRun], batches: list[BatchRun], args: argparse.Namespace) -> str:
    walls = [ratio(b.wall, lv.wall) for lv, b in zip(lives, batches, strict=True)]
    qps = [ratio(b.questions_per_second, lv.questions_per_second) for lv, b in zip(lives, batches, strict=True)]
    rows = [
        [f"live, {args.clients} clients", spread([r.wall for r in lives], "{:.1f}"),
         spread([r.questions_per_second for r in lives], "{:.1f}"),
         spread([r.requests_per_second for r in lives], "{:.2f}"),
         spread([median(r.latencies) for r in lives], "{:.2f}"),
         spread([quantile(r.latencies, 0.95) for r in lives], "{:.2f}"),
         f"{sum(len(r.latencies) for r in lives)} of {sum(r.requests for r in lives)} answered, "
         f"{sum(len(r.errors) for r in lives)} errors"],
        ["batch job", spread([r.wall for r in batches], "{:.1f}"),
         spread([r.questions_per_second for r in batches], "{:.1f}"),
         spread([r.requests_per_second for r in batches], "{:.2f}"), "", "",
         f"{sum(r.completed for r in batches)} of {sum(r.lines for r in batches)} completed, "
         f"{sum(r.failed for r in batches)} failed"
         + ("; " + "; ".join(p for r in batches for p in r.problems) if any(r.problems for r in batches)
            else "; output checked")],
        ["batch / live", spread(walls, "{:.2f}x"), spread(qps, "{:.2f}x"), "", "", "", ""],
    ]
    header = ["run", "wall s", "questions/s", "requests/s", "median latency s", "p95 latency s", "lines"]
    return markdown_table(header, rows)


def chat_table(beside: Beside, args: argparse.Namespace) -> str:
    def row(name: str, wave: Wave, progress: str) -> list[str]:
        return [name, f"{median(wave.ttfts) * 1000:,.0f}", f"{quantile(wave.ttfts, 0.95) * 1000:,.0f}",
                f"{median(wave.walls):.2f}", f"{wave.seconds:.2f}", str(len(wave.errors)), progress]

    busy = (f"{beside.after - beside.before} lines ({beside.before} -> {beside.after} of {beside.lines}) "
            f"in {beside.busy.seconds:.1f} s")
    rows = [row("idle", beside.idle, ""), row(f"beside a job of {beside.lines} chat lines", beside.busy, busy)]
    header = ["server", "median TTFT ms", "p95 TTFT ms", "median stream s", "wave s", "errors",
              "job's lines completed during the wave"]
    return markdown_table(header, rows)


def reading(lives: list[LiveRun], batches: list[BatchRun], beside: Beside, args: argparse.Namespace,
            batch_lines: str) -> str:
    wall_ratio = median(ratio(b.wall, lv.wall) for lv, b in zip(lives, batches, strict=True))
    live_q = median(r.questions_per_second for r in lives)
    batch_q = median(r.questions_per_second for r in batches)
    pace = "slower than" if wall_ratio > 1.1 else "faster than" if wall_ratio < 0.9 else "within 10% of"
    idle, busy = median(beside.idle.ttfts), median(beside.busy.ttfts)
    rate = ratio(beside.after - beside.before, beside.busy.seconds)
    return (
        f"The decision job answered its {args.lines} lines in {wall_ratio:.2f}x the wall time of the same requests "
        f"sent live by {args.clients} clients ({batch_q:.1f} against {live_q:.1f} questions/s): {pace} the live "
        f"run{' (one round: no spread to judge the difference by)' if args.rounds == 1 else ''}, with at most {batch_lines} of its lines in flight at once where the live run kept "
        f"{args.clients} requests waiting, and the create-to-completed time includes the job's own start, "
        f"its writes of each line's result and the output file, and up to {POLL_SECONDS} s of polling. "
        f"Beside a running chat job, live chat's median time to the first token went from "
        f"{idle * 1000:,.0f} ms (idle) to {busy * 1000:,.0f} ms ({ratio(busy, idle):.1f}x; p95 "
        f"{quantile(beside.idle.ttfts, 0.95) * 1000:,.0f} -> {quantile(beside.busy.ttfts, 0.95) * 1000:,.0f} ms), "
        f"while the job still completed {beside.after - beside.before} lines during the live wave "
        f"({rate:.1f} lines/s): live prompts are admitted before the batch lines that wait with them, but they "
        f"share the batch's decode steps with the lines already running. The cancelled job ended "
        f"`{beside.final_status}` {beside.cancel_seconds:.1f} s after the cancel, {beside.final_completed} of "
        f"{beside.lines} lines completed and {beside.final_failed} failed.")


def swama_commit(src: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "engine", "handlers"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" with uncommitted changes to engine/ or handlers/" if dirty else "")


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.batch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="an MLX model folder (default: the test cache's smollm2-mlx)")
    parser.add_argument("--lines", type=int, default=200, help="decision requests, live and as one job (default 200)")
    parser.add_argument("--clients", type=int, default=32, help="live decision clients (default 32)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of live and batch, the order reversed every other round (default 1)")
    parser.add_argument("--load-requests", action="store_true",
                        help="send tools.bench.load's decision requests (20 questions: 10 predicates, 10 four-way "
                             "choices) instead of this module's 4-question ones")
    parser.add_argument("--input-tokens", type=int, default=300, help="tokens of each decision input (default 300)")
    parser.add_argument("--chat-streams", type=int, default=8, help="live chat streams per wave (default 8)")
    parser.add_argument("--chat-lines", type=int, default=200, help="lines of the chat job (default 200)")
    parser.add_argument("--chat-max-tokens", type=int, default=32, help="max_tokens of every chat request (default 32)")
    parser.add_argument("--server-flags", default="", help="more `swama serve` flags, one string (e.g. '--batch-lines 32')")
    parser.add_argument("--data", type=Path, default=None,
                        help="the server's data folder (default: a fresh temporary one)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per request (default 600)")
    parser.add_argument("--phase-timeout", type=float, default=1800.0,
                        help="seconds allowed per phase: a live run, a job (default 1800)")
    parser.add_argument("--swama-src", type=Path, default=None,
                        help="run the server from another checkout's package layout (DIR/swama/...)")
    add_write_option(parser)
    args = parser.parse_args(argv)
    if min(args.lines, args.clients, args.rounds, args.chat_streams, args.chat_lines) < 1 or args.chat_max_tokens < 2:
        parser.error("--lines, --clients, --rounds, --chat-streams and --chat-lines must be at least 1, "
                     "--chat-max-tokens at least 2")
    return args


def flag_value(flags: list[str], name: str, default: str) -> str:
    for i, flag in enumerate(flags):
        if flag == name and i + 1 < len(flags):
            return flags[i + 1]
        if flag.startswith(name + "="):
            return flag.split("=", 1)[1]
    return default


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder, model = resolve_model_dir(args.model_dir)
    command = shlex.join(["python", "-m", "tools.bench.batch", *(sys.argv[1:] if argv is None else argv)])
    from openai import OpenAI

    extra_flags = shlex.split(args.server_flags)
    flags = ["--max-model-queue", "1024", *extra_flags]
    batch_lines = flag_value(extra_flags, "--batch-lines", "16")
    text = ticket_text(args.input_tokens)
    body_of = (lambda model, text, index, run: load_decision_body(model, text, run, index)) \
        if args.load_requests else decision_body
    questions = len(body_of(model, text, 0, 0)["questions"])
    lives: list[LiveRun] = []
    batches: list[BatchRun] = []
    with temp_dir("bench-batch-") as root:
        store = build_store(Path(root) / "models", folder, model)
        data = args.data or Path(root) / "data"
        env = {"SWAMA_MODELS": str(store), "SWAMA_IDLE_SECONDS": "3600", "HF_HUB_OFFLINE": "1",
               "SWAMA_DATA": str(data)}
        if args.swama_src is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(args.swama_src), os.environ.get("PYTHONPATH", "")])
        port = free_port()
        argv_server = [sys.executable, "-m", "swama.handlers.cli", "serve", "--port", str(port), "--log-level",
                       "warning", "--data", str(data), *flags]
        with Server("swama", argv_server, port, "/v1/models", env=server_env(env), start_timeout=300) as server:
            try:
                client = OpenAI(base_url=server.base_url + "/v1", api_key="bench", timeout=args.timeout,
                                max_retries=0)
                with httpx.Client(timeout=args.timeout) as http:  # loads the model
                    http.post(server.base_url + "/v1/decisions",
                              json=body_of(model, text, -1, 0)).raise_for_status()
                    stream_chat(http, server, request_body(model, chat_scenario(args.chat_max_tokens), 0))
                warm = [body_of(model, text, -2 - i, 0) for i in range(args.clients)]
                run_live_decisions(server.base_url, warm, args.clients, args.timeout, args.phase_timeout)
                for r in range(args.rounds):
                    bodies = [[body_of(model, text, i, 2 * r + k + 1) for i in range(args.lines)] for k in (0, 1)]
                    order = ("live", "batch") if r % 2 == 0 else ("batch", "live")
                    for k, kind in enumerate(order):
                        if kind == "live":
                            lives.append(run_live_decisions(server.base_url, bodies[k], args.clients, args.timeout,
                                                            args.phase_timeout))
                            lv = lives[-1]
                            print(f"round {r + 1}, live: {lv.wall:.1f} s, {lv.questions_per_second:.1f} questions/s, "
                                  f"{len(lv.errors)} errors" + (f" (first: {lv.errors[0]})" if lv.errors else ""),
                                  flush=True)
                        else:
                            batches.append(run_batch_decisions(client, bodies[k], 2 * r + k + 1, args.phase_timeout))
                            b = batches[-1]
                            print(f"round {r + 1}, batch: {b.wall:.1f} s, {b.questions_per_second:.1f} questions/s, "
                                  f"{b.status}, {b.completed} completed, {b.failed} failed"
                                  + (f"; problems: {'; '.join(b.problems)}" if b.problems else ""), flush=True)
                beside = chat_beside_job(server, client, model, args)
            except BaseException:
                print(f"server log (last lines):\n{server.log_tail()}", file=sys.stderr, flush=True)
                raise
    facts = {**machine_facts(), "openai (client)": package_version("openai"),
             "swama commit": swama_commit(args.swama_src or REPO_ROOT)}
    body = "\n\n".join([
        f"One `swama serve` on the model folder `{folder.name}` (flags `{shlex.join(flags)}`, {batch_lines} lines "
        f"of a job in flight at once), its own temporary data folder. Measured {today()} with:\n\n```\n{command}\n```",
        f"### Decisions: {args.lines} requests of {questions} questions over ~{args.input_tokens}-token inputs, "
        f"live and as one batch job",
        f"{args.rounds} round(s), live then batch (batch then live in every other round); medians, with the "
        "spread (min-max) over rounds when there are several. Batch wall time: from the create call to the first "
        f"poll (every {POLL_SECONDS} s) that sees the job completed; the upload before it took "
        f"{median(b.upload for b in batches):.2f} s.",
        decision_table(lives, batches, args),
        f"### Live chat: {args.chat_streams} streams of {args.chat_max_tokens} tokens, idle and beside a chat job",
        f"{args.chat_streams} streamed requests started together (temperature 0, each its own first line); "
        f"TTFT is the time to the first content delta. The job ({args.chat_lines} lines of max_tokens "
        f"{args.chat_max_tokens}) had run {beside.job_started:.1f} s, to its first completed line, when the wave "
        f"started; it was then cancelled (`{beside.final_status}` {beside.cancel_seconds:.1f} s later, "
        f"{beside.final_completed} lines completed, {beside.final_failed} failed).",
        chat_table(beside, args),
        reading(lives, batches, beside, args, batch_lines),
        "Machine:\n\n" + facts_lines(facts),
    ])
    failed = any(b.problems for b in batches) or any(r.errors for r in lives) or beside.idle.errors \
        or beside.busy.errors
    if failed:
        print(body)
        print("\nsome lines or requests failed (see above): the section was not written", file=sys.stderr)
        return 1
    print(f"## {TITLE}\n")
    publish(TITLE, body, args.write)
    return 0


if __name__ == "__main__":
    from tools.bench.chat import exit_on_sigterm

    exit_on_sigterm()
    sys.exit(main())
