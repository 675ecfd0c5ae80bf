"""Strict JSON parsing of request bodies."""

from __future__ import annotations

import subprocess
import sys

import pytest

from swama.handlers.http.strict_json import MAX_DEPTH, JSONRule, StrictJSONError, parse_strict_json


def _rule(body: bytes | str) -> tuple[JSONRule, str | None]:
    with pytest.raises(StrictJSONError) as caught:
        parse_strict_json(body)
    return caught.value.rule, caught.value.key


def test_member_order_is_kept_at_every_level() -> None:
    value = parse_strict_json(b'{"z":1,"a":{"y":2,"b":3},"m":[{"q":1,"c":2}]}')
    assert list(value) == ["z", "a", "m"]
    assert list(value["a"]) == ["y", "b"]
    assert list(value["m"][0]) == ["q", "c"]


def test_python_number_types_are_kept() -> None:
    value = parse_strict_json(b"[1.00,-0,-0.0,1e-7,123456789012345678901234567890]")
    assert value == [1.0, 0, -0.0, 1e-07, 123456789012345678901234567890]
    assert isinstance(value[0], float) and isinstance(value[1], int)
    assert repr(value[2]) == "-0.0"


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (b'{"a":1,"a":2}', "a"),
        (b'{"a":1,"\\u0061":2}', "a"),
        (b'{"x":{"y":[{"k":1,"k":1}]}}', "k"),
        (b'{"outer":1,"inner":{"v":null,"v":null}}', "v"),
        ('{"é":1,"\\u00e9":2}'.encode(), "é"),
    ],
)
def test_duplicate_keys_are_refused_at_any_depth(body: bytes, key: str) -> None:
    assert _rule(body) == (JSONRule.DUPLICATE_KEY, key)


def test_same_key_in_sibling_objects_is_fine() -> None:
    assert parse_strict_json(b'[{"a":1},{"a":2}]') == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize(
    "body",
    [
        b"NaN",
        b'{"t":NaN}',
        b'{"t":Infinity}',
        b'{"t":-Infinity}',
        b'{"t":1e400}',
        b'{"t":-1e400}',
        b'"\\ud83d"',
        b'"\\ude00"',
        b'{"\\ud800":1}',
        b'["ok","x\\udfffy"]',
        b'"\\ude00\\ud83d"',
        b'{"a":1,}',
        b"[1,2",
        b"",
        b"   ",
        b"{'a':1}",
        b'{"a":1} {"b":2}',
        b'"\xff"',
        b'"\xed\xa0\x80"',
        b'"tab\there"',
    ],
)
def test_invalid_documents_are_refused(body: bytes) -> None:
    assert _rule(body) == (JSONRule.INVALID, None)


def test_surrogate_pairs_and_large_finite_numbers_are_accepted() -> None:
    value = parse_strict_json(b'["\\uD83D\\uDE00", 1.7976931348623157e308]')
    assert value == ["😀", 1.7976931348623157e308]


def test_text_input_is_accepted() -> None:
    assert parse_strict_json('{"k":"ü"}') == {"k": "ü"}


def _nested_arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_depth_limit_is_256() -> None:
    assert MAX_DEPTH == 256
    parse_strict_json(_nested_arrays(256))
    assert _rule(_nested_arrays(257)) == (JSONRule.TOO_DEEP, None)


def test_depth_counts_objects_and_arrays_together() -> None:
    deep = b'{"a":' * 128 + b"[" * 128 + b"1" + b"]" * 128 + b"}" * 128
    parse_strict_json(deep)
    deeper = b'{"a":' * 129 + b"[" * 128 + b"1" + b"]" * 128 + b"}" * 129
    assert _rule(deeper) == (JSONRule.TOO_DEEP, None)


def test_brackets_inside_strings_do_not_count_towards_depth() -> None:
    body = b'{"s":"' + b"[" * 1000 + b'\\"{{{","t":[' + b"[]," * 400 + b"[]]}"
    value = parse_strict_json(body)
    assert value["s"].startswith("[[[") and len(value["t"]) == 401


def test_many_shallow_containers_are_not_too_deep() -> None:
    parse_strict_json(b"[" + b",".join([b"[1]"] * 5000) + b"]")


def test_an_unterminated_string_of_escaped_quotes_is_refused_in_linear_time() -> None:
    """4 MB of `\\"` pairs in a string that never ends, behind more brackets than the depth limit.
    Skipping strings with a regular expression before parsing retried from every quote, quadratic in
    the body (16 KB took 1.0-1.6 s, 32 KB 3.9 s, so this body would take days); read by the JSON
    scanner it takes milliseconds. The 60 s bound is thousands of times that, and
    unreachable unless the work is quadratic again. It runs in a process of its own: the regular
    expression held the GIL, so a thread of this one could not have been waited for."""
    code = ("from swama.handlers.http.strict_json import MAX_DEPTH, StrictJSONError, parse_strict_json\n"
            "try:\n"
            "    parse_strict_json(b'[' * (MAX_DEPTH + 44) + b'\"' + b'\\\\\"' * 2_000_000)\n"
            "except StrictJSONError as e:\n"
            "    print(e.rule.name)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "INVALID", done.stderr


def test_nesting_far_past_the_limit_is_too_deep_not_a_crash() -> None:
    assert _rule(_nested_arrays(100_000)) == (JSONRule.TOO_DEEP, None)
    assert _rule(b"[" * 100_000) == (JSONRule.TOO_DEEP, None)  # unterminated too
    assert _rule(b'{"a":' * 300 + b"1" + b"}" * 300) == (JSONRule.TOO_DEEP, None)
