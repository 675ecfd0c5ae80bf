"""/v1/decisions request validation (exact messages, Swama's order) and the byte-exact response."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from conftest import served_schema_accepts, stated_handler_rule

from swama.engine.decisions.scorer import DecisionError, ScoredAnswer, answer_from_logprobs
from swama.generated.decisions_models import DecisionCreateRequest, DecisionQuestion
from swama.generated.routes import OPERATIONS
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import parse_json_request, rules_of
from swama.handlers.routes.decisions import (
    check_questions,
    create_decision,
    input_of,
    question_view,
    questions_of,
)
from swama.handlers.routes.decisions_render import render_decision_response
from swama.handlers.routes.decisions_wording import Question

SGLANG_SHAPE = (
    "The SGLang prompt format 1 request shape was removed from /v1/decisions; send the OpenAI Decisions "
    "format (questions with type, name and instructions)."
)
OPTIONS = "Choice questions require 2–255 distinct, valid options."

PREDICATE = {"type": "predicate", "instructions": "Q"}
BASE: dict[str, Any] = {"model": "m", "input": "x", "questions": [PREDICATE]}


def body(**changes: Any) -> bytes:
    request = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is _DROP:
            request.pop(key, None)
        else:
            request[key] = value
    return json.dumps(request, ensure_ascii=False).encode()


_DROP = object()


def option(value: str | bool, description: str | None = None) -> dict[str, Any]:
    return {"value": value} if description is None else {"value": value, "description": description}


def level(label: str, description: str | None = None) -> dict[str, Any]:
    return {"label": label} if description is None else {"label": label, "description": description}


def question(kind: str, name: str | None, instructions: str, choices: Any = (), levels: Any = ()) -> Question:
    """A typed question as the generated model parses it."""
    fields: dict[str, Any] = {"type": kind, "instructions": instructions}
    if name is not None:
        fields["name"] = name
    if kind == "choice":
        fields["choices"] = list(choices)
    if kind == "score":
        fields["levels"] = list(levels)
    return DecisionQuestion.model_validate(fields).root


def with_question(question: dict[str, Any], index: int = 0) -> bytes:
    questions = [dict(PREDICATE) for _ in range(index)] + [question]
    return body(questions=questions)


def choice(*values: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "choice", "instructions": "Q", "choices": [{"value": v} for v in values], **extra}


def score(*labels: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "score", "instructions": "Q", "levels": [{"label": lb} for lb in labels], **extra}


def with_input(value: Any) -> bytes:
    return body(input=value)


def message(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **extra}


def parse_decision_request(raw: bytes) -> DecisionCreateRequest:
    """The route's parse: the pipeline with its rules, then the rules on the typed request."""
    request = parse_json_request(OPERATIONS["createDecision"], rules_of(create_decision), raw)
    assert isinstance(request, DecisionCreateRequest)
    check_questions(questions_of(request))
    return request


def refusal(raw: bytes) -> str:
    with pytest.raises((ApiError, DecisionError)) as caught:
        parse_decision_request(raw)
    assert (caught.value.status, caught.value.type) == (400, "invalid_request_error")
    return caught.value.message


# Every refusal, in Swama's wording ------------------------------------------------------------

REFUSALS: list[tuple[str, bytes, str]] = [
    # body
    ("array-body", b"[]", "Invalid decision request."),
    ("string-body", b'"x"', "Invalid decision request."),
    ("not-json", b"{model: m}", "Invalid decision request."),
    ("trailing-comma", b'{"model":"m",}', "Invalid decision request."),
    ("duplicate-key", b'{"model":"m","model":"n","input":"x","questions":[]}', "Invalid decision request."),
    ("nan", b'{"model":"m","input":"x","questions":[],"n":NaN}', "Invalid decision request."),
    ("lone-surrogate", b'{"model":"m","input":"\\ud800","questions":[]}', "Invalid decision request."),
    ("too-deep", b'{"model":"m","input":' + b"[" * 300 + b"]" * 300 + b"}", "Invalid decision request."),
    # the removed SGLang shape
    ("sglang-id", with_question({"id": "q", "type": "predicate", "instructions": "Q"}), SGLANG_SHAPE),
    ("sglang-question", with_question({"question": "Q?"}), SGLANG_SHAPE),
    ("sglang-options", with_question({"type": "choice", "options": ["a", "b"]}, index=1), SGLANG_SHAPE),
    ("sglang-yes-no", with_question({"type": "yes_no", "instructions": "Q"}), SGLANG_SHAPE),
    (
        "sglang-with-removed-fields",
        body(temperature=1, questions=[{"id": "a", "question": "Q"}]),
        SGLANG_SHAPE,
    ),
    # unknown fields
    ("unknown-temperature", body(temperature=1), "Unknown decision field 'temperature'."),
    (
        "unknown-chat-template-kwargs",
        body(chat_template_kwargs={}),
        "Unknown decision field 'chat_template_kwargs'.",
    ),
    (
        "unknown-prompt-format",
        body(prompt_format_version=1),
        "Unknown decision field 'prompt_format_version'.",
    ),
    (
        "unknown-token-ids",
        body(return_prompt_token_ids=False),
        "Unknown decision field 'return_prompt_token_ids'.",
    ),
    ("unknown-cache-key", body(prompt_cache_key="k"), "Unknown decision field 'prompt_cache_key'."),
    ("unknown-sorted", body(zeta=1, alpha=2, mid=3), "Unknown decision field 'alpha'."),
    ("unknown-before-model", body(model=_DROP, temperature=1), "Unknown decision field 'temperature'."),
    ("unknown-message", with_input([message("x", name="bob")]), "Unknown decision field 'name'."),
    (
        "unknown-text-part",
        with_input([message([{"type": "input_text", "text": "x", "image_url": "u"}])]),
        "Unknown decision field 'image_url'.",
    ),
    (
        "unknown-image-part",
        with_input([message([{"type": "input_image", "image_url": "data:", "file_id": "f"}])]),
        "Unknown decision field 'file_id'.",
    ),
    ("unknown-question", with_question({**PREDICATE, "weight": 1}), "Unknown decision field 'weight'."),
    (
        "unknown-predicate-choices",
        with_question({**PREDICATE, "choices": []}),
        "Unknown decision field 'choices'.",
    ),
    (
        "unknown-choice-levels",
        with_question({**choice("a", "b"), "levels": []}),
        "Unknown decision field 'levels'.",
    ),
    (
        "unknown-choice-entry",
        with_question(
            {"type": "choice", "instructions": "Q", "choices": [{"value": "a", "label": "x"}, {"value": "b"}]}
        ),
        "Unknown decision field 'label'.",
    ),
    (
        "unknown-level-entry",
        with_question(
            {"type": "score", "instructions": "Q", "levels": [{"label": "a"}, {"label": "b", "value": 1}]}
        ),
        "Unknown decision field 'value'.",
    ),
    (
        "unknown-top-level-first",
        body(zz=1, questions=[{**PREDICATE, "aa": 1}]),
        "Unknown decision field 'zz'.",
    ),
    # model
    ("model-missing", body(model=_DROP), "model must be a non-empty string."),
    ("model-empty", body(model=""), "model must be a non-empty string."),
    ("model-blank", body(model="  "), "model must be a non-empty string."),
    ("model-number", body(model=5), "model must be a non-empty string."),
    ("model-null", body(model=None), "model must be a non-empty string."),
    # safety_identifier
    (
        "safety-too-long",
        body(safety_identifier="s" * 129),
        "safety_identifier must be a string of at most 128 characters, or null.",
    ),
    (
        "safety-number",
        body(safety_identifier=5),
        "safety_identifier must be a string of at most 128 characters, or null.",
    ),
    # input
    ("input-missing", body(input=_DROP), "input must be a string or an array of user messages."),
    ("input-number", with_input(5), "input must be a string or an array of user messages."),
    ("input-null", with_input(None), "input must be a string or an array of user messages."),
    ("input-object", with_input({"role": "user"}), "input must be a string or an array of user messages."),
    ("message-string", with_input(["x"]), "input[0] must be a message object."),
    (
        "message-assistant",
        with_input([message("x", role="assistant")]),
        "input[0] role must be user; other roles are not supported.",
    ),
    (
        "message-system",
        with_input([message("x"), message("y", role="system")]),
        "input[1] role must be user; other roles are not supported.",
    ),
    (
        "message-no-role",
        with_input([{"content": "x"}]),
        "input[0] role must be user; other roles are not supported.",
    ),
    ("message-type", with_input([message("x", type="item")]), "input[0] type must be message."),
    ("message-type-null", with_input([message("x", type=None)]), "input[0] type must be message."),
    (
        "content-missing",
        with_input([{"role": "user"}]),
        "input[0] content must be a string or an array of parts.",
    ),
    ("content-number", with_input([message(5)]), "input[0] content must be a string or an array of parts."),
    ("part-string", with_input([message(["x"])]), "input[0].content[0] must be an object."),
    (
        "part-type",
        with_input([message("a"), message([{"type": "input_text", "text": "x"}, {"type": "input_file"}])]),
        "input[1].content[1] type must be input_text or input_image.",
    ),
    (
        "part-no-type",
        with_input([message([{"text": "x"}])]),
        "input[0].content[0] type must be input_text or input_image.",
    ),
    (
        "part-text",
        with_input([message([{"type": "input_text", "text": 5}])]),
        "input[0].content[0] text must be a string.",
    ),
    (
        "part-text-missing",
        with_input([message([{"type": "input_text"}])]),
        "input[0].content[0] text must be a string.",
    ),
    (
        "part-image-url",
        with_input([message([{"type": "input_image", "image_url": {"url": "x"}}])]),
        "input[0].content[0] image_url must be a string.",
    ),
    (
        "part-image-url-missing",
        with_input([message([{"type": "input_image"}])]),
        "input[0].content[0] image_url must be a string.",
    ),
    (
        "part-detail",
        with_input([message([{"type": "input_image", "image_url": "data:", "detail": "medium"}])]),
        "input[0].content[0] detail must be low, high, auto, original, or null.",
    ),
    (
        "part-detail-number",
        with_input([message([{"type": "input_image", "image_url": "data:", "detail": 1}])]),
        "input[0].content[0] detail must be low, high, auto, original, or null.",
    ),
    # questions
    ("questions-missing", body(questions=_DROP), "questions must be an array of 1–200 questions."),
    ("questions-empty", body(questions=[]), "questions must be an array of 1–200 questions."),
    ("questions-object", body(questions={"a": PREDICATE}), "questions must be an array of 1–200 questions."),
    ("questions-201", body(questions=[PREDICATE] * 201), "questions must be an array of 1–200 questions."),
    ("question-string", body(questions=[PREDICATE, "q"]), "questions[1] must be an object."),
    (
        "question-type",
        with_question({"type": "boolean", "instructions": "Q"}),
        "questions[0] type must be predicate, choice, or score.",
    ),
    (
        "question-no-type",
        with_question({"instructions": "Q"}),
        "questions[0] type must be predicate, choice, or score.",
    ),
    (
        "question-name",
        with_question({**PREDICATE, "name": 5}, index=1),
        "questions[1] name must be a string.",
    ),
    ("question-name-null", with_question({**PREDICATE, "name": None}), "questions[0] name must be a string."),
    (
        "instructions-missing",
        with_question({"type": "predicate"}),
        "questions[0] instructions must be a non-empty string.",
    ),
    (
        "instructions-empty",
        with_question({"type": "predicate", "instructions": ""}),
        "questions[0] instructions must be a non-empty string.",
    ),
    (
        "instructions-blank",
        with_question({"type": "predicate", "instructions": " \n"}),
        "questions[0] instructions must be a non-empty string.",
    ),
    (
        "instructions-object",
        with_question({"type": "predicate", "instructions": {"q": 1}}),
        "questions[0] instructions must be a non-empty string.",
    ),
    # choices
    (
        "choices-missing",
        with_question({"type": "choice", "instructions": "Q"}),
        "questions[0] choices must contain 2–255 entries.",
    ),
    ("choices-one", with_question(choice("a")), "questions[0] choices must contain 2–255 entries."),
    (
        "choices-256",
        with_question(choice(*[f"o{i}" for i in range(256)])),
        "questions[0] choices must contain 2–255 entries.",
    ),
    (
        "choices-object",
        with_question({**choice(), "choices": {"a": 1, "b": 2}}),
        "questions[0] choices must contain 2–255 entries.",
    ),
    (
        "choice-entry",
        with_question({**choice(), "choices": [{"value": "a"}, "b"]}),
        "Each choice must be an object.",
    ),
    (
        "choice-value-number",
        with_question(choice("a", 1)),
        "questions[0] choice value must be a string or a boolean.",
    ),
    (
        "choice-value-null",
        with_question(choice("a", None)),
        "questions[0] choice value must be a string or a boolean.",
    ),
    (
        "choice-value-missing",
        with_question({**choice(), "choices": [{"value": "a"}, {}]}),
        "questions[0] choice value must be a string or a boolean.",
    ),
    (
        "choice-description",
        with_question({**choice(), "choices": [{"value": "a", "description": 5}, {"value": "b"}]}),
        "choice description must be a string.",
    ),
    (
        "choice-description-null",
        with_question({**choice(), "choices": [{"value": "a"}, {"value": "b", "description": None}]}),
        "choice description must be a string.",
    ),
    (
        "duplicate-string",
        with_question(choice("a", "b", "a")),
        'questions[0] has the duplicate choice value "a".',
    ),
    (
        "duplicate-boolean",
        with_question(choice(True, False, True)),
        "questions[0] has the duplicate choice value true.",
    ),
    (
        "duplicate-quoted",
        with_question(choice('say "hi"', 'say "hi"')),
        'questions[0] has the duplicate choice value "say \\"hi\\"".',
    ),
    (
        "string-and-boolean-true",
        with_question(choice("true", True)),
        "questions[0] has both the string and the boolean true; they cannot be told apart.",
    ),
    (
        "string-and-boolean-false",
        with_question(choice(False, "false")),
        "questions[0] has both the string and the boolean false; they cannot be told apart.",
    ),
    # levels
    (
        "levels-missing",
        with_question({"type": "score", "instructions": "Q"}),
        "questions[0] levels must contain 2–10 entries.",
    ),
    ("levels-one", with_question(score("a")), "questions[0] levels must contain 2–10 entries."),
    (
        "levels-11",
        with_question(score(*[f"l{i}" for i in range(11)])),
        "questions[0] levels must contain 2–10 entries.",
    ),
    (
        "level-entry",
        with_question({**score(), "levels": [{"label": "a"}, ["b"]]}),
        "Each score level must be an object.",
    ),
    (
        "level-label-missing",
        with_question({**score(), "levels": [{"label": "a"}, {}]}),
        "questions[0] level label must be a non-empty string.",
    ),
    (
        "level-label-blank",
        with_question(score("a", "  ")),
        "questions[0] level label must be a non-empty string.",
    ),
    (
        "level-label-number",
        with_question(score("a", 2)),
        "questions[0] level label must be a non-empty string.",
    ),
    (
        "level-description",
        with_question({**score(), "levels": [{"label": "a"}, {"label": "b", "description": ["x"]}]}),
        "level description must be a string.",
    ),
    # names and option rules
    (
        "duplicate-name",
        body(questions=[{**PREDICATE, "name": "a"}, {**PREDICATE, "name": "b"}, {**PREDICATE, "name": "a"}]),
        "Duplicate question name 'a'.",
    ),
    ("case-duplicate", with_question(choice("Billing", "billing")), OPTIONS),
    ("case-duplicate-boolean", with_question(choice("True", True)), OPTIONS),
    ("padded-duplicate", with_question(choice("a", " a ")), OPTIONS),
    ("control-character", with_question(choice("a\u0007", "b")), OPTIONS),
    ("line-break", with_question(choice("a\nb", "c")), OPTIONS),
    ("line-separator", with_question(choice("a", "b\u2028c")), OPTIONS),
    ("empty-value", with_question(choice("", "b")), OPTIONS),
    ("blank-value", with_question(choice("b", "  ")), OPTIONS),
    ("pair-labels-duplicate", with_question(choice(*[f"o{i}" for i in range(26)], "O3")), OPTIONS),
]


@pytest.mark.parametrize(
    ("raw", "message"), [(raw, msg) for _, raw, msg in REFUSALS], ids=[c for c, _, _ in REFUSALS]
)
def test_refusals(raw: bytes, message: str) -> None:
    assert refusal(raw) == message


# Check order --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (body(model=5, safety_identifier=5, input=5, questions=[]), "model must be a non-empty string."),
        (
            body(safety_identifier=5, input=5, questions=[]),
            "safety_identifier must be a string of at most 128 characters, or null.",
        ),
        (body(input=5, questions=[]), "input must be a string or an array of user messages."),
        (body(questions=[{"type": "x"}, "q"]), "questions[0] type must be predicate, choice, or score."),
        (
            with_question({"type": "choice", "name": 1, "instructions": "", "choices": []}),
            "questions[0] name must be a string.",
        ),
        (
            with_question({"type": "choice", "instructions": "", "choices": []}),
            "questions[0] instructions must be a non-empty string.",
        ),
        (
            with_question({**choice(), "choices": [{"value": "a"}, 5, {"value": "a"}]}),
            "Each choice must be an object.",
        ),
        (
            with_question({**choice(), "choices": [{"value": "a"}, {"value": "a"}, 5]}),
            'questions[0] has the duplicate choice value "a".',
        ),
        (with_question(choice("true", True, "true")), 'questions[0] has the duplicate choice value "true".'),
        (
            body(questions=[{**PREDICATE, "name": "a"}, {**PREDICATE, "name": "a"}, {"type": "x"}]),
            "Duplicate question name 'a'.",
        ),
        (
            body(questions=[choice("A", "a"), {"type": "x"}]),
            "questions[1] type must be predicate, choice, or score.",
        ),
        (
            body(questions=[choice("A", "a"), {**PREDICATE, "name": "n"}, {**PREDICATE, "name": "n"}]),
            "Duplicate question name 'n'.",
        ),
    ],
)
def test_check_order(raw: bytes, message: str) -> None:
    assert refusal(raw) == message


# Accepted limits and shapes --------------------------------------------------------------------


def first_question(raw: bytes) -> Question:
    return questions_of(parse_decision_request(raw))[0]


def test_limits_accepted() -> None:
    assert len(parse_decision_request(body(questions=[PREDICATE] * 200)).questions) == 200
    assert len(first_question(with_question(choice(*[f"o{i}" for i in range(255)]))).choices) == 255
    assert len(first_question(with_question(choice("a", "b"))).choices) == 2
    assert len(first_question(with_question(score(*[f"l{i}" for i in range(10)]))).levels) == 10
    assert len(first_question(with_question(score("a", "b"))).levels) == 2


def test_safety_identifier_counts_unicode_scalars() -> None:
    assert parse_decision_request(body(safety_identifier="😀" * 128)).safety_identifier == "😀" * 128
    assert parse_decision_request(body(safety_identifier=None)).safety_identifier is None
    assert parse_decision_request(body()).safety_identifier is None
    assert refusal(body(safety_identifier="😀" * 129)).startswith("safety_identifier must be")


def test_documented_example_request() -> None:
    raw = (
        b'{"model":"mlx-community/Qwen3.5-0.8B-4bit","input":"My invoice charged me twice.","questions":['
        b'{"type":"predicate","name":"billing","instructions":"Is this a billing issue?"},'
        b'{"type":"choice","name":"team","instructions":"Which team should handle this?","choices":'
        b'[{"value":"billing"},{"value":"technical"},{"value":"sales"}]},'
        b'{"type":"score","name":"urgency","instructions":"How urgent is it?","levels":'
        b'[{"label":"low"},{"label":"medium"},{"label":"high","description":"needs action today"}]},'
        b'{"type":"choice","instructions":"Was the customer charged correctly?",'
        b'"choices":[{"value":true},{"value":false}]}]}'
    )
    request = parse_decision_request(raw)
    assert request.model_dump(mode="json", exclude_unset=True) == json.loads(raw)
    assert input_of(request.input) == ("My invoice charged me twice.", [])
    assert questions_of(request) == [
        question("predicate", "billing", "Is this a billing issue?"),
        question(
            "choice",
            "team",
            "Which team should handle this?",
            choices=(option("billing"), option("technical"), option("sales")),
        ),
        question(
            "score",
            "urgency",
            "How urgent is it?",
            levels=(level("low"), level("medium"), level("high", "needs action today")),
        ),
        question(
            "choice",
            None,
            "Was the customer charged correctly?",
            choices=(option(True), option(False)),
        ),
    ]


def test_openai_sdk_body() -> None:
    raw = (
        b'{"model":"m","input":"I was charged twice.","questions":[{"type":"predicate","name":"billing",'
        b'"instructions":"The message is about billing."},{"type":"choice","name":"tone",'
        b'"instructions":"Tone?","choices":[{"value":"calm"},{"value":"angry","description":"upset"},'
        b'{"value":true}]},{"type":"score","name":"urgency","instructions":"How urgent?",'
        b'"levels":[{"label":"low"},{"label":"high","description":"today"}]}]}'
    )
    questions = questions_of(parse_decision_request(raw))
    tone = questions[1]
    assert [c.value.root for c in tone.choices] == ["calm", "angry", True]
    assert question_view(tone).option_details == ("", "upset", "")
    assert question_view(questions[2]).option_details == ("low", "high: today")


def test_message_input_joins_texts_and_keeps_images() -> None:
    raw = with_input(
        [
            message("first"),
            message(
                [
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
                    {"type": "input_text", "text": "second"},
                    {"type": "input_image", "image_url": "https://example.com/x.png"},
                ],
                type="message",
            ),
            message([{"type": "input_text", "text": ""}]),
        ]
    )
    text, images = input_of(parse_decision_request(raw).input)
    assert text == "first\nsecond\n"
    assert [(image.field, image.url, image.detail) for image in images] == [
        ("input[1].content[0]", "data:image/png;base64,AAAA", "low"),
        ("input[1].content[2]", "https://example.com/x.png", None),
    ]


@pytest.mark.parametrize("detail", ["low", "high", "auto", "original", None])
def test_image_details_accepted(detail: str | None) -> None:
    part = {"type": "input_image", "image_url": "data:", "detail": detail}
    (image,) = input_of(parse_decision_request(with_input([message([part])])).input)[1]
    assert image.detail == detail


def test_blank_and_empty_inputs_are_allowed() -> None:
    for value, text in (("", ""), ("  ", "  "), ([], ""), ([message([])], "")):
        assert input_of(parse_decision_request(with_input(value)).input)[0] == text


def test_the_option_names_refusal_states_the_accepted_count() -> None:
    # 255 choices are accepted, pair labels or not: the refusal says so, not the 26 letters or 676 pairs.
    values = [f"o{i}" for i in range(254)]
    assert len(first_question(with_question(choice(*values, "last"))).choices) == 255
    for bad in ("O3", " o7 ", "", "x\ty"):
        assert refusal(with_question(choice("o3", "o7", bad))) == OPTIONS
        assert refusal(with_question(choice(*values, bad))) == OPTIONS


def test_duplicate_choice_values_are_a_stated_rule() -> None:
    """Choice values are distinct. The served document says it where JSON Schema can (uniqueItems:
    no two equal entries); the same value with another description passes the schema and is refused
    by a rule the overlay lists as handler-only."""
    duplicate = 'questions[0] has the duplicate choice value "a".'
    equal = {**choice(), "choices": [option("a"), option("a")]}
    described = {**choice(), "choices": [option("a"), option("a", "again")]}
    assert not served_schema_accepts("DecisionChoiceQuestion", equal)
    assert served_schema_accepts("DecisionChoiceQuestion", described)
    assert refusal(with_question(equal)) == refusal(with_question(described)) == duplicate
    assert stated_handler_rule("createDecision", duplicate)
    assert served_schema_accepts("DecisionChoiceQuestion", {**choice(), "choices": [option("a"), option(True)]})
    first_question(with_question(choice("a", True)))


def test_unnamed_questions_may_repeat_and_names_are_kept() -> None:
    request = parse_decision_request(body(questions=[PREDICATE, PREDICATE, {**PREDICATE, "name": ""}]))
    assert [q.name for q in questions_of(request)] == [None, None, ""]


def test_more_than_26_distinct_choices_are_accepted() -> None:
    assert len(first_question(with_question(choice(*[f"o{i}" for i in range(27)], True))).choices) == 28


def test_strings_are_kept_verbatim() -> None:
    request = parse_decision_request(
        body(input="  in\tput ", questions=[{"type": "predicate", "instructions": " Q? ", "name": " n "}])
    )
    (only,) = questions_of(request)
    assert (request.input, only.instructions, only.name) == ("  in\tput ", " Q? ", " n ")


# Response -----------------------------------------------------------------------------------


def _answer(kind: str, probabilities: list[float], **fields: Any) -> ScoredAnswer:
    values = {"choice_index": 0, "score": None, "confidence": None, "mass": 1.0, **fields}
    return ScoredAnswer(kind=kind, probabilities=tuple(probabilities), **values)  # type: ignore[arg-type]


GOLDEN = (
    b'{"model":"org/model","answers":[{"type":"predicate","name":null,"probability":0.8},'
    b'{"type":"choice","name":"c","choice":false,"probabilities":[{"value":true,"probability":0.25},'
    b'{"value":false,"probability":0.5},{"value":"maybe","probability":0.25}],"confidence":0.25},'
    b'{"type":"score","name":"s","score":1.0,"probabilities":[{"value":0,"label":"low","probability":0.75},'
    b'{"value":1,"label":"high","probability":0.25}],"confidence":0.5}],"usage":{"input_tokens":42,'
    b'"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0},"output_tokens":0,'
    b'"output_tokens_details":{"reasoning_tokens":0},"total_tokens":42}}'
)


def test_wire_golden() -> None:
    answers = [
        (question("predicate", None, "Q"), _answer("yes_no", [0.8, 0.2])),
        (
            question(
                "choice",
                "c",
                "Q",
                choices=(option(True), option(False), option("maybe")),
            ),
            _answer("choice", [0.25, 0.5, 0.25], choice_index=1, confidence=0.25),
        ),
        (
            question("score", "s", "Q", levels=(level("low"), level("high", "now"))),
            _answer("score", [0.75, 0.25], score=1, confidence=0.5),
        ),
    ]
    assert render_decision_response("org/model", answers, 42) == GOLDEN


def test_documented_example_response() -> None:
    documented_formatted = """{"model":"mlx-community/Qwen3.5-0.8B-4bit","answers":[
  {"type":"predicate","name":"billing","probability":0.8175744761936437},
  {"type":"choice","name":"team","choice":"billing","probabilities":[{"value":"billing","probability":0.9478362250325003},{"value":"technical","probability":0.047189986937231164},{"value":"sales","probability":0.004973788030268673}],"confidence":0.9217543375487502},
  {"type":"score","name":"urgency","score":1.922966354728045,"probabilities":[{"value":0,"label":"low","probability":0.015163456120649954},{"value":1,"label":"medium","probability":0.04670673303065524},{"value":2,"label":"high","probability":0.9381298108486948}],"confidence":0.8844495320920672},
  {"type":"choice","name":null,"choice":true,"probabilities":[{"value":true,"probability":0.5621765008857981},{"value":false,"probability":0.4378234991142019}],"confidence":0.12435300177159614}],
 "usage":{"input_tokens":184,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0},"output_tokens":0,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":184}}"""  # noqa: E501
    from swama.engine.decisions.scorer import choice_confidence, expected_score, score_confidence

    team_p = [0.9478362250325003, 0.047189986937231164, 0.004973788030268673]
    urgency_p = [0.015163456120649954, 0.04670673303065524, 0.9381298108486948]
    bool_p = [0.5621765008857981, 0.4378234991142019]
    answers = [
        (
            question("predicate", "billing", "Q"),
            _answer("yes_no", [0.8175744761936437, 0.1824255238063563]),
        ),
        (
            question(
                "choice",
                "team",
                "Q",
                choices=tuple(option(v) for v in ("billing", "technical", "sales")),
            ),
            _answer("choice", team_p, confidence=choice_confidence(team_p)),
        ),
        (
            question(
                "score",
                "urgency",
                "Q",
                levels=(
                    level("low"),
                    level("medium"),
                    level("high", "needs action today"),
                ),
            ),
            _answer(
                "score",
                urgency_p,
                choice_index=2,
                score=expected_score(urgency_p),
                confidence=score_confidence(urgency_p),
            ),
        ),
        (
            question("choice", None, "Q", choices=(option(True), option(False))),
            _answer("choice", bool_p, confidence=choice_confidence(bool_p)),
        ),
    ]
    assert (
        render_decision_response("mlx-community/Qwen3.5-0.8B-4bit", answers, 184)
        == documented_formatted.replace("\n", "").replace("  {", "{").replace(' "usage"', '"usage"').encode()
    )


def test_scored_answers_render_in_request_order() -> None:
    typed = question("choice", "ü", "Q", choices=(option("b"), option("a")))
    answer = answer_from_logprobs("choice", [math.log(0.1), math.log(0.3)])
    wire = json.loads(render_decision_response("m", [(typed, answer)], 7))
    assert wire["answers"][0]["choice"] == "a"
    assert [p["value"] for p in wire["answers"][0]["probabilities"]] == ["b", "a"]
    assert render_decision_response("m", [(typed, answer)], 7).startswith(
        b'{"model":"m","answers":[{"type":"choice","name":"\xc3\xbc"'
    )


@pytest.mark.parametrize(
    ("question", "answer", "message"),
    [
        (
            question("predicate", None, "Q"),
            _answer("yes_no", [math.nan, 0.5]),
            "The model returned an invalid decision answer.",
        ),
        (
            question("predicate", None, "Q"),
            _answer("yes_no", [1.0]),
            "The model returned an invalid decision answer.",
        ),
        (
            question("predicate", None, "Q"),
            _answer("choice", [0.5, 0.5], confidence=0),
            "The model returned an invalid decision answer.",
        ),
        (
            question("choice", None, "Q", choices=(option("a"), option("b"))),
            _answer("choice", [0.2, 0.3, 0.5], confidence=0.1),
            "The model returned an invalid choice answer.",
        ),
        (
            question("choice", None, "Q", choices=(option("a"), option("b"))),
            _answer("choice", [0.5, 0.5], confidence=math.inf),
            "The model returned an invalid choice answer.",
        ),
        (
            question("choice", None, "Q", choices=(option("a"), option("b"))),
            _answer("choice", [0.5, 0.5], confidence=0.0, choice_index=2),
            "The model returned an invalid choice answer.",
        ),
        (
            question("score", None, "Q", levels=(level("a"), level("b"))),
            _answer("score", [0.5, 0.5], score=math.nan, confidence=0.0),
            "The model returned an invalid score answer.",
        ),
        (
            question("score", None, "Q", levels=(level("a"), level("b"))),
            _answer("score", [0.5], score=0.0, confidence=0.0),
            "The model returned an invalid score answer.",
        ),
    ],
)
def test_invalid_answers_are_server_errors(
    question: Question, answer: ScoredAnswer, message: str
) -> None:
    with pytest.raises(DecisionError) as caught:
        render_decision_response("m", [(question, answer)], 1)
    assert (caught.value.status, caught.value.message, caught.value.type) == (500, message, "server_error")

