"""One model split across ranks (`swama serve MODEL --ranks N` / `--hostfile FILE`): real processes on
loopback talking over MLX's ring backend (named, so that a GPU machine runs them too: NCCL takes a
GPU per rank), compared with the one-process server on the same weights."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2_ID, TINY_ID
from precision import (
    BF16_NEAR_TIE,
    BF16_PROBABILITY,
    BF16_TINY_LOGIT_STEP,
    BF16_TINY_PROBABILITY,
    F32_PROBABILITY,
    F32_TINY_LOGPROB,
    F32_TINY_PROBABILITY,
    FULL_F32,
    ON_GPU,
    tol,
)

from live_server import LiveServer, free_port, processes_marked, start_server
from swama.engine.files.store import ModelStore
from swama.engine.text.prompt_disk import fingerprint

pytestmark = pytest.mark.slow

PROMPTS = ["Say hello to the team.", "What is the capital of France?", "List three colours."]
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


RING = ("--rank-backend", "ring")
# On a GPU a kernel's first use compiles it, which can hold one rank for seconds while the other waits.
RANK_TIMEOUT = "60" if ON_GPU else "10"
# A split sums each layer's products in another order, so the split and the one process round apart
# as two computations of the same logits do (tests/precision.py), in float32 and in bfloat16 (on a GPU).
TINY_PROBABILITY = tol(F32_TINY_PROBABILITY, BF16_TINY_PROBABILITY)
TINY_LOGPROB = tol(F32_TINY_LOGPROB, 4 * BF16_TINY_LOGIT_STEP)
SMOLLM2_PROBABILITY = tol(F32_PROBABILITY, BF16_PROBABILITY)


def _ranked(store: Path, name: str, model: str, *args: str) -> LiveServer:
    return start_server(store, store.parent / f"{name}.log", model, "--rank-timeout", RANK_TIMEOUT, *RING, *args,
                        timeout=240)


@pytest.fixture(scope="module")
def tiny_ranks(model_store: Path) -> Iterator[LiveServer]:
    server = _ranked(model_store, "tiny-ranks", TINY_ID, "--ranks", "2")
    yield server
    server.stop()


def _chat(server: LiveServer, model: str, text: str, max_tokens: int = 16, **extra: object) -> dict:
    r = httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
        "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _probabilities(server: LiveServer, model: str) -> list[float]:
    r = httpx.post(server.v1 + "/decisions", timeout=120, json={"model": model, **DECISION})
    assert r.status_code == 200, r.text
    out: list[float] = []
    for answer in r.json()["answers"]:
        out += [p["probability"] for p in answer["probabilities"]] if "probabilities" in answer else [answer["probability"]]
    return out


def _same_text(one: LiveServer, model: str, prompt: str, split: str, whole: str, max_tokens: int) -> None:
    """The split's greedy text is the one process's; in bfloat16 it may part from it only where the
    one process's top two tokens are within BF16_NEAR_TIE of each other."""
    if split == whole:
        return
    assert not FULL_F32, (split, whole)
    common = len(os.path.commonprefix([split, whole]))
    at = 0
    for entry in _chat(one, model, prompt, max_tokens, logprobs=True, top_logprobs=2)["choices"][0]["logprobs"]["content"]:
        if at + len(entry["token"]) > common:
            first, second = entry["top_logprobs"][:2]
            assert first["logprob"] - second["logprob"] < BF16_NEAR_TIE, (split, whole, entry)
            return
        at += len(entry["token"])
    raise AssertionError(f"the texts part past the one process's tokens: {split!r} against {whole!r}")


def _same_answers(ranks: LiveServer, one: LiveServer, model: str, prompts: list[str] = PROMPTS,
                  max_tokens: int = 16, probability: float = TINY_PROBABILITY) -> None:
    for text in prompts:
        _same_text(one, model, text, _chat(ranks, model, text, max_tokens)["choices"][0]["message"]["content"],
                   _chat(one, model, text, max_tokens)["choices"][0]["message"]["content"], max_tokens)
    split, whole = _probabilities(ranks, model), _probabilities(one, model)
    assert max(abs(a - b) for a, b in zip(split, whole, strict=True)) < probability, (split, whole)


def test_two_ranks_answer_as_one_process(tiny_ranks: LiveServer, model_server: LiveServer) -> None:
    health = httpx.get(tiny_ranks.url + "/health", timeout=10).json()
    group = health["ranks"]
    assert (group["size"], group["backend"], group["split"], group["state"]) == (2, "ring", "tensor", "serving")
    assert [r["rank"] for r in group["ranks"]] == [0, 1] and all(r["pid"] > 0 for r in group["ranks"])
    _same_answers(tiny_ranks, model_server, TINY_ID)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_idle_ranks_sleep(tiny_ranks: LiveServer) -> None:
    """Between plans the other ranks wait on rank 0's doorbell, asleep: MLX's ring backend polls its
    sockets inside a collective, and an idle two-rank server's rank 1 so took 3.0 CPU-seconds in
    these 3 s (measured, two threads polling). Asleep, a rank wakes for the heartbeat once a second."""
    pids = [r["pid"] for r in httpx.get(tiny_ranks.url + "/health", timeout=10).json()["ranks"]["ranks"]]
    before = [_cpu_seconds(pid) for pid in pids]
    time.sleep(3)  # the window measured, not a wait for anything
    used = [_cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
    assert max(used) < 0.5, used


def test_responses_and_systemone_on_ranks(tiny_ranks: LiveServer, model_server: LiveServer) -> None:
    def respond(server: LiveServer) -> str:
        r = httpx.post(server.v1 + "/responses", timeout=120, json={
            "model": TINY_ID, "input": "Name a fruit.", "max_output_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()["output"][0]["content"][0]["text"]

    def systemone(server: LiveServer) -> dict:
        r = httpx.post(server.v1 + "/systemone", timeout=120, json={
            "model": TINY_ID, "state": {"ticket": "Refund please"},
            "questions": {"u": {"type": "noul", "instructions": "Is it urgent?"}}})
        assert r.status_code == 200, r.text
        return r.json()["answers"]["u"]

    _same_text(model_server, TINY_ID, "Name a fruit.", respond(tiny_ranks), respond(model_server), 8)
    assert abs(systemone(tiny_ranks)["noul"] - systemone(model_server)["noul"]) < TINY_PROBABILITY


def test_eight_streams_are_batched_across_ranks(tiny_ranks: LiveServer, model_server: LiveServer) -> None:
    prompts = [f"Count to {n} please." for n in range(8)]

    def stream(text: str) -> str:
        parts = []
        with httpx.stream("POST", tiny_ranks.v1 + "/chat/completions", timeout=120, json={
                "model": TINY_ID, "messages": [{"role": "user", "content": text}], "max_tokens": 12,
                "temperature": 0, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]
                    assert delta["finish_reason"] != "error", delta
                    parts.append(delta["delta"].get("content") or "")
        return "".join(parts)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streamed = list(pool.map(stream, prompts))
    for prompt, text in zip(prompts, streamed, strict=True):
        _same_text(model_server, TINY_ID, prompt, text,
                   _chat(model_server, TINY_ID, prompt, 12)["choices"][0]["message"]["content"], 12)
    group = httpx.get(tiny_ranks.url + "/health", timeout=10).json()["ranks"]
    assert group["state"] == "serving"
    metrics = httpx.get(tiny_ranks.url + "/metrics", timeout=10).text
    assert "swama_ranks 2.0" in metrics and "swama_rank_group_up 1.0" in metrics
    assert 'swama_rank_steps{rank="1"}' in metrics


def test_second_turn_resumes_the_prompt_cache_on_every_rank(tiny_ranks: LiveServer) -> None:
    # Each rank resumes from its own prompt cache, and all resume at the shortest prefix any of them
    # resumed, so cached tokens in the answer mean every rank hit.
    messages = [{"role": "user", "content": "Tell me about the sea in a few words."}]
    first = httpx.post(tiny_ranks.v1 + "/chat/completions", timeout=120, json={
        "model": TINY_ID, "messages": messages, "max_tokens": 8, "temperature": 0}).json()
    messages += [first["choices"][0]["message"], {"role": "user", "content": "And the sky?"}]
    second = httpx.post(tiny_ranks.v1 + "/chat/completions", timeout=120, json={
        "model": TINY_ID, "messages": messages, "max_tokens": 8, "temperature": 0}).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert httpx.get(tiny_ranks.url + "/health", timeout=10).json()["ranks"]["state"] == "serving"
    metrics = httpx.get(tiny_ranks.url + "/metrics", timeout=30).text
    assert 'swama_prompt_cache_hits_total{model="test/tiny-qwen3",tier="memory"}' in metrics
    assert 'swama_prompt_cache_hits_total{model="test/tiny-qwen3",tier="disk"}' in metrics


SYSTEM = " ".join(f"Rule {i}: answer politely, cite the order number, and never promise a refund date."
                  for i in range(40))  # ~700 tokens: two whole blocks of 256


def _blocks_in_order(folder: Path) -> list[Path]:
    """A rank's block files of one prompt, first block first (each names its parent in its header)."""
    by_parent = {}
    for path in folder.glob("*.kv"):
        data = path.read_bytes()
        size = int.from_bytes(data[8:12], "little")
        by_parent[json.loads(data[12:12 + size])["parent"]] = path
    chain, parent = [], folder.name
    while parent in by_parent:
        chain.append(by_parent[parent])
        parent = chain[-1].stem
    return chain


def test_each_rank_resumes_its_own_blocks_from_disk_and_the_ranks_agree(model_store: Path, tmp_path: Path) -> None:
    # Each rank writes its own shard's blocks under the data folder. After a restart both read them
    # back; where one rank holds fewer (here its second block is damaged), every rank resumes from
    # the shortest prefix any of them holds, and the answer is the one the cold server gave.
    data = tmp_path / "data"
    body = {"model": TINY_ID, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is order 12?"}]}

    def up() -> LiveServer:
        return start_server(model_store, tmp_path / "ranks-disk.log", TINY_ID, "--rank-timeout", RANK_TIMEOUT, *RING,
                            "--ranks", "2", timeout=240, env={"SWAMA_DATA": str(data)})

    def ask(server: LiveServer) -> dict:
        r = httpx.post(server.v1 + "/chat/completions", timeout=120, json=body)
        assert r.status_code == 200, r.text
        return r.json()

    server = up()
    try:
        first = ask(server)
        assert first["usage"]["prompt_tokens"] > 2 * 256 + 1
        deadline = time.monotonic() + 60
        while True:  # both ranks' writer threads have written the prompt's first blocks
            folders = sorted(p for p in (data / "prompt-cache").iterdir() if p.is_dir())
            if len(folders) == 2 and all(len(_blocks_in_order(f)) >= 2 for f in folders):
                break
            assert time.monotonic() < deadline, [list(f.iterdir()) for f in folders]
            time.sleep(0.2)
    finally:
        server.stop()
    # Rank 1's second block damaged: rank 0 reads all its blocks, rank 1 one, and rank 0 cuts back to it.
    follower = fingerprint(ModelStore(model_store).get(TINY_ID).path,
                           "mlx.core.bfloat16" if ON_GPU else "mlx.core.float32", "rank1of2")
    assert follower in [f.name for f in folders]
    damaged = _blocks_in_order(data / "prompt-cache" / follower)[1]
    damaged.write_bytes(damaged.read_bytes()[:100])

    server = up()  # new processes: nothing in memory
    try:
        again = ask(server)
        details = again["usage"]["prompt_tokens_details"]
        assert details["cached_tokens"] == 256 and details["disk_cached_tokens"] == 256
        assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        third = ask(server)  # now from the memory tier of every rank
        assert third["usage"]["prompt_tokens_details"]["cached_tokens"] > 512
        assert third["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        assert httpx.get(server.url + "/health", timeout=10).json()["ranks"]["state"] == "serving"
    finally:
        server.stop()


def test_sampled_tokens_agree_across_ranks(tiny_ranks: LiveServer) -> None:
    # Unseeded sampling: rank 0 draws the seed and shares it, so both ranks sample the same tokens
    # (a rank that sampled others would fail the group at the next step).
    for _ in range(3):
        _chat(tiny_ranks, TINY_ID, "Write a word.", 8, temperature=1.0)
    assert httpx.get(tiny_ranks.url + "/health", timeout=10).json()["ranks"]["state"] == "serving"


def test_structured_outputs_and_logprobs_on_ranks(tiny_ranks: LiveServer, model_server: LiveServer) -> None:
    """Every rank masks the same tokens (a rank that did not would sample others and fail the group);
    log probabilities and a scored prompt come out as on one process."""
    schema = {"type": "object", "additionalProperties": False, "required": ["n"],
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}}
    extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
             "logprobs": True, "top_logprobs": 3, "temperature": 0.9, "seed": 4}
    split, whole = (_chat(s, TINY_ID, "Give a number.", 24, **extra)["choices"][0] for s in (tiny_ranks, model_server))
    # In bfloat16 the same seed may draw another token where the two distributions round apart:
    # the tokens up to there are compared.
    assert split["message"]["content"] == whole["message"]["content"] or not FULL_F32
    if split["finish_reason"] == "stop":
        assert 0 <= json.loads(split["message"]["content"])["n"] <= 99
    same = 0
    for a, b in zip(split["logprobs"]["content"], whole["logprobs"]["content"], strict=False):
        if a["token"] != b["token"]:
            break
        assert abs(a["logprob"] - b["logprob"]) < TINY_LOGPROB, (a, b)
        same += 1
    assert same > 0 and (same == len(whole["logprobs"]["content"]) or not FULL_F32)
    prompts = [httpx.post(s.v1 + "/completions", timeout=120, json={
        "model": TINY_ID, "prompt": "One two three four", "max_tokens": 0, "echo": True, "logprobs": 2}).json()
        for s in (tiny_ranks, model_server)]
    a, b = (p["choices"][0]["logprobs"]["token_logprobs"][1:] for p in prompts)
    assert len(a) == len(b) > 0 and max(abs(x - y) for x, y in zip(a, b, strict=True)) < TINY_LOGPROB
    assert httpx.get(tiny_ranks.url + "/health", timeout=10).json()["ranks"]["state"] == "serving"


def test_an_adapter_is_refused_on_ranks(tiny_ranks: LiveServer, model_store: Path, tmp_path: Path) -> None:
    from swama.engine.adapters.install import create_adapter
    from swama.engine.files.store import ModelStore
    from tools.testmodels.lora import random_adapter

    store = ModelStore(model_store)
    folder = random_adapter(store.get(TINY_ID).path, tmp_path / "adapter")
    create_adapter(store, folder, "test/tiny-adapter", TINY_ID, say=lambda _: None)
    try:
        r = httpx.post(tiny_ranks.v1 + "/chat/completions", timeout=120, json={
            "model": "test/tiny-adapter", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert r.status_code == 400 and "split across ranks" in r.json()["error"]["message"], r.text
        assert _chat(tiny_ranks, TINY_ID, "Hi", max_tokens=4)["choices"][0]["message"]["content"] is not None
    finally:
        store.remove("test/tiny-adapter")


def test_a_split_that_does_not_fit_is_refused_at_start(model_store: Path) -> None:
    env = {**os.environ, "SWAMA_MODELS": str(model_store)}
    done = subprocess.run([sys.executable, "-m", "swama.handlers.cli", "serve", SMOLLM2_ID, "--ranks", "2", *RING],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "9 attention heads, 3 key/value heads do not split evenly over 2 ranks; it splits over 3" in done.stderr


def test_a_port_in_use_is_refused_before_any_rank_starts(model_store: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "swama.handlers.cli", "serve", TINY_ID, "--ranks", "2", *RING,
                               "--port", str(port)], env={**os.environ, "SWAMA_MODELS": str(model_store)},
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"rank 0 cannot listen on 127.0.0.1:{port}" in done.stderr


def test_hostfile_with_two_loopback_entries(model_store: Path, tmp_path: Path, model_server: LiveServer) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    server = _ranked(model_store, "tiny-hostfile", TINY_ID, "--hostfile", str(hostfile))
    try:
        group = httpx.get(server.url + "/health", timeout=10).json()["ranks"]
        assert group["size"] == 2
        _same_answers(server, model_server, TINY_ID)
    finally:
        server.stop()
    _gone([r["pid"] for r in group["ranks"]])  # stopping the server stops mlx.launch's ranks too


def test_a_group_whose_rank_0_cannot_serve_ends_every_process(model_store: Path, tmp_path: Path) -> None:
    """Rank 0 fails its HTTP start-up (another server holds the data folder): the group ends, every
    process of it, within a bound, instead of rank 1 spinning on a group nobody serves."""
    data = tmp_path / "held"
    holder = start_server(model_store, tmp_path / "holder.log", env={"SWAMA_DATA": str(data)})
    mark = f"rank0-fails-{os.getpid()}-{time.monotonic_ns()}"  # every process of the group inherits it
    try:
        done = subprocess.run([sys.executable, "-m", "swama.handlers.cli", "serve", TINY_ID, "--ranks", "2", *RING,
                               "--rank-timeout", RANK_TIMEOUT, "--rank-restarts", "0", "--port", str(free_port())],
                              env={**os.environ, "SWAMA_MODELS": str(model_store), "SWAMA_DATA": str(data),
                                   "SWAMA_TEST_MARK": mark}, capture_output=True, text=True, timeout=120)
    finally:
        holder.stop()
        deadline = time.monotonic() + 15  # the supervisor has returned: its ranks are ending, within a bound
        while (left := [p for p in processes_marked("SWAMA_TEST_MARK", mark) if _alive(p)]) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:  # never leave a spinning rank to the rest of the suite
            os.kill(pid, signal.SIGKILL)
    assert done.returncode == 1 and "giving up" in done.stderr, done.stderr[-3000:]
    assert left == [], "processes of the group were left running"


def _gone(pids: list[int]) -> None:
    """None of `pids` is left (bounded: 15 s)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    assert not [pid for pid in pids if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_killed_rank_ends_the_stream_the_group_restarts_and_goes_with_its_supervisor(model_store: Path) -> None:
    """A rank killed mid-stream ends the stream with an error and the group restarts. Then the server
    itself is killed outright (SIGKILL, the OOM killer): each rank it started goes with it, rank 0
    included, which would otherwise go on serving its port."""
    server = _ranked(model_store, "tiny-kill", TINY_ID, "--ranks", "2")
    try:
        rank1 = httpx.get(server.url + "/health", timeout=10).json()["ranks"]["ranks"][1]["pid"]
        events: list[dict] = []
        with httpx.stream("POST", server.v1 + "/chat/completions", timeout=60, json={
                "model": TINY_ID, "messages": [{"role": "user", "content": "Talk for a long time."}],
                "max_tokens": 4000, "temperature": 0, "stream": True}) as r:
            lines = r.iter_lines()
            for line in lines:  # the stream is running
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    break
            os.kill(rank1, signal.SIGKILL)
            killed = time.monotonic()
            for line in lines:
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
            ended = time.monotonic() - killed
        assert ended < 30
        last = events[-1]["choices"][0]
        assert last["finish_reason"] == "error" and "ranks serving model" in events[-1]["error"]["message"]
        deadline = time.monotonic() + 180
        health: dict = {}
        while time.monotonic() < deadline:
            try:
                health = httpx.get(server.url + "/health", timeout=5).json()
                if health["ranks"]["restarts"] == 1:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert health["ranks"]["restarts"] == 1 and f"rank 1 (pid {rank1})" in health["ranks"]["last_failure"]
        assert health["ranks"]["state"] == "serving"
        assert _chat(server, TINY_ID, "Hello again.", 4)["choices"][0]["finish_reason"] == "length"
        pids = [r["pid"] for r in httpx.get(server.url + "/health", timeout=10).json()["ranks"]["ranks"]]
        assert all(_alive(pid) for pid in pids)
        server.process.kill()
        server.process.wait(10)
        _gone(pids)
    finally:
        server.stop()


@pytest.mark.parametrize("kv_server", [8], indirect=True)
def test_smollm2_across_three_ranks_with_quantized_caches_answers_as_one_process(model_store: Path,
                                                                              kv_server: LiveServer) -> None:
    """A real model split over three ranks, its key/value caches quantized (--kv-bits 8 on every rank),
    answers as one process with the same quantized caches does. SmolLM2's 9 attention heads and 3
    key/value heads split over 3 ranks, not 2; each rank quantizes its own heads, alike. Three ranks on
    two cores wait on each other at every layer's collective: a few tokens are enough here. (Full
    precision across ranks: the tiny model's tests above.)"""
    server = _ranked(model_store, "smollm2-ranks-kv8", SMOLLM2_ID, "--ranks", "3", "--rank-timeout", "120",
                     "--kv-bits", "8")
    try:
        _same_answers(server, kv_server, SMOLLM2_ID, PROMPTS[1:2], max_tokens=6,
                      probability=SMOLLM2_PROBABILITY)
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert f'swama_kv_bits{{model="{SMOLLM2_ID}"}} 8.0' in text
    finally:
        server.stop()
