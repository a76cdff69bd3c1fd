"""The benchmarks (python -m benchmarks.<name>); benchmarks/results/README.md says which
wrote what.

A results file names no machine's folders: shown() gives a path as a command run from the
repository's root names it, local() takes them out of a message (an error's traceback).
"""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shown(path: str) -> str:
    """path as a results file names it: relative to the repository's root, or by its name alone
    where it lies outside the repository."""
    full = os.path.abspath(path)
    return (
        os.path.relpath(full, REPO)
        if os.path.commonpath([full, REPO]) == REPO
        else os.path.basename(full)
    )


def local(text: str) -> str:
    """text with paths in this checkout made relative to it and the home folder written ~."""
    home = os.path.expanduser("~")
    text = text.replace(REPO + os.sep, "")
    return text.replace(home + os.sep, "~" + os.sep) if home != os.sep else text
