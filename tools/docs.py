"""Parts of the documentation made from the code, so they cannot drift from it:
the server's options table in docs/cli.md, from the settings models.

    python -m tools.docs          # rewrite them
    python -m tools.docs check    # exit 1 when a document is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from swama.engine.client import RuntimeSettings
from swama.handlers.cli.options import options_table
from swama.handlers.http.settings import ServerSettings

REPO = Path(__file__).resolve().parents[1]
CLI_DOC = REPO / "docs" / "cli.md"
BEGIN, END = "<!-- options: made by python -m tools.docs -->", "<!-- options: end -->"


def rendered(text: str) -> str:
    """`text` with the options table between the markers made afresh."""
    table = options_table(ServerSettings, RuntimeSettings)
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{CLI_DOC.name} has no {BEGIN} ... {END} section")
    return pattern.sub(lambda _: f"{BEGIN}\n{table}{END}", text)


def main(argv: list[str]) -> int:
    text = CLI_DOC.read_text(encoding="utf-8")
    fresh = rendered(text)
    if argv[:1] == ["check"]:
        if fresh != text:
            print(f"{CLI_DOC.relative_to(REPO)} is out of date: run python -m tools.docs")
            return 1
        print(f"{CLI_DOC.relative_to(REPO)} is up to date")
        return 0
    CLI_DOC.write_text(fresh, encoding="utf-8")
    print(f"wrote {CLI_DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
