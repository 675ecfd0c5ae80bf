"""Files and batch jobs on a real server, driven by the openai SDK as users drive OpenAI's Batch API:
answers equal the live route's, refusals go to the error file worded as the live route words them,
bad input is refused with a 4xx, and a job killed with the server (kill -9, three times) completes
with every custom_id exactly once."""

from __future__ import annotations

import io
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SMOLLM2_ID, make_store
from openai import OpenAI
from precision import BF16_PROBABILITY, F32_PROBABILITY, f32_reordered, forward_products, tol

from live_server import LiveServer, read_http_answer, start_server

KEY = "batch-key"
MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
FINAL = ("completed", "failed", "expired", "cancelled")
# A job's lines may run in other batches than the live requests: the same values in another summation
# order. MiniLM's unit vectors: 6 layers (H 384, I 1536, heads of 32, at most 256 tokens) on components
# of at most 1; bf16 as in test_embeddings.py.
VECTOR = tol(f32_reordered(1, forward_products(6, 384, 1536, 32, 256)), 5e-3)
PROBABILITY = tol(F32_PROBABILITY, BF16_PROBABILITY)


@pytest.fixture(scope="module")
def batch_store(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path, minilm_dir: Path) -> Path:
    return make_store(tmp_path_factory, "batch-store", {SMOLLM2_ID: smollm2_dir, MINILM_ID: minilm_dir})


@pytest.fixture(scope="module")
def server(batch_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    log = tmp_path_factory.mktemp("batches") / "batch-server.log"
    live = start_server(batch_store, log, "smollm2", "--api-key", KEY)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.v1, api_key=KEY, max_retries=0, timeout=120)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def line(custom_id: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": 6,
            "temperature": 0, **extra}


def finished(client: OpenAI, batch_id: str, seconds: float = 300) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in FINAL:
            return batch
        time.sleep(0.5)
    raise AssertionError(f"batch {batch_id} did not finish in {seconds} s: {batch}")


def read_lines(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x.strip()]


def submit(client: OpenAI, lines: list[dict[str, Any]], endpoint: str, **extra: Any) -> Any:
    upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert upload.purpose == "batch" and upload.filename == "in.jsonl" and upload.bytes == len(jsonl(lines))
    return client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h", **extra)


def test_a_chat_job_answers_as_the_live_route_and_refuses_as_it(client: OpenAI) -> None:
    bodies = {"a": chat("Say hi."), "b": chat("Name a colour."), "c": chat("Count to three."),
              "too-hot": chat("Hi", temperature=5), "nobody": {**chat("Hi"), "model": "no-such-model"}}
    batch = submit(client, [line(k, "/v1/chat/completions", v) for k, v in bodies.items()], "/v1/chat/completions",
                   metadata={"run": "test"})
    assert batch.status in ("validating", "in_progress") and batch.request_counts.total == 5
    batch = finished(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 2)
    assert batch.metadata == {"run": "test"} and batch.model is None  # the lines name two models
    assert batch.usage.output_tokens > 0
    output, errors = read_lines(client, batch.output_file_id), read_lines(client, batch.error_file_id)
    assert sorted(x["custom_id"] for x in output) == ["a", "b", "c"]
    for x in output:
        live = client.chat.completions.create(**bodies[x["custom_id"]])
        assert x["response"]["status_code"] == 200 and x["error"] is None
        assert x["response"]["body"]["object"] == "chat.completion"
        assert x["response"]["body"]["choices"][0]["message"]["content"] == live.choices[0].message.content
    by_id = {x["custom_id"]: x for x in errors}
    assert set(by_id) == {"too-hot", "nobody"}
    for custom_id, item in by_id.items():
        status = httpx.post(f"{client.base_url}chat/completions", json=bodies[custom_id],
                            headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert item["response"]["status_code"] == status.status_code >= 400
        assert item["response"]["body"] == status.json()


def test_decision_and_completion_jobs(client: OpenAI) -> None:
    question = {"type": "predicate", "name": "billing", "instructions": "Is this about billing?"}
    inputs = ["I was charged twice for my order.", "The app crashes on start.", "Please refund my card."]
    decision = submit(client, [line(f"d{i}", "/v1/decisions", {"model": "smollm2", "input": text,
                                                               "questions": [question]})
                               for i, text in enumerate(inputs)], "/v1/decisions")
    completion = submit(client, [line(f"c{i}", "/v1/completions", {"model": "smollm2", "prompt": p, "max_tokens": 4,
                                                                  "temperature": 0})
                                 for i, p in enumerate(["Once upon", "The sky is"])], "/v1/completions")
    decision, completion = finished(client, decision.id), finished(client, completion.id)
    assert decision.status == completion.status == "completed" and decision.model == "smollm2"
    answers = {x["custom_id"]: x["response"]["body"] for x in read_lines(client, decision.output_file_id)}
    assert sorted(answers) == ["d0", "d1", "d2"]
    for i, text in enumerate(inputs):
        live = httpx.post(f"{client.base_url}decisions", json={"model": "smollm2", "input": text,
                                                                "questions": [question]},
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60).json()
        got, want = answers[f"d{i}"]["answers"][0], live["answers"][0]
        assert got["name"] == want["name"] == "billing"
        assert abs(got["probability"] - want["probability"]) < PROBABILITY
    texts = [x["response"]["body"]["choices"][0]["text"] for x in read_lines(client, completion.output_file_id)]
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)


def test_embedding_and_responses_jobs(client: OpenAI) -> None:
    texts = ["The invoice was wrong.", "The app crashes."]
    embeddings = submit(client, [line(f"e{i}", "/v1/embeddings", {"model": MINILM_ID, "input": t})
                                 for i, t in enumerate(texts)], "/v1/embeddings")
    responses = submit(client, [line("r0", "/v1/responses", {"model": "smollm2", "input": "Say hi.",
                                                             "max_output_tokens": 4, "temperature": 0})],
                       "/v1/responses")
    embeddings, responses = finished(client, embeddings.id), finished(client, responses.id)
    assert embeddings.status == responses.status == "completed"
    vectors = {x["custom_id"]: x["response"]["body"]["data"][0]["embedding"]
               for x in read_lines(client, embeddings.output_file_id)}
    for i, text in enumerate(texts):
        live = client.embeddings.create(model=MINILM_ID, input=text).data[0].embedding
        assert max(abs(a - b) for a, b in zip(vectors[f"e{i}"], live, strict=True)) < VECTOR
    [answer] = read_lines(client, responses.output_file_id)
    assert answer["custom_id"] == "r0" and answer["response"]["body"]["object"] == "response"


def test_uploads_stop_at_the_files_quota(tmp_path: Path) -> None:
    live = start_server(tmp_path, tmp_path / "quota.log", "--files-quota-bytes", "100")
    try:
        def upload(size: int) -> httpx.Response:
            return httpx.post(f"{live.v1}/files", files={"file": ("x.txt", b"x" * size)},
                              data={"purpose": "user_data"}, timeout=30)

        first = upload(60)
        assert first.status_code == 200, first.text
        refused = upload(60)  # 120 bytes would pass the quota of 100
        assert refused.status_code == 413 and refused.json()["error"]["code"] == "files_quota_exceeded"
        assert "--files-quota-bytes" in refused.json()["error"]["message"]
        assert httpx.delete(f"{live.v1}/files/{first.json()['id']}", timeout=30).status_code == 200
        assert upload(60).status_code == 200  # room again
    finally:
        live.stop()


def test_bad_input_gets_a_clear_4xx(client: OpenAI, server: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}

    def upload(data: bytes, purpose: str = "batch") -> httpx.Response:
        return httpx.post(f"{server.v1}/files", files={"file": ("x.jsonl", data)}, data={"purpose": purpose},
                          headers=headers, timeout=30)

    def create(file_id: str, endpoint: str = "/v1/chat/completions") -> httpx.Response:
        return httpx.post(f"{server.v1}/batches", json={"input_file_id": file_id, "endpoint": endpoint,
                                                        "completion_window": "24h"}, headers=headers, timeout=30)

    def refused(response: httpx.Response, status: int, text: str) -> None:
        assert response.status_code == status, response.text
        assert text in response.json()["error"]["message"], response.text

    refused(upload(b"not json\n"), 400, "line 1 of 'x.jsonl' is not valid JSON")
    refused(upload(b"[1, 2]\n"), 400, "is not a JSON object")
    refused(upload(b"\n\n"), 400, "The file is empty.")
    refused(upload(b"\xff\xfe"), 400, "is not UTF-8")
    refused(upload(b"{}", purpose="fine-tune"), 400, "purpose")
    assert httpx.post(f"{server.v1}/files", files={"file": ("x.jsonl", b"{}")}, data={"purpose": "batch"},
                      timeout=30).status_code == 401
    good = line("x", "/v1/chat/completions", chat("Hi"))
    cases = [([good, good], "'custom_id' 'x' is used by line 1 already"),
             ([{**good, "url": "/v1/embeddings"}], "is not the batch's endpoint"),
             ([{**good, "method": "GET"}], "'method' must be 'POST'"),
             ([{**good, "body": "text"}], "'body' must be a JSON object"),
             ([{**good, "extra": 1}], "unknown field 'extra'")]
    for lines, text in cases:
        file_id = upload(jsonl(lines)).json()["id"]
        refused(create(file_id), 400, text)
    user_file = upload(jsonl([good]), purpose="user_data").json()["id"]
    refused(create(user_file), 400, "a batch reads files of purpose 'batch'")
    refused(create("file-nothing"), 404, "No file with id 'file-nothing'.")
    refused(create(user_file, endpoint="/v1/moderations"), 400, "")
    refused(httpx.get(f"{server.v1}/batches/batch_nothing", headers=headers), 404, "No batch with id")
    refused(httpx.post(f"{server.v1}/batches/batch_nothing/cancel", headers=headers), 404, "No batch with id")
    # An id is never a path: one that tries to climb out is just an id this server does not hold.
    assert httpx.get(f"{server.v1}/files/..%2F..%2Fetc%2Fpasswd/content", headers=headers).status_code == 404
    refused(httpx.get(f"{server.v1}/files/..%5Cbatches.sqlite3/content", headers=headers), 404, "No file with id")
    refused(httpx.get(f"{server.v1}/files?limit=0", headers=headers), 400, "'limit' must be")
    # An upload over the limit is refused by its declared length, unread (a raw request: no client sends 300 MB here).
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(f"POST /v1/files HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
                    "Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 300000000\r\n\r\n--x".encode())
        answer = read_http_answer(raw).decode()
    assert answer.startswith("HTTP/1.1 413") and "The file is larger than 200000000 bytes" in answer, answer


def test_files_list_retrieve_delete(client: OpenAI) -> None:
    made = [client.files.create(file=(f"f{i}.jsonl", io.BytesIO(jsonl([line(str(i), "/v1/completions", {})]))),
                                purpose="batch") for i in range(3)]
    listed = [f.id for f in client.files.list(purpose="batch", order="asc")]
    assert [f.id for f in made] == [i for i in listed if i in {f.id for f in made}]
    assert client.files.retrieve(made[0].id).filename == "f0.jsonl"
    assert client.files.delete(made[0].id).deleted is True
    with pytest.raises(Exception, match="No file with id"):
        client.files.retrieve(made[0].id)


def test_cancel_stops_a_job(client: OpenAI) -> None:
    lines = [line(f"n{i}", "/v1/chat/completions", chat(f"Write a long story number {i}.", max_tokens=48))
             for i in range(40)]
    batch = submit(client, lines, "/v1/chat/completions")
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    batch = finished(client, batch.id)
    assert batch.status == "cancelled" and batch.request_counts.completed < 40
    done = read_lines(client, batch.output_file_id) + read_lines(client, batch.error_file_id)
    assert len(done) == batch.request_counts.completed + batch.request_counts.failed
    again = client.batches.cancel(batch.id)  # cancelling a cancelled job again changes nothing
    assert again.status == "cancelled"


def test_a_job_survives_kill_9_three_times(model_store: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    total = 20  # each kill comes after 3 more lines finished: 9 or more before the last restart
    lines = [line(f"k{i}", "/v1/chat/completions", chat(f"Tell me fact {i}.", max_tokens=16)) for i in range(total)]

    def up() -> tuple[LiveServer, OpenAI]:
        live = start_server(model_store, tmp_path / "kill.log", "smollm2", "--batch-lines", "4",
                            env={"SWAMA_DATA": str(data)})
        return live, OpenAI(base_url=live.v1, api_key="x", max_retries=0, timeout=60)

    live, client = up()
    batch_id = submit(client, lines, "/v1/chat/completions").id
    kills = 0
    try:
        for _ in range(3):
            before = client.batches.retrieve(batch_id).request_counts.completed
            deadline = time.monotonic() + 120
            while client.batches.retrieve(batch_id).request_counts.completed < before + 3:
                assert time.monotonic() < deadline, "the job made no progress"
                time.sleep(0.2)
            live.process.send_signal(signal.SIGKILL)
            live.process.wait(10)
            kills += 1
            live, client = up()
        batch = finished(client, batch_id)
        seen = [x["custom_id"] for x in read_lines(client, batch.output_file_id)
                + read_lines(client, batch.error_file_id)]
    finally:
        live.stop()
    assert kills == 3 and batch.status == "completed"
    assert sorted(seen) == sorted(f"k{i}" for i in range(total))  # every line exactly once
    assert batch.request_counts.completed + batch.request_counts.failed == total
