"""One settings model: every server option written once, with its default, environment variable,
help text and bounds, and the command line's flags made from it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from swama.engine.client import EngineSettings, RuntimeSettings, SettingsError, env_of, flag_of, read
from swama.handlers.cli.main import build_parser
from swama.handlers.cli.options import add_options, given
from swama.handlers.http.settings import ServerSettings

REPO = Path(__file__).resolve().parents[2]
# The modules that define the options; everything else must take them from there.
SETTINGS_MODULES = {REPO / "engine" / "settings.py", REPO / "handlers" / "http" / "settings.py"}


def _serve_parser() -> argparse.ArgumentParser:
    sub = build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    return sub.choices["serve"]


def _cli_fields(cls: type) -> list[str]:
    return [name for name, info in cls.model_fields.items()
            if not isinstance(info.json_schema_extra, dict) or info.json_schema_extra.get("cli", True)]


def _hand_written() -> list[Path]:
    files = [p for folder in ("engine", "handlers") for p in (REPO / folder).rglob("*.py")]
    return [p for p in files if p not in SETTINGS_MODULES and "__pycache__" not in p.parts]


def test_every_server_option_is_a_serve_flag_with_its_default_and_variable() -> None:
    help_text = " ".join(_serve_parser().format_help().split())
    for cls in (ServerSettings, RuntimeSettings):
        for name in _cli_fields(cls):
            if name == "default_model":
                continue
            assert flag_of(cls, name) in help_text, name
            assert env_of(cls, name) in help_text, name


def test_flags_override_the_environment_which_overrides_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, EngineSettings)
    monkeypatch.setenv("SWAMA_BATCH_ROWS", "4")
    monkeypatch.setenv("SWAMA_MAX_QUEUE", "7")
    args = parser.parse_args(["--batch-rows", "8", "--no-batching", "--num-ctx", "2048"])
    settings = read(EngineSettings, **given(args, EngineSettings))
    assert (settings.batch_rows, settings.batching, settings.context_limit) == (8, False, 2048)
    assert settings.max_queue == 7  # from the environment
    assert settings.max_model_queue == EngineSettings.model_fields["max_model_queue"].default
    assert "max_queue" not in given(args, EngineSettings)  # an unset flag leaves the environment to decide


def test_a_value_out_of_bounds_is_refused_naming_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match=r"^--batch-rows must be at least 1 \(got 0\)$"):
        read(EngineSettings, batch_rows=0)
    monkeypatch.setenv("SWAMA_PORT", "70000")
    with pytest.raises(SettingsError, match=r"^--port must be at most 65535 \(got 70000\)$"):
        read(ServerSettings)
    monkeypatch.setenv("SWAMA_DEVICE", "tpu")
    with pytest.raises(SettingsError, match="unknown device 'tpu'"):
        read(RuntimeSettings)
    monkeypatch.delenv("SWAMA_PORT")
    monkeypatch.setenv("SWAMA_DECISION_CALIBRATION", "warm")
    with pytest.raises(SettingsError, match=r"^--decision-calibration must be one of none, contextual, fitted"):
        read(ServerSettings)


def test_a_profile_folder_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SettingsError, match="cannot write profiles into .*is not a writable folder"):
        read(EngineSettings, profile_dir=blocker / "profiles")
    later = tmp_path / "not-yet" / "profiles"  # made when the first profile is written
    assert read(EngineSettings, profile_dir=later).profile_dir == later


def test_the_legacy_variables_keep_their_meaning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAMA_PROMPT_CACHE", "0")
    monkeypatch.setenv("SWAMA_DECISION_PREFIX_CACHE", "0")
    monkeypatch.setenv("SWAMA_MODELS", "/somewhere/models")
    settings = read(EngineSettings)
    assert settings.prompt_cache_budget() == 0 and not settings.decision_prefix_reuse
    assert str(settings.models_root) == "/somewhere/models"
    monkeypatch.delenv("SWAMA_PROMPT_CACHE")
    monkeypatch.setenv("SWAMA_PROMPT_CACHE_BYTES", "12345")
    assert read(EngineSettings).prompt_cache_budget() == 12345


def _literal(value: object) -> str | None:
    if isinstance(value, bool) or value in (None, ""):
        return None
    if isinstance(value, float) and value.is_integer():
        return rf"{int(value)}(?:\.0)?"
    return re.escape(str(value))


def test_no_default_is_written_twice() -> None:
    """A setting's default lives in its field. Elsewhere in hand-written code no keyword default or
    assignment of an option by its own name restates it, no help text spells a number default out,
    and nothing but the settings models reads an option's environment variable."""
    fields = {**ServerSettings.model_fields, **RuntimeSettings.model_fields}
    envs = {env_of(cls, name) for cls in (ServerSettings, RuntimeSettings) for name in cls.model_fields}
    found = []
    for path in _hand_written():
        text = path.read_text(encoding="utf-8")
        for name, info in fields.items():
            literal = _literal(info.default)
            if literal is None:
                continue
            if re.search(rf"\b{name}\b\s*(?::[^=\n]*)?=\s*[\"']?{literal}\b", text):
                found.append(f"{path.relative_to(REPO)}: {name} = {info.default}")
            # 0 and 1 are every other option's default too (a seed, a greedy temperature): not tied to one setting.
            if (isinstance(info.default, int | float) and info.default not in (0, 1)
                    and re.search(rf"\(default {literal}\b", text)):
                found.append(f"{path.relative_to(REPO)}: a help text restates the default {info.default}")
        for env in envs:
            if re.search(rf"environ(?:\.get)?[\[(]\s*[\"']{env}[\"']", text):
                found.append(f"{path.relative_to(REPO)}: reads {env} itself")
    assert not found, found


def test_the_engine_options_restate_no_default_of_their_own() -> None:
    """The pool and the scheduler take their limits from the settings, not from defaults of their own."""
    import inspect

    from swama.engine.serving.pool import ModelPool
    from swama.engine.serving.scheduler import Scheduler

    pool = inspect.signature(ModelPool.__init__).parameters
    assert not {"idle_seconds", "max_queue", "max_model_queue", "queue_timeout", "memory_limit"} & set(pool)
    rows = inspect.signature(Scheduler.__init__).parameters["rows"]
    assert rows.default is None  # None: the settings' default (engine/settings.py default_of)
