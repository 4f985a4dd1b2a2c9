"""``python -m tuner.cli``: the same as ``python -m tuner``."""

import sys

from tuner.cli import main

sys.exit(main())
