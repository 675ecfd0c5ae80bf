"""The prompt cache's disk tier on a live `swama serve`: Codex after a restart, sessions sharing a
system prompt, and how fast blocks read back against prefilling them.

    python -m tools.bench.prompt_disk [--parts codex,sessions,read] [--system-tokens 4000] [--sessions 8]
                                      [--read-tokens 4096] [--model-dir DIR] [--codex PATH] [--write [MD]]

Every server runs the SmolLM2 test model (`.cache/test-models/smollm2-mlx` by default; float32 on the
CPU, swama's own choice there) from a temporary model store, with its own temporary data folder
(`--data`), started with `server_env()` as tools.bench.load starts it, and is stopped on every way
out. Each server's model is loaded by one short chat request (its own tiny system prompt) before
anything is timed; the figures per turn come from the server's /metrics, read before and after it.

**Codex after a restart** (`--parts codex`). One server with `--max-tokens 32`. (a) cold: the first
`codex exec --skip-git-repo-check -s read-only --disable multi_agent "Reply with PONG"` on a fresh data
folder; (b) warm: a second `codex exec` with another short prompt on the same server (a new Codex
session: the same instructions, served from the memory tier); then, once /metrics shows blocks written
and the count has stood still for 2 s, the server is stopped (SIGTERM) and a new one started on the
same data folder; (c) after the restart: a third `codex exec` (new session, same instructions). Reported
per turn: wall time of the whole `codex exec` (Codex shows no time to the first token), the prompt
tokens the server saw, the cached ones (`swama_prompt_cache_hit_tokens`) and which tier served them
(the `swama_prompt_cache_hits{tier}` deltas). The Codex CLI is the one the live tests install
(`.cache/codex/node_modules/.bin/codex`); without it this part is skipped.

**Sessions sharing a system prompt** (`--parts sessions`). `--sessions` chat sessions of 2 turns each,
interleaved round robin (every session's first turn, then every second turn), sent one after another:
the same ~`--system-tokens`-token system prompt, each session its own question, max_tokens 8,
temperature 0. Reported: prompt tokens computed (prompt_tokens - cached_tokens summed over the requests)
and wall time, on three fresh servers with fresh data folders: (i) default (memory and disk tiers),
(ii) `--prompt-cache-disk-bytes 0` (memory only), (iii) `--no-prompt-cache`. Then (iv): server (i)
restarted on its data folder, and one new session's first turn, against the same turn on (iii).

**Disk read speed** (`--parts read`). In one process of its own (no server, the servers' environment):
the model is loaded, a `--read-tokens` prompt is prefilled into a fresh cache (the model's forward in
steps of 512 tokens, swama's CPU prefill step; median of 3), written through `prompt_cache_for(...)
.put(...)` and `.close()`, then read back by `.take(ids + [1])` of a new `prompt_cache_for(...)` on the
same folder each time (a restart: the memory tier is empty; median of 3), once as the files lie in the
page cache and once after asking the kernel to drop them (posix_fadvise DONTNEED, best effort).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.bench.common import (
    REPO_ROOT,
    Server,
    add_write_option,
    build_store,
    facts_lines,
    free_port,
    machine_facts,
    markdown_table,
    package_version,
    publish,
    resolve_model_dir,
    server_env,
    temp_dir,
    today,
)

TITLE = "Prompt cache on disk: Codex after a restart, sessions sharing a system prompt, read speed"
PARTS = ("codex", "sessions", "read")
CODEX = REPO_ROOT / ".cache" / "codex" / "node_modules" / ".bin" / "codex"
CODEX_ARGS = ["exec", "--skip-git-repo-check", "-s", "read-only", "--disable", "multi_agent"]
CODEX_PROMPTS = ("Reply with PONG", "Reply with PING", "Reply with PONG")
PREFILL_STEP = 512  # swama's prefill step on the CPU
BLOCK = 256
QUESTIONS = ["What is the capital of France?", "Name a planet with rings.", "How many legs does a spider have?",
             "What colour is the sky on a clear day?", "Who wrote Hamlet?", "What is two plus two?",
             "Name a large ocean.", "What do bees make?"]
FOLLOW_UP = "Say that again in three words."
RULES = ["Answer in one short sentence unless the user asks for more.", "Never invent a fact you are unsure of.",
         "Prefer plain words to jargon.", "When a question is ambiguous, pick the likeliest reading and say so.",
         "Numbers are written as digits.", "Do not repeat the question back to the user.",
         "Keep a friendly but neutral tone.", "If asked for code, give the smallest working example.",
         "Name units with every measurement.", "Say so when something is outside your knowledge."]


# ---------------------------------------------------------------------------------------------
# Servers and their metrics


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        samples.append((name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return samples


@dataclass
class Snapshot:
    """The counters this benchmark reads, at one moment."""

    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    memory_hits: float = 0.0
    disk_hits: float = 0.0
    disk_read_tokens: float = 0.0
    disk_written_bytes: float = 0.0
    disk_rejected: float = 0.0
    responses: float = 0.0  # POST /v1/responses answered

    def __sub__(self, other: Snapshot) -> Snapshot:
        return Snapshot(**{k: getattr(self, k) - getattr(other, k) for k in self.__dataclass_fields__})

    @property
    def tier(self) -> str:
        tiers = [t for t, n in (("memory", self.memory_hits), ("disk", self.disk_hits)) if n]
        return " + ".join(tiers) or "none"


def snapshot(server: Server) -> Snapshot:
    samples = parse_metrics(httpx.get(server.base_url + "/metrics", timeout=30).text)

    def total(name: str, **labels: str) -> float:
        return sum(v for n, lab, v in samples
                   if n in (name, name + "_total") and all(lab.get(k) == x for k, x in labels.items()))

    return Snapshot(prompt_tokens=total("swama_prompt_tokens"), cached_tokens=total("swama_prompt_cache_hit_tokens"),
                    memory_hits=total("swama_prompt_cache_hits", tier="memory"),
                    disk_hits=total("swama_prompt_cache_hits", tier="disk"),
                    disk_read_tokens=total("swama_prompt_cache_disk_read_tokens"),
                    disk_written_bytes=total("swama_prompt_cache_disk_written_bytes"),
                    disk_rejected=total("swama_prompt_cache_disk_rejected"),
                    responses=total("swama_requests", route="/v1/responses", method="POST"))


def wait_disk_settled(server: Server, timeout: float = 120.0, quiet: float = 2.0) -> float:
    """Until the blocks written count is above 0 and has not moved for `quiet` seconds (at most
    `timeout`); the bytes written."""
    deadline = time.monotonic() + timeout
    last, since = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        written = snapshot(server).disk_written_bytes
        if written != last:
            last, since = written, time.monotonic()
        elif written > 0 and time.monotonic() - since >= quiet:
            return written
        time.sleep(0.25)
    raise RuntimeError(f"the disk tier's bytes written did not settle above 0 within {timeout:.0f} s "
                       f"(last {last:.0f}):\n{server.log_tail(60)}")


def graceful_stop(server: Server, timeout: float = 60.0) -> tuple[float, int | None, str]:
    """SIGTERM, then wait (killed past `timeout`): the seconds it took, the exit status, the log's last lines."""
    assert server.proc is not None
    start = time.monotonic()
    server.proc.terminate()
    try:
        server.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
    seconds = time.monotonic() - start
    tail = server.log_tail(40)
    server.stop()
    return seconds, server.proc.returncode, tail


def stop_words(returncode: int | None, tail: str) -> str:
    clean = "Application shutdown complete" in tail
    # uvicorn re-raises the SIGTERM it handled once it has shut down, hence -15 after a clean shutdown.
    return f"exit status {returncode}, " + ("after uvicorn's 'Application shutdown complete'" if clean
                                           else "no shutdown line in its log")


def log_problems(tail: str) -> list[str]:
    return [line for line in tail.splitlines() if "ERROR" in line or "Traceback" in line or "WARNING" in line]


@dataclass
class Swama:
    """Starts `swama serve` on one model store, each server with the data folder it is given."""

    store: Path
    model: str

    @contextmanager
    def serve(self, name: str, data: Path, *flags: str) -> Iterator[Server]:
        port = free_port()
        argv = [sys.executable, "-m", "swama.handlers.cli", "serve", "--port", str(port), "--log-level", "info",
                "--data", str(data), *flags]
        env = server_env({"SWAMA_MODELS": str(self.store), "SWAMA_IDLE_SECONDS": "3600", "HF_HUB_OFFLINE": "1"})
        env.pop("SWAMA_DATA", None)
        with Server(name, argv, port, "/v1/models", env=env, start_timeout=300, stop_timeout=60) as server:
            try:
                yield server
            except BaseException:
                print(f"server '{name}' log (last lines):\n{server.log_tail(60)}", file=sys.stderr, flush=True)
                raise

    def load(self, server: Server, timeout: float) -> float:
        """Load the model with one short request of its own; the seconds it took."""
        start = time.monotonic()
        chat(server, self.model, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
             timeout, max_tokens=1)
        return time.monotonic() - start


def chat(server: Server, model: str, messages: list[dict[str, str]], timeout: float, max_tokens: int = 8) -> dict:
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=timeout,
                   json={"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    if r.status_code != 200:
        raise RuntimeError(f"chat completion answered {r.status_code}: {r.text[:500]}\n{server.log_tail(60)}")
    return r.json()


# ---------------------------------------------------------------------------------------------
# Part 1: Codex after a restart


@dataclass
class CodexTurn:
    name: str
    wall: float
    returncode: int
    delta: Snapshot
    reply: str
    tokens_used: str
    errors: list[str]

    @property
    def ok(self) -> bool:
        # A reply cut at the server's --max-tokens is reported by Codex as an incomplete response (exit 1).
        return self.returncode == 0 or (self.returncode == 1 and bool(self.errors) and all(
            "Incomplete response returned, reason: max_output_tokens" in e for e in self.errors))


def codex_env(home: Path) -> dict[str, str]:
    # Codex is a Node.js program; the BLAS preload meant for MLX breaks Node's thread start-up.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return {**env, "CODEX_HOME": str(home), "LOCALMLX_API_KEY": "sk-local"}


def codex_version(codex: Path) -> str:
    try:
        out = subprocess.run([str(codex), "--version"], capture_output=True, text=True, timeout=60,
                             env=codex_env(Path(tempfile.gettempdir())), stdin=subprocess.DEVNULL)
        return out.stdout.strip() or out.stderr.strip()[:80]
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"


def run_codex(codex: Path, home: Path, work: Path, server: Server, model: str, prompt: str, name: str,
              timeout: float) -> CodexTurn:
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "localmlx"\n'
        "[model_providers.localmlx]\n"
        'name = "Local MLX server"\n'
        f'base_url = "{server.base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "LOCALMLX_API_KEY"\n')
    before = snapshot(server)
    start = time.monotonic()
    out = subprocess.run([str(codex), *CODEX_ARGS, prompt], capture_output=True, text=True, timeout=timeout,
                         cwd=work, stdin=subprocess.DEVNULL, env=codex_env(home))
    wall = time.monotonic() - start
    time.sleep(0.5)  # the server counts a generation as it finishes; Codex may return a moment earlier
    delta = snapshot(server) - before
    lines = out.stderr.splitlines()
    reply = lines[lines.index("codex") + 1].strip() if "codex" in lines and lines.index("codex") + 1 < len(lines) \
        else out.stdout.strip()
    text = out.stdout + out.stderr
    used = ""
    match = re.search(r"tokens used:?\s*\n?\s*([\d,]+)", text)
    if match:
        used = match.group(1)
    errors = [line for line in text.splitlines() if line.startswith("ERROR")]
    turn = CodexTurn(name, wall, out.returncode, delta, reply, used, errors)
    print(f"codex {name}: {wall:.1f} s, exit {out.returncode}, prompt {delta.prompt_tokens:.0f}, cached "
          f"{delta.cached_tokens:.0f} ({delta.tier}), reply {reply[:60]!r}", flush=True)
    if not turn.ok:
        print(f"codex {name} failed:\n{text[-3000:]}", file=sys.stderr, flush=True)
    return turn


def codex_part(swama: Swama, root: Path, codex: Path, timeout: float) -> tuple[list[CodexTurn], dict[str, Any]]:
    home, work, data = root / "codex-home", root / "codex-work", root / "codex-data"
    home.mkdir()
    work.mkdir()
    info: dict[str, Any] = {}
    turns = []
    with swama.serve("codex-1", data, "--max-tokens", "32") as server:
        info["load_first"] = swama.load(server, timeout)
        turns.append(run_codex(codex, home, work, server, swama.model, CODEX_PROMPTS[0], "cold", timeout))
        turns.append(run_codex(codex, home, work, server, swama.model, CODEX_PROMPTS[1], "warm", timeout))
        info["written"] = wait_disk_settled(server)
        info["stop_seconds"], info["stop_returncode"], info["stop_log"] = graceful_stop(server)
    info["files"] = sum(1 for _ in (data / "prompt-cache").rglob("*.kv"))
    with swama.serve("codex-2", data, "--max-tokens", "32") as server:
        info["load_second"] = swama.load(server, timeout)
        turns.append(run_codex(codex, home, work, server, swama.model, CODEX_PROMPTS[2], "after restart", timeout))
        if turns[-1].delta.disk_hits == 0:
            print(f"WARNING: the turn after the restart read nothing from disk; server log:\n{server.log_tail(80)}",
                  file=sys.stderr, flush=True)
    return turns, info


def codex_table(turns: list[CodexTurn]) -> str:
    rows = []
    for t in turns:
        d = t.delta
        rows.append([t.name, f"{t.wall:.1f}", str(t.returncode) + ("" if t.ok else " (failed)"), f"{d.responses:.0f}",
                     f"{d.prompt_tokens:,.0f}", f"{d.cached_tokens:,.0f}", f"{d.prompt_tokens - d.cached_tokens:,.0f}",
                     d.tier, f"{d.disk_read_tokens:,.0f}", t.tokens_used or "?", t.reply[:40].replace("|", "/")])
    return markdown_table(["turn", "codex exec wall s", "exit", "requests", "prompt tokens", "cached tokens",
                           "computed", "tier that served it", "tokens read from disk", "Codex's 'tokens used'",
                           "reply"], rows)


# ---------------------------------------------------------------------------------------------
# Part 2: sessions sharing a system prompt


def count_tokens(model_dir: Path) -> Callable[[str], int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def system_prompt(model_dir: Path, tokens: int) -> str:
    """A house-rules text of about `tokens` tokens (the same every run)."""
    count = count_tokens(model_dir)
    lines = ["You are the help desk assistant of the Harbour Street library. Follow these house rules."]
    i = 0
    while True:
        line = f"Rule {i + 1}: {RULES[i % len(RULES)]} (section {i // len(RULES) + 1})"
        if count("\n".join([*lines, line])) > tokens:
            return "\n".join(lines)
        lines.append(line)
        i += 1


def question(session: int) -> str:
    q = QUESTIONS[session % len(QUESTIONS)]
    return q if session < len(QUESTIONS) else f"{q} (asked again, number {session + 1})"


@dataclass
class Turn:
    session: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    wall: float
    reply: str
    delta: Snapshot

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def send_turn(server: Server, model: str, history: list[dict[str, str]], session: int, turn: int,
              timeout: float) -> Turn:
    before = snapshot(server)
    start = time.monotonic()
    body = chat(server, model, history, timeout)
    wall = time.monotonic() - start
    usage = body["usage"]
    reply = body["choices"][0]["message"]["content"] or ""
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Turn(session, turn, usage["prompt_tokens"], cached, wall, reply, snapshot(server) - before)


def run_sessions(server: Server, model: str, system: str, sessions: int, timeout: float) -> list[Turn]:
    histories = [[{"role": "system", "content": system}, {"role": "user", "content": question(s)}]
                 for s in range(sessions)]
    turns = []
    for turn in (1, 2):
        for s in range(sessions):
            if turn == 2:
                histories[s] += [{"role": "assistant", "content": turns[s].reply},
                                 {"role": "user", "content": FOLLOW_UP}]
            turns.append(send_turn(server, model, histories[s], s, turn, timeout))
    return turns


def new_session(server: Server, model: str, system: str, sessions: int, timeout: float) -> Turn:
    """The first turn of one session none of the measured ones had."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question(sessions)}]
    return send_turn(server, model, messages, sessions, 1, timeout)


@dataclass
class Config:
    name: str
    flags: tuple[str, ...]
    turns: list[Turn] = field(default_factory=list)
    wall: float = 0.0
    extra: Turn | None = None  # a new session's first turn: after the restart for (i), on the server for (iii)
    stop: tuple[float, int | None, str] | None = None  # (i)'s stop before the restart: seconds, exit status, log


def sessions_part(swama: Swama, root: Path, system: str, sessions: int, timeout: float) -> dict[str, Config]:
    configs = {"i": Config("(i) default: memory + disk", ()),
               "ii": Config("(ii) memory only (`--prompt-cache-disk-bytes 0`)", ("--prompt-cache-disk-bytes", "0")),
               "iii": Config("(iii) no cache (`--no-prompt-cache`)", ("--no-prompt-cache",))}
    for key, config in configs.items():
        data = root / f"sessions-data-{key}"
        with swama.serve(f"sessions-{key}", data, *config.flags) as server:
            swama.load(server, timeout)
            start = time.monotonic()
            config.turns = run_sessions(server, swama.model, system, sessions, timeout)
            config.wall = time.monotonic() - start
            print(f"sessions {key}: {config.wall:.1f} s, computed {sum(t.computed for t in config.turns):,} of "
                  f"{sum(t.prompt_tokens for t in config.turns):,} prompt tokens", flush=True)
            if key == "iii":
                config.extra = new_session(server, swama.model, system, sessions, timeout)
            if key == "i":
                wait_disk_settled(server)
                config.stop = graceful_stop(server)
        if key == "i":
            with swama.serve("sessions-i-restarted", data, *config.flags) as server:
                swama.load(server, timeout)
                config.extra = new_session(server, swama.model, system, sessions, timeout)
                if config.extra.delta.disk_hits == 0:
                    print("WARNING: the new session after the restart read nothing from disk; server log:\n"
                          f"{server.log_tail(80)}", file=sys.stderr, flush=True)
    return configs


def sessions_tables(configs: dict[str, Config]) -> tuple[str, str]:
    base = sum(t.computed for t in configs["iii"].turns)
    replies = [t.reply for t in configs["iii"].turns]
    rows = []
    for config in configs.values():
        computed = sum(t.computed for t in config.turns)
        same = sum(a.reply == b for a, b in zip(config.turns, replies, strict=True))
        rows.append([config.name, str(len(config.turns)), f"{sum(t.prompt_tokens for t in config.turns):,}",
                     f"{sum(t.cached_tokens for t in config.turns):,}", f"{computed:,}",
                     f"{computed / base:.2f}" if base else "", f"{config.wall:.1f}",
                     f"{config.wall / configs['iii'].wall:.2f}", f"{same} of {len(config.turns)}"])
    table = markdown_table(["configuration", "requests", "prompt tokens", "cached tokens", "computed",
                            "computed / no cache", "wall s", "wall / no cache", "replies as with no cache"], rows)
    after, cold = configs["i"].extra, configs["iii"].extra
    assert after is not None and cold is not None
    rows2 = [[name, f"{t.prompt_tokens:,}", f"{t.cached_tokens:,}", f"{t.computed:,}", t.delta.tier,
              f"{t.delta.disk_read_tokens:,.0f}", f"{t.wall:.2f}"]
             for name, t in (("(iv) after a restart of (i), same data folder", after), ("(iii) no cache", cold))]
    rows2.append(["(iv) / (iii)", "", "", "", "", "", f"{after.wall / cold.wall:.2f}"])
    table2 = markdown_table(["a new session's first turn", "prompt tokens", "cached tokens", "computed",
                             "tier that served it", "tokens read from disk", "wall s"], rows2)
    return table, table2


# ---------------------------------------------------------------------------------------------
# Part 3: disk read speed (a process of its own)


def read_child(model_dir: Path, tokens: int, folder: Path) -> dict[str, Any]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from swama.engine.runtime import compute_dtype, loaded_blas
    from swama.engine.text.language import load_language_model
    from swama.engine.text.prompt_cache import prompt_cache_for

    model = load_language_model("bench", model_dir)
    text = system_prompt(model_dir, tokens + 64)
    ids = model.tokenizer.encode(text)[:tokens]
    assert len(ids) == tokens, f"the text gave {len(ids)} tokens, not {tokens}"

    def prefill(n: int) -> list[Any]:
        cache = make_prompt_cache(model.model)
        for s in range(0, n, PREFILL_STEP):
            logits = model.model(mx.array([ids[s:min(n, s + PREFILL_STEP)]]), cache=cache)
            mx.eval(logits, [c.state for c in cache])
        return cache

    prefill(min(tokens, PREFILL_STEP))  # warm-up
    prefills = []
    for _ in range(3):
        start = time.perf_counter()
        cache = prefill(tokens)
        prefills.append(time.perf_counter() - start)
    start = time.perf_counter()
    writer = prompt_cache_for(model, 1 << 32, folder, 1 << 34)
    assert writer is not None and writer.disk is not None
    writer.put(list(ids), cache)
    writer.close()
    write_seconds = time.perf_counter() - start
    files = sorted(folder.rglob("*.kv"))
    size = sum(p.stat().st_size for p in files)

    def read(drop: bool) -> tuple[float, int, float]:
        if drop:
            for path in files:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        reader = prompt_cache_for(model, 1 << 32, folder, 1 << 34)
        assert reader is not None
        start = time.perf_counter()
        got, n = reader.take(list(ids) + [1])
        seconds = time.perf_counter() - start
        diff = 0.0
        if got is not None:
            diff = max(float(mx.max(mx.abs(a.keys[..., :n, :] - b.keys[..., :n, :])).item())
                       for a, b in zip(got, cache, strict=True))
        reader.close()
        return seconds, n, diff

    warm = [read(False) for _ in range(3)]
    cold = [read(True) for _ in range(3)]
    return {"tokens": tokens, "prefill": prefills, "write": write_seconds, "files": len(files), "bytes": size,
            "warm": warm, "cold": cold, "dtype": str(compute_dtype()), "blas": loaded_blas() or "bundled"}


def read_part(model_dir: Path, root: Path, tokens: int, timeout: float) -> dict[str, Any]:
    out_file = root / "read.json"
    cmd = [sys.executable, "-m", "tools.bench.prompt_disk", "--read-child", str(out_file), "--model-dir",
           str(model_dir), "--read-tokens", str(tokens)]
    env = server_env({"HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)})
    out = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"the read process exited with {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-4000:]}")
    result = json.loads(out_file.read_text())
    print(f"read: prefill {statistics.median(result['prefill']):.2f} s, take "
          f"{statistics.median(r[0] for r in result['warm']):.3f} s (page cache), "
          f"{statistics.median(r[0] for r in result['cold']):.3f} s (dropped)", flush=True)
    return result


def read_table(result: dict[str, Any]) -> str:
    n = result["tokens"]
    prefill = statistics.median(result["prefill"])
    rows = [[f"prefill {n:,} tokens (forward in steps of {PREFILL_STEP})", f"{prefill:.3f}", f"{n / prefill:,.0f}",
             "1.00x", ""]]
    for name, runs in (("take from disk, files in the page cache", result["warm"]),
                       ("take from disk, page cache dropped (fadvise)", result["cold"])):
        seconds = statistics.median(r[0] for r in runs)
        got = {r[1] for r in runs}
        diff = max(r[2] for r in runs)
        rows.append([name, f"{seconds:.3f}", f"{n / seconds:,.0f}", f"{prefill / seconds:.1f}x",
                     f"{'/'.join(str(g) for g in sorted(got))} tokens, max key difference {diff:g}"])
    rows.append([f"write ({result['files']} blocks: put + close)", f"{result['write']:.3f}",
                 f"{n / result['write']:,.0f}", "", ""])
    return markdown_table(["step", "median s", "tokens/s", "speed vs prefill", "resumed"], rows)


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="which parts to run (default codex,sessions,read)")
    parser.add_argument("--system-tokens", type=int, default=4000, help="tokens of the shared system prompt")
    parser.add_argument("--sessions", type=int, default=8, help="interleaved chat sessions of 2 turns (default 8)")
    parser.add_argument("--read-tokens", type=int, default=4096,
                        help="tokens prefilled and read back in the read part (a multiple of 256; default 4096)")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--codex", type=Path, default=CODEX, help="the Codex CLI (default: the live tests' install)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per request or codex exec")
    parser.add_argument("--read-child", type=Path, default=None, help=argparse.SUPPRESS)
    add_write_option(parser)
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts takes a comma-separated subset of {','.join(PARTS)}")
    if args.sessions < 1 or args.system_tokens < 1 or args.read_tokens < BLOCK or args.read_tokens % BLOCK:
        parser.error("--sessions and --system-tokens must be at least 1, --read-tokens a multiple of 256")
    return args


def swama_commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "engine", "handlers"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" with uncommitted changes to engine/ or handlers/" if dirty else "")


def codex_reading(turns: list[CodexTurn], info: dict[str, Any]) -> str:
    cold, warm, after = turns
    ratio = after.wall / warm.wall
    verdict = "within" if ratio <= 2 else "outside"
    text = (f"Codex: the cold turn took {cold.wall:.1f} s, the warm one {warm.wall:.1f} s ({warm.delta.cached_tokens:,.0f} "
            f"of {warm.delta.prompt_tokens:,.0f} prompt tokens cached, tier: {warm.delta.tier}), the one after the "
            f"restart {after.wall:.1f} s ({after.delta.cached_tokens:,.0f} of {after.delta.prompt_tokens:,.0f} cached, "
            f"tier: {after.delta.tier}, {after.delta.disk_read_tokens:,.0f} tokens read from disk): "
            f"{ratio:.2f}x the warm turn, {verdict} the 2x target, and {cold.wall / after.wall:.1f}x faster than cold. "
            f"The gap to the warm turn is the part of the prompt the disk cannot hold (blocks are whole "
            f"{BLOCK}-token runs: up to {BLOCK - 1} more tokens to prefill than from memory) plus reading the blocks "
            f"back. The first server wrote {info['written'] / 2**20:,.1f} MiB ({info['files']} block files) and "
            f"stopped in {info['stop_seconds']:.1f} s ({stop_words(info['stop_returncode'], info['stop_log'])}); "
            f"loading the model took "
            f"{info['load_first']:.1f} s and {info['load_second']:.1f} s, outside the timed turns.")
    if after.delta.disk_hits == 0:
        text += " **The turn after the restart read nothing from disk.**"
    problems = log_problems(info["stop_log"])
    if problems:
        text += f" The first server's log as it stopped: `{' / '.join(problems[:3])}`."
    if not all(t.ok for t in turns):
        text += " **A Codex turn failed** (see the exit column)."
    return text


def sessions_reading(configs: dict[str, Config], sessions: int, system_tokens: int) -> str:
    computed = {k: sum(t.computed for t in c.turns) for k, c in configs.items()}
    first = configs["iii"].turns[0].prompt_tokens
    after, cold = configs["i"].extra, configs["iii"].extra
    assert after is not None and cold is not None
    text = (f"Sessions: a first turn is {first:,} prompt tokens. With a cache the {2 * sessions} requests computed "
            f"{computed['i']:,} tokens (memory + disk) and {computed['ii']:,} (memory only), against {computed['iii']:,} "
            f"without one: the system prompt is computed {computed['iii'] / max(first, 1):.1f} times' worth without a "
            f"cache and {computed['i'] / max(first, 1):.2f} times' worth with one; wall time "
            f"{configs['i'].wall / configs['iii'].wall:.2f}x and {configs['ii'].wall / configs['iii'].wall:.2f}x of no "
            f"cache. After a restart of (i), a new session's first turn resumed {after.cached_tokens:,} of "
            f"{after.prompt_tokens:,} tokens from {after.delta.tier} and took {after.wall:.2f} s against "
            f"{cold.wall:.2f} s with no cache ({after.wall / cold.wall:.2f}x).")
    if after.delta.disk_hits == 0:
        text += " **The new session after the restart read nothing from disk.**"
    stop = configs["i"].stop
    if stop is not None:
        text += f" Server (i) stopped in {stop[0]:.1f} s ({stop_words(stop[1], stop[2])})"
        problems = log_problems(stop[2])
        text += f"; its log as it stopped: `{' / '.join(problems[:3])}`." if problems else "."
    return text


def read_reading(result: dict[str, Any]) -> str:
    n = result["tokens"]
    prefill = statistics.median(result["prefill"])
    warm = statistics.median(r[0] for r in result["warm"])
    cold = statistics.median(r[0] for r in result["cold"])
    return (f"Read speed: {n:,} tokens ({result['dtype']}) take {result['bytes'] / n / 1024:,.1f} KiB on disk per "
            f"token ({result['bytes'] / 2**20:,.1f} MiB in {result['files']} files); reading them back runs at "
            f"{n / warm:,.0f} tokens/s with the files in the page cache and {n / cold:,.0f} tokens/s after dropping "
            f"them, against {n / prefill:,.0f} tokens/s prefilled: {prefill / warm:.0f}x and {prefill / cold:.0f}x "
            f"faster. The read process ran on BLAS: {result['blas']}.")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder, model = resolve_model_dir(args.model_dir)
    if args.read_child is not None:
        with temp_dir("bench-prompt-disk-read-") as root:
            result = read_child(folder, args.read_tokens, Path(root) / "prompt-cache")
        args.read_child.write_text(json.dumps(result))
        return 0
    command = shlex.join(["python", "-m", "tools.bench.prompt_disk", *(sys.argv[1:] if argv is None else argv)])
    sections = []
    readings = []
    facts = {**machine_facts(), "httpx (client)": package_version("httpx"), "swama commit": swama_commit()}
    failed = False
    with temp_dir("bench-prompt-disk-") as tmp:
        root = Path(tmp)
        swama = Swama(build_store(root / "models", folder, model), model)
        if "codex" in args.parts:
            if not args.codex.exists():
                sections.append(f"### Codex after a restart\n\nSkipped: the Codex CLI is not at `{args.codex}` "
                                "(the live tests install it there: `tests/live/test_responses_live.py`).")
                print(f"codex part skipped: no Codex CLI at {args.codex}", file=sys.stderr, flush=True)
            else:
                facts["codex"] = codex_version(args.codex)
                turns, info = codex_part(swama, root, args.codex, args.timeout)
                failed |= not all(t.ok for t in turns) or turns[2].delta.disk_hits == 0
                sections.append(
                    "### Codex after a restart\n\n"
                    f"`codex exec {shlex.join(CODEX_ARGS[1:])} PROMPT` against `swama serve --max-tokens 32`, three "
                    "new Codex sessions with the same instructions: cold (a fresh data folder), warm (the same "
                    "server), and after a restart (a new server on the same data folder). Wall time is the whole "
                    "`codex exec`, start to exit: Codex shows no time to the first token. Tokens and tiers are "
                    "the server's /metrics deltas over the turn.\n\n" + codex_table(turns)
                    + f"\n\nAfter restart / warm: **{turns[2].wall / turns[1].wall:.2f}x** (target: within 2x); "
                    f"cold / after restart: {turns[0].wall / turns[2].wall:.1f}x.")
                readings.append(codex_reading(turns, info))
        if "sessions" in args.parts:
            system = system_prompt(folder, args.system_tokens)
            configs = sessions_part(swama, root, system, args.sessions, args.timeout)
            failed |= configs["i"].extra is None or configs["i"].extra.delta.disk_hits == 0
            table, table2 = sessions_tables(configs)
            sections.append(
                f"### {args.sessions} interleaved sessions sharing a {args.system_tokens:,}-token system prompt\n\n"
                f"Chat completions, {args.sessions} sessions of 2 turns sent one after another round robin (every "
                "first turn, then every second turn), the same system prompt, each session its own question, "
                "max_tokens 8, temperature 0; each configuration a fresh server with a fresh data folder. Computed = "
                "prompt_tokens - cached_tokens, summed over the requests.\n\n" + table
                + "\n\nA new session's first turn on a server restarted on (i)'s data folder, against the same "
                "turn on (iii):\n\n" + table2)
            readings.append(sessions_reading(configs, args.sessions, args.system_tokens))
        if "read" in args.parts:
            result = read_part(folder, root, args.read_tokens, args.timeout * 2)
            sections.append(
                f"### Disk read speed: {args.read_tokens:,} tokens\n\nOne process, no server: the prompt prefilled "
                "into a fresh cache (median of 3), written with `prompt_cache_for(...).put` and `.close`, then read "
                "back by `.take(ids + [1])` of a new `prompt_cache_for` on the same folder (median of 3, the memory "
                "tier empty each time).\n\n" + read_table(result))
            readings.append(read_reading(result))
    facts_text = "Machine and versions:\n\n" + facts_lines(facts)
    body = "\n\n".join([
        f"Measured {today()} on `{folder.name}` (float32 on the CPU) with:\n\n```\n{command}\n```",
        *sections,
        *(["**Reading.** " + "\n\n".join(readings)] if readings else []),
        facts_text,
    ])
    print(f"## {TITLE}\n")
    publish(TITLE, body, args.write if not failed else None)
    if failed:
        print("\nsomething failed or never hit the disk (see above): the section was not written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from tools.bench.chat import exit_on_sigterm

    exit_on_sigterm()
    sys.exit(main())
