"""``python -m tuner``: the tuner's command line (see `tuner.cli`)."""

import sys

from tuner.cli import main

sys.exit(main())
