"""/v1/responses on a live server with real SmolLM2 weights: the openai SDK and the Codex CLI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from live_server import LiveServer, npm_binary, start_server
from swama.generated import openai_models as om

pytestmark = pytest.mark.slow

SMOL = "smollm2"
CODEX_VERSION = "0.171.0"


@pytest.fixture(scope="module")
def client(model_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=model_server.v1, api_key="sk-local", max_retries=0, timeout=300)


def test_non_streaming_response(client: openai.OpenAI, model_server: LiveServer) -> None:
    r = client.responses.create(model=SMOL, input="What is the capital of France?", temperature=0,
                                max_output_tokens=30, instructions="Answer in one sentence.")
    assert "Paris" in r.output_text and r.status == "completed" and r.id.startswith("resp_")
    assert r.usage.input_tokens > 10 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    raw = httpx.post(model_server.v1 + "/responses", timeout=300, json={
        "model": SMOL, "input": "Say hi.", "max_output_tokens": 3}).json()
    om.Response.model_validate(raw)
    assert raw["status"] == "incomplete" and raw["incomplete_details"] == {"reason": "max_output_tokens"}


def parse_sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_streaming_events_validate_and_count_up(model_server: LiveServer) -> None:
    r = httpx.post(model_server.v1 + "/responses", timeout=300, json={
        "model": SMOL, "input": [{"role": "developer", "content": "Be brief."},
                                 {"role": "user", "content": [{"type": "input_text", "text": "Capital of France?"}]}],
        "stream": True, "temperature": 0, "max_output_tokens": 30})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in r.text
    events = parse_sse(r.text)
    for name, payload in events:
        assert payload["type"] == name
        om.ResponseStreamEvent.model_validate(payload)
    assert [p["sequence_number"] for _, p in events] == list(range(len(events)))
    names = [n for n, _ in events]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    text = "".join(p["delta"] for n, p in events if n == "response.output_text.delta")
    assert "Paris" in text and events[-1][1]["response"]["output"][0]["content"][0]["text"] == text


def test_sdk_streaming(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=SMOL, input="What is the capital of France?", temperature=0,
                                          instructions="Answer in one sentence.", max_output_tokens=40,
                                          stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed",
                                                                        "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert "Paris" in text and events[-1].response.output_text == text


def test_function_call_round_trip(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": False}]
    r = client.responses.create(model=SMOL, tools=tools, temperature=0, max_output_tokens=60, input=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 degrees and sunny"},
    ])
    assert r.status in ("completed", "incomplete")
    assert r.tools[0].name == "get_weather" and r.parallel_tool_calls is True
    calls = [item for item in r.output if item.type == "function_call"]
    for call in calls:
        assert call.name == "get_weather" and isinstance(json.loads(call.arguments), dict)
    assert r.output_text or calls


@pytest.mark.parametrize(("body", "code"), [
    ({"store": True}, "unsupported_parameter"),
    ({"previous_response_id": "resp_1"}, "unsupported_parameter"),
    ({"metadata": {}}, "unsupported_parameter"),
    ({"tools": [{"type": "namespace", "name": "multi_agent_v1"}]}, "unsupported_parameter"),
    ({"input": [{"role": "user", "content": [{"type": "input_image",
                                              "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}, "invalid_image"),
    ({"temperature": "hot"}, "invalid_value"),
])
def test_refusals(model_server: LiveServer, body: dict, code: str) -> None:
    r = httpx.post(model_server.v1 + "/responses", timeout=60, json={"model": SMOL, "input": "hi", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] is None


def test_nothing_is_stored(model_server: LiveServer) -> None:
    for method, path in (("GET", "/responses/resp_123"), ("DELETE", "/responses/resp_123"),
                         ("POST", "/responses/resp_123/cancel")):
        r = httpx.request(method, model_server.v1 + path)
        assert r.status_code == 404 and "not stored" in r.json()["error"]["message"]


@pytest.fixture(scope="session")
def codex(model_cache_dir: Path) -> Path:
    """The Codex CLI from npm, installed into the test cache (a failure here is a set-up failure)."""
    return npm_binary(model_cache_dir.parent / "codex", f"@openai/codex@{CODEX_VERSION}", "codex")


def test_codex_cli_end_to_end(codex: Path, model_store: Path, tmp_path: Path) -> None:
    # Codex sends no output limit; the cap keeps a rambling 135M model from running for many minutes.
    server = start_server(model_store, tmp_path / "server.log", "smollm2", "--max-tokens", "64")
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "smollm2"\nmodel_provider = "localmlx"\n'
        # Codex's own instructions (18 KB, two thirds of its prompt) replaced by a line: its prompt
        # still carries its tools, permissions and environment, and the prefill on a CPU core halves.
        f'model_instructions_file = "{home / "instructions.md"}"\n'
        "[model_providers.localmlx]\n"
        'name = "Local MLX server"\n'
        f'base_url = "{server.v1}"\n'
        'wire_api = "responses"\n'
        'env_key = "LOCALMLX_API_KEY"\n')
    (home / "instructions.md").write_text("You are Codex, a coding agent. Answer the user briefly.\n")
    # Codex is a Node.js program; the OpenBLAS preload meant for MLX breaks Node's thread start-up.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        out = subprocess.run(
            [str(codex), "exec", "--skip-git-repo-check", "-s", "read-only", "--disable", "multi_agent",
             "Reply with PONG"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path, stdin=subprocess.DEVNULL,
            env={**env, "CODEX_HOME": str(home), "LOCALMLX_API_KEY": "sk-local"})
    finally:
        server.stop()
    text = out.stdout + out.stderr
    errors = [line for line in text.splitlines() if line.startswith("ERROR")]
    # The turn completed and Codex printed the model's answer. A reply cut at the server's cap is
    # reported by Codex as an incomplete response (exit 1); any other error fails the test.
    assert out.returncode == 0 or (out.returncode == 1 and errors and all(
        "Incomplete response returned, reason: max_output_tokens" in e for e in errors)), text[-3000:]
    # The transcript shows the model's answer under a `codex` line (and stdout repeats it on success).
    lines = out.stderr.splitlines()
    assert "codex" in lines and lines[lines.index("codex") + 1].strip(), text[-3000:]
    assert out.returncode != 0 or out.stdout.strip()
    assert "tokens used" in text
