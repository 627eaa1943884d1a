"""``python -m workers``: the ``rlwb`` command (`workers.cli`)."""

import sys

from workers.cli import main

sys.exit(main())
