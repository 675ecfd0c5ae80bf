"""`python -m swama.engine.process INBOX_FD OUTBOX_FD`: the engine process a server starts for itself
(engine/process/proxy.py); its settings come in SWAMA_ENGINE_SETTINGS, as JSON."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    from swama.engine.runtime import keep_torch_out

    keep_torch_out()  # before the engine imports transformers (engine/runtime.py says why)
    from swama.engine.process.core import main
    from swama.engine.process.proxy import SETTINGS_VARIABLE

    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), os.environ.pop(SETTINGS_VARIABLE)))
