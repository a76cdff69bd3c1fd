"""`python -m sjdvp_core.download <entry>`: download a catalogue entry (sjdvp_core.hub.download)."""

import sys

from .hub.download import main

if __name__ == "__main__":
    sys.exit(main())
