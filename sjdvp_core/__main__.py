"""`python -m sjdvp_core`: generate with several methods side by side (sjdvp_core.cli.generate)."""

import sys

from .cli.generate import command

sys.exit(command())
