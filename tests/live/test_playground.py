"""The browser playground in headless Chromium (Debian's package, driven by Playwright): decisions
drawn as bars that match the API, debiased or calibrated answers beside their plain reading, snippets
that reproduce the request, streaming chat, the models and metrics view, errors in the server's words,
the API key and --no-ui.

Screenshots go to .cache/test-artifacts/playground (SWAMA_TEST_ARTIFACTS overrides it)."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2_ID, install_folder
from PIL import Image
from precision import F32_PROBABILITY, F64_ARITHMETIC

from live_server import LiveServer, start_server

pytestmark = pytest.mark.slow

playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("SWAMA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# The flags a closed network needs: no background connections, no component updates, no sync.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
ARTIFACTS = Path(os.environ.get("SWAMA_TEST_ARTIFACTS")
                 or Path(__file__).resolve().parents[2] / ".cache" / "test-artifacts" / "playground")
KEY = "playground-secret"
QWEN_VL = "test/tiny-qwen3-vl"
# A bar is drawn to whole pixels (or fractions of one): its width may differ from the probability
# by a pixel of the track.
PIXEL = 1.0


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        # A missing browser fails the suite (CI installs it); skipping these tests takes a decision.
        message = f"Chromium not found at {CHROMIUM} (apt-get install chromium; tools/dev.sh does it as root)"
        if os.environ.get("SWAMA_SKIP_BROWSER") == "1":
            pytest.skip(message + "; SWAMA_SKIP_BROWSER=1")
        pytest.fail(message + ", or set SWAMA_SKIP_BROWSER=1 to skip the browser tests")
    # Playwright's Node driver cannot start with OpenBLAS preloaded (the suite preloads it for MLX):
    # the driver and the browser it starts get the environment without it.
    preload = os.environ.pop("LD_PRELOAD", None)
    try:
        pw = playwright_sync.sync_playwright().start()
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    finally:
        if preload is not None:
            os.environ["LD_PRELOAD"] = preload
    yield browser
    browser.close()
    pw.stop()


def open_page(browser, server: LiveServer, path: str = "/"):
    context = browser.new_context(base_url=server.url, viewport={"width": 1360, "height": 1000})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    page = context.new_page()
    page.requests_seen = []  # every URL the page asks for, to prove it fetches nothing from elsewhere
    page.on("request", lambda request: page.requests_seen.append((request.url, request.headers)))
    page.script_errors = []  # exceptions the page's script did not catch
    page.on("pageerror", lambda error: page.script_errors.append(str(error)))
    page.goto(path)
    page.wait_for_selector("body[data-ready=true]")
    return page


@pytest.fixture
def page(browser, model_server: LiveServer):
    page = open_page(browser, model_server)
    yield page
    errors = page.script_errors
    page.context.close()
    assert not errors, errors


def wait_for_model(page, model: str = SMOLLM2_ID) -> None:
    page.wait_for_selector(f"#d-model option[value='{model}']", state="attached")


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def run_decision(page) -> dict:
    page.evaluate("() => { state.last = null; }")
    page.click("#d-run")
    page.wait_for_function("() => state.last !== null && !document.querySelector('#d-run').disabled", timeout=120_000)
    return page.evaluate("state.last")


def bars(page) -> list[list[dict]]:
    """Per answer, per option: the probability it claims, the bar's share of its track, winner or not."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#d-answers .answer')).map(a =>
        Array.from(a.querySelectorAll('.option')).map(o => ({
            label: o.querySelector('.label').textContent,
            p: Number(o.dataset.probability),
            bar: o.querySelector('.bar').getBoundingClientRect().width,
            track: o.querySelector('.track').getBoundingClientRect().width,
            winner: o.classList.contains('winner')})))""")


def api_options(answer: dict) -> list[float]:
    if answer["type"] == "predicate":
        return [answer["probability"], 1 - answer["probability"]]
    return [p["probability"] for p in answer["probabilities"]]


def test_the_page_is_served_whole_and_offline(model_server: LiveServer, browser) -> None:
    root, ui = httpx.get(model_server.url + "/"), httpx.get(model_server.url + "/ui/")
    assert root.status_code == ui.status_code == 200
    assert root.text == ui.text and "<title>swama playground</title>" in root.text
    assert "default-src 'none'" in root.headers["content-security-policy"]
    assert httpx.get(model_server.url + "/ui", follow_redirects=False).headers["location"] == "/ui/"
    for asset in ("playground.js", "playground.css"):
        text = httpx.get(f"{model_server.url}/ui/{asset}").text
        assert not re.search(r"https?://", text), f"{asset} names an outside address"
    assert httpx.get(model_server.url + "/ui/nothing.js").status_code == 404
    page = open_page(browser, model_server)
    page.wait_for_selector("#d-model option", state="attached")
    assert {url.split("/")[2] for url, _ in page.requests_seen} == {model_server.url.split("/")[2]}
    page.context.close()


def test_a_decision_is_drawn_as_the_api_answers_it(page, model_server: LiveServer) -> None:
    wait_for_model(page)
    assert page.input_value("#d-model") == SMOLLM2_ID  # the server's default model comes preselected
    run = run_decision(page)
    body = run["body"]
    assert [q["type"] for q in body["questions"]] == ["predicate", "choice", "score"]
    direct = httpx.post(model_server.v1 + "/decisions", json=body, timeout=120)
    assert direct.status_code == 200, direct.text
    assert run["response"]["answers"] == direct.json()["answers"]
    drawn = bars(page)
    assert len(drawn) == 3
    for answer, options in zip(direct.json()["answers"], drawn, strict=True):
        expected = api_options(answer)
        # String(p) gives the JSON's float64 back; 1 - p is float64 on both sides.
        assert [o["p"] for o in options] == pytest.approx(expected, abs=F64_ARITHMETIC)
        for option, p in zip(options, expected, strict=True):
            assert option["bar"] == pytest.approx(p * option["track"], abs=PIXEL)
        best = max(range(len(expected)), key=lambda i: (expected[i], -i))
        assert [o["winner"] for o in options] == [i == best for i in range(len(expected))]
    # The label masses shown are the ones System One reports for the same prompts.
    masses = direct.headers["x-swama-label-mass"].split(",")
    assert run["masses"] == [float(m) for m in masses]
    facts = page.locator("#d-answers .answer .facts").all_inner_texts()
    assert all(f"label mass {float(m):.4f}" in text for m, text in zip(masses, facts, strict=True))
    summary = page.inner_text("#d-summary")
    assert f"{direct.json()['usage']['input_tokens']} input tokens" in summary and " ms" in summary
    shot(page, "decisions")


def test_the_label_mass_header_matches_systemone(model_server: LiveServer) -> None:
    decisions = httpx.post(model_server.v1 + "/decisions", timeout=120, json={
        "model": "smollm2", "input": "The sky is green.",
        "questions": [{"type": "predicate", "instructions": "Is the statement true?"},
                      {"type": "choice", "instructions": "Which colour?", "choices": [{"value": "green"}, {"value": "blue"}]}]})
    systemone = httpx.post(model_server.v1 + "/systemone", timeout=120, json={
        "model": "smollm2", "state": "The sky is green.",
        "questions": {"a": {"type": "noul", "instructions": "Is the statement true?"},
                      "b": {"type": "choice", "instructions": "Which colour?", "criteria": {"green": None, "blue": None}}}})
    masses = [float(m) for m in decisions.headers["x-swama-label-mass"].split(",")]
    answers = systemone.json()["answers"]
    # The same prompts, but the second request may resume the first's prefix from the prompt cache:
    # float32 in another summation order (tests/precision.py). A label mass is a sum of probabilities.
    assert masses == pytest.approx([answers["a"]["x_label_mass"], answers["b"]["x_label_mass"]], abs=F32_PROBABILITY)


def _run_snippet(kind: str, page, tmp_path: Path, env: dict[str, str] | None = None) -> str:
    page.click(f"button.copy[data-snippet={kind}]")
    page.wait_for_function("() => document.querySelector('#d-copied').textContent.length > 0")
    assert page.inner_text("#d-copied") == "copied to the clipboard"
    text = page.evaluate("navigator.clipboard.readText()")
    assert text == page.evaluate("document.querySelector('#d-snippet').textContent")
    if kind == "curl":
        cmd = ["bash", "-c", text]
    else:
        script = tmp_path / f"snippet_{kind}.py"
        script.write_text(text)
        cmd = [sys.executable, str(script)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_copied_snippets_reproduce_the_request(page, tmp_path: Path) -> None:
    wait_for_model(page)
    # An unnamed question and quotes in the text: the snippets must quote them right.
    page.fill("#d-input", "It's a \"double\" charge, isn't it?\nSecond line.")
    page.click("button.add[data-add=predicate]")
    page.locator("#d-questions .question").last.locator(".instructions").fill("Is the customer 'angry'?")
    run = run_decision(page)
    answers = run["response"]["answers"]
    assert len(answers) == 4 and answers[3]["name"] is None

    assert json.loads(_run_snippet("curl", page, tmp_path))["answers"] == answers
    assert json.loads(_run_snippet("openai", page, tmp_path))["answers"] == answers

    # typesafe-sdk asks the same questions on /v1/systemone, which renders the same prompts.
    systemone = json.loads(_run_snippet("typesafe", page, tmp_path))
    assert list(systemone) == ["billing", "team", "urgency", "q1"]
    assert systemone["billing"]["noul"] == answers[0]["probability"]
    assert list(systemone["team"]["probabilities"].values()) == [p["probability"] for p in answers[1]["probabilities"]]
    assert systemone["urgency"]["score"] == answers[2]["score"]
    assert systemone["q1"]["noul"] == answers[3]["probability"]
    shot(page, "snippet")


def test_history_survives_a_reload(page) -> None:
    wait_for_model(page)
    page.fill("#d-input", "Remember this input.")
    run = run_decision(page)
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    first = page.locator("#d-history li button").first
    assert "Remember this input." in first.inner_text()
    page.fill("#d-input", "something else")
    first.click()
    assert page.input_value("#d-input") == "Remember this input."
    assert page.evaluate("state.last.response") == run["response"]
    assert len(bars(page)) == 3


def test_chat_streams_and_reports_its_speed(page) -> None:
    page.click(".tab[data-tab=chat]")
    page.select_option("#c-model", SMOLLM2_ID)
    page.fill("#c-max", "24")
    page.fill("#c-temp", "0")
    # Count the reply's updates: a streamed reply grows in several steps.
    page.evaluate("""() => { window.updates = 0; new MutationObserver(() => window.updates++)
        .observe(document.querySelector('#c-log'), {subtree: true, characterData: true, childList: true}); }""")
    page.fill("#c-input", "Name three colours.")
    page.press("#c-input", "Enter")
    page.wait_for_function("() => !document.querySelector('#c-send').disabled && document.querySelectorAll('.msg').length == 2",
                           timeout=120_000)
    reply = page.locator(".msg.assistant .text").inner_text()
    assert reply.strip()
    assert page.evaluate("window.updates") >= 5
    stats = page.inner_text("#c-stats")
    assert re.search(r"\d+ tokens · [\d.]+ tok/s · first token \d+ ms · prompt \d+ tokens · cached \d+", stats), stats
    assert float(page.get_attribute("#c-stats", "data-rate")) > 0
    # The second turn starts with the first one: its prompt comes from the cache.
    page.fill("#c-input", "And one more?")
    page.press("#c-input", "Enter")
    page.wait_for_function("() => !document.querySelector('#c-send').disabled && document.querySelectorAll('.msg').length == 4",
                           timeout=120_000)
    assert int(page.get_attribute("#c-stats", "data-cached")) > 0
    shot(page, "chat")


# ---- chat: token probabilities and response formats ---------------------------------------------

JSON_SCHEMA = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]},
                                                "sure": {"type": "boolean"}},
               "required": ["colour", "sure"], "additionalProperties": False}


def _chunk(content: str | None = None, tokens: list[dict] | None = None, finish: str | None = None, **extra) -> dict:
    delta = {} if content is None else {"content": content}
    logprobs = None if tokens is None else {"content": tokens, "refusal": None}
    return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": SMOLLM2_ID,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}], **extra}


def _sse(chunks: list[dict]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def _token(text: str, logprob: float, alternatives: list[tuple[str, float]] = (), raw: bytes | None = None) -> dict:
    raw = text.encode() if raw is None else raw
    return {"token": text, "logprob": logprob, "bytes": list(raw),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alternatives]}


def _fake_chat(page, chunks: list[dict]) -> list[dict]:
    """Answers the page's chat requests with `chunks`; the list returned fills with the bodies it sent."""
    sent: list[dict] = []

    def answer(route) -> None:
        sent.append(route.request.post_data_json)
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=_sse(chunks))

    page.route("**/v1/chat/completions", answer)
    return sent


def _chat(page, text: str, turns: int) -> None:
    """Sends `text` and waits for the reply: `turns` messages in the log once it is done."""
    page.fill("#c-input", text)
    page.press("#c-input", "Enter")
    page.wait_for_function("n => !document.querySelector('#c-send').disabled && document.querySelectorAll('.msg').length == n",
                           arg=turns, timeout=120_000)
    assert page.is_hidden("#c-error"), page.inner_text("#c-error")


def _hsl(p: float) -> tuple[int, int, int]:
    """The token background the page draws for probability p: hsl(120p, 80%, 84%)."""
    import colorsys

    r, g, b = colorsys.hls_to_rgb(round(120 * p) / 360, 0.84, 0.80)
    return round(r * 255), round(g * 255), round(b * 255)


def _background(page, locator) -> tuple[int, int, int]:
    rgb = locator.evaluate("e => getComputedStyle(e).backgroundColor")
    return tuple(int(v) for v in re.findall(r"\d+", rgb)[:3])


def _tip_rows(page) -> list[tuple[str, str, bool]]:
    return [tuple(r) for r in page.evaluate("""() => Array.from(document.querySelectorAll('#c-tip tr')).map(r =>
        [r.cells[0].textContent, r.cells[1].textContent, r.classList.contains('chosen')])""")]


def test_chat_reports_tokens_per_step_when_drafted_tokens_were_accepted(page) -> None:
    usage = {"prompt_tokens": 40, "completion_tokens": 150, "total_tokens": 190,
             "prompt_tokens_details": {"cached_tokens": 0}}
    _fake_chat(page, [_chunk("", finish=None), _chunk("def f():"), _chunk(None, finish="stop",
                                                                           usage={**usage, "accepted_draft_tokens": 90})])
    page.click(".tab[data-tab=chat]")
    page.select_option("#c-model", SMOLLM2_ID)
    _chat(page, "Repeat the file.", 2)
    stats = page.inner_text("#c-stats")
    # 150 tokens in 150 - 90 = 60 decode steps.
    assert stats.endswith(" · 2.5 tokens/step (90 drafted tokens accepted)"), stats
    assert float(page.get_attribute("#c-stats", "data-tokens-per-step")) == 2.5
    # Without the field (no drafted token accepted), nothing is said of steps.
    page.unroute("**/v1/chat/completions")
    _fake_chat(page, [_chunk("", finish=None), _chunk("ok"), _chunk(None, finish="stop", usage=usage)])
    _chat(page, "And now?", 4)
    stats = page.inner_text("#c-stats")
    assert "tokens/step" not in stats and stats.endswith("cached 0"), stats
    assert page.get_attribute("#c-stats", "data-tokens-per-step") == ""


def test_chat_controls_compose_the_request(page) -> None:
    sent = _fake_chat(page, [_chunk("", finish=None), _chunk("ok"), _chunk(None, finish="stop")])
    page.click(".tab[data-tab=chat]")
    page.select_option("#c-model", SMOLLM2_ID)
    assert page.is_visible("#c-logprobs") and not page.is_checked("#c-logprobs")
    assert page.is_hidden("#c-legend") and page.is_hidden("#c-schema-box")
    assert [o["value"] for o in page.evaluate("Array.from(document.querySelectorAll('#c-format option'))"
                                              ".map(o => ({value: o.value}))")] == ["none", "json_object", "json_schema"]
    assert page.input_value("#c-format") == "none"

    # Neither control set: the request is as it was.
    _chat(page, "plain", 2)
    assert not {"logprobs", "top_logprobs", "response_format"} & set(sent[-1])
    assert sent[-1]["stream"] is True and sent[-1]["messages"][-1] == {"role": "user", "content": "plain"}

    page.check("#c-logprobs")
    assert page.is_visible("#c-legend")
    _chat(page, "with logprobs", 4)
    assert sent[-1]["logprobs"] is True and sent[-1]["top_logprobs"] == 5 and "response_format" not in sent[-1]

    page.select_option("#c-format", "json_object")
    assert page.is_hidden("#c-schema-box")
    _chat(page, "an object", 6)
    assert sent[-1]["response_format"] == {"type": "json_object"} and sent[-1]["logprobs"] is True

    page.uncheck("#c-logprobs")
    page.select_option("#c-format", "json_schema")
    assert page.is_visible("#c-schema") and page.is_hidden("#c-schema-error")
    default = json.loads(page.input_value("#c-schema"))  # the example the box starts with is a schema
    assert default["type"] == "object"
    page.fill("#c-schema", json.dumps(JSON_SCHEMA, indent=2))
    _chat(page, "a schema", 8)
    assert sent[-1]["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "playground", "schema": JSON_SCHEMA, "strict": True}}
    assert not {"logprobs", "top_logprobs"} & set(sent[-1])

    # A schema that does not parse says why as it is typed, and nothing is sent.
    count = len(sent)
    page.fill("#c-schema", '{"type": "object",}')
    page.wait_for_selector("#c-schema-error:not([hidden])")
    assert page.inner_text("#c-schema-error").startswith("The JSON schema is not valid JSON: ")
    assert page.get_attribute("#c-schema", "aria-invalid") == "true"
    shot(page, "chat-schema-error")
    page.fill("#c-input", "not sent")
    page.press("#c-input", "Enter")
    assert page.evaluate("document.activeElement.id") == "c-schema"
    assert page.input_value("#c-input") == "not sent" and page.locator(".msg").count() == 8 and len(sent) == count
    page.fill("#c-schema", "[1, 2]")
    assert "must be a JSON object" in page.inner_text("#c-schema-error")
    page.fill("#c-schema", "")
    assert "empty" in page.inner_text("#c-schema-error")
    page.select_option("#c-format", "none")  # another format: the schema box and its error go away
    assert page.is_hidden("#c-schema-box") and page.is_hidden("#c-schema-error")
    page.press("#c-input", "Enter")
    # The bubbles appear before the request is answered; wait for the reply to end, as _chat does.
    page.wait_for_function("() => !document.querySelector('#c-send').disabled && document.querySelectorAll('.msg').length == 10")
    assert len(sent) == count + 1

    # The controls are remembered by the browser.
    page.check("#c-logprobs")
    page.select_option("#c-format", "json_schema")
    page.fill("#c-schema", '{"type": "object"}')
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.is_checked("#c-logprobs") and page.input_value("#c-format") == "json_schema"
    assert page.input_value("#c-schema") == '{"type": "object"}'


def test_tokens_are_drawn_by_probability(page) -> None:
    """A made-up stream: tokens with their logprobs, a character split across two tokens, text without
    logprobs, and a token the text does not hold (cut by a stop sequence)."""
    e_acute = "é".encode()
    chunks = [
        _chunk("", []),
        _chunk("Hello", [_token("Hello", math.log(0.9), [("Hello", math.log(0.9)), ("Hi", math.log(0.05))])]),
        _chunk(" caf", [_token(" caf", math.log(0.2), [(" world", math.log(0.5)), (" caf", math.log(0.2)),
                                                        ("\n", math.log(0.1))])]),
        # The first byte of é alone ends no character: the server holds its text back.
        _chunk("", [_token("\ufffd", math.log(0.5), [], raw=e_acute[:1])]),
        _chunk("é", [_token("\ufffd", math.log(0.8), [], raw=e_acute[1:])]),
        _chunk("!"),  # no logprobs: plain text
        _chunk(" Bye", [_token(" Bye", math.log(0.0004), [(".", math.log(0.6))])]),
        _chunk("", [_token("STOP", math.log(0.7))]),
        _chunk(None, finish="stop", usage={"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}),
    ]
    _fake_chat(page, chunks)
    page.click(".tab[data-tab=chat]")
    page.select_option("#c-model", SMOLLM2_ID)
    page.check("#c-logprobs")
    _chat(page, "Say hello.", 2)
    text = page.locator(".msg.assistant .text")
    assert text.evaluate("e => e.textContent") == "Hello café! Bye"
    tokens = page.locator(".msg.assistant .tok")
    drawn = tokens.evaluate_all("ts => ts.map(t => [t.textContent, Number(t.dataset.p), t.getAttribute('tabindex')])")
    assert [t[0] for t in drawn] == ["Hello", " caf", "é", " Bye"]
    # The page's Math.exp of the JSON's logprobs (summed over the é's two tokens): a few float64 roundings.
    assert [t[1] for t in drawn] == pytest.approx([0.9, 0.2, 0.5 * 0.8, 0.0004], abs=F64_ARITHMETIC)
    assert [t[2] for t in drawn] == ["0", "-1", "-1", "-1"]  # one tab stop for the reply
    for i, (_, p, _) in enumerate(drawn):  # each channel rounded to an integer by the browser and by _hsl
        assert _background(page, tokens.nth(i)) == pytest.approx(_hsl(p), abs=1)
    assert page.evaluate("state.chat.at(-1)") == {"role": "assistant", "content": "Hello café! Bye"}

    # Hovering a token shows its alternatives, most likely first, the chosen one marked.
    assert page.is_hidden("#c-tip")
    tokens.nth(1).hover()
    page.wait_for_selector("#c-tip:not([hidden])")
    assert page.inner_text("#c-tip .tip-head").startswith("\u2423caf 20.0%")
    assert _tip_rows(page) == [("\u2423world", "50.0%", False), ("\u2423caf", "20.0%", True), ("\u21b5", "10.0%", False)]
    assert tokens.nth(1).get_attribute("aria-describedby") == "c-tip"
    tip, token = page.locator("#c-tip").bounding_box(), tokens.nth(1).bounding_box()
    assert tip["y"] >= token["y"] + token["height"] - 1  # below the token, not over it
    shot(page, "chat-logprobs")
    page.mouse.move(5, 5)
    page.wait_for_selector("#c-tip", state="hidden")

    # The keyboard: Tab reaches the reply's first token, the arrows move, Escape closes the tip.
    page.focus("#c-system")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Hello"
    page.wait_for_selector("#c-tip:not([hidden])")
    assert _tip_rows(page)[0] == ("Hello", "90.0%", True)
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.textContent") == "é"
    assert [t.get_attribute("tabindex") for t in tokens.all()] == ["-1", "-1", "0", "-1"]
    assert page.locator("#c-tip .tip-token").count() == 2  # the two tokens that make the é
    assert page.locator("#c-tip .tip-head").all_inner_texts()[0].startswith("\ufffd 50.0%")
    page.keyboard.press("End")
    assert page.inner_text("#c-tip .tip-head").startswith("\u2423Bye <0.1%")
    page.keyboard.press("Escape")
    page.wait_for_selector("#c-tip", state="hidden")


def test_a_json_answer_is_pretty_printed(page) -> None:
    answer = '{"colour":"blue","sure":true,"shades":["navy",null]}'
    _fake_chat(page, [_chunk(answer[:9]), _chunk(answer[9:30]), _chunk(answer[30:]), _chunk(None, finish="stop")])
    page.click(".tab[data-tab=chat]")
    page.select_option("#c-model", SMOLLM2_ID)
    _chat(page, "JSON please", 2)
    reply = page.locator(".msg.assistant")
    assert reply.locator("pre.json").inner_text() == json.dumps(json.loads(answer), indent=2)
    assert reply.locator(".text").is_hidden()
    reply.locator("button.view").click()
    assert reply.locator(".text").inner_text() == answer and reply.locator("pre.json").is_hidden()
    reply.locator("button.view").click()
    assert reply.locator("pre.json").is_visible()
    assert page.evaluate("state.chat.at(-1).content") == answer  # the history holds what the model said
    # Text that is not a JSON object or array is left as it is.
    page.unroute("**/v1/chat/completions")
    _fake_chat(page, [_chunk('"just a string"'), _chunk(None, finish="stop")])
    _chat(page, "again", 4)
    assert page.locator(".msg.assistant").nth(1).locator("pre.json").count() == 0


def _sent_and_received(page, text: str, turns: int) -> tuple[dict, list[dict]]:
    """Sends `text` to the live server; the request body and the chunks the page received."""
    with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as answered:
        _chat(page, text, turns)
    response = answered.value
    body = response.body().decode()
    chunks = [json.loads(line[5:]) for line in body.split("\n") if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    return json.loads(response.request.post_data), chunks


def test_live_tokens_with_probabilities(page) -> None:
    page.click(".tab[data-tab=chat]")
    page.select_option("#c-model", SMOLLM2_ID)
    page.check("#c-logprobs")
    page.fill("#c-max", "12")
    page.fill("#c-temp", "0")
    body, chunks = _sent_and_received(page, "What is the capital of France?", 2)
    assert body["logprobs"] is True and body["top_logprobs"] == 5
    entries = [e for c in chunks for e in ((c["choices"] or [{}])[0].get("logprobs") or {}).get("content") or []]
    content = "".join(((c["choices"] or [{}])[0].get("delta") or {}).get("content") or "" for c in chunks)
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert content.strip() and 0 < len(entries) <= usage["completion_tokens"]
    tokens = page.locator(".msg.assistant .tok")
    drawn = tokens.evaluate_all("ts => ts.map(t => [t.textContent, Number(t.dataset.logprob)])")
    assert page.locator(".msg.assistant .text").evaluate("e => e.textContent") == content
    # Every token is drawn (an English answer: each token is whole characters), with its logprob.
    assert [t for t, _ in drawn] == [e["token"] for e in entries]
    assert [lp for _, lp in drawn] == [e["logprob"] for e in entries]
    for i, entry in enumerate(entries):  # each colour channel rounded to an integer by the browser and _hsl
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 5
        assert _background(page, tokens.nth(i)) == pytest.approx(_hsl(math.exp(entry["logprob"])), abs=1)
    # At temperature 0 the model takes its most likely token: the tip's first row, marked as chosen.
    tokens.first.hover()
    page.wait_for_selector("#c-tip:not([hidden])")
    rows = _tip_rows(page)
    first = entries[0]
    assert len(rows) == 5 and rows[0][2] and rows[0][1] == page.evaluate("p => percent(p)", math.exp(first["logprob"]))
    assert [r[1] for r in rows] == [page.evaluate("p => percent(p)", math.exp(a["logprob"])) for a in first["top_logprobs"]]
    assert [r[0] for r in rows] == [page.evaluate("t => visibleToken(t)", a["token"]) for a in first["top_logprobs"]]
    shot(page, "chat-logprobs-live")


def test_live_json_schema_answer(page) -> None:
    page.click(".tab[data-tab=chat]")
    page.select_option("#c-model", SMOLLM2_ID)
    page.select_option("#c-format", "json_schema")
    page.fill("#c-schema", json.dumps(JSON_SCHEMA, indent=2))
    page.fill("#c-max", "48")
    page.fill("#c-temp", "0")
    body, chunks = _sent_and_received(page, "What colour is the sky on a clear day? Answer in JSON.", 2)
    assert body["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "playground", "schema": JSON_SCHEMA, "strict": True}}
    content = "".join(((c["choices"] or [{}])[0].get("delta") or {}).get("content") or "" for c in chunks)
    value = json.loads(content)
    assert set(value) == {"colour", "sure"} and value["colour"] in ("red", "green", "blue") and isinstance(value["sure"], bool)
    reply = page.locator(".msg.assistant")
    assert reply.locator("pre.json").inner_text() == json.dumps(value, indent=2)
    assert reply.locator(".text").is_hidden()
    shot(page, "chat-json-schema-live")

    # With token probabilities too: the JSON is pretty-printed, "raw" shows the tokens it came as.
    page.check("#c-logprobs")
    page.click("#c-new")
    body, chunks = _sent_and_received(page, "What colour is grass? Answer in JSON.", 2)
    assert body["logprobs"] is True and body["response_format"]["type"] == "json_schema"
    content = "".join(((c["choices"] or [{}])[0].get("delta") or {}).get("content") or "" for c in chunks)
    entries = [e for c in chunks for e in ((c["choices"] or [{}])[0].get("logprobs") or {}).get("content") or []]
    assert reply.locator("pre.json").inner_text() == json.dumps(json.loads(content), indent=2)
    reply.locator("button.view").click()
    tokens = reply.locator(".tok")
    assert reply.locator(".text").evaluate("e => e.textContent") == content
    assert tokens.evaluate_all("ts => ts.map(t => t.textContent)") == [e["token"] for e in entries]
    tokens.nth(1).hover()
    page.wait_for_selector("#c-tip:not([hidden])")
    assert page.locator("#c-tip .tip-head code").first.inner_text() == page.evaluate("t => visibleToken(t)", entries[1]["token"])
    shot(page, "chat-json-schema-logprobs-live")


def test_errors_show_the_servers_message(page, model_server: LiveServer) -> None:
    wait_for_model(page)
    team = page.locator("#d-questions .question[data-type=choice] .option-row .value")
    team.nth(1).fill("billing")  # a duplicate choice value
    body = page.evaluate("decisionBody()")
    page.click("#d-run")
    page.wait_for_selector("#d-error:not([hidden])")
    expected = httpx.post(model_server.v1 + "/decisions", json=body, timeout=60)
    assert expected.status_code == 400
    assert page.inner_text("#d-error .status") == "HTTP 400"
    assert page.inner_text("#d-error .message") == expected.json()["error"]["message"]
    shot(page, "decision-error")

    page.click(".tab[data-tab=chat]")
    page.select_option("#c-model", SMOLLM2_ID)
    page.fill("#c-max", str(10**12))
    page.fill("#c-input", "hi")
    page.press("#c-input", "Enter")
    page.wait_for_selector("#c-error:not([hidden])")
    direct = httpx.post(model_server.v1 + "/chat/completions", timeout=60, json={
        "model": SMOLLM2_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**12, "stream": True})
    assert direct.status_code == 400
    assert page.inner_text("#c-error .message") == direct.json()["error"]["message"]
    assert page.locator(".msg").count() == 0  # the failed turn is not kept: its text is back in the box
    assert page.input_value("#c-input") == "hi"


# ---- decisions: debiasing and calibration -------------------------------------------------------

ADJUSTMENT_OPTIONS = {"#d-debias": ["none", "permute", "prior"], "#d-calibration": ["none", "contextual", "fitted"]}


def _fake_decisions(page, status: int, payload: dict, masses: str = "0.9,0.8,0.7") -> list[dict]:
    """Answers the page's decision requests with `payload`; the list returned fills with the bodies it sent."""
    sent: list[dict] = []

    def answer(route) -> None:
        sent.append(route.request.post_data_json)
        route.fulfill(status=status, headers={"Content-Type": "application/json", "X-Swama-Label-Mass": masses},
                      body=json.dumps(payload))

    page.route("**/v1/decisions", answer)
    return sent


def _decide(page) -> dict | None:
    """Runs the form; the run the page kept, or None when it showed an error instead."""
    page.evaluate("() => { state.last = null; }")
    page.click("#d-run")
    page.wait_for_function("() => !document.querySelector('#d-run').disabled"
                           " && (state.last !== null || !document.querySelector('#d-error').hidden)", timeout=180_000)
    return None if page.is_visible("#d-error") else page.evaluate("state.last")


def readings(page) -> list[dict[str, dict]]:
    """Per answer, per reading drawn ("plain", "adjusted"): its name and its options as `bars` reads them."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#d-answers .answer')).map(a =>
        Object.fromEntries(Array.from(a.querySelectorAll('.reading')).map(r => [r.dataset.reading, {
            name: r.querySelector('.reading-name').textContent,
            options: Array.from(r.querySelectorAll('.option')).map(o => ({
                label: o.querySelector('.label').textContent,
                p: Number(o.dataset.probability),
                bar: o.querySelector('.bar').getBoundingClientRect().width,
                track: o.querySelector('.track').getBoundingClientRect().width,
                winner: o.classList.contains('winner')}))}])))""")


def _check_reading(options: list[dict], expected: list[float]) -> None:
    assert [o["p"] for o in options] == pytest.approx(expected, abs=F64_ARITHMETIC)  # as in the decision test
    for option, p in zip(options, expected, strict=True):
        assert option["bar"] == pytest.approx(p * option["track"], abs=PIXEL)
    best = max(range(len(expected)), key=lambda i: (expected[i], -i))
    assert [o["winner"] for o in options] == [i == best for i in range(len(expected))]


def _adjusted(answer: dict, probabilities: list[float], adjustment: dict) -> dict:
    """`answer` (a real one) as an adjusted answer would come: new probabilities, its own as the plain reading."""
    out = {**answer, "x_adjustment": {**adjustment, "raw_probabilities": api_options(answer)}}
    if answer["type"] == "predicate":
        out["probability"] = probabilities[0]
        return out
    out["probabilities"] = [{**p, "probability": q} for p, q in zip(answer["probabilities"], probabilities, strict=True)]
    if answer["type"] == "choice":
        out["choice"] = answer["probabilities"][max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))]["value"]
    else:
        out["score"] = sum(p["value"] * q for p, q in zip(answer["probabilities"], probabilities, strict=True))
    return out


def test_adjustment_controls_compose_the_request_and_show_both_readings(page, tmp_path: Path) -> None:
    wait_for_model(page)
    for select, values in ADJUSTMENT_OPTIONS.items():
        assert page.locator(f"{select} option").evaluate_all("os => os.map(o => o.value)") == values
        assert page.input_value(select) == "none"
    # Both at "none": the request is as it always was, and the answers are drawn as one reading.
    plain = run_decision(page)
    assert not {"x_debias", "x_calibration"} & set(plain["body"])
    assert page.locator("#d-answers .reading, #d-answers .adjustment").count() == 0
    real = plain["response"]

    # permute + contextual: the fields go at the top level; each answer shows its plain reading beside
    # the adjusted one, and a line naming what was applied.
    page.select_option("#d-debias", "permute")
    page.select_option("#d-calibration", "contextual")
    contextual = {"calibration": "contextual", "orders": 1}
    predicate, choice, score = real["answers"]
    answers = [
        _adjusted(predicate, [0.25], {**contextual, "debias": "none", "content_free": [0.875, 0.125]}),
        _adjusted(choice, [0.125, 0.25, 0.625], {**contextual, "debias": "permute", "orders": 3,
                                                 "content_free": [0.5, 0.25, 0.25]}),
        _adjusted(score, [0.5, 0.25, 0.25], {**contextual, "debias": "none", "content_free": [0.25, 0.5, 0.25]}),
    ]
    sent = _fake_decisions(page, 200, {**real, "answers": answers})
    run = run_decision(page)
    assert sent[-1] == {**plain["body"], "x_debias": "permute", "x_calibration": "contextual"} == run["body"]
    assert list(sent[-1])[-2:] == ["x_debias", "x_calibration"]
    drawn = readings(page)
    assert [sorted(d) for d in drawn] == [["adjusted", "plain"]] * 3
    assert [d["plain"]["name"] for d in drawn] == ["plain"] * 3
    assert [d["adjusted"]["name"] for d in drawn] == ["contextual", "permute + contextual", "contextual"]
    for answer, reading in zip(answers, drawn, strict=True):
        _check_reading(reading["plain"]["options"], answer["x_adjustment"]["raw_probabilities"])
        _check_reading(reading["adjusted"]["options"], api_options(answer))
        assert [o["label"] for o in reading["plain"]["options"]] == [o["label"] for o in reading["adjusted"]["options"]]
    assert page.locator("#d-answers .adjustment").all_inner_texts() == [
        "applied: debias none (permute asked), 1 order scored · calibration contextual · content-free reading [0.875, 0.125]",
        "applied: debias permute, 3 orders scored · calibration contextual · content-free reading [0.500, 0.250, 0.250]",
        "applied: debias none (permute asked), 1 order scored · calibration contextual · content-free reading [0.250, 0.500, 0.250]",
    ]
    shot(page, "decisions-adjusted")

    # The snippets carry the fields: in the body for curl, as extra_body for the SDKs.
    page.click("button.copy[data-snippet=curl]")
    curl = page.inner_text("#d-snippet")
    assert '"x_debias":"permute","x_calibration":"contextual"' in curl
    for kind, pad in (("openai", "    "), ("typesafe", "        ")):
        page.click(f"button.copy[data-snippet={kind}]")
        page.wait_for_function("k => document.querySelector('#d-snippet').dataset.kind === k", arg=kind)
        text = page.evaluate("document.querySelector('#d-snippet').textContent")
        extra = [f"{pad}extra_body={{", f'{pad}    "x_debias": "permute",', f'{pad}    "x_calibration": "contextual",', f"{pad}}},"]
        assert "\n".join(extra) + "\n" + pad[4:] + ")" in text, text
        compile(text, f"snippet_{kind}.py", "exec")

    # A prior from the calibration file and a fitted temperature: the line names both.
    page.unroute("**/v1/decisions")
    page.select_option("#d-debias", "prior")
    page.select_option("#d-calibration", "fitted")
    fitted = {"calibration": "fitted", "orders": 1, "temperature": 1.25}
    answers = [
        _adjusted(predicate, [0.5], {**fitted, "debias": "none"}),
        _adjusted(choice, [0.5, 0.25, 0.25], {**fitted, "debias": "prior", "prior": [0.5, 0.375, 0.125],
                                              "prior_questions": 16, "prior_source": "file"}),
        _adjusted(score, [0.25, 0.25, 0.5], {**fitted, "debias": "none"}),
    ]
    sent = _fake_decisions(page, 200, {**real, "answers": answers})
    run_decision(page)
    assert {k: sent[-1][k] for k in ("x_debias", "x_calibration")} == {"x_debias": "prior", "x_calibration": "fitted"}
    assert [d["adjusted"]["name"] for d in readings(page)] == ["fitted", "prior + fitted", "fitted"]
    assert page.locator("#d-answers .adjustment").nth(1).inner_text() == (
        "applied: debias prior, 1 order scored · prior [0.500, 0.375, 0.125] (from the calibration file, 16 questions)"
        " · calibration fitted · temperature 1.250")
    # Still estimating the prior: the question was answered by permuting, and the line says so.
    page.unroute("**/v1/decisions")
    answers[1] = _adjusted(choice, [0.5, 0.25, 0.25], {**fitted, "debias": "permute", "orders": 3,
                                                       "prior_questions": 2, "prior_source": "estimating"})
    _fake_decisions(page, 200, {**real, "answers": answers})
    run_decision(page)
    assert page.locator("#d-answers .adjustment").nth(1).inner_text() == (
        "applied: debias permute (prior asked), 3 orders scored · prior (still estimating, 2 questions)"
        " · calibration fitted · temperature 1.250")

    # An error answer (fitted with no calibration file) is shown in the server's words, as any error.
    page.unroute("**/v1/decisions")
    page.select_option("#d-debias", "none")
    message = "x_calibration fitted needs a calibration file for smollm2: run swama calibrate first"
    sent = _fake_decisions(page, 400, {"error": {"message": message, "type": "invalid_request_error",
                                                 "param": "x_calibration", "code": None}})
    assert _decide(page) is None
    assert "x_debias" not in sent[-1] and sent[-1]["x_calibration"] == "fitted"
    assert page.inner_text("#d-error .status") == "HTTP 400" and page.inner_text("#d-error .message") == message
    page.unroute("**/v1/decisions")

    # The controls are remembered; an entry of the history brings back its own, and its two readings.
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert (page.input_value("#d-debias"), page.input_value("#d-calibration")) == ("none", "fitted")
    entry = page.locator("#d-history li button").nth(2)  # the permute + contextual run
    assert entry.inner_text().endswith(" · permute · contextual")
    entry.click()
    assert (page.input_value("#d-debias"), page.input_value("#d-calibration")) == ("permute", "contextual")
    assert [d["adjusted"]["name"] for d in readings(page)] == ["contextual", "permute + contextual", "contextual"]
    page.locator("#d-history li button").last.click()  # the plain run: no adjustment, one reading
    assert (page.input_value("#d-debias"), page.input_value("#d-calibration")) == ("none", "none")
    assert page.locator("#d-answers .reading").count() == 0 and len(bars(page)) == 3


def test_live_adjusted_decision(page, model_server: LiveServer, tmp_path: Path) -> None:
    """The server's own debiasing and calibration, drawn: needs the server to take x_debias and x_calibration."""
    wait_for_model(page)
    # fitted needs the model's calibration file, which the test store does not have: the server's 400.
    page.select_option("#d-calibration", "fitted")
    body = page.evaluate("decisionBody()")
    assert body["x_calibration"] == "fitted" and "x_debias" not in body
    assert _decide(page) is None
    refused = httpx.post(model_server.v1 + "/decisions", json=body, timeout=120)
    assert refused.status_code == 400
    assert page.inner_text("#d-error .message") == refused.json()["error"]["message"]

    page.select_option("#d-debias", "permute")
    page.select_option("#d-calibration", "contextual")
    run = _decide(page)
    assert run is not None, page.inner_text("#d-error")
    assert {k: run["body"][k] for k in ("x_debias", "x_calibration")} == {"x_debias": "permute", "x_calibration": "contextual"}
    direct = httpx.post(model_server.v1 + "/decisions", json=run["body"], timeout=180)
    assert direct.status_code == 200, direct.text
    answers = direct.json()["answers"]
    assert run["response"]["answers"] == answers
    adjustments = [a["x_adjustment"] for a in answers]
    assert [a["debias"] for a in adjustments] == ["none", "permute", "none"]  # only a choice has an option order
    assert [a["orders"] for a in adjustments] == [1, 3, 1]  # every order of the three choices
    assert all(a["calibration"] == "contextual" and a.get("content_free") for a in adjustments)
    drawn = readings(page)
    assert [d["adjusted"]["name"] for d in drawn] == ["contextual", "permute + contextual", "contextual"]
    for answer, reading in zip(answers, drawn, strict=True):
        _check_reading(reading["plain"]["options"], answer["x_adjustment"]["raw_probabilities"])
        _check_reading(reading["adjusted"]["options"], api_options(answer))
    assert page.locator("#d-answers .adjustment").nth(1).inner_text().startswith(
        "applied: debias permute, 3 orders scored · calibration contextual · content-free reading [")
    shot(page, "decisions-adjusted-live")

    # The snippets send the same request.
    assert json.loads(_run_snippet("curl", page, tmp_path))["answers"] == answers
    assert json.loads(_run_snippet("openai", page, tmp_path))["answers"] == answers
    systemone = json.loads(_run_snippet("typesafe", page, tmp_path))
    assert all("x_adjustment" in a for a in systemone.values())


def test_models_and_live_metrics(page, model_server: LiveServer) -> None:
    httpx.post(model_server.v1 + "/chat/completions", timeout=120, json={
        "model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    page.click(".tab[data-tab=server]")
    row = page.locator(f"#m-table tr[data-model='{SMOLLM2_ID}']")
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == "language" and re.fullmatch(r"[\d.]+ MiB", cells[2]) and cells[3] == "yes"
    assert page.locator("#m-table tbody tr").count() == len(httpx.get(model_server.v1 + "/models").json()["data"])
    # The second reading gives a rate; tokens generated meanwhile show in it.
    rate = "() => Number((document.querySelector('[data-stat=generated-rate]') || {}).textContent)"
    page.wait_for_function(f"() => !Number.isNaN(({rate})())", timeout=20_000)
    chat = threading.Thread(target=httpx.post, args=(model_server.v1 + "/chat/completions",), kwargs={
        "timeout": 120, "json": {"model": "smollm2", "messages": [{"role": "user", "content": "Count to twenty."}],
                                 "max_tokens": 32, "temperature": 0}})
    chat.start()
    page.wait_for_function(f"() => ({rate})() > 0", timeout=60_000)
    chat.join()
    stat = {k: page.inner_text(f"[data-stat={k}]")
            for k in ("queue", "running", "loaded", "generated", "requests", "draft-accepted")}
    assert int(stat["queue"]) >= 0 and int(stat["running"]) >= 0 and int(stat["loaded"]) >= 1
    assert float(stat["draft-accepted"]) >= 0
    assert float(stat["generated"]) >= 4 and float(stat["requests"]) > 0
    shot(page, "server")


def _batch(number: int, status: str, completed: int, failed: int, total: int, model: str | None = "smollm2") -> dict:
    return {"id": f"batch_{number}", "object": "batch", "endpoint": "/v1/chat/completions", "model": model,
            "status": status, "input_file_id": f"file-{number}", "output_file_id": None, "error_file_id": None,
            "completion_window": "24h", "created_at": 1_700_000_000 + number, "metadata": None,
            "request_counts": {"total": total, "completed": completed, "failed": failed}}


def test_running_batch_jobs_show_with_their_progress(browser, empty_server: LiveServer) -> None:
    """The server view lists the batch jobs not yet over from GET /v1/batches (a stand-in answer here:
    the real routes are tested with the server), refreshed every 2 s, and nothing when there are none
    or the route fails."""
    answer = {"status": 200, "body": {"object": "list", "data": [
        _batch(4, "in_progress", 117, 3, 200), _batch(3, "completed", 10, 0, 10), _batch(2, "validating", 0, 0, 0, None),
        _batch(1, "cancelling", 5, 0, 8)], "first_id": "batch_4", "last_id": "batch_1", "has_more": False}}
    asked: list[tuple[str, str | None]] = []

    def batches(route) -> None:
        asked.append((route.request.url, route.request.headers.get("authorization")))
        route.fulfill(status=answer["status"], headers={"Content-Type": "application/json"},
                      body=json.dumps(answer["body"]))

    page = open_page(browser, empty_server)
    page.route(re.compile(r"/v1/batches(\?|$)"), batches)
    page.fill("#api-key", KEY)
    page.click("#key-save")
    page.click(".tab[data-tab=server]")
    page.wait_for_selector("#b-card:not([hidden]) tr[data-batch]")
    assert asked[0] == (empty_server.url + "/v1/batches?limit=100", f"Bearer {KEY}")
    rows = page.locator("#b-table tbody tr")
    assert [rows.nth(i).get_attribute("data-batch") for i in range(rows.count())] == ["batch_4", "batch_2", "batch_1"]
    assert rows.nth(0).locator("td").all_inner_texts()[:4] == ["batch_4", "smollm2", "/v1/chat/completions",
                                                               "in_progress"]
    assert rows.nth(0).locator(".count").inner_text() == "120/200 (60%), 3 failed"
    assert rows.nth(1).locator("td").nth(1).inner_text() == "\u2013" and rows.nth(1).locator(".count").inner_text() == "0/0"
    track, bar = (page.locator("tr[data-batch=batch_4] .progress " + part).bounding_box()["width"] for part in (".track", ".bar"))
    assert abs(bar - 0.6 * track) <= PIXEL
    shot(page, "batches")

    answer["body"]["data"][0] = _batch(4, "finalizing", 197, 3, 200)
    page.wait_for_function("() => document.querySelector('tr[data-batch=batch_4] .count').textContent.startsWith('200/200')",
                           timeout=10_000)
    answer["body"]["data"] = [_batch(3, "completed", 10, 0, 10)]
    page.wait_for_selector("#b-card", state="hidden", timeout=10_000)
    # A route that fails shows nothing either, and no error: a card drawn by hand goes at the next reading.
    answer.update(status=404, body={"error": {"message": "Not found", "type": "invalid_request_error"}})
    page.evaluate("renderBatches([{id: 'batch_9', status: 'in_progress', request_counts: {total: 1}}])")
    assert page.is_visible("#b-card")
    seen = len(asked)
    for _ in range(50):
        if len(asked) > seen:
            break
        page.wait_for_timeout(100)
    assert len(asked) > seen
    page.wait_for_selector("#b-card", state="hidden", timeout=5_000)
    assert page.is_hidden("#banner")
    errors = page.script_errors
    page.context.close()
    assert not errors, errors


def _png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), color).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def key_server(tmp_path_factory, smollm2_dir: Path, tiny_vision_dirs: dict[str, Path]) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("playground-store")
    install_folder(root, SMOLLM2_ID, smollm2_dir)
    install_folder(root, QWEN_VL, tiny_vision_dirs["qwen3_5_vl"])
    server = start_server(root, root.parent / "playground-key.log", "smollm2", "--api-key", KEY)
    yield server
    server.stop()


def test_the_key_is_entered_once_and_sent_as_a_bearer_token(browser, key_server: LiveServer, tmp_path: Path) -> None:
    page = open_page(browser, key_server)
    page.wait_for_selector("#banner:not([hidden])")
    refused = httpx.get(key_server.v1 + "/models")
    assert refused.status_code == 401
    assert page.inner_text("#banner .message") == refused.json()["error"]["message"]
    assert page.locator("#d-model option[value]").first.get_attribute("value") == ""  # nothing listed
    page.fill("#api-key", KEY)
    page.click("#key-save")
    wait_for_model(page)
    assert page.is_hidden("#banner")
    run_decision(page)
    decided = [h for url, h in page.requests_seen if url.endswith("/v1/decisions")]
    assert decided and decided[-1]["authorization"] == f"Bearer {KEY}"
    # The snippet reads the key from SWAMA_API_KEY instead of printing it.
    out = _run_snippet("openai", page, tmp_path, env={"SWAMA_API_KEY": KEY})
    assert KEY not in page.evaluate("document.querySelector('#d-snippet').textContent")
    assert json.loads(out)["answers"] == page.evaluate("state.last.response.answers")

    # Images for a vision model: the drop zone appears, the files go as input_image parts.
    page.select_option("#d-model", QWEN_VL)
    assert page.is_visible("#d-drop")
    page.set_input_files("#d-files", [
        {"name": f"{i}.png", "mimeType": "image/png", "buffer": _png(c)} for i, c in enumerate([(255, 0, 0), (0, 0, 255)])])
    page.wait_for_function("() => document.querySelectorAll('#d-thumbs img').length == 2")
    with_images = run_decision(page)
    parts = with_images["body"]["input"][0]["content"]
    assert [p["type"] for p in parts] == ["input_text", "input_image", "input_image"]
    assert parts[1]["image_url"] == "data:image/png;base64," + base64.b64encode(_png((255, 0, 0))).decode()
    text_only = httpx.post(key_server.v1 + "/decisions", headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                           json={**with_images["body"], "input": parts[0]["text"]})
    assert with_images["response"]["usage"]["input_tokens"] > text_only.json()["usage"]["input_tokens"]
    shot(page, "vision")

    # Chat with an image on the vision model: the picture goes as an image_url part and the reply streams.
    page.click(".tab[data-tab=chat]")
    page.select_option("#c-model", QWEN_VL)
    assert page.is_visible("#c-drop")
    page.set_input_files("#c-files", [{"name": "red.png", "mimeType": "image/png", "buffer": _png((255, 0, 0))}])
    page.fill("#c-max", "8")
    page.fill("#c-input", "What colour is this?")
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as sent:
        page.press("#c-input", "Enter")
    page.wait_for_function("() => !document.querySelector('#c-send').disabled && document.querySelectorAll('.msg').length == 2",
                           timeout=120_000)
    assert page.is_hidden("#c-error"), page.inner_text("#c-error")
    content = json.loads(sent.value.post_data)["messages"][-1]["content"]
    assert [p["type"] for p in content] == ["text", "image_url"]
    assert page.locator(".msg.user img").count() == 1 and page.locator("#c-thumbs img").count() == 0
    assert re.match(r"\d+ tokens", page.inner_text("#c-stats"))
    page.click(".tab[data-tab=decisions]")

    # Entered once: a new visit finds the key in the browser's storage.
    page.reload()
    wait_for_model(page)
    assert page.is_hidden("#banner")
    page.context.close()


def test_no_ui_serves_only_the_api(empty_server: LiveServer, tmp_path: Path) -> None:
    server = start_server(tmp_path / "store", tmp_path / "no-ui.log", "--no-ui")
    try:
        for path in ("/", "/ui/", "/ui/playground.js"):
            r = httpx.get(server.url + path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert httpx.get(server.v1 + "/models").status_code == 200
    finally:
        server.stop()
    assert httpx.get(empty_server.url + "/").status_code == 200  # on by default
