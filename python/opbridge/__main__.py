"""python -m opbridge: the opbridge command line (see opbridge.cli)."""

import sys

from .cli import main

sys.exit(main())
