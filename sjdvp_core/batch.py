"""`python -m sjdvp_core.batch` (and torchrun -m): many images, resumable (sjdvp_core.cli.batch)."""

import sys

from .cli.batch import main

if __name__ == "__main__":
    sys.exit(main())
