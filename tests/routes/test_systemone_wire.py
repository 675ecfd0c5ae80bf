"""/v1/systemone request validation (exact messages, Swama's order), the response and error bodies."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from conftest import served_schema_accepts
from precision import F64_ARITHMETIC

from swama.engine.decisions.scorer import (
    DecisionError,
    ScoredAnswer,
    answer_from_logprobs,
    build_content,
    labels_for,
    render_text,
)
from swama.generated.routes import OPERATIONS
from swama.generated.systemone_models import SystemOneQuestion, SystemOneRequest
from swama.handlers.http.body import BODY_LIMITS
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import parse_json_request, rules_of
from swama.handlers.routes import decisions as decisions_route
from swama.handlers.routes.decisions import create_decision
from swama.handlers.routes.systemone import check_questions, create_system_one, question_view, questions_of
from swama.handlers.routes.systemone_render import render_systemone_response
from swama.handlers.routes.systemone_wording import Question

MAX_BODY_BYTES = 13 * 1024 * 1024
BLANK = (
    "Non-empty instructions are required on this decision backend. Supported bounds: a choice needs at least "
    "two options; a score takes 2 to 10 levels."
)
OPTIONS = "Choice questions require 2–255 distinct, valid options."

NOUL = {"type": "noul", "instructions": "Is it?"}
BASE: dict[str, Any] = {"model": "m", "state": "s", "questions": {"q": NOUL}}
_DROP = object()


def body(**changes: Any) -> bytes:
    request = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is _DROP:
            request.pop(key, None)
        else:
            request[key] = value
    return json.dumps(request, ensure_ascii=False).encode()


def with_question(question: Any) -> bytes:
    return body(questions={"q": question})


def choice(criteria: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "choice", "instructions": "Which?", "criteria": criteria, **extra}


def score(criteria: Any) -> dict[str, Any]:
    return {"type": "score", "instructions": "How much?", "criteria": criteria}


def options(count: int) -> dict[str, None]:
    return {f"option {i}": None for i in range(count)}


def parse_systemone_request(raw: bytes) -> SystemOneRequest:
    """The route's parse: the pipeline with its rules, then the rule on the typed questions."""
    request = parse_json_request(OPERATIONS["createSystemOne"], rules_of(create_system_one), raw)
    assert isinstance(request, SystemOneRequest)
    check_questions(questions_of(request))
    return request


def questions(raw: bytes) -> list[tuple[str, Question]]:
    return questions_of(parse_systemone_request(raw))


def typed(question: dict[str, Any]) -> Question:
    return SystemOneQuestion.model_validate(question).root


def refusal(raw: bytes, status: int = 400) -> str:
    with pytest.raises((ApiError, DecisionError)) as caught:
        parse_systemone_request(raw)
    assert (caught.value.status, caught.value.type) == (status, "invalid_request_error")
    return caught.value.message


# Every refusal, in Swama's wording ------------------------------------------------------------

REFUSALS: list[tuple[str, bytes, str]] = [
    # JSON
    ("trailing-comma", b'{"model":"m",}', "Invalid SystemOne request."),
    ("lone-surrogate", b'{"model":"m","state":"\\udc00","questions":{}}', "Invalid SystemOne request."),
    ("nan", b'{"model":"m","state":NaN}', "Invalid SystemOne request."),
    ("empty", b"", "Invalid SystemOne request."),
    ("not-utf8", b'{"model":"\xff"}', "Invalid SystemOne request."),
    (
        "duplicate-top",
        b'{"model":"m","model":"n","state":"s","questions":{}}',
        "Duplicate SystemOne object key 'model'.",
    ),
    (
        "duplicate-escaped",
        b'{"model":"m","state":"s","questions":{"q":{"type":"choice","instructions":"i",'
        b'"criteria":{"a":1,"\\u0061":2}}}}',
        "Duplicate SystemOne object key 'a'.",
    ),
    (
        "duplicate-question-id",
        b'{"model":"m","state":"s","questions":{"q":{},"q":{}}}',
        "Duplicate SystemOne object key 'q'.",
    ),
    (
        "too-deep",
        b'{"model":"m","state":' + b"[" * 300 + b"]" * 300 + b"}",
        "SystemOne JSON is nested too deeply.",
    ),
    ("root-array", b"[]", "The SystemOne request must be an object."),
    ("root-string", b'"x"', "The SystemOne request must be an object."),
    # top level
    ("model-missing", body(model=_DROP), "model must be a non-empty string."),
    ("model-empty", body(model=""), "model must be a non-empty string."),
    ("model-number", body(model=1), "model must be a non-empty string."),
    ("state-missing", body(state=_DROP), "state must be text, an object, or an array."),
    ("state-null", body(state=None), "state must be text, an object, or an array."),
    ("state-number", body(state=1.5), "state must be text, an object, or an array."),
    ("state-boolean", body(state=True), "state must be text, an object, or an array."),
    ("questions-missing", body(questions=_DROP), "questions must be a non-empty map."),
    ("questions-empty", body(questions={}), "questions must be a non-empty map."),
    ("questions-array", body(questions=[NOUL]), "questions must be a non-empty map."),
    ("temperature", body(temperature=1), "temperature is not part of this API; use /v1/decisions for it."),
    (
        "temperature-false",
        body(temperature=False),
        "temperature is not part of this API; use /v1/decisions for it.",
    ),
    (
        "prompt-format-version",
        body(prompt_format_version=1),
        "prompt_format_version is not part of this API; use /v1/decisions for it.",
    ),
    (
        "return-prompt-token-ids",
        body(return_prompt_token_ids=False),
        "return_prompt_token_ids is not part of this API; use /v1/decisions for it.",
    ),
    (
        "video",
        body(video="data:video/mp4;base64,AAAA"),
        "video is not supported on this backend; send images instead.",
    ),
    ("video-empty-list", body(video=[]), "video is not supported on this backend; send images instead."),
    ("kwargs-string", body(chat_template_kwargs="x"), "chat_template_kwargs must be an object."),
    ("kwargs-array", body(chat_template_kwargs=[]), "chat_template_kwargs must be an object."),
    (
        "kwargs-unknown",
        body(chat_template_kwargs={"tools": [], "enable_thinking": False, "a": 1}),
        "Unknown chat_template_kwargs field 'a'.",
    ),
    (
        "kwargs-thinking-true",
        body(chat_template_kwargs={"enable_thinking": True}),
        "Decisions require enable_thinking=false.",
    ),
    (
        "kwargs-thinking-null",
        body(chat_template_kwargs={"enable_thinking": None}),
        "Decisions require enable_thinking=false.",
    ),
    (
        "kwargs-thinking-string",
        body(chat_template_kwargs={"enable_thinking": "false"}),
        "Decisions require enable_thinking=false.",
    ),
    (
        "kwargs-thinking-zero",
        body(chat_template_kwargs={"enable_thinking": 0}),
        "Decisions require enable_thinking=false.",
    ),
    # question keys
    ("question-string", with_question("noul"), "question 'q' must be an object."),
    ("question-unknown", with_question({**NOUL, "name": "n"}), "Unknown question 'q' field 'name'."),
    (
        "question-unknown-sorted",
        with_question({**NOUL, "zeta": 1, "alpha": 1}),
        "Unknown question 'q' field 'alpha'.",
    ),
    ("type-missing", with_question({"instructions": "x"}), "question 'q' type must be a non-empty string."),
    (
        "type-empty",
        with_question({"type": "", "instructions": "x"}),
        "question 'q' type must be a non-empty string.",
    ),
    (
        "type-number",
        with_question({"type": 1, "instructions": "x"}),
        "question 'q' type must be a non-empty string.",
    ),
    # instructions
    (
        "instructions-number",
        with_question({"type": "noul", "instructions": 5}),
        "instructions must be text, an object, an array, or null.",
    ),
    (
        "instructions-boolean",
        with_question({"type": "noul", "instructions": True}),
        "instructions must be text, an object, an array, or null.",
    ),
    ("instructions-missing", with_question({"type": "noul"}), BLANK),
    ("instructions-null", with_question({"type": "noul", "instructions": None}), BLANK),
    ("instructions-empty", with_question({"type": "noul", "instructions": ""}), BLANK),
    ("instructions-whitespace", with_question({"type": "noul", "instructions": " \n\t"}), BLANK),
    ("instructions-empty-object", with_question({"type": "choice", "instructions": {}}), BLANK),
    ("instructions-empty-array", with_question({"type": "score", "instructions": []}), BLANK),
    # question type
    (
        "type-yes-no",
        with_question({"type": "yes_no", "instructions": "x"}),
        "Question type must be noul, choice, or score.",
    ),
    (
        "type-predicate",
        with_question({"type": "predicate", "instructions": "x"}),
        "Question type must be noul, choice, or score.",
    ),
    (
        "type-box",
        with_question({"type": "box", "instructions": "x", "criteria": {}}),
        "Question type must be noul, choice, or score.",
    ),
    # noul criteria
    ("noul-criteria-string", with_question({**NOUL, "criteria": "yes"}), "noul criteria must be an object."),
    ("noul-criteria-array", with_question({**NOUL, "criteria": []}), "noul criteria must be an object."),
    (
        "noul-criteria-unknown",
        with_question({**NOUL, "criteria": {"true": "a", "yes": 1, "no": 2}}),
        "Unknown noul criteria field 'no'.",
    ),
    (
        "noul-criteria-yes",
        with_question({**NOUL, "criteria": {"yes": "a"}}),
        "Unknown noul criteria field 'yes'.",
    ),
    (
        "noul-true-number",
        with_question({**NOUL, "criteria": {"true": 1}}),
        "criteria.true must be text, an object, an array, or null.",
    ),
    (
        "noul-false-boolean",
        with_question({**NOUL, "criteria": {"true": "a", "false": False}}),
        "criteria.false must be text, an object, an array, or null.",
    ),
    # choice criteria
    (
        "choice-criteria-missing",
        with_question({"type": "choice", "instructions": "x"}),
        "choice criteria must be a map of names to descriptions.",
    ),
    (
        "choice-criteria-array",
        with_question(choice(["a", "b"])),
        "choice criteria must be a map of names to descriptions.",
    ),
    (
        "choice-criteria-null",
        with_question(choice(None)),
        "choice criteria must be a map of names to descriptions.",
    ),
    ("choice-none", with_question(choice({})), "a choice needs at least two options on this backend."),
    (
        "choice-one",
        with_question(choice({"a": None})),
        "a choice needs at least two options on this backend.",
    ),
    (
        "choice-256",
        with_question(choice(options(256))),
        "This backend supports at most 255 options per choice.",
    ),
    (
        "choice-677",
        with_question(choice(options(677))),
        "This backend supports at most 255 options per choice.",
    ),
    (
        "choice-description-number",
        with_question(choice({"a": None, "b": 2})),
        "choice description must be text, an object, an array, or null.",
    ),
    (
        "choice-description-boolean",
        with_question(choice({"a": True, "b": None})),
        "choice description must be text, an object, an array, or null.",
    ),
    ("choice-case-duplicate", with_question(choice({"Billing": None, "billing": None})), OPTIONS),
    ("choice-empty-name", with_question(choice({"": None, "b": None})), OPTIONS),
    ("choice-control-name", with_question(choice({"a\tb": None, "b": None})), OPTIONS),
    ("choice-pair-duplicate", with_question(choice({**options(30), "OPTION 3": None})), OPTIONS),
    # score criteria
    (
        "score-criteria-missing",
        with_question({"type": "score", "instructions": "x"}),
        "score criteria must be an ordered array.",
    ),
    (
        "score-criteria-object",
        with_question(score({"0": "low", "1": "high"})),
        "score criteria must be an ordered array.",
    ),
    ("score-one", with_question(score(["only"])), "a score takes 2 to 10 levels on this backend."),
    ("score-none", with_question(score([])), "a score takes 2 to 10 levels on this backend."),
    (
        "score-11",
        with_question(score([f"l{i}" for i in range(11)])),
        "a score takes 2 to 10 levels on this backend.",
    ),
    (
        "score-null-level",
        with_question(score(["a", None])),
        "Score criteria entries must be non-empty text, objects, or arrays.",
    ),
    (
        "score-empty-level",
        with_question(score(["", "b"])),
        "Score criteria entries must be non-empty text, objects, or arrays.",
    ),
    (
        "score-blank-level",
        with_question(score(["a", "  "])),
        "Score criteria entries must be non-empty text, objects, or arrays.",
    ),
    (
        "score-empty-object",
        with_question(score(["a", {}])),
        "Score criteria entries must be non-empty text, objects, or arrays.",
    ),
    (
        "score-empty-array",
        with_question(score([[], "b"])),
        "Score criteria entries must be non-empty text, objects, or arrays.",
    ),
    (
        "score-number-level",
        with_question(score(["a", 3])),
        "Score criteria entries must be non-empty text, objects, or arrays.",
    ),
]


@pytest.mark.parametrize(
    ("raw", "message"), [(raw, msg) for _, raw, msg in REFUSALS], ids=[c for c, _, _ in REFUSALS]
)
def test_refusals(raw: bytes, message: str) -> None:
    assert refusal(raw) == message


# Body size --------------------------------------------------------------------------------------


def test_body_limit_is_13_mib() -> None:
    # Bodies over the limit get 413 before parsing (tests/live/test_server.py sends one).
    assert BODY_LIMITS["/v1/systemone"] == MAX_BODY_BYTES


def test_exactly_13_mib_is_parsed() -> None:
    assert refusal(b" " * MAX_BODY_BYTES) == "Invalid SystemOne request."
    valid = body()
    padded = valid + b" " * (MAX_BODY_BYTES - len(valid))
    assert len(padded) == MAX_BODY_BYTES
    assert parse_systemone_request(padded).model == "m"


# Check order --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'[{"a":1,"a":2}]', "Duplicate SystemOne object key 'a'."),
        (body(model=_DROP, state=None, questions={}, temperature=1), "model must be a non-empty string."),
        (body(state=None, questions={}, temperature=1), "state must be text, an object, or an array."),
        (body(questions={}, temperature=1), "questions must be a non-empty map."),
        (
            body(temperature=1, prompt_format_version=1, video="v"),
            "temperature is not part of this API; use /v1/decisions for it.",
        ),
        (
            body(return_prompt_token_ids=True, prompt_format_version=1),
            "prompt_format_version is not part of this API; use /v1/decisions for it.",
        ),
        (
            body(video="v", chat_template_kwargs=5),
            "video is not supported on this backend; send images instead.",
        ),
        (body(chat_template_kwargs=5, questions={"q": "x"}), "chat_template_kwargs must be an object."),
        (
            body(chat_template_kwargs={"x": 1, "enable_thinking": True}),
            "Unknown chat_template_kwargs field 'x'.",
        ),
        (with_question({"type": "", "instructions": 5, "extra": 1}), "Unknown question 'q' field 'extra'."),
        (with_question({"type": "", "instructions": 5}), "question 'q' type must be a non-empty string."),
        (
            with_question({"type": "yes_no", "instructions": 5}),
            "instructions must be text, an object, an array, or null.",
        ),
        (with_question({"type": "yes_no", "instructions": "  "}), BLANK),
        (with_question({"type": "yes_no", "criteria": 5}), BLANK),
        (
            with_question({"type": "yes_no", "instructions": "x", "criteria": 5}),
            "Question type must be noul, choice, or score.",
        ),
        (with_question(choice({"a": 5})), "a choice needs at least two options on this backend."),
        (
            with_question(choice({"A": 5, "a": None})),
            "choice description must be text, an object, an array, or null.",
        ),
        (with_question(score(["a", None] * 6)), "a score takes 2 to 10 levels on this backend."),
        (body(questions={"a": {"type": "noul"}, "b": "x"}), BLANK),
        (body(questions={"a": "x", "b": {"type": "noul"}}), "question 'a' must be an object."),
        (body(questions={"a": choice({"A": None, "a": None}), "b": {"type": "noul"}}), BLANK),
        # an option name the schema refuses is judged after every other schema rule, as the others
        (body(questions={"a": choice({"": None, "b": None}), "b": {"type": "noul"}}), BLANK),
        (with_question(choice({"": None})), "a choice needs at least two options on this backend."),
        (with_question(choice({" ": None, "b": 5})), "choice description must be text, an object, an array, or null."),
        (body(questions={"a": choice({"x\ny": None, "b": None}), "b": choice({"": None, "c": None})}), OPTIONS),
    ],
)
def test_check_order(raw: bytes, message: str) -> None:
    assert refusal(raw) == message


# Accepted requests ----------------------------------------------------------------------------


def test_typesafe_sdk_body() -> None:
    raw = (
        b'{"state":"I was charged twice. Please help.","model":"my-model","questions":{"billing":'
        b'{"type":"noul","instructions":"Is this about billing?"},"tone":{"type":"choice",'
        b'"instructions":"What is the tone?","criteria":{"calm":null,"angry":"An upset message"}},'
        b'"urgency":{"type":"score","instructions":"How urgent?",'
        b'"criteria":["Can wait","This week","Today"]}}}'
    )
    request = parse_systemone_request(raw)
    assert (request.model, request.state, request.images) == ("my-model", "I was charged twice. Please help.", None)
    assert questions_of(request) == [
        ("billing", typed({"type": "noul", "instructions": "Is this about billing?"})),
        ("tone", typed({"type": "choice", "instructions": "What is the tone?",
                        "criteria": {"calm": None, "angry": "An upset message"}})),
        ("urgency", typed({"type": "score", "instructions": "How urgent?",
                           "criteria": ["Can wait", "This week", "Today"]})),
    ]
    assert request.model_dump(mode="json", exclude_unset=True) == json.loads(raw)


def test_unknown_top_level_fields_are_ignored_and_nulls_accepted() -> None:
    request = parse_systemone_request(
        body(
            assets={"x": 1},
            extra=[1, 2],
            temperature=None,
            prompt_format_version=None,
            return_prompt_token_ids=None,
            video=None,
            chat_template_kwargs=None,
        )
    )
    assert request.model == "m" and len(request.questions) == 1
    assert "assets" not in request.model_dump()  # ignored: System One's contract allows them
    for kwargs in ({}, {"enable_thinking": False}):
        parse_systemone_request(body(chat_template_kwargs=kwargs))


def test_images_are_checked_by_the_schema() -> None:
    assert parse_systemone_request(body()).images is None
    assert parse_systemone_request(body(images=None)).images is None
    assert parse_systemone_request(body(images=[])).images == []
    images = ["data:image/png;base64,AAAA", {"content_type": "image/png", "base64": "AAAA"}]
    assert [image.model_dump() for image in parse_systemone_request(body(images=images)).images] == images
    assert refusal(body(images="not a list")) == "images must be an array."
    assert refusal(body(images=["data:"] * 5)) == "A request accepts at most 4 images."
    assert refusal(body(images=["https://x/y.png"])) == "images[0] must be a base64 data URL."
    assert refusal(body(images=[5])) == "images[0] must be a data URL string or an object."
    assert refusal(body(images=[{**images[1], "x": 1}])) == "Unknown images[0] field 'x'."
    assert refusal(body(images=[{"base64": "AAAA"}])) == "images[0] needs string content_type and base64 fields."
    assert refusal(body(images=[{**images[1], "content_type": "image/gif"}])) == (
        "images[0] content_type must be image/png, image/jpeg, or image/webp.")


@pytest.mark.parametrize("state", ["", "  ", {}, [], {"a": [1, 2.50]}, [{"b": None}]])
def test_states(state: Any) -> None:
    assert parse_systemone_request(body(state=state)).state == state


def test_structured_instructions_and_criteria() -> None:
    question = {"type": "noul", "instructions": ["ask", {"k": 1}], "criteria": {"false": [1], "true": None}}
    ((_, parsed),) = questions(with_question(question))
    assert (parsed.instructions.root, parsed.criteria.true, parsed.criteria.false) == (["ask", {"k": 1}], None, [1])
    assert question_view(parsed).option_details == ("", "[1]")
    ((_, bare),) = questions(with_question({**NOUL, "criteria": None}))
    ((_, empty),) = questions(with_question({**NOUL, "criteria": {}}))
    assert question_view(bare).option_details == question_view(empty).option_details == ("", "")


@pytest.mark.parametrize("count", [2, 26, 27, 151, 255])
def test_choice_counts_accepted(count: int) -> None:
    ((_, question),) = questions(with_question(choice(options(count))))
    assert list(question.criteria) == list(options(count))


@pytest.mark.parametrize("count", [2, 10])
def test_score_counts_accepted(count: int) -> None:
    ((_, question),) = questions(with_question(score([f"l{i}" for i in range(count)])))
    assert len(question.criteria) == count


# Names that are blank, or hold a control or line-break character (Unicode Cc, Zl, Zp), and names that
# are not.
OPTION_NAMES = ["", " ", "\t", "\u3000", "\xa0", "a\tb", "a\nb", "\x85", "b\u2028", "c\u2029", "\x7f", "\x1c",
                "a", " a ", "a b", "😀", "\ufeff", "Ä", "\u200b", "-"]


@pytest.mark.parametrize("name", OPTION_NAMES, ids=[ascii(n) for n in OPTION_NAMES])
def test_the_served_document_states_which_option_names_are_taken(name: str) -> None:
    """A choice option name the served schema allows (its propertyNames) is accepted; one it refuses
    is refused, with the option-name message: the same on System One and on both Clef cards."""
    question = choice({name: None, "other": None})
    stated = {served_schema_accepts(component, question)
              for component in ("SystemOneChoiceQuestion", "WorkersAiClefChoiceQuestion",
                                "WorkersAiClefFlashChoiceQuestion")}
    assert len(stated) == 1
    if stated.pop():
        assert list(questions(with_question(question))[0][1].criteria) == [name, "other"]
    else:
        assert refusal(with_question(question)) == OPTIONS


def test_the_option_names_refusal_states_the_accepted_count() -> None:
    # 255 options are accepted: the refusal says so, not the 26 letters or the 676 pair labels.
    assert refusal(with_question(choice({"": None, "b": None}))) == OPTIONS
    assert refusal(with_question(choice({**options(254), "": None}))) == OPTIONS
    assert refusal(with_question(choice({**options(254), "Option 7": None}))) == OPTIONS


def test_question_ids_keep_order_and_may_be_empty() -> None:
    assert [qid for qid, _ in questions(body(questions={"z": NOUL, "": NOUL, "a": NOUL}))] == ["z", "", "a"]


def test_legend_depth() -> None:
    def nested(depth: int) -> str:
        return "[" * depth + '"x"' + "]" * depth

    template = (
        '{{"model":"m","state":"s","questions":'
        '{{"q":{{"type":"score","instructions":"i","criteria":["a",{0}]}}}}}}'
    )
    parse_systemone_request(template.format(nested(200)).encode())
    assert refusal(template.format(nested(300)).encode()) == "SystemOne JSON is nested too deeply."


# Equivalence with /v1/decisions ----------------------------------------------------------------


def test_same_prompts_as_the_equivalent_decisions_request() -> None:
    state = {"ticket": "Refund please", "tags": ["billing"], "amount": 12.50}
    systemone = parse_systemone_request(
        json.dumps(
            {
                "model": "m",
                "state": state,
                "questions": {
                    "billing": {"type": "noul", "instructions": "Is this about billing?"},
                    "team": {
                        "type": "choice",
                        "instructions": "Which team?",
                        "criteria": {"billing": None, "sales": "Deals"},
                    },
                    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]},
                },
            }
        ).encode()
    )
    state_text = render_text(systemone.state)
    decisions = parse_json_request(
        OPERATIONS["createDecision"],
        rules_of(create_decision),
        json.dumps(
            {
                "model": "m",
                "input": state_text,
                "questions": [
                    {"type": "predicate", "instructions": "Is this about billing?"},
                    {
                        "type": "choice",
                        "instructions": "Which team?",
                        "choices": [{"value": "billing"}, {"value": "sales", "description": "Deals"}],
                    },
                    {
                        "type": "score",
                        "instructions": "How urgent?",
                        "levels": [{"label": "low"}, {"label": "high"}],
                    },
                ],
            }
        ).encode(),
    )
    assert state_text == '{"ticket":"Refund please","tags":["billing"],"amount":12.5}'
    pairs = zip(questions_of(systemone), decisions_route.questions_of(decisions), strict=True)  # type: ignore[arg-type]
    for (_, s_question), d_question in pairs:
        s_view, d_view = question_view(s_question), decisions_route.question_view(d_question)
        assert s_view == d_view
        assert build_content(state_text, s_view, labels_for(s_view)) == build_content(
            decisions_route.input_of(decisions.input)[0], d_view, labels_for(d_view)  # type: ignore[attr-defined]
        )


# Response -----------------------------------------------------------------------------------

FIXTURE_REQUEST = (
    b'{"model":"m","state":"","questions":{"pick":{"type":"choice","instructions":"Which?","criteria":'
    b'{"second":null,"first":"one"}},"lvl":{"type":"score","instructions":"How?",'
    b'"criteria":[{"urgent":false},["now"]]},'
    b'"yn":{"type":"noul","instructions":"Is it?"}}}'
)
FIXTURE_RESPONSE = (
    b'{"model":"m","answers":{"pick":{"type":"choice","choice":"second","confidence":0.0,"probabilities":'
    b'{"second":0.5,"first":0.5},"x_label_mass":0.4},"lvl":{"type":"score","score":0.5,'
    b'"confidence":0.0,"legend":{"0":{"urgent":false},"1":["now"]},'
    b'"probabilities":{"0":0.5,"1":0.5},"x_label_mass":0.4},"yn":{"type":"noul",'
    b'"noul":0.5,"x_label_mass":0.4}},"usage":{"input_tokens":123,"output_tokens":0}}'
)


def test_response_fixture() -> None:
    request = parse_systemone_request(FIXTURE_REQUEST)
    lp = [math.log(0.2), math.log(0.2)]
    answers = [(qid, q, answer_from_logprobs(question_view(q).kind, lp)) for qid, q in questions_of(request)]
    wire = render_systemone_response(request.model, answers, 123)
    assert wire == FIXTURE_RESPONSE
    assert "confidence" not in json.loads(wire)["answers"]["yn"]


def test_legend_echoes_original_json_values() -> None:
    question = typed({"type": "score", "instructions": "i", "criteria": ["plain", {"z": 1.50, "a": [True, None]}, ["é"]]})
    answer = answer_from_logprobs("score", [math.log(0.1), math.log(0.1), math.log(0.2)])
    wire = render_systemone_response("m", [("s", question, answer)], 1)
    assert b'"legend":{"0":"plain","1":{"z":1.5,"a":[true,null]},"2":["\xc3\xa9"]}' in wire
    # 1 x 0.25 + 2 x 0.5 from the logprobs, in float64 on the host.
    assert json.loads(wire)["answers"]["s"]["score"] == pytest.approx(1.25, abs=F64_ARITHMETIC)


def _answer(kind: str, probabilities: list[float], **fields: Any) -> ScoredAnswer:
    values = {"choice_index": 0, "score": None, "confidence": None, "mass": 0.5, **fields}
    return ScoredAnswer(kind=kind, probabilities=tuple(probabilities), **values)  # type: ignore[arg-type]


NOUL_Q = {"type": "noul", "instructions": "i"}
CHOICE_Q = {"type": "choice", "instructions": "i", "criteria": {"a": None, "b": None}}
SCORE_Q = {"type": "score", "instructions": "i", "criteria": ["a", "b"]}


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        (NOUL_Q, _answer("yes_no", [math.nan, 0.5])),
        (NOUL_Q, _answer("yes_no", [0.5, 0.5], mass=math.inf)),
        (NOUL_Q, _answer("score", [0.5, 0.5], score=0.5, confidence=0.0)),
        (CHOICE_Q, _answer("choice", [1.0], confidence=1.0)),
        (CHOICE_Q, _answer("choice", [0.5, 0.5])),
        (SCORE_Q, _answer("score", [0.5, 0.5], score=math.nan, confidence=0.0)),
    ],
)
def test_invalid_answers_are_server_errors(question: dict[str, Any], answer: ScoredAnswer) -> None:
    with pytest.raises(DecisionError) as caught:
        render_systemone_response("m", [("q", typed(question), answer)], 1)
    assert (caught.value.status, caught.value.message, caught.value.type) == (
        500,
        "The model returned an invalid SystemOne answer.",
        "server_error",
    )
