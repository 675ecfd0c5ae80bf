"""The layout the code keeps: routes and the command line reach the engine through one typed door,
the engine's errors are one family, the loaded model is plain data at the bottom of the engine, and
no module imports itself back."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import swama
from swama.engine import client
from swama.engine.errors import EngineError
from swama.engine.model import LoadedModel
from swama.engine.serving.engine import Engine

REPO = Path(__file__).resolve().parents[1]
DOOR = "swama.engine.client"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(("swama", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path, *, top_level_only: bool) -> set[str]:
    """Modules `path` imports (from-imports resolved to the module, not the name); with
    `top_level_only`, leave out imports inside functions and `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _module_name(path).rsplit(".", 0 if path.name == "__init__.py" else 1)[0]
    nodes = list(ast.iter_child_nodes(tree)) if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("swama.")}


def _existing(names: set[str]) -> set[str]:
    modules = {_module_name(p) for p in _sources("engine", "handlers", "generated")}
    return {name for name in names if name in modules}


def test_routes_and_the_command_line_reach_the_engine_only_through_its_door() -> None:
    reached: dict[str, set[str]] = {}
    for path in _sources("handlers"):
        engine = {m for m in _existing(_imports(path, top_level_only=False)) if m.startswith("swama.engine")}
        if engine - {DOOR}:
            reached[str(path.relative_to(REPO))] = engine - {DOOR}
    assert not reached, reached


def test_no_handler_touches_the_engine_s_store_or_pool() -> None:
    touched = []
    for path in _sources("handlers"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("store", "pool") and \
                    isinstance(node.value, (ast.Name, ast.Attribute)) and "engine" in ast.unparse(node.value):
                touched.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert not touched, touched


@pytest.mark.parametrize(("folders", "top_level_only"), [(("engine", "handlers"), True), (("engine",), False)])
def test_no_module_imports_itself_back(folders: tuple[str, ...], top_level_only: bool) -> None:
    """Not at import time; and inside the engine not at all: no import in a function or for annotations
    runs back either, so its layers stand in one direction."""
    graph = {_module_name(p): _existing(_imports(p, top_level_only=top_level_only)) for p in _sources(*folders)}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        for nxt in graph.get(node, ()):
            if nxt in trail:
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, [*trail, nxt])
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    assert not cycles, cycles[:5]


def test_the_model_type_imports_no_kind_of_model() -> None:
    """Loaders are found through serving/loaders.py's registry; engine/model.py names none of them."""
    imported = _existing(_imports(REPO / "engine" / "model.py", top_level_only=True))
    assert not {m for m in imported if m.startswith(("swama.engine.kinds.", "swama.engine.text",
                                                     "swama.engine.decisions", "swama.engine.serving"))}


def test_the_model_is_plain_data_that_names_no_layer_above_it() -> None:
    """What a layer keeps per model lives in that layer, beside the model (`LoadedModel.beside`, keyed
    by the layer's own type): engine/model.py imports none of them, not even for its annotations."""
    assert {f.name for f in dataclasses.fields(LoadedModel)} == {"id", "path", "model", "tokenizer", "config",
                                                                  "eos_ids", "kind", "beside"}
    imported = _existing(_imports(REPO / "engine" / "model.py", top_level_only=False))
    assert imported <= {"swama.engine.errors", "swama.engine.settings", "swama.engine.runtime",
                        "swama.engine.files.kinds"}, imported


def test_the_engine_is_the_door_it_promises() -> None:
    """Engine has every member of the EngineClient protocol, with the same parameters."""
    for name, member in vars(client.EngineClient).items():
        if name.startswith("_") or not callable(member):
            continue
        implemented = getattr(Engine, name, None)
        assert implemented is not None, name
        wanted = list(inspect.signature(member).parameters)
        got = list(inspect.signature(implemented).parameters)
        if isinstance(inspect.getattr_static(Engine, name), staticmethod):
            got = ["self", *got]
        assert got == wanted, (name, got, wanted)


def test_the_engine_s_errors_are_one_family() -> None:
    """Every exception class the engine defines is an EngineError, so one function maps them all."""
    outside = []
    for info in pkgutil.walk_packages(swama.engine.__path__, "swama.engine."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                if not issubclass(value, EngineError):
                    outside.append(f"{info.name}.{name}")
    assert not outside, outside
