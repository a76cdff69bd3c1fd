"""`python -m sjdvp_core.check <folder>`: check a model folder (sjdvp_core.hub.check)."""

import sys

from .hub.check import main

if __name__ == "__main__":
    sys.exit(main())
