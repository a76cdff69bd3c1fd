"""The workflows the pack ships (workflows/*.json, in the UI format the frontend saves), read as the
ComfyUI tests load them before converting them to API prompts (tests/comfy/workflow_format.py)."""

from __future__ import annotations

import json


def load(path):
    """The UI-format workflow saved at path, as a dict."""
    with open(path) as f:
        return json.load(f)
