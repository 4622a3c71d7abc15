"""``python -m fairq_server.sim``: the same as ``fairq sim``."""

import sys

from fairq_server.sim.cli import main

sys.exit(main())
