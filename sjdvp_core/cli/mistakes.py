"""Mistakes on the command line end as argparse ends its own: one line on stderr, exit status 2.

The engine and the loaders refuse bad input with a ValueError whose message says what to do (a size the
model cannot make, a class it does not know, a folder of another family, a missing file: CheckpointError
is a ValueError). A user who typed the command needs that message, not the stack under it; any other
exception is a bug and keeps its traceback."""
from __future__ import annotations

import sys
from collections.abc import Callable


def run_command(prog: str, main: Callable[[], int | None]) -> int:
    """main()'s exit status (None: 0), or 2 after printing `prog: error: <message>` for a ValueError."""
    try:
        return main() or 0
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
