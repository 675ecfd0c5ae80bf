"""Whether a model's batch decodes on the compiled step: `--compiled-step auto|on|off`.

`auto` takes it on a GPU, where a step's cost is the host's launching of its operations and the
trace cuts them; on the CPU a step's cost is the arithmetic, which the trace does not change, so
auto leaves mlx-lm's forward there (`on` takes it on either device). A model whose family or layers
the step does not cover keeps mlx-lm's forward whatever the setting, with one log line saying why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from swama.engine.model import LoadedModel
from swama.engine.text.compiled_step.forward import Decoder, why_not

log = logging.getLogger("swama.engine")


@dataclass(frozen=True)
class _Decoder:
    """Kept beside a model: its compiled step (fused once), or None where it has none."""

    decoder: Decoder | None


def decoder_for(model: LoadedModel, mode: str, on_gpu: bool) -> Decoder | None:
    if mode == "off" or (mode == "auto" and not on_gpu):
        return None

    def make() -> _Decoder:
        reason = why_not(model.model)
        if reason is not None:
            log.info("%s decodes with mlx-lm's forward: %s", model.id, reason)
            return _Decoder(None)
        return _Decoder(Decoder(model.model))

    return model.beside.setdefault(_Decoder, make).decoder
