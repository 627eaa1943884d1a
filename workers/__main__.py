"""``python -m workers``: the worker side of ``rlwb`` (`workers.commands`)."""

import sys

from workers.commands import main

sys.exit(main())
