"""What a decision question that names no debiasing or calibration gets on a model.

Clients that cannot send extension fields (the TypeSafe SDK's `system_one`, Clef's clients,
harnesses written for the System One API) still get the server's debiasing this way. A question's own
`x_debias` / `x_calibration`, then its request's, win; then the model's calibration file's defaults
(`swama calibrate --default-debias METHOD` writes them, with `fitted` calibration); then the
server's `--decision-debias` / `--decision-calibration`; then the plain reading. Debiasing corrects
option order, so a default debias applies to choice questions only. A default `fitted` calibration
applies where the model has a temperature fitted for the question's kind, and nowhere else. Every
answer still names in `x_adjustment` what was applied to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .methods import Adjustment, Calibration, Debias
from .store import CalibrationFile


@dataclass(frozen=True)
class Defaults:
    debias: Debias = "none"
    calibration: Calibration = "none"
    source: str = "none"  # where they come from: "model" (its calibration file), "server" or "none"
    file: CalibrationFile | None = None

    def resolve(self, debias: str | None, calibration: str | None, kind: str, option_count: int) -> Adjustment:
        """A question's adjustment from what it (or its request) named, None where nothing."""
        if debias is None:
            debias = self.debias if kind == "choice" else "none"
        if calibration is None:
            calibration = self.calibration
            if calibration == "fitted" and (self.file is None
                                            or self.file.temperature(debias, kind, option_count) is None):
                calibration = "none"
        return Adjustment(debias, calibration)  # type: ignore[arg-type]


NO_DEFAULTS = Defaults()


def model_defaults(file: CalibrationFile, debias: str = "none", calibration: str = "none") -> Defaults:
    """A model's defaults: its calibration file's where it names them, else the server's."""
    if file.defaults:
        return Defaults(file.defaults["debias"], file.defaults["calibration"], "model", file)  # type: ignore[arg-type]
    source = "none" if (debias, calibration) == ("none", "none") else "server"
    return Defaults(debias, calibration, source, file)  # type: ignore[arg-type]
