"""A model's decision calibration, kept in its folder as `swama-calibration.json`.

`swama calibrate` writes it: fitted temperatures per debiasing method and question kind (and
option count), positional priors per option count, and (`--default-debias`) the debiasing and
calibration a question that names none gets on this model. The server reads it again whenever the
file changes, so a running server picks up a new calibration without a restart.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .methods import CALIBRATION_METHODS, DEBIAS_METHODS

CALIBRATION_FILE = "swama-calibration.json"
FILE_FORMAT = 1


@dataclass(frozen=True)
class Prior:
    probabilities: tuple[float, ...]  # per position, first position first
    questions: int  # how many questions it was estimated from


@dataclass
class CalibrationFile:
    prompt_format: int = 1
    # debias method -> "choice" / "yes_no" / "score", or "choice/4" for one option count -> temperature
    temperatures: dict[str, dict[str, float]] = field(default_factory=dict)
    priors: dict[int, Prior] = field(default_factory=dict)  # option count -> prior
    report: dict[str, Any] = field(default_factory=dict)  # what `swama calibrate` measured, for people
    defaults: dict[str, str] = field(default_factory=dict)  # {"debias": ..., "calibration": ...}, or empty

    def temperature(self, debias: str, kind: str, option_count: int) -> float | None:
        """The temperature for this kind of question, one fitted for its option count first."""
        fitted = self.temperatures.get(debias, {})
        return fitted.get(f"{kind}/{option_count}", fitted.get(kind))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FILE_FORMAT,
            "prompt_format": self.prompt_format,
            "temperatures": self.temperatures,
            "priors": {str(n): {"probabilities": list(p.probabilities), "questions": p.questions}
                       for n, p in sorted(self.priors.items())},
            "report": self.report,
            **({"defaults": self.defaults} if self.defaults else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CalibrationFile:
        if data.get("format") != FILE_FORMAT:
            raise ValueError(f"unknown calibration file format {data.get('format')!r}")
        temperatures = {str(method): {str(k): float(t) for k, t in kinds.items()}
                        for method, kinds in data.get("temperatures", {}).items() if method in DEBIAS_METHODS}
        priors = {int(n): Prior(tuple(float(p) for p in prior["probabilities"]), int(prior["questions"]))
                  for n, prior in data.get("priors", {}).items()}
        defaults = {str(k): str(v) for k, v in data.get("defaults", {}).items()}
        if defaults and (set(defaults) != {"debias", "calibration"} or defaults["debias"] not in DEBIAS_METHODS
                         or defaults["calibration"] not in CALIBRATION_METHODS):
            raise ValueError(f"defaults {defaults} name no debias method and calibration")
        return cls(int(data.get("prompt_format", 1)), temperatures, priors, dict(data.get("report", {})), defaults)


def calibration_path(folder: Path) -> Path:
    return Path(folder) / CALIBRATION_FILE


def read_calibration(folder: Path) -> CalibrationFile:
    """The model's calibration; an empty one when it has none."""
    path = calibration_path(folder)
    try:
        return CalibrationFile.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return CalibrationFile()
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path.name} of this model cannot be read ({exc}); run swama calibrate again") from exc


def write_calibration(folder: Path, calibration: CalibrationFile) -> Path:
    """Written whole to a temporary file and renamed, so a reader never sees half a file."""
    path = calibration_path(folder)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(calibration.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


class CalibrationCache:
    """Each model folder's calibration, read again when the file's modification time or size changes."""

    def __init__(self) -> None:
        self._read: dict[Path, tuple[tuple[int, int] | None, CalibrationFile]] = {}

    def get(self, folder: Path) -> CalibrationFile:
        try:
            stat = calibration_path(folder).stat()
            stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            stamp = None
        cached = self._read.get(Path(folder))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        calibration = read_calibration(folder) if stamp is not None else CalibrationFile()
        self._read[Path(folder)] = (stamp, calibration)
        return calibration
