"""Model folders on disk: the marker an unfinished download leaves, so that nothing lists or loads a
model before its last file is in place and verified (sjdvp_core.hub.download writes it). A folder
model's marker lies in its folder; a model file in a folder that several entries share (LlamaGen
GPTs beside one tokenizer) has a marker of its own there, so that one entry's unfinished download
leaves its complete siblings loadable."""

from __future__ import annotations

import json
import os

_PREFIX, _SUFFIX = ".sjdvp-download", ".json"
INCOMPLETE = _PREFIX + _SUFFIX


def marker(folder: str, model: str | None = None) -> str:
    """The marker's path: the folder's own, or that of the model file `model` in it."""
    return os.path.join(folder, f"{_PREFIX}.{model}{_SUFFIX}" if model else INCOMPLETE)


def file_markers(folder: str) -> list[str]:
    """The markers of model files' unfinished downloads in folder."""
    return sorted(
        os.path.join(folder, n)
        for n in os.listdir(folder)
        if n != INCOMPLETE and n.startswith(_PREFIX) and n.endswith(_SUFFIX)
    )


def incomplete(folder: str, model: str | None = None) -> bool:
    """Whether the folder (or the model file `model` in it) is a download that has not finished."""
    return os.path.isfile(marker(folder, model))


def unfinished_marker(path: str) -> str | None:
    """The marker of the unfinished download that path (a folder or a model file) is part of, if
    any: the file's own, any model file's in the folder given (the folder may resolve to it), or
    a folder's on the way up."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        folder = path
        markers = file_markers(path)
        if markers:
            return markers[0]
    else:
        folder = os.path.dirname(path)
        if incomplete(folder, os.path.basename(path)):
            return marker(folder, os.path.basename(path))
    while True:
        if incomplete(folder):
            return marker(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def read_marker(path: str) -> dict:
    """A marker's record ({"entry": name, "done": {file: hash}}); {} where it is missing or
    unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def marked_entry(path: str) -> str | None:
    """The catalogue entry a marker names (None if it is unreadable)."""
    return read_marker(path).get("entry")


def incomplete_message(path: str) -> str:
    """What to do about the unfinished download whose marker is at path."""
    folder = os.path.dirname(path)
    name = marked_entry(path) or os.path.basename(folder)
    return (
        f"{folder}: an unfinished download of {name} (the marker {os.path.basename(path)} is still there). "
        f"Choose '{name}' in the loader again, or run `python -m sjdvp_core.download {name} --dir "
        f"{os.path.dirname(folder)}`, to resume it; what is already downloaded is kept. If you finished it "
        f"by hand, delete {path}"
    )
