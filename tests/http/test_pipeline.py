"""The request pipeline every route takes (handlers/http/pipeline.py), checked on the real routes."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pydantic
import pytest

from swama.generated.routes import OPERATIONS
from swama.handlers import routes
from swama.handlers.http import forms, pipeline
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import parse_json_request, resolve, rules_of, validate

ROUTES = Path(routes.__file__).parent
BODY_OPERATIONS = [op for op in OPERATIONS.values() if op.request_model is not None]


@pytest.mark.parametrize("op", BODY_OPERATIONS, ids=lambda op: op.operation_id)
def test_every_route_says_which_fields_it_acts_on(op: pipeline.Operation) -> None:
    rules = rules_of(resolve(op.handler))
    assert rules.handled is not None, f"{op.operation_id} would take any field a spec change adds"
    fields = set(op.request_model.model_fields)
    assert rules.handled <= fields, f"{op.operation_id} lists fields its model lacks: {rules.handled - fields}"


@pytest.mark.parametrize("op", BODY_OPERATIONS, ids=lambda op: op.operation_id)
def test_every_handler_takes_its_generated_model(op: pipeline.Operation) -> None:
    handler = resolve(op.handler)
    hints = inspect.get_annotations(handler, eval_str=True)
    second = list(inspect.signature(handler).parameters)[1]  # (call, <the typed request>)
    assert hints[second] is op.request_model, (op.operation_id, hints)


def test_no_handler_reads_the_raw_body() -> None:
    """After the pipeline's raw checks, handlers work on typed models: nobody parses `call.body`."""
    for path in sorted(ROUTES.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "body" and isinstance(node.value, ast.Name) \
                    and node.value.id == "call":
                pytest.fail(f"{path.name}:{node.lineno} reads call.body")


def test_a_field_the_model_accepts_but_the_route_does_not_act_on_is_refused() -> None:
    op = OPERATIONS["createChatCompletion"]
    rules = rules_of(resolve(op.handler))

    # What a spec change that adds an optional field would generate.
    widened = pydantic.create_model("Widened", __base__=op.request_model,
                                    __module__=op.request_model.__module__, brand_new=(str | None, None))

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert validate(widened, rules, body).model == "m"
    with pytest.raises(ApiError) as refused:
        validate(widened, rules, {**body, "brand_new": "x"})
    assert refused.value.status == 400 and refused.value.param == "brand_new"
    assert "not supported by this server" in refused.value.message
    # An explicit null means "not sent".
    assert validate(widened, rules, {**body, "brand_new": None}).model == "m"


@pytest.mark.parametrize("op", [op for op in BODY_OPERATIONS if op.media_type == "application/json"],
                         ids=lambda op: op.operation_id)
@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'{"a": 1, "a": 2}', b'{"x": NaN}', b'"\\ud800"'])
def test_raw_checks_come_first_on_every_json_route(op: pipeline.Operation, body: bytes) -> None:
    rules = rules_of(resolve(op.handler))
    with pytest.raises(Exception) as refused:
        parse_json_request(op, rules, body)
    assert getattr(refused.value, "status", None) == 400, refused.value
    assert not isinstance(refused.value, pydantic.ValidationError)


def test_form_fields_are_typed_from_the_model() -> None:
    """Multipart text fields become the JSON types the model declares, then the model parses them."""
    op = OPERATIONS["createTranscription"]
    kinds = forms._form_kinds(op.request_model)
    assert "number" in kinds["temperature"] and "string" in kinds["model"]
    assert forms._form_value("0.5", kinds["temperature"]) == 0.5
    assert forms._form_value("x", kinds["temperature"]) == "x"  # the model refuses it
    assert forms._form_value("null", kinds["chunking_strategy"]) is None
    assert forms._form_value("0.5", kinds["model"]) == "0.5"  # text stays text
    # JSON nested past the depth limit, or past Python's recursion bound, stays text for the model to
    # refuse (it raised RecursionError, a 500).
    for depth in (300, 100_000):
        deep = '{"a":' * depth + "1" + "}" * depth
        assert forms._form_value(deep, kinds["chunking_strategy"]) == deep


def test_the_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key a request sends, as a bearer token or Anthropic's x-api-key, is compared with
    hmac.compare_digest (whose time does not depend on where the strings part), never with ==."""
    from starlette.requests import Request

    from swama.handlers.http.settings import ServerSettings

    compared: list[tuple[bytes, bytes]] = []
    real = pipeline.hmac.compare_digest
    monkeypatch.setattr(pipeline.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    settings = ServerSettings(api_key="sekrit")

    def check(operation: str, **headers: str) -> bool:
        raw = [(k.replace("_", "-").encode(), v.encode("latin-1")) for k, v in headers.items()]
        request = Request({"type": "http", "method": "POST", "path": "/", "headers": raw})
        try:
            pipeline._check_key(OPERATIONS[operation], request, settings)
            return True
        except ApiError as err:
            assert err.status == 401
            return False

    assert check("createChatCompletion", authorization="Bearer sekrit")
    assert not check("createChatCompletion", authorization="Bearer sekriT")
    assert not check("createChatCompletion", authorization="Bearer s\xe9krit")  # not ASCII: refused, no error
    assert check("createMessage", x_api_key="sekrit")
    assert not check("createMessage", x_api_key="wrong")
    assert (b"Bearer sekriT", b"Bearer sekrit") in compared and (b"wrong", b"sekrit") in compared
