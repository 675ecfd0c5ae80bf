"""The playground's batch jobs card, read as files: the page asks /v1/batches with the key it sends
elsewhere, on the server view's 2 s refresh, and the card it fills exists, hidden until there is a job.
The browser test (tests/live/test_playground.py) draws it from a stand-in answer."""

from __future__ import annotations

import re
from pathlib import Path

import swama.handlers.http

ASSETS = Path(swama.handlers.http.__file__).resolve().parent / "playground_assets"


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def _function(js: str, name: str) -> str:
    """The text of a top-level function, to its closing brace at the start of a line."""
    match = re.search(rf"^(?:async )?function {name}\(.*?^\}}$", js, re.M | re.S)
    assert match, name
    return match.group(0)


def test_the_page_reads_the_batches_with_its_key() -> None:
    refresh = _function(_asset("playground.js"), "refreshBatches")
    assert '"/v1/batches?limit=100"' in refresh
    assert "headers: authHeaders()" in refresh
    assert "AbortSignal.timeout(" in refresh  # a reading that never comes does not stop the next ones


def test_only_jobs_not_yet_over_are_shown() -> None:
    js = _asset("playground.js")
    [active] = re.findall(r"const BATCH_ACTIVE = \[(.*?)\];", js)
    assert {s.strip().strip('"') for s in active.split(",")} == {"validating", "in_progress", "finalizing",
                                                                 "cancelling"}
    start = _function(js, "start")
    assert "refreshBatches()" in start and 'document.visibilityState === "visible"' in start


def test_the_card_is_on_the_server_view_and_hidden_at_first() -> None:
    html = _asset("index.html")
    server = html[html.index('id="panel-server"'):]
    assert re.search(r'<div class="card wide" id="b-card" hidden>', server)
    assert '<table id="b-table">' in server
    css = _asset("playground.css")
    assert ".progress .bar" in css and ".wide" in css
