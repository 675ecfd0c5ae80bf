"""`python -m swama.handlers.cli`: the `swama` command."""

import sys

from swama.handlers.cli.main import main

sys.exit(main())
