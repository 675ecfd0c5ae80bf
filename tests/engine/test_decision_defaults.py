"""What a decision question that names no debiasing or calibration gets (engine/decisions/adjust/
defaults.py): the question's or request's own value first, then the model's calibration file, then
the server's options; debiasing only for choice questions; fitted only where a temperature is."""

from __future__ import annotations

from pathlib import Path

import pytest

from swama.engine.client import (
    NO_DEFAULTS,
    Adjustment,
    CalibrationFile,
    model_defaults,
    read_calibration,
    write_calibration,
)

FITTED = CalibrationFile(temperatures={"permute": {"choice": 0.7}, "none": {"yes_no": 1.5}})


def test_nothing_named_and_no_defaults_is_the_plain_reading() -> None:
    assert NO_DEFAULTS.resolve(None, None, "choice", 3) == Adjustment()
    assert model_defaults(CalibrationFile()).source == "none"


def test_the_servers_defaults_fill_what_a_question_leaves_unnamed() -> None:
    server = model_defaults(CalibrationFile(), "permute", "contextual")
    assert server.source == "server"
    assert server.resolve(None, None, "choice", 4) == Adjustment("permute", "contextual")
    assert server.resolve(None, None, "yes_no", 2) == Adjustment("none", "contextual")  # no option order there
    assert server.resolve("none", None, "choice", 4) == Adjustment("none", "contextual")  # its own value wins
    assert server.resolve(None, "none", "score", 3) == Adjustment("none", "none")


def test_a_models_file_defaults_come_before_the_servers() -> None:
    own = CalibrationFile(temperatures=FITTED.temperatures, defaults={"debias": "permute", "calibration": "fitted"})
    defaults = model_defaults(own, "prior", "contextual")
    assert (defaults.debias, defaults.calibration, defaults.source) == ("permute", "fitted", "model")
    assert defaults.resolve(None, None, "choice", 3) == Adjustment("permute", "fitted")
    # fitted only where the model has a temperature for the question: none for score questions here
    assert defaults.resolve(None, None, "score", 3) == Adjustment("none", "none")
    assert defaults.resolve(None, None, "yes_no", 2) == Adjustment("none", "fitted")
    # a request that asks for fitted itself keeps it, and the engine says why it cannot apply
    assert defaults.resolve(None, "fitted", "score", 3) == Adjustment("none", "fitted")


def test_the_defaults_round_trip_through_the_file_and_bad_ones_are_refused(tmp_path: Path) -> None:
    own = CalibrationFile(temperatures=FITTED.temperatures, defaults={"debias": "prior", "calibration": "fitted"})
    write_calibration(tmp_path, own)
    assert read_calibration(tmp_path).defaults == own.defaults
    write_calibration(tmp_path, CalibrationFile())
    assert "defaults" not in (tmp_path / "swama-calibration.json").read_text()
    bad = (tmp_path / "swama-calibration.json")
    bad.write_text('{"format": 1, "defaults": {"debias": "sideways", "calibration": "none"}}')
    with pytest.raises(ValueError, match="cannot be read"):
        read_calibration(tmp_path)
