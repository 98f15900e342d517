"""`python -m retsnoop_otel`."""

import sys

from retsnoop_otel.cli import main

sys.exit(main())
