"""Packages that only some loads need (bitsandbytes for 4-bit weights, accelerate for device maps):
imported when used, with a message that says what to install when missing."""

from __future__ import annotations

import importlib


class MissingPackage(ImportError):
    """An optional package a load needs, with the message that says what to install."""


def require(package: str, needed_by: str, otherwise: str, hint: str = ""):
    """The package's module, or a MissingPackage naming who needs it, the pip command and the way
    around it."""
    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise MissingPackage(
            f"{needed_by} needs {package}, which is not installed: run `pip install {package}`{hint} "
            f"in ComfyUI's Python, {otherwise}"
        ) from e
