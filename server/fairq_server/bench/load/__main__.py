"""``python -m fairq_server.bench.load``: see :func:`fairq_server.bench.load.cli.main`."""

import sys

from fairq_server.bench.load.cli import main

sys.exit(main())
