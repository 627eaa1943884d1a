"""``python -m ui``: the ``rlwb`` command (`ui.cli`)."""

import sys

from ui.cli import main

if __name__ == "__main__":
    sys.exit(main())
