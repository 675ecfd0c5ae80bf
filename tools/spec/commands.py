"""The spec pipeline's command line.

    python -m tools.spec extract  [--openai F] [--decisions F] [--systemone F] [--clef F [--clef-flash F]]
                                  [--tokenize F]   # our vLLM tokenizer document: rebuilt every time
                                  [--anthropic]    # from the installed anthropic SDK (the pinned version)
                                  [--cohere]       # from the installed cohere SDK (the pinned version)
    python -m tools.spec generate            # specs/ -> generated/
    python -m tools.spec check               # exit 1 when generated/ is stale or hand-edited
    python -m tools.spec diff OLD_DIR [NEW_DIR]
    python -m tools.spec bump --openai F ... # extract, generate, print the schema diff, run tests
    python -m tools.spec bump --anthropic    # after `pip install anthropic==<new version>` and a new
                                             # ANTHROPIC.commit in tools/spec/sources.py

Upstream files not given keep their pinned documents. Overlays in specs/overlays/ are applied at
extraction; `--specs-dir`/`--generated-dir` point the commands at another tree (a trial bump).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.spec import codegen, sdk_types
from tools.spec import diff as spec_diff
from tools.spec import extract as spec_extract
from tools.spec.sources import SOURCES

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "specs"
GENERATED = REPO / "generated"


def _add_upstream_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--openai", type=Path, help="openai/openai-openapi openapi.yaml")
    parser.add_argument("--decisions", type=Path, help="the Decisions API document")
    parser.add_argument("--systemone", type=Path, help="System One openapi.json (with --clef)")
    parser.add_argument("--clef", type=Path,
                        help="Cloudflare Clef model card, clef.json (with --systemone and/or --clef-flash)")
    parser.add_argument("--clef-flash", type=Path,
                        help="Cloudflare Clef-flash model card, clef-flash.json (with --clef): the Workers AI routes")
    parser.add_argument("--tokenize", type=Path,
                        help="our document of vLLM's /tokenize and /detokenize (default: "
                             "tools/spec/written/vllm-tokenize.yaml; rebuilt on every extraction)")
    parser.add_argument("--anthropic", action="store_true",
                        help="build the Anthropic Messages document from the installed anthropic SDK "
                             "(no file: the package is the upstream; it must be the pinned version)")
    parser.add_argument("--cohere", action="store_true",
                        help="build the Cohere rerank document from the installed cohere SDK "
                             "(no file: the package is the upstream; it must be the pinned version)")


def _extract(args: argparse.Namespace, specs_dir: Path) -> None:
    given = {"openai": args.openai, "decisions": args.decisions, "systemone": args.systemone, "clef": args.clef,
             "clef_flash": args.clef_flash, "tokenize": args.tokenize, "anthropic": args.anthropic, "cohere": args.cohere}
    if not any(given.values()):
        raise SystemExit("give at least one upstream file (--openai, --decisions, --systemone with --clef, "
                         "--clef with --clef-flash, --tokenize), --anthropic or --cohere")
    try:
        pins = spec_extract.extract_all(specs_dir, **given)
    except sdk_types.SdkMismatch as exc:
        raise SystemExit(str(exc)) from None
    names = {s.doc for key, s in SOURCES.items() if given.get(key)}
    if (specs_dir / SOURCES["openai"].doc).exists():
        names |= {SOURCES["tokenize"].doc, SOURCES["score"].doc}  # ours, in the repository: rebuilt every time
    for pin in pins:
        if pin["document"] in names:
            print(f"wrote specs/{pin['document']}  ({pin['upstream_repo']} @ {pin['upstream_commit']})")


def print_overlay_changes(old_dir: Path, new_dir: Path) -> None:
    """Overlays are reviewed text: show every changed line, beside the schema diff they cause."""
    import difflib

    names = {p.name for d in (old_dir, new_dir) for p in (d / "overlays").glob("*.yaml")}
    for name in sorted(names):
        old = (old_dir / "overlays" / name).read_text().splitlines() if (old_dir / "overlays" / name).exists() else []
        new = (new_dir / "overlays" / name).read_text().splitlines() if (new_dir / "overlays" / name).exists() else []
        lines = list(difflib.unified_diff(old, new, f"old/overlays/{name}", f"new/overlays/{name}", lineterm=""))
        print(f"== overlays/{name}: {'changed' if lines else 'unchanged'}")
        for line in lines[2:]:
            print("  " + line)


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


def print_overlay_pins(old_dir: Path, new_dir: Path) -> None:
    """Which overlays differ from the ones the previous pins were made with."""
    import json

    def pins(folder: Path) -> dict[str, dict]:
        path = folder / "pins.json"
        return {p["document"]: p for p in json.loads(path.read_text())} if path.exists() else {}

    old, new = pins(old_dir), pins(new_dir)
    for document, pin in new.items():
        if "overlay" not in pin:
            continue
        same = old.get(document, {}).get("overlay_sha256") == pin["overlay_sha256"]
        print(f"== {pin['overlay']}: " + ("unchanged since the last pin" if same else
                                         f"changed since the last pin; review it: git diff specs/{pin['overlay']}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.spec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs-dir", type=Path, default=None, help="the specs folder (default: specs/)")
    parser.add_argument("--generated-dir", type=Path, default=None,
                        help="the generated folder (default: generated/)")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_upstream_args(sub.add_parser("extract", help="upstream files -> specs/"))
    sub.add_parser("generate", help="specs/ -> generated/")
    sub.add_parser("check", help="fail when generated/ differs from a fresh compile of specs/")
    d = sub.add_parser("diff", help="schema changes between two specs folders")
    d.add_argument("old", type=Path)
    d.add_argument("new", type=Path, nargs="?", default=None)
    b = sub.add_parser("bump", help="extract + generate + diff + run the tests")
    _add_upstream_args(b)
    b.add_argument("--no-tests", action="store_true")
    args = parser.parse_args(argv)
    specs_dir = args.specs_dir or SPECS
    generated_dir = args.generated_dir or GENERATED

    if args.command == "extract":
        _extract(args, specs_dir)
    elif args.command == "generate":
        for name in codegen.write(specs_dir, generated_dir):
            print(f"wrote generated/{name}")
    elif args.command == "check":
        stale = codegen.check(specs_dir, generated_dir)
        if stale:
            print("generated/ is out of date with specs/ (or was edited by hand): " + ", ".join(stale))
            print("run: python -m tools.spec generate")
            return 1
        print("generated/ is up to date")
    elif args.command == "diff":
        print_diff(args.old, args.new or specs_dir)
        print_overlay_changes(args.old, args.new or specs_dir)
    elif args.command == "bump":
        with tempfile.TemporaryDirectory() as tmp:
            before = Path(tmp) / "before"
            shutil.copytree(specs_dir, before)
            _extract(args, specs_dir)
            codegen.write(specs_dir, generated_dir)
            print_diff(before, specs_dir)
            print_overlay_pins(before, specs_dir)
        if not args.no_tests:
            return subprocess.call([sys.executable, "-m", "pytest", "-q", str(REPO / "tests")], cwd=REPO)
    return 0
