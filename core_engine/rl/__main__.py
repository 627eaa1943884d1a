import sys

from core_engine.rl.cli import main

sys.exit(main())
