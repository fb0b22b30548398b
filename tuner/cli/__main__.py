"""``python -m tuner.cli``: the ``tuner`` command."""

import sys

from tuner.cli.main import main

sys.exit(main())
