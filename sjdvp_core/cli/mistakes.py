"""Mistakes on the command line end as argparse ends its own: one line on stderr, exit status 2.

The engine and the loaders refuse bad input with a ValueError whose message says what to do (a size the
model cannot make, a class it does not know, a folder of another family, a missing file: CheckpointError
is a ValueError); a model path that does not exist is a FileNotFoundError, an optional package not installed a
MissingPackage, and an output path that is a file or cannot be written an OSError of its own. A user who typed
the command needs that message, not the stack under it; any other exception is a bug and keeps its traceback."""
from __future__ import annotations

import sys
from collections.abc import Callable

from ..models.optional import MissingPackage

# the user's own paths: missing, a file where a folder goes (or the reverse), another user's
PATH_MISTAKES = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)


def run_command(prog: str, main: Callable[[], int | None]) -> int:
    """main()'s exit status (None: 0), or 2 after printing `prog: error: <message>` for a user's mistake."""
    try:
        return main() or 0
    except (ValueError, MissingPackage, *PATH_MISTAKES) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
