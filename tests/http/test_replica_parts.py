"""The parts of `--replicas` that need no Ray cluster: the affinity key, the request router's choice,
the ASGI driver a replica runs its app through, the replica's identity, and how a failed replica's
response ends. The whole path runs live in tests/live/test_replicas.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve.request_router import PendingRequest, ReplicaID

from swama.handlers.scale.affinity import affinity_key
from swama.handlers.scale.failures import StreamWatch, replica_failed
from swama.handlers.scale.replica import ReplicaIdentity, run_asgi
from swama.handlers.scale.routing import AffinityRouter
from swama.handlers.scale.wire import ForwardedRequest, ResponseStart


def _body(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


# -- the affinity key ------------------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "Name a colour."}


def test_a_conversation_keeps_its_key_from_turn_to_turn() -> None:
    turn1 = affinity_key("/v1/chat/completions", _body({"model": "m", "messages": [SYSTEM, FIRST]}))
    turn2 = affinity_key("/v1/chat/completions", _body({"model": "m", "messages": [
        SYSTEM, FIRST, {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}],
        "max_tokens": 9}))
    assert turn1 and turn1 == turn2
    other = affinity_key("/v1/chat/completions", _body({"model": "m", "messages": [
        SYSTEM, {"role": "user", "content": "Name a bird."}]}))
    other_model = affinity_key("/v1/chat/completions", _body({"model": "n", "messages": [SYSTEM, FIRST]}))
    assert len({turn1, other, other_model}) == 3


def test_a_responses_conversation_keys_alike_as_text_or_as_items() -> None:
    as_text = affinity_key("/v1/responses", _body({"model": "m", "input": "Name a colour."}))
    as_items = affinity_key("/v1/responses", _body({"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
        {"role": "user", "content": "Another?"}]}))
    assert as_text and as_text == as_items
    assert as_text != affinity_key("/v1/responses", _body({"model": "m", "input": "Name a colour.",
                                                             "instructions": "Be brief."}))


def test_decisions_that_share_an_input_share_a_key() -> None:
    def decide(text: str, question: str) -> str:
        return affinity_key("/v1/decisions", _body({"model": "m", "input": text, "questions": [
            {"type": "predicate", "name": "q", "instructions": question}]}))

    assert decide("Ticket 1", "Billing?") == decide("Ticket 1", "Refund?") != decide("Ticket 2", "Billing?")
    systemone = affinity_key("/v1/systemone", _body({"model": "m", "state": {"t": 1}, "questions": {}}))
    clef = affinity_key("/accounts/a/ai/run/@cf/cloudflare/clef", _body({"model": "clef", "state": {"t": 1},
                                                                         "questions": {}}))
    assert systemone and clef and systemone != clef


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/embeddings", _body({"model": "m", "input": "x"})),
    ("/v1/chat/completions", b"not json"),
    ("/v1/chat/completions", _body({"model": "m", "messages": [SYSTEM]})),  # no user turn yet
    ("/v1/chat/completions", b""),
])
def test_anything_else_has_no_key(path: str, body: bytes) -> None:
    assert affinity_key(path, body) == ""


# -- the request router ----------------------------------------------------------------------------

DEPLOYMENT = DeploymentID(name="engine", app_name="swama")


@dataclass
class FakeReplica:
    replica_id: ReplicaID
    max_ongoing_requests: int = 100


def _replica(name: str) -> FakeReplica:
    return FakeReplica(ReplicaID(unique_id=name, deployment_id=DEPLOYMENT))


def _pending(key: str) -> PendingRequest:
    return PendingRequest(args=[], kwargs={}, metadata=RequestMetadata(request_id="r", internal_request_id="i",
                                                                       session_id=key))


def test_the_router_keeps_a_key_on_its_replica_and_lets_go_when_it_is_gone_or_far_busier() -> None:
    async def scenario() -> None:
        router = AffinityRouter(DEPLOYMENT, DeploymentHandleSource.UNKNOWN, use_replica_queue_len_cache=True)
        router.initialize_state(max_keys=2, imbalance=3)
        a, b, c = _replica("a"), _replica("b"), _replica("c")
        # No key, or a key never served: one rank of every replica, for the least loaded among them.
        ranks = await router.choose_replicas([a, b, c], _pending("k1"))
        assert len(ranks) == 1 and {r.replica_id.unique_id for r in ranks[0]} == {"a", "b", "c"}
        router.on_request_routed(_pending("k1"), b.replica_id, None)
        ranks = await router.choose_replicas([a, b, c], _pending("k1"))
        assert ranks[0] == [b] and {r.replica_id.unique_id for r in ranks[1]} == {"a", "c"}
        # Far busier than the least loaded: the prefix is not worth the wait.
        router.replica_queue_len_cache.update(b.replica_id, 9)
        router.replica_queue_len_cache.update(a.replica_id, 1)
        assert len(await router.choose_replicas([a, b, c], _pending("k1"))) == 1
        router.replica_queue_len_cache.update(b.replica_id, 3)
        assert (await router.choose_replicas([a, b, c], _pending("k1")))[0] == [b]
        # Its replica gone (dead, or scaled down): back to the least loaded, and the key forgotten.
        assert len(await router.choose_replicas([a, c], _pending("k1"))) == 1
        assert (await router.choose_replicas([a, b, c], _pending("k1")))[0] != [b]
        # The map is bounded: the least recently used key goes first.
        for key, replica in (("k1", a), ("k2", b), ("k3", c)):
            router.on_request_routed(_pending(key), replica.replica_id, None)
        assert len(await router.choose_replicas([a, b, c], _pending("k1"))) == 1
        assert (await router.choose_replicas([a, b, c], _pending("k3")))[0] == [c]

    asyncio.run(scenario())


# -- the replica's ASGI driver ---------------------------------------------------------------------

def _request(path: str = "/v1/x", body: bytes = b"{}") -> ForwardedRequest:
    return ForwardedRequest("POST", path, b"a=1", [(b"content-type", b"application/json")], body, ("127.0.0.1", 5))


async def _collect(items: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in items]


def test_the_driver_passes_the_request_and_streams_the_response() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(path=scope["path"], query=scope["query_string"], body=(await receive())["body"])
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]})
        for part in (b"one ", b"two"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    items = asyncio.run(_collect(run_asgi(app, _request(body=b"hello"))))
    assert items == [ResponseStart(201, [(b"content-type", b"text/plain")]), b"one ", b"two"]
    assert seen == {"path": "/v1/x", "query": b"a=1", "body": b"hello"}


def test_a_caller_that_stops_reading_is_the_app_s_client_disconnecting() -> None:
    events: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        events.append((await receive())["type"])  # waits until the caller goes

    async def scenario() -> None:
        stream = run_asgi(app, _request())
        assert isinstance(await stream.__anext__(), ResponseStart)
        assert await stream.__anext__() == b"first"
        await stream.aclose()

    asyncio.run(scenario())
    assert events == ["http.disconnect"]


def test_an_app_that_fails_mid_response_fails_the_stream() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise ValueError("engine broke")

    with pytest.raises(ValueError, match="engine broke"):
        asyncio.run(_collect(run_asgi(app, _request())))


def test_the_replica_names_itself_on_every_response_and_in_health() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = json.dumps({"status": "ok"}).encode() if scope["path"] == "/health" else b"plain"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    identity = ReplicaIdentity(app, {"id": "abc", "pid": 42, "node": "127.0.0.1"})
    health = asyncio.run(_collect(run_asgi(identity, ForwardedRequest("GET", "/health", b"", [], b""))))
    assert (b"x-swama-replica", b"abc") in health[0].headers
    assert json.loads(health[1]) == {"status": "ok", "replica": {"id": "abc", "pid": 42, "node": "127.0.0.1"}}
    assert health[0].header(b"content-length") == str(len(health[1])).encode()
    other = asyncio.run(_collect(run_asgi(identity, _request())))
    assert (b"x-swama-replica", b"abc") in other[0].headers and other[1:] == [b"plain"]


# -- a failed replica's answer ---------------------------------------------------------------------

def test_a_replica_that_failed_before_answering_is_a_503_in_the_route_s_envelope() -> None:
    openai_body = json.loads(replica_failed("/v1/chat/completions", "its process exited").body)
    assert openai_body["error"]["code"] == "replica_failed" and "its process exited" in openai_body["error"]["message"]
    response = replica_failed("/accounts/a/ai/run/@cf/cloudflare/clef", "its process exited")
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert json.loads(response.body)["success"] is False


def _frames(text: bytes) -> list[tuple[str | None, dict[str, Any] | str]]:
    frames = []
    for frame in text.decode().strip().split("\n\n"):
        event = next((line[7:] for line in frame.split("\n") if line.startswith("event: ")), None)
        data = next(line[6:] for line in frame.split("\n") if line.startswith("data: "))
        frames.append((event, data if data == "[DONE]" else json.loads(data)))
    return frames


def test_a_chat_stream_ends_with_an_error_chunk_and_done() -> None:
    watch = StreamWatch("/v1/chat/completions", b"text/event-stream; charset=utf-8")
    first = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    watch.feed(f"data: {json.dumps(first)}\n\n".encode())
    watch.feed(b'data: {"id": "chatcmpl-1", "choices": []}\n\n')
    (_, chunk), (_, done) = _frames(watch.tail("gone"))
    assert {k: chunk[k] for k in ("id", "object", "created", "model")} == {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}
    assert chunk["choices"][0]["finish_reason"] == "error" and chunk["error"]["code"] == "replica_failed"
    assert done == "[DONE]"


def test_a_responses_stream_ends_with_response_failed_in_sequence() -> None:
    watch = StreamWatch("/v1/responses", b"text/event-stream")
    created = {"type": "response.created", "sequence_number": 0,
               "response": {"id": "resp_1", "status": "in_progress", "output": [], "model": "m"}}
    frames = [f"event: response.created\ndata: {json.dumps(created)}\n\n".encode(),
              b'event: response.in_progress\ndata: {"sequence_number":1}\n\n',
              b'event: response.output_text.delta\ndata: {"sequence_number":2}\n\n']
    # Frames split anywhere across chunks still count once each.
    joined = b"".join(frames)
    for cut in range(0, len(joined), 7):
        watch.feed(joined[cut:cut + 7])
    [(event, failed)] = _frames(watch.tail("gone"))
    assert event == "response.failed" and failed["sequence_number"] == 3
    assert failed["response"]["id"] == "resp_1" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "gone"}


def test_a_body_that_is_no_stream_gets_no_tail() -> None:
    watch = StreamWatch("/v1/embeddings", b"application/json")
    watch.feed(b'{"data": []}')
    assert watch.tail("gone") == b""


# -- the deployment's options ----------------------------------------------------------------------

def test_replica_counts_and_autoscaling_on_queue_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    from swama.handlers.http.settings import ServerSettings
    from swama.handlers.scale import replicas

    monkeypatch.setattr(replicas, "_on_gpus", lambda: False)
    fixed = replicas._engine_options(ServerSettings(replicas=3, batch_rows=8, max_queue=10))
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["max_ongoing_requests"] == 18 and fixed["max_queued_requests"] == 10
    assert fixed["request_router_config"].request_router_kwargs == {"imbalance": 8}
    scaled = replicas._engine_options(ServerSettings(min_replicas=1, max_replicas=4, batch_rows=8))
    assert "num_replicas" not in scaled
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                            "target_ongoing_requests": 8}
    assert replicas._replica_counts(ServerSettings(replicas=9, min_replicas=2, max_replicas=4)) == (4, 2, 4)
    assert replicas._describe(ServerSettings(min_replicas=1, max_replicas=4))[0] == "1 replica (autoscaled 1-4)"
    assert replicas._describe(ServerSettings(replicas=2, ray_address="head:6379")) == (
        "2 replicas", "the Ray cluster at head:6379")


def test_replicas_take_a_gpu_each_or_share_a_local_machine_s_gpus() -> None:
    from swama.handlers.scale.replicas import gpu_share

    assert gpu_share(4, 8, local=True) == 1.0  # enough GPUs: one each
    assert gpu_share(2, 1, local=True) == 0.5  # two engines feed one GPU
    assert gpu_share(3, 1, local=True) == 0.33  # rounded down, so that all three fit
    assert gpu_share(8, 4, local=True) == 0.5
    assert gpu_share(2, 1, local=False) == 1.0  # a cluster may add nodes to place them


def test_a_body_nested_past_the_interpreters_bound_has_no_affinity() -> None:
    """The ingress reads a body's affinity before any replica checks it: JSON nested 100,000 deep has
    none (it raised RecursionError there, a 500), and the replica's own pipeline refuses it with a 400."""
    assert affinity_key("/v1/chat/completions", b'{"model":"m","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}") == ""
