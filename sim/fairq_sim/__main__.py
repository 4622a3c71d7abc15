"""``python -m fairq_sim``: the same as ``fairq sim``."""

import sys

from fairq_sim.cli import main

sys.exit(main())
