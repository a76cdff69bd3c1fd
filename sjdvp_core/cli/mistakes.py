"""Mistakes on the command line end as argparse ends its own: one line on stderr, exit status 2.

The engine and the loaders refuse bad input with a ValueError whose message says what to do (a
size the model cannot make, a class it does not know, a folder of another family, a missing file:
CheckpointError is a ValueError); a model path that does not exist is a FileNotFoundError, an
optional package not installed a MissingPackage, and an output path that is a file or cannot be
written a ValueError of its own (`output_folder`). A user who typed the command needs that
message, not the stack under it; Ctrl-C is one line and exit status 130, as a shell reports it;
any other exception is a bug and keeps its traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..models.optional import MissingPackage

# the user's own paths: missing, a file where a folder goes (or the reverse), another user's
PATH_MISTAKES = (
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)


def run_command(prog: str, main: Callable[[], int | None]) -> int:
    """main()'s exit status (None: 0), or 2 after printing `prog: error: <message>` for a user's
    mistake, or 130 after `prog: interrupted` (and what the KeyboardInterrupt says: what was
    kept, how to resume)."""
    try:
        return main() or 0
    except (ValueError, MissingPackage, *PATH_MISTAKES) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"\n{prog}: interrupted" + (f"; {e}" if str(e) else ""), file=sys.stderr)
        return 130


def output_folder(path: str, flag: str) -> str:
    """The folder a command writes into, created (with its parents) before the model loads, so that
    a path it cannot write is said at once, not after minutes of loading."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path}: that is a file; give a folder (it is created if missing)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"{flag} {path}: cannot create that folder ({e.strerror}); give one you can write to"
        ) from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: this user cannot write there; give another folder")
    return path
