"""`python -m specpilot` runs the CLI."""

import sys

from specpilot.cli import main

sys.exit(main())
