"""`python -m tools.spec`: the spec pipeline's command line (see tools/spec/commands.py)."""

import sys

from tools.spec.commands import main

if __name__ == "__main__":
    sys.exit(main())
