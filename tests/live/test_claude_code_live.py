"""Claude Code (npm @anthropic-ai/claude-code), unchanged, in print mode against the live server through
ANTHROPIC_BASE_URL and a dummy key: its real requests (streamed, `?beta=true`, system blocks with
cache_control, adaptive thinking, context_management, output_config, the Read tool offered) are
answered by SmolLM2 and the turn ends with its answer printed. SmolLM2-135M answers in text rather than
calling Read (no run seen calling it), so the tool's half of the round trip is tested with the anthropic
SDK (test_messages_live.py), not here."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from live_server import LiveServer, npm_binary

CLAUDE_CODE_VERSION = "2.1.328"


@pytest.fixture(scope="session")
def claude_code(model_cache_dir: Path) -> Path:
    """Claude Code from npm, installed into the test cache (a failure here is a set-up failure)."""
    return npm_binary(model_cache_dir.parent / "claude-code", f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}",
                      "claude")


def _count(server: LiveServer, status: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    pattern = rf'swama_requests_total\{{[^}}]*route="/v1/messages"[^}}]*status="{status}"[^}}]*\}} (\S+)'
    return sum(float(v) for v in re.findall(pattern, text))


def test_claude_code_print_mode_end_to_end(claude_code: Path, model_server: LiveServer, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text("The code word is PAPAYA.\n")
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
        "ANTHROPIC_BASE_URL": model_server.url, "ANTHROPIC_API_KEY": "local",
        # No traffic beyond the turn itself (telemetry, update checks, the warm-up probe).
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
        # SmolLM2's window, so Claude Code budgets its prompt and answer to fit (with --bare it allows
        # answers up to about 4.6k tokens there); an answer cut at max_tokens makes it ask to resume.
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "8192", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "1024",
        "DISABLE_AUTO_COMPACT": "1", "CLAUDE_CODE_MAX_RETRIES": "0",
        # Claude Code sends no temperature (so 1.0, Anthropic's default), and at 1.0 SmolLM2 now and
        # then rambles past the output cap on every resumption until Claude Code gives up: a draw of
        # the model's, not the protocol's. Claude Code's own extra-body setting makes the turn greedy,
        # so the run is the same every time (the request is otherwise Claude Code's, field for field).
        "CLAUDE_CODE_EXTRA_BODY": '{"temperature": 0}',
    }
    (tmp_path / "home").mkdir()
    before, refused = _count(model_server, "200"), _count(model_server, "400")
    out = subprocess.run(
        [str(claude_code), "-p", "Read the file note.txt and tell me the code word in it.", "--model", "smollm2",
         "--bare", "--tools", "Read", "--no-session-persistence", "--output-format", "json"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["type"] == "result" and result["is_error"] is False and result["terminal_reason"] == "completed"
    assert result["result"].strip() and result["num_turns"] >= 1
    assert result["modelUsage"]["smollm2"]["inputTokens"] + result["modelUsage"]["smollm2"]["cacheReadInputTokens"] > 300
    # Every turn it took was a streamed /v1/messages answered with 200, none refused.
    assert _count(model_server, "200") - before >= result["num_turns"]
    assert _count(model_server, "400") == refused
