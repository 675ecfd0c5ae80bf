"""`python -m swama.handlers.cli`: the `swama` command."""

import sys

from swama.handlers.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
