"""The browser playground in headless Chromium (Debian's package, driven by Playwright): decisions
drawn as bars that match the API, snippets that reproduce the request, streaming chat, the models
and metrics view, errors in the server's words, the API key and --no-ui.

Screenshots go to .cache/test-artifacts/playground (SWAMA_TEST_ARTIFACTS overrides it)."""

from __future__ import annotations

import base64
import io
import json
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

from live_server import LiveServer, start_server

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
    page.goto(path)
    page.wait_for_selector("body[data-ready=true]")
    return page


@pytest.fixture
def page(browser, model_server: LiveServer):
    page = open_page(browser, model_server)
    yield page
    page.context.close()


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
        assert [o["p"] for o in options] == pytest.approx(expected, abs=1e-12)
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
    assert masses == pytest.approx([answers["a"]["x_label_mass"], answers["b"]["x_label_mass"]], rel=1e-3)


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
    stat = {k: page.inner_text(f"[data-stat={k}]") for k in ("queue", "running", "loaded", "generated", "requests")}
    assert int(stat["queue"]) >= 0 and int(stat["running"]) >= 0 and int(stat["loaded"]) >= 1
    assert float(stat["generated"]) >= 4 and float(stat["requests"]) > 0
    shot(page, "server")


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
