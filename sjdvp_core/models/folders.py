"""Model folders on disk: the marker an unfinished download leaves in its folder, so that nothing lists
or loads a model before its last file is in place and verified (sjdvp_core.hub.download writes it)."""
from __future__ import annotations

import json
import os

INCOMPLETE = ".sjdvp-download.json"


def incomplete(folder: str) -> bool:
    """Whether folder is a download that has not finished (it must not be listed or loaded)."""
    return os.path.isfile(os.path.join(folder, INCOMPLETE))


def incomplete_folder(path: str) -> str | None:
    """The unfinished download folder that path (a folder or a file) is in or under, if any."""
    path = os.path.abspath(path)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    while True:
        if incomplete(folder):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def incomplete_message(folder: str) -> str:
    name = os.path.basename(folder)
    try:
        with open(os.path.join(folder, INCOMPLETE), encoding="utf-8") as f:
            name = json.load(f).get("entry", name)
    except (OSError, ValueError):
        pass
    return (f"{folder}: an unfinished download of {name} (the marker {INCOMPLETE} is still there). Choose "
            f"'{name}' in the loader again, or run `python -m sjdvp_core.download {name}`, to resume it; "
            "what is already downloaded is kept")
