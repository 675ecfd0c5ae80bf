"""Several GPUs of one host: one model split across ranks (NCCL tensor parallel) and one replica per
GPU (Ray Serve), against one process on one GPU, measured in one run.

    python -m tools.bench.gpus [--shapes qwen3-4b,qwen3-14b] [--ranks 1,2,4,8] [--replicas 0,1,2,4]
                               [--parts ranks,capacity,replicas,faults] [--streams 1,8,64] [--rounds 3]
                               [--rank-backend auto] [--models-dir DIR] [--write [docs/benchmarks.md]]

The models are random-weight bfloat16 models of the real shapes (tools.testmodels.tiny, built once
into `--models-dir`). A count larger than the GPUs this process sees is reported as not run, with
the reason; `1` in `--ranks` is one process without ranks, the baseline. The parts:

- ranks: for each shape and rank count, a live `swama serve MODEL [--ranks N]`: prefill tokens/s
  (a ~4,000-token prompt answered with one token; the median of `--rounds`), decode tokens/s at each
  of `--streams` concurrent streams of 128 tokens (aggregate, the median of `--rounds`), and the
  scaling efficiency (tokens/s over N times the one-GPU figure). Every server also answers four
  greedy prompts and one decision request, compared with the one-GPU server: the greedy texts must
  be equal (or part at a near-tie, reported), the decision probabilities within bfloat16's bounds.
- capacity: the last shape with a --memory-limit of 60% of its weights: one process refuses to load
  it (503); split across the smallest rank count above 1, each rank holds its share and answers.
- replicas: the first shape, one process (`0` in `--replicas`) and `--replicas N` on a local Ray (one GPU per replica, or
  a share of one where there are fewer GPUs than replicas): 64
  chat streams and 64 decision clients (20 questions over a ~1,000-token input each, back to back
  for 20 s); and routing: 32 two-turn conversations, how many second turns landed on the replica
  that answered the first (x-swama-replica).
- faults: `--ranks 2` on the first shape: a rank other than 0 killed during a stream; how long the
  stream took to end, what it ended with, and how long until the restarted group answered again.

Every wait is bounded. The environment's NCCL variables reach every process started (the ranks
also default NCCL_NVLS_ENABLE to 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.bench.common import (
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

TITLE = "Several GPUs: ranks (tensor parallel over NCCL) and replicas (Ray Serve)"
PARTS = ("ranks", "capacity", "replicas", "faults")
PROMPTS = ["Say hello to the team.", "What is the capital of France?", "List three colours.",
           "Write one sentence about the sea."]
DECISION = {
    "input": "The customer writes: my invoice is wrong and I want a refund today.",
    "questions": [
        {"type": "choice", "instructions": "Which team should handle it?",
         "choices": [{"value": "billing"}, {"value": "sales"}, {"value": "support"}]},
        {"type": "predicate", "instructions": "Is it urgent?"},
        {"type": "score", "instructions": "How angry is the customer?",
         "levels": [{"label": "calm"}, {"label": "annoyed"}, {"label": "furious"}]},
    ],
}
PREFILL_TOKENS = 4000
DECODE_TOKENS = 128
REPLICA_CLIENTS = 64
DECISION_SECONDS = 20.0
CONVERSATIONS = 32
# bfloat16 on random weights: a split sums the same products in another order, so greedy texts may
# part where two tokens are within this many nats, and probabilities move by up to this much.
NEAR_TIE_NATS = 0.05
PROBABILITY_BOUND = 0.05


@dataclass
class Answers:
    texts: list[str]
    probabilities: list[float]


@dataclass
class RankRow:
    shape: str
    ranks: int
    prefill: list[float] = field(default_factory=list)
    decode: dict[int, list[float]] = field(default_factory=dict)
    answers: Answers | None = None
    note: str = ""


def counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def visible_gpus() -> int:
    from swama.engine.client import gpu_count

    return gpu_count()


def serve(store: Path, repo_id: str, label: str, flags: list[str], start_timeout: float = 900) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "swama.handlers.cli", "serve", repo_id, "--port", str(port), "--log-level",
            "warning", "--max-model-queue", "4096", *flags]
    env = server_env({"SWAMA_MODELS": str(store), "SWAMA_IDLE_SECONDS": "3600", "HF_HUB_OFFLINE": "1"})
    return Server(label, argv, port, "/v1/models", env=env, start_timeout=start_timeout, stop_timeout=120)


def split_flags(n: int, backend: str) -> list[str]:
    return [] if n == 1 else ["--ranks", str(n), "--rank-backend", backend, "--rank-timeout", "60"]


# -- what a server answers -------------------------------------------------------------------------

def chat(server: Server, model: str, text: str, max_tokens: int, **extra: Any) -> dict:
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=600, json={
        "model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
        "temperature": 0, **extra})
    r.raise_for_status()
    return r.json()


def answers(server: Server, model: str) -> Answers:
    texts = [chat(server, model, p, 32)["choices"][0]["message"]["content"] for p in PROMPTS]
    r = httpx.post(server.base_url + "/v1/decisions", timeout=600, json={"model": model, **DECISION})
    r.raise_for_status()
    probabilities = [p for a in r.json()["answers"] for p in _probabilities(a)]
    return Answers(texts, probabilities)


def _probabilities(answer: dict) -> list[float]:
    if "probabilities" in answer:
        return [p["probability"] for p in answer["probabilities"]]
    return [answer["probability"]]


def near_tie_parting(server: Server, model: str, prompt: str, ours: str, theirs: str) -> str:
    """Where two greedy texts part: the gap (nats) between the top two tokens at that point, as this
    server scores them."""
    common = os.path.commonprefix([ours, theirs])
    body = chat(server, model, prompt, 32, logprobs=True, top_logprobs=2)
    text = ""
    for entry in body["choices"][0]["logprobs"]["content"]:
        if len(text) + len(entry["token"]) > len(common):
            top = entry["top_logprobs"]
            gap = top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else float("inf")
            return f"parts at char {len(common)}, top-2 gap {gap:.3f} nats"
        text += entry["token"]
    return f"parts at char {len(common)}"


def compare(row: RankRow, base: Answers, server: Server, model: str) -> str:
    mine = row.answers
    assert mine is not None
    partings = [near_tie_parting(server, model, p, a, b)
                for p, a, b in zip(PROMPTS, mine.texts, base.texts, strict=True) if a != b]
    diff = max((abs(a - b) for a, b in zip(mine.probabilities, base.probabilities, strict=True)), default=0.0)
    same = f"{len(PROMPTS) - len(partings)}/{len(PROMPTS)} equal" + (f" ({'; '.join(partings)})" if partings else "")
    return f"{same}; max |Δp| {diff:.4f}{'' if diff <= PROBABILITY_BOUND else ' (over the bound)'}"


# -- rates -----------------------------------------------------------------------------------------

def prefill_rate(server: Server, model: str, round_: int) -> float:
    from tools.bench.load import ticket_text

    text = f"Round {round_}: summarise this.\n" + ticket_text(PREFILL_TOKENS)
    start = time.perf_counter()
    body = chat(server, model, text, 1)
    return body["usage"]["prompt_tokens"] / (time.perf_counter() - start)


def decode_rates(server: Server, model: str, streams: int, rounds: int) -> list[float]:
    from tools.bench.chat import Target
    from tools.bench.serving import run_level

    target = Target(server.name, "", model, lambda port: server)
    run_level(target, server, streams, 1, 4, 900_000 + streams, 600)  # this batch shape once
    rates = []
    for r in range(rounds):
        level = run_level(target, server, streams, 1, DECODE_TOKENS, (r + 1) * 100_000 + streams, 600)
        if level.errors:
            raise RuntimeError(f"{len(level.errors)} streams failed: {level.errors[0]}")
        rates.append(level.tokens_per_second)
    return rates


# -- the parts -------------------------------------------------------------------------------------

def measure_ranks(store: Path, shape: str, repo_id: str, args: argparse.Namespace, gpus: int) -> list[RankRow]:
    rows: list[RankRow] = []
    base: Answers | None = None
    for n in args.ranks:
        row = RankRow(shape, n)
        rows.append(row)
        if n > 1 and args.rank_backend in ("auto", "nccl") and n > gpus:
            row.note = f"not run: {n} ranks take {n} GPUs, this machine has {gpus}"
            print(f"  {shape} ranks {n}: {row.note}", flush=True)
            continue
        label = "one process" if n == 1 else f"--ranks {n}"
        try:
            with serve(store, repo_id, label, split_flags(n, args.rank_backend)) as server:
                row.answers = answers(server, repo_id)
                if base is None and n == 1:
                    base = row.answers
                elif base is not None:
                    row.note = compare(row, base, server, repo_id)
                row.prefill = [prefill_rate(server, repo_id, r) for r in range(args.rounds + 1)][1:]
                for streams in args.streams:
                    row.decode[streams] = decode_rates(server, repo_id, streams, args.rounds)
        except Exception as exc:  # reported in the table; the other counts go on
            row.note = f"failed: {str(exc).splitlines()[0][:300]}"
        print(f"  {shape} {label}: prefill {_m(row.prefill)} tok/s, decode "
              + ", ".join(f"{s}: {_m(v)}" for s, v in row.decode.items()) + f" {row.note}", flush=True)
    return rows


def capacity(store: Path, repo_id: str, weights: int, n: int, backend: str) -> list[list[str]]:
    limit = int(weights * 0.6)
    out = []
    for flags, label in (([], "one process"), (split_flags(n, backend), f"--ranks {n}")):
        with serve(store, repo_id, label, [*flags, "--memory-limit", str(limit)]) as server:
            r = httpx.post(server.base_url + "/v1/chat/completions", timeout=600, json={
                "model": repo_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
            said = "answered" if r.status_code == 200 else r.json()["error"]["message"][:160]
            out.append([label, f"{limit / 2**30:.1f} GiB", f"{r.status_code}: {said}"])
    return out


def replicas(store: Path, repo_id: str, args: argparse.Namespace, gpus: int) -> list[list[str]]:
    from tools.bench.chat import Target
    from tools.bench.load import decision_level, ticket_text
    from tools.bench.serving import run_level

    rows = []
    for n in args.replicas:  # 0: one process, no Ray
        label = "one process" if n == 0 else f"--replicas {n}"
        if 0 < gpus < n:  # on a local Ray the replicas share the GPUs out (handlers/scale/replicas.py)
            label += f" ({gpus / n:g} GPU each)"
        flags = [] if n == 0 else ["--replicas", str(n)]
        try:
            with serve(store, repo_id, label, flags) as server:
                target = Target(label, "", repo_id, lambda port: server)
                run_level(target, server, REPLICA_CLIENTS, 1, 4, 800_000, 600)  # loads every replica
                chat_rates = [run_level(target, server, REPLICA_CLIENTS, 1, DECODE_TOKENS, (r + 1) * 10_000, 600)
                              .tokens_per_second for r in range(args.rounds)]
                decision_level(server, repo_id, ticket_text(1000), REPLICA_CLIENTS, 3, 600)  # warm-up
                qps = [decision_level(server, repo_id, ticket_text(1000), REPLICA_CLIENTS, DECISION_SECONDS, 600).qps
                       for _ in range(args.rounds)]
                kept = sticky_conversations(server, repo_id) if n else "-"
            rows.append([label, _m(chat_rates, 1) + f" ({_spread(chat_rates)})", _m(qps, 1) + f" ({_spread(qps)})",
                         kept, ""])
        except Exception as exc:
            rows.append([label, "-", "-", "-", f"failed: {str(exc).splitlines()[0][:300]}"])
        print(f"  {rows[-1]}", flush=True)
    return rows


def sticky_conversations(server: Server, model: str) -> str:
    kept, seen = 0, set()
    with httpx.Client(timeout=600) as http:
        for c in range(CONVERSATIONS):
            turns = [{"role": "system", "content": f"You are assistant number {c}."},
                     {"role": "user", "content": f"Conversation {c}: tell me about lighthouses."}]
            first = http.post(server.base_url + "/v1/chat/completions",
                              json={"model": model, "messages": turns, "max_tokens": 16, "temperature": 0})
            first.raise_for_status()
            turns += [first.json()["choices"][0]["message"], {"role": "user", "content": "And then?"}]
            second = http.post(server.base_url + "/v1/chat/completions",
                               json={"model": model, "messages": turns, "max_tokens": 16, "temperature": 0})
            second.raise_for_status()
            seen.add(first.headers.get("x-swama-replica"))
            kept += first.headers.get("x-swama-replica") == second.headers.get("x-swama-replica")
    return f"{kept}/{CONVERSATIONS} (over {len(seen)} replicas)"


def faults(store: Path, repo_id: str, backend: str) -> list[list[str]]:
    with serve(store, repo_id, "--ranks 2", split_flags(2, backend)) as server:
        rank1 = httpx.get(server.base_url + "/health", timeout=10).json()["ranks"]["ranks"][1]["pid"]
        last: dict = {}
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=120, json={
                "model": repo_id, "messages": [{"role": "user", "content": "Talk for a long time."}],
                "max_tokens": 4000, "temperature": 0, "stream": True}) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    break
            os.kill(rank1, signal.SIGKILL)
            killed = time.monotonic()
            for line in lines:
                if line.startswith("data: {"):
                    last = json.loads(line[6:])
            ended = time.monotonic() - killed
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if chat(server, repo_id, "Hello again.", 4)["choices"][0]["finish_reason"]:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        back = time.monotonic() - killed
        health = httpx.get(server.base_url + "/health", timeout=10).json()["ranks"]
    reason = (last.get("choices") or [{}])[0].get("finish_reason")
    message = (last.get("error") or {}).get("message", "")[:120]
    return [["rank 1 killed (SIGKILL) during a stream", f"{ended:.1f} s", f"finish_reason {reason}: {message}",
             f"{back:.0f} s", f"restarts {health['restarts']}, state {health['state']}"]]


# -- the report ------------------------------------------------------------------------------------

def _m(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):.{digits}f}" if values else "-"


def _spread(values: list[float]) -> str:
    return f"{min(values):.0f}-{max(values):.0f}" if values else "-"


def rank_table(rows: list[RankRow], streams: list[int]) -> str:
    base = {r.shape: r for r in rows if r.ranks == 1}
    header = ["shape", "ranks", "prefill tok/s", *[f"decode tok/s, {s} streams" for s in streams],
              "efficiency at " + ", ".join(str(s) for s in streams), "against one GPU"]
    body = []
    for r in rows:
        one = base.get(r.shape)
        eff = []
        for s in streams:
            if one and one.decode.get(s) and r.decode.get(s):
                eff.append(f"{statistics.median(r.decode[s]) / (r.ranks * statistics.median(one.decode[s])):.2f}")
            else:
                eff.append("-")
        body.append([r.shape, str(r.ranks), _m(r.prefill) + (f" ({_spread(r.prefill)})" if r.prefill else ""),
                     *[_m(r.decode.get(s, [])) + (f" ({_spread(r.decode[s])})" if r.decode.get(s) else "")
                       for s in streams], " / ".join(eff), r.note or ("baseline" if r.ranks == 1 else "")])
    return markdown_table(header, body)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from tools.bench.gpu import SHAPES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3-4b,qwen3-14b",
                        help=f"comma-separated, from {', '.join(SHAPES)}")
    parser.add_argument("--ranks", type=counts, default=[1, 2, 4, 8], help="rank counts; 1 is one process")
    parser.add_argument("--replicas", type=counts, default=[0, 1, 2, 4], help="replica counts; 0 is one process")
    parser.add_argument("--streams", type=counts, default=[1, 8, 64])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {', '.join(PARTS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank-backend", default="auto", choices=("auto", "nccl", "ring"))
    parser.add_argument("--models-dir", type=Path, default=Path("/tmp/swama-bench/shaped"))
    add_write_option(parser)
    args = parser.parse_args(argv)
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [s for s in args.shapes if s not in SHAPES] + [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown shape or part: {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    from swama.engine.serving.memory import model_bytes
    from tools.bench.gpu import REPO_IDS, build_shape, find_donor

    args = parse_args(argv)
    command = "python -m tools.bench.gpus " + shlex.join(sys.argv[1:] if argv is None else argv)
    gpus = visible_gpus()
    donor = find_donor(None, args.models_dir)
    folders = {s: build_shape(s, args.models_dir, donor) for s in args.shapes}
    sections = [f"Measured {today()} with `{command}` on {gpus} visible GPU(s).\n"]
    with temp_dir("bench-gpus-store-") as root:
        stores = {s: build_store(Path(root) / s, folders[s], REPO_IDS[s]) for s in args.shapes}
        if "ranks" in args.parts:
            rows = [row for s in args.shapes for row in measure_ranks(stores[s], s, REPO_IDS[s], args, gpus)]
            sections.append(f"Ranks, bfloat16, prefill of a ~{PREFILL_TOKENS}-token prompt, decode of "
                            f"{DECODE_TOKENS} tokens per stream; medians of {args.rounds} rounds (spread):\n\n"
                            + rank_table(rows, args.streams))
        last = args.shapes[-1]
        split = next((n for n in args.ranks if n > 1), 2)
        if "capacity" in args.parts:
            if args.rank_backend in ("auto", "nccl") and split > gpus:
                sections.append(f"Capacity: not run: {split} ranks take {split} GPUs, this machine has {gpus}.")
            else:
                weights = model_bytes(folders[last], 2)
                sections.append(f"Capacity, {last} ({weights / 2**30:.1f} GiB of weights):\n\n" + markdown_table(
                    ["server", "--memory-limit", "first request"],
                    capacity(stores[last], REPO_IDS[last], weights, split, args.rank_backend)))
        first = args.shapes[0]
        if "replicas" in args.parts:
            sections.append(f"Replicas, {first}: {REPLICA_CLIENTS} chat streams of {DECODE_TOKENS} tokens and "
                            f"{REPLICA_CLIENTS} decision clients for {DECISION_SECONDS:.0f} s; medians of "
                            f"{args.rounds} rounds (spread):\n\n" + markdown_table(
                                ["server", "chat tok/s", "decision q/s", "second turns on the first turn's replica",
                                 "note"], replicas(stores[first], REPO_IDS[first], args, gpus)))
        if "faults" in args.parts:
            if args.rank_backend in ("auto", "nccl") and gpus < 2:
                sections.append(f"Faults: not run: 2 ranks take 2 GPUs, this machine has {gpus}.")
            else:
                sections.append(f"Faults, {first}, --ranks 2:\n\n" + markdown_table(
                    ["what", "stream ended after", "with", "answering again after", "group"],
                    faults(stores[first], REPO_IDS[first], args.rank_backend)))
    facts = {**machine_facts(), "ray": package_version("ray"),
             "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "unset (the ranks default it to 0)")}
    publish(TITLE, "\n\n".join(sections) + "\n\nMachine:\n\n" + facts_lines(facts) + "\n", args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
