"""Prompt format 1: render_text, question views and the exact content strings."""

from __future__ import annotations

import json

import pytest

from swama.engine.decisions.scorer import (
    QuestionView,
    build_content,
    decision_choice_view,
    decision_score_view,
    labels_for,
    noul_view,
    predicate_view,
    render_text,
    systemone_choice_view,
    systemone_score_view,
)
from swama.generated.routes import OPERATIONS
from swama.handlers.http.pipeline import parse_json_request, rules_of
from swama.handlers.http.strict_json import parse_strict_json
from swama.handlers.routes import decisions, systemone
from swama.handlers.routes.decisions import create_decision
from swama.handlers.routes.systemone import create_system_one

# render_text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "rendered"),
    [
        ('{"b":1.00,"a":-0,"c":1e-7}', '{"b":1.0,"a":0,"c":1e-07}'),
        ('["a/b","\\u0000","\\uD83D\\uDE00",-0.0]', '["a/b","\\u0000","😀",-0.0]'),
        ('{"ticket": "Refund please", "tags": ["billing"]}', '{"ticket":"Refund please","tags":["billing"]}'),
        ('{"k": 1}', '{"k":1}'),
        ("[123456789012345678901234567890]", "[123456789012345678901234567890]"),
        (
            '{"q":"say \\"hi\\"\\\\ \\n","é":[true,false,null]}',
            '{"q":"say \\"hi\\"\\\\ \\n","é":[true,false,null]}',
        ),
        ("{}", "{}"),
        ("[]", "[]"),
    ],
)
def test_render_text_json_fixtures(source: str, rendered: str) -> None:
    assert render_text(parse_strict_json(source)) == rendered


def test_render_text_null_and_strings() -> None:
    assert render_text(None) == ""
    assert render_text('  keep "as" is\n') == '  keep "as" is\n'
    assert render_text("") == ""
    assert render_text("😀 ü") == "😀 ü"


# §2.5: /v1/systemone with a blank state -------------------------------------------------------


def _systemone_contents(questions: str, state: str = '""') -> list[str]:
    body = f'{{"model":"m","state":{state},"questions":{questions}}}'.encode()
    request = parse_json_request(OPERATIONS["createSystemOne"], rules_of(create_system_one), body)
    contents = []
    for _, question in systemone.questions_of(request):  # type: ignore[arg-type]
        view = systemone.question_view(question)
        contents.append(build_content(render_text(request.state), view, labels_for(view)))  # type: ignore[attr-defined]
    return contents


def test_systemone_blank_state_fixtures() -> None:
    contents = _systemone_contents(
        '{"n":{"type":"noul","instructions":"Is it?"},'
        '"c":{"type":"choice","instructions":"Which?","criteria":{"a":null,"b":"second"}},'
        '"s":{"type":"score","instructions":"How much?","criteria":["low","high"]}}'
    )
    assert contents == [
        "\n\nIs the following true? Is it?\nAnswer with yes or no only.",
        "\n\nQuestion: Which?\nA: a\nB: b - second\nAnswer with the letter of one option only.",
        "\n\nQuestion: How much?\n0: low\n1: high\nAnswer with the number of one level only.",
    ]


def test_systemone_criteria_keep_order_and_decode_escaped_keys() -> None:
    (content,) = _systemone_contents(
        '{"c":{"type":"choice","instructions":"Which?","criteria":{"zebra":null,"\\u0061nt":"small"}}}'
    )
    assert (
        content
        == "\n\nQuestion: Which?\nA: zebra\nB: ant - small\nAnswer with the letter of one option only."
    )


def test_systemone_noul_criteria_render_as_text() -> None:
    (content,) = _systemone_contents(
        '{"n":{"type":"noul","instructions":"Is it?","criteria":{"true":{"yes":"affirm"},"false":"deny"}}}'
    )
    assert (
        content
        == '\n\nIs the following true? Is it?\nyes: {"yes":"affirm"}\nno: deny\nAnswer with yes or no only.'
    )


def test_systemone_score_criteria_render_as_json() -> None:
    (content,) = _systemone_contents(
        '{"s":{"type":"score","instructions":"How?","criteria":[{"b":2,"a":1},["urgent"]]}}'
    )
    assert (
        content
        == '\n\nQuestion: How?\n0: {"b":2,"a":1}\n1: ["urgent"]\nAnswer with the number of one level only.'
    )


def test_systemone_structured_state_and_instructions() -> None:
    (content,) = _systemone_contents(
        '{"n":{"type":"noul","instructions":{"ask":"Refund?"}}}',
        state='{"ticket": "Refund please", "n": 1.50}',
    )
    assert content == (
        '{"ticket":"Refund please","n":1.5}\n\n'
        'Is the following true? {"ask":"Refund?"}\nAnswer with yes or no only.'
    )


def test_pair_label_lines_may_skip_labels() -> None:
    view = systemone_choice_view("Pick", [("17", None), ("3", "three"), ("29", "")])
    content = build_content("", view, ["AA", "AB", "AD"])
    assert (
        content
        == "\n\nQuestion: Pick\nAA: 17\nAB: 3 - three\nAD: 29\nAnswer with the letter of one option only."
    )


# SGLang PROMPT_FIXTURES[1] ------------------------------------------------------------------

SGLANG_TEXT = '{"ticket":"Refund please","tags":["billing"]}'


def test_sglang_choice_fixture() -> None:
    view = systemone_choice_view(
        {"question": "Which team?"}, [("billing", "Payments"), ("sales", None), ("other", {"k": 1})]
    )
    assert build_content(SGLANG_TEXT, view, ["A", "B", "C"]) == SGLANG_TEXT + "\n\n" + "\n".join(
        [
            'Question: {"question":"Which team?"}',
            "A: billing - Payments",
            "B: sales",
            'C: other - {"k":1}',
            "Answer with the letter of one option only.",
        ]
    )


def test_sglang_score_fixture() -> None:
    view = systemone_score_view("Mood?", ["Calm", "Angry"])
    assert build_content(SGLANG_TEXT, view, ["0", "1"]) == SGLANG_TEXT + "\n\n" + "\n".join(
        ["Question: Mood?", "0: Calm", "1: Angry", "Answer with the number of one level only."]
    )


def test_sglang_yes_no_fixture() -> None:
    view = noul_view("Urgent", None, "Can wait")
    assert build_content(SGLANG_TEXT, view, ["yes", "no"]) == SGLANG_TEXT + "\n\n" + "\n".join(
        ["Is the following true? Urgent", "no: Can wait", "Answer with yes or no only."]
    )


# /v1/decisions --------------------------------------------------------------------------------

DOCUMENTED_REQUEST = (
    b'{"model":"mlx-community/Qwen3.5-0.8B-4bit","input":"My invoice charged me twice.","questions":['
    b'{"type":"predicate","name":"billing","instructions":"Is this a billing issue?"},'
    b'{"type":"choice","name":"team","instructions":"Which team should handle this?","choices":'
    b'[{"value":"billing"},{"value":"technical"},{"value":"sales"}]},'
    b'{"type":"score","name":"urgency","instructions":"How urgent is it?","levels":'
    b'[{"label":"low"},{"label":"medium"},{"label":"high","description":"needs action today"}]},'
    b'{"type":"choice","instructions":"Was the customer charged correctly?",'
    b'"choices":[{"value":true},{"value":false}]}]}'
)


def test_documented_example_contents() -> None:
    request = parse_json_request(OPERATIONS["createDecision"], rules_of(create_decision), DOCUMENTED_REQUEST)
    text, _ = decisions.input_of(request.input)  # type: ignore[attr-defined]
    contents = []
    for question in decisions.questions_of(request):  # type: ignore[arg-type]
        view = decisions.question_view(question)
        contents.append(build_content(text, view, labels_for(view)))
    assert contents == [
        "My invoice charged me twice.\n\nIs the following true? Is this a billing issue?\n"
        "Answer with yes or no only.",
        "My invoice charged me twice.\n\nQuestion: Which team should handle this?\nA: billing\nB: technical\n"
        "C: sales\nAnswer with the letter of one option only.",
        "My invoice charged me twice.\n\nQuestion: How urgent is it?\n0: low\n1: medium\n"
        "2: high: needs action today\n"
        "Answer with the number of one level only.",
        "My invoice charged me twice.\n\nQuestion: Was the customer charged correctly?\nA: true\nB: false\n"
        "Answer with the letter of one option only.",
    ]


def test_predicate_content_is_fixed() -> None:
    assert build_content("in", predicate_view("Is it?"), ["yes", "no"]) == (
        "in\n\nIs the following true? Is it?\nAnswer with yes or no only."
    )


def test_decision_views() -> None:
    assert decision_choice_view("Q", [(True, None), (False, "no"), ("maybe", "")]) == QuestionView(
        "choice", "Q", ("true", "false", "maybe"), ("", "no", "")
    )
    assert decision_score_view("Q", [("low", None), ("mid", ""), ("high", "now")]) == QuestionView(
        "score", "Q", ("0", "1", "2"), ("low", "mid", "high: now")
    )
    assert predicate_view("Q") == QuestionView("yes_no", "Q", ("yes", "no"), ("", ""))


# Edge rules of §2.3 -------------------------------------------------------------------------


def test_description_left_out_only_when_it_renders_empty() -> None:
    view = systemone_choice_view("Q", [("x", "  "), ("y", {}), ("z", ""), ("w", None), ("v", [])])
    assert build_content("t", view, ["A", "B", "C", "D", "E"]).split("\n")[3:8] == [
        "A: x -   ",
        "B: y - {}",
        "C: z",
        "D: w",
        "E: v - []",
    ]


def test_option_names_are_inserted_raw() -> None:
    view = systemone_choice_view("Q", [(" padded ", None), ('{"json":1}', None)])
    assert build_content("", view, ["A", "B"]).split("\n")[3:5] == ["A:  padded ", 'B: {"json":1}']


def test_blank_question_lines() -> None:
    assert build_content("t", noul_view("", None, None), ["yes", "no"]) == (
        "t\n\nIs the following true?\nAnswer with yes or no only."
    )
    assert build_content("t", systemone_choice_view(None, [("a", None), ("b", None)]), ["A", "B"]) == (
        "t\n\nA: a\nB: b\nAnswer with the letter of one option only."
    )


def test_blank_input_is_kept_and_no_trailing_newline() -> None:
    content = build_content("", predicate_view("Q"), ["yes", "no"])
    assert content.startswith("\n\n") and not content.endswith("\n")
    spaced = build_content("  \n", predicate_view("Q"), ["yes", "no"])
    assert spaced.startswith("  \n\n\n")


def test_noul_detail_lines_only_when_non_empty() -> None:
    view = noul_view("Q", {"a": [1, 2.50]}, "")
    assert build_content("", view, ["yes", "no"]) == (
        '\n\nIs the following true? Q\nyes: {"a":[1,2.5]}\nAnswer with yes or no only.'
    )


def test_label_count_must_match_options() -> None:
    with pytest.raises(ValueError):
        build_content("", predicate_view("Q"), ["yes"])


def test_render_text_is_json_dumps_compatible() -> None:
    value = parse_strict_json('{"x":[1,{"y":"ü/\\u0007"}],"z":-1.5e+300}')
    assert render_text(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert render_text(value) == '{"x":[1,{"y":"ü/\\u0007"}],"z":-1.5e+300}'
