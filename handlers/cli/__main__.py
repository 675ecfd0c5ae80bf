"""`python -m swama.handlers.cli` and the `swama` command."""

import sys


def run() -> int:
    # PyTorch stays out before any command can import transformers (engine/runtime.py says why).
    from swama.engine.client import keep_torch_out

    keep_torch_out()
    from swama.handlers.cli.main import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
