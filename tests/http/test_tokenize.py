"""POST /tokenize and /detokenize without a model: the pinned document they are served from, the
refusals of the generated models in the routes' words, and what the handlers hand the engine."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pydantic
import pytest
import yaml
from conftest import served_schema_accepts
from fastapi import FastAPI
from fastapi.testclient import TestClient

from swama.engine.client import BadInput, NotFound, Task, Tokenized, TokenizeJob
from swama.generated import tokenize_models
from swama.generated.routes import OPERATIONS, router
from swama.handlers.http.errors import ApiError
from swama.handlers.http.openapi import family_for, merged_spec
from swama.handlers.http.pipeline import parse_json_request, resolve, rules_of
from swama.handlers.http.settings import ServerSettings
from swama.handlers.routes.tokenize_wording import refuse_unhandled
from tools.spec import extract as spec_extract
from tools.spec.commands import SPECS
from tools.spec.sources import TOKENIZE_DOCUMENT

TOKENIZE, DETOKENIZE = OPERATIONS["tokenize"], OPERATIONS["detokenize"]
USER = [{"role": "user", "content": "hi"}]
PROMPT = {"model": "m", "prompt": "Hello"}
CHAT = {"model": "m", "messages": USER}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def parse(op: Any, body: dict[str, Any]) -> pydantic.BaseModel:
    return parse_json_request(op, rules_of(resolve(op.handler)), json.dumps(body).encode())


# -- the pinned document ---------------------------------------------------------------------------

def test_the_document_is_ours_and_pinned_with_its_inputs() -> None:
    pins = {p["document"]: p for p in json.loads((SPECS / "pins.json").read_text())}
    pin = pins["tokenize.yaml"]
    assert pin["upstream_repo"] == "vllm-project/vllm" and "Our own document of vLLM's shapes" in pin["note"]
    assert pin["upstream_sha256"] == spec_extract.sha256_of(TOKENIZE_DOCUMENT)
    assert pin["openai_sha256"] == spec_extract.sha256_of(SPECS / "openai.yaml")
    assert pin["overlay"] == "overlays/tokenize.yaml"
    assert pin["operations"] == ["POST /tokenize", "POST /detokenize"]


def test_messages_and_tools_are_the_chat_route_s_own_components() -> None:
    """Copied by name, unchanged: the served document holds one copy, so the two routes cannot
    take different messages (merged_spec refuses a component two documents define differently)."""
    ours = yaml.safe_load((SPECS / "tokenize.yaml").read_text())["components"]["schemas"]
    chat = yaml.safe_load((SPECS / "openai.yaml").read_text())["components"]["schemas"]
    borrowed = {name for name in ours if name in chat}
    assert {"ChatCompletionRequestMessage", "ChatCompletionTool", "ErrorResponse"} <= borrowed
    assert all(ours[name] == chat[name] for name in borrowed)
    own = set(ours) - borrowed
    assert own == {"TokenizeRequest", "TokenizeCompletionRequest", "TokenizeChatRequest", "TokenizeResponse",
                   "DetokenizeRequest", "DetokenizeResponse"}
    chat_form = ours["TokenizeChatRequest"]["properties"]
    assert chat_form["messages"]["items"] == {"$ref": "#/components/schemas/ChatCompletionRequestMessage"}


def test_a_fresh_extraction_gives_the_pinned_document(tmp_path: Any) -> None:
    doc = spec_extract.extract_tokenize(TOKENIZE_DOCUMENT, SPECS / "openai.yaml")
    from tools.spec import overlay as spec_overlay

    spec_overlay.apply_overlay_file(doc, SPECS / "overlays" / "tokenize.yaml")
    spec_extract.add_discriminator_mappings(doc["components"]["schemas"])
    assert spec_extract.dump_yaml(doc) == (SPECS / "tokenize.yaml").read_text()


def test_the_served_document_has_both_routes_and_their_rules() -> None:
    paths = merged_spec()["paths"]
    tokenize, detokenize = paths["/tokenize"]["post"], paths["/detokenize"]["post"]
    assert tokenize["operationId"] == "tokenize" and detokenize["operationId"] == "detokenize"
    assert any("continue_final_message" in rule for rule in tokenize["x-swama-handler-rules"])
    assert any("vocabulary" in rule for rule in detokenize["x-swama-handler-rules"])
    # Refusals come in the OpenAI envelope, as on /v1/chat/completions.
    assert family_for("/tokenize") == family_for("/detokenize") == "openai"
    assert TOKENIZE.error_family == DETOKENIZE.error_family == "openai"


# -- what the generated models refuse, in the routes' words ----------------------------------------

REFUSALS = [
    # op, body, (code, message, param)
    (TOKENIZE, {"prompt": "x"}, ("missing_required_parameter", "Missing required field 'model'.", "model")),
    (TOKENIZE, {"model": "m", "messages": USER, "prompt": "x"},
     ("invalid_value", "Send either 'prompt' (text to tokenize) or 'messages' (a chat to render and tokenize), "
                       "not both.", "messages")),
    (TOKENIZE, {"model": "m"},
     ("missing_required_parameter", "Missing required field: 'prompt' (text to tokenize) or 'messages' (a chat "
                                    "to render and tokenize).", "prompt")),
    (TOKENIZE, {"model": " ", "prompt": "x"}, ("invalid_type", None, "model")),
    (TOKENIZE, {**PROMPT, "prompt": ""},
     ("invalid_type", "Invalid value at 'prompt': String should have at least 1 character.", "prompt")),
    (TOKENIZE, {**PROMPT, "prompt": ["a"]}, ("invalid_type", None, "prompt")),
    (TOKENIZE, {**PROMPT, "add_special_tokens": "yes"}, ("invalid_type", None, "add_special_tokens")),
    (TOKENIZE, {**PROMPT, "add_generation_prompt": False},
     ("unknown_parameter", "Unknown field 'add_generation_prompt'.", "add_generation_prompt")),
    (TOKENIZE, {**CHAT, "messages": []}, ("invalid_value", "Invalid request payload or missing messages", "messages")),
    (TOKENIZE, {**CHAT, "messages": [{"role": "wizard", "content": "x"}]},
     ("invalid_value", "Invalid role: wizard. Must be 'system', 'user', 'assistant', or 'tool'", "messages.0.role")),
    (TOKENIZE, {**CHAT, "tools": [{"type": "function"}]},
     ("invalid_value", "Tools require a name and an object parameter schema.", "tools.0")),
    # vLLM's fields this server does not serve are refused by name, never ignored.
    (TOKENIZE, {**CHAT, "chat_template": "{{ messages }}"},
     ("unsupported_parameter", "'chat_template' is not supported by this server; it is rejected rather than "
                               "ignored.", "chat_template")),
    (TOKENIZE, {**CHAT, "mm_processor_kwargs": {}}, ("unsupported_parameter", None, "mm_processor_kwargs")),
    (TOKENIZE, {**CHAT, "chat_template_kwargs": []}, ("invalid_type", None, "chat_template_kwargs")),
    (DETOKENIZE, {"model": "m", "tokens": []},
     ("invalid_type", "Invalid value at 'tokens': List should have at least 1 item after validation, not 0.", "tokens")),
    (DETOKENIZE, {"model": "m", "tokens": [-1]},
     ("invalid_type", "Invalid value at 'tokens.0': Input should be greater than or equal to 0.", "tokens.0")),
    (DETOKENIZE, {"model": "m", "tokens": [1.5]}, ("invalid_type", None, "tokens.0")),
    (DETOKENIZE, {"model": "m", "tokens": ["1"]}, ("invalid_type", None, "tokens.0")),
    (DETOKENIZE, {"model": "m", "tokens": [2**63]}, ("invalid_type", None, "tokens.0")),
    (DETOKENIZE, {"tokens": [1]}, ("missing_required_parameter", "Missing required field 'model'.", "model")),
    (DETOKENIZE, {"model": "m", "tokens": [1], "prompt": "x"}, ("unknown_parameter", None, "prompt")),
]


@pytest.mark.parametrize(("op", "body", "expected"), REFUSALS)
def test_refusals_are_400s_in_the_route_s_words(op: Any, body: dict[str, Any],
                                                expected: tuple[str, str | None, str]) -> None:
    with pytest.raises(ApiError) as refused:
        parse(op, body)
    code, message, param = expected
    assert (refused.value.status, refused.value.code, refused.value.param) == (400, code, param)
    if message is not None:
        assert refused.value.message == message
    # The served document says so too: a client validating against it never sends these.
    component = "TokenizeRequest" if op is TOKENIZE else "DetokenizeRequest"
    assert not served_schema_accepts(component, body)


ACCEPTED = [
    (PROMPT, tokenize_models.TokenizeCompletionRequest, {"add_special_tokens": True, "return_token_strs": False}),
    ({**PROMPT, "add_special_tokens": False, "return_token_strs": None},
     tokenize_models.TokenizeCompletionRequest, {"add_special_tokens": False, "return_token_strs": None}),
    (CHAT, tokenize_models.TokenizeChatRequest,
     {"add_special_tokens": False, "add_generation_prompt": True, "continue_final_message": False}),
    ({**CHAT, "tools": [TOOL], "chat_template_kwargs": {"enable_thinking": False}, "return_token_strs": True,
      "add_generation_prompt": False, "continue_final_message": True},
     tokenize_models.TokenizeChatRequest, {"add_generation_prompt": False, "continue_final_message": True}),
]


@pytest.mark.parametrize(("body", "form", "values"), ACCEPTED)
def test_each_form_parses_with_vllm_s_defaults(body: dict[str, Any], form: type, values: dict[str, Any]) -> None:
    parsed = parse(TOKENIZE, body).root
    assert type(parsed) is form
    assert {name: getattr(parsed, name) for name in values} == values
    assert served_schema_accepts("TokenizeRequest", body)


def test_a_field_a_form_gains_is_refused_until_the_route_acts_on_it() -> None:
    widened = pydantic.create_model("Widened", __base__=tokenize_models.TokenizeChatRequest,
                                    __module__=tokenize_models.__name__, brand_new=(str | None, None))
    refuse_unhandled(widened.model_validate({**CHAT, "brand_new": None}))  # null: not sent
    with pytest.raises(ApiError) as refused:
        refuse_unhandled(widened.model_validate({**CHAT, "brand_new": "x"}))
    assert refused.value.param == "brand_new" and refused.value.code == "unsupported_parameter"


def test_rules_no_schema_says_are_the_engine_s() -> None:
    with pytest.raises(BadInput, match="^add_generation_prompt and continue_final_message cannot both be true"):
        TokenizeJob(messages=USER, continue_final_message=True).check()
    with pytest.raises(BadInput, match="^chat_template_kwargs may not set 'tokenize'"):
        TokenizeJob(messages=USER, template_kwargs={"enable_thinking": True, "tokenize": True}).check()
    TokenizeJob(messages=USER, add_generation_prompt=False, continue_final_message=True,
                template_kwargs={"enable_thinking": True}).check()


# -- the handlers, over an engine that records what it is asked ------------------------------------

@dataclass(frozen=True)
class Installed:
    id: str
    kind: str = "language"


@dataclass
class RecordingEngine:
    jobs: list[TokenizeJob] = field(default_factory=list)
    detokenized: list[list[int]] = field(default_factory=list)

    def model_for(self, name: str, task: Task) -> Installed:
        assert task is Task.GENERATE
        if name != "smollm2":
            raise NotFound("The model is not available locally.", code="model_not_found")
        return Installed("HuggingFaceTB/SmolLM2-135M-Instruct")

    def require(self, model: Installed, task: Task, name: str | None = None) -> None:
        if task is Task.READ_IMAGES:
            raise BadInput("Images are not supported by this model; it has no vision processor.",
                           code="invalid_image")

    async def tokenize(self, model_id: str, job: TokenizeJob) -> Tokenized:
        job.check()
        self.jobs.append(job)
        return Tokenized([5, 6, 7], ["a", "b", "c"] if job.token_strs else None, 16384)

    async def detokenize(self, model_id: str, ids: list[int]) -> str:
        self.detokenized.append(ids)
        return "text"


@pytest.fixture
def wired() -> tuple[TestClient, RecordingEngine]:
    app = FastAPI()
    app.include_router(router)
    app.state.settings = ServerSettings()
    app.state.engine = engine = RecordingEngine()
    return TestClient(app, base_url="http://localhost"), engine  # a Host the server answers to


def test_completion_form_reaches_the_engine_as_a_prompt(wired: tuple[TestClient, RecordingEngine]) -> None:
    client, engine = wired
    r = client.post("/tokenize", json={"model": "smollm2", "prompt": "Hello", "return_token_strs": True})
    assert r.status_code == 200
    assert r.json() == {"count": 3, "max_model_len": 16384, "tokens": [5, 6, 7], "token_strs": ["a", "b", "c"]}
    (job,) = engine.jobs
    assert (job.prompt, job.add_special_tokens, job.token_strs, job.messages) == ("Hello", True, True, [])


def test_chat_form_reaches_the_engine_as_the_chat_route_converts_it(
        wired: tuple[TestClient, RecordingEngine]) -> None:
    client, engine = wired
    messages = [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Use metric."},
                {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]
    r = client.post("/tokenize", json={"model": "smollm2", "messages": messages, "tools": [TOOL],
                                       "add_generation_prompt": False, "chat_template_kwargs": {"x": 1}})
    assert r.status_code == 200 and r.json()["token_strs"] is None
    (job,) = engine.jobs
    assert job.prompt is None and job.add_special_tokens is False and job.template_kwargs == {"x": 1}
    assert (job.add_generation_prompt, job.continue_final_message) == (False, False)
    # Adjacent system turns merged (developer is system), text parts joined, arguments parsed.
    assert job.messages == [
        {"role": "system", "content": "Be brief.\nUse metric."},
        {"role": "user", "content": "Weather\nin Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C", "tool_call_id": "c1"}]
    assert job.tools == [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.mark.parametrize(("path", "body", "status", "message"), [
    ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "The model is not available locally."),
    ("/detokenize", {"model": "nope", "tokens": [1]}, 404, "The model is not available locally."),
    ("/tokenize", {"model": "smollm2", "messages": USER, "continue_final_message": True}, 400,
     "add_generation_prompt and continue_final_message cannot both be true; set add_generation_prompt to false "
     "to continue the final message."),
    ("/tokenize", {"model": "smollm2", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}, 400,
     "Images are not supported by this model; it has no vision processor."),
    ("/tokenize", {"model": "smollm2", "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}, 400,
     "Tool 'f' requires JSON object arguments or parameters"),
    ("/tokenize", {"model": "smollm2", "prompt": "x", "messages": USER}, 400,
     "Send either 'prompt' (text to tokenize) or 'messages' (a chat to render and tokenize), not both."),
])
def test_refusals_come_in_the_openai_envelope(wired: tuple[TestClient, RecordingEngine], path: str,
                                              body: dict[str, Any], status: int, message: str) -> None:
    client, _ = wired
    r = client.post(path, json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert set(r.json()) == {"error"} and set(error) == {"message", "type", "param", "code"}
    assert error["message"] == message and error["type"] == "invalid_request_error"


def test_detokenize_hands_the_engine_plain_ids(wired: tuple[TestClient, RecordingEngine]) -> None:
    client, engine = wired
    r = client.post("/detokenize", json={"model": "smollm2", "tokens": [1, 2.0, 3]})
    assert r.status_code == 200 and r.json() == {"prompt": "text"}
    assert engine.detokenized == [[1, 2, 3]] and all(type(t) is int for t in engine.detokenized[0])
