"""``python -m fairq_bench.load``: see :func:`fairq_bench.load.cli.main`."""

import sys

from fairq_bench.load.cli import main

sys.exit(main())
