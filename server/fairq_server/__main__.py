import sys

from fairq_server.cli import main

sys.exit(main())
