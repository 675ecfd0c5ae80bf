"""Documentation made from the code stays in step with it."""

from __future__ import annotations

from tools.docs import CLI_DOC, rendered


def test_the_options_table_in_docs_cli_is_made_from_the_settings() -> None:
    text = CLI_DOC.read_text(encoding="utf-8")
    assert rendered(text) == text, "docs/cli.md is out of date: run python -m tools.docs"
