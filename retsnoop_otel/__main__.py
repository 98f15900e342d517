"""`python -m retsnoop_otel`."""

import sys

from .cli import main

sys.exit(main())
