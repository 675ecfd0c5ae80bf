"""The spec pipeline's command line.

    python -m swama.tools.specs extract  --openai F --decisions F --systemone F --clef F
    python -m swama.tools.specs generate            # specs/ -> generated/
    python -m swama.tools.specs check               # exit 1 when generated/ is stale or hand-edited
    python -m swama.tools.specs diff OLD_DIR [NEW_DIR]
    python -m swama.tools.specs bump --openai F ... # extract, generate, print the schema diff, run tests
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from swama.tools import codegen, spec_diff, spec_extract

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"
GENERATED = REPO / "generated"


def _add_upstream_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--openai", type=Path, required=True, help="openai/openai-openapi openapi.yaml")
    parser.add_argument("--decisions", type=Path, required=True, help="the Decisions API document")
    parser.add_argument("--systemone", type=Path, required=True, help="System One openapi.json")
    parser.add_argument("--clef", type=Path, required=True, help="Cloudflare Clef model card (clef.json)")


def _extract(args: argparse.Namespace, specs_dir: Path) -> None:
    pins = spec_extract.extract_all(specs_dir, args.openai, args.decisions, args.systemone, args.clef)
    for pin in pins:
        print(f"wrote specs/{pin['document']}  ({pin['upstream_repo']} @ {pin['upstream_commit']})")


def print_diff(old_dir: Path, new_dir: Path) -> int:
    changed = 0
    for name in codegen.DOCUMENTS.values():
        old_path, new_path = old_dir / name, new_dir / name
        old = spec_extract.load_document(old_path) if old_path.exists() else {}
        new = spec_extract.load_document(new_path) if new_path.exists() else {}
        lines = spec_diff.diff_documents(old, new)
        print(f"== {name}: {len(lines) and 'changed' or 'no schema changes'}")
        for line in lines:
            print("  " + line)
        changed += bool(lines)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swama.tools.specs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_upstream_args(sub.add_parser("extract", help="upstream files -> specs/"))
    sub.add_parser("generate", help="specs/ -> generated/")
    sub.add_parser("check", help="fail when generated/ differs from a fresh compile of specs/")
    d = sub.add_parser("diff", help="schema changes between two specs folders")
    d.add_argument("old", type=Path)
    d.add_argument("new", type=Path, nargs="?", default=SPECS)
    b = sub.add_parser("bump", help="extract + generate + diff + run the tests")
    _add_upstream_args(b)
    b.add_argument("--no-tests", action="store_true")
    args = parser.parse_args(argv)

    if args.command == "extract":
        _extract(args, SPECS)
    elif args.command == "generate":
        for name in codegen.write(SPECS, GENERATED):
            print(f"wrote generated/{name}")
    elif args.command == "check":
        stale = codegen.check(SPECS, GENERATED)
        if stale:
            print("generated/ is out of date with specs/ (or was edited by hand): " + ", ".join(stale))
            print("run: python -m swama.tools.specs generate")
            return 1
        print("generated/ is up to date")
    elif args.command == "diff":
        print_diff(args.old, args.new)
    elif args.command == "bump":
        with tempfile.TemporaryDirectory() as tmp:
            before = Path(tmp) / "before"
            shutil.copytree(SPECS, before)
            _extract(args, SPECS)
            codegen.write(SPECS, GENERATED)
            print_diff(before, SPECS)
        if not args.no_tests:
            return subprocess.call([sys.executable, "-m", "pytest", "-q", str(REPO / "tests")], cwd=REPO)
    return 0


if __name__ == "__main__":
    sys.exit(main())
