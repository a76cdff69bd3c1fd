"""The shipped workflows stay as tools/make_workflows.py writes them (defaults from the engine's
settings)."""

import importlib.util
import json
import os
import sys

from tests.comfy.server import REPO


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_workflows", os.path.join(REPO, "tools", "make_workflows.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_shipped_workflows_are_as_generated():
    gen = _generator()
    for name, workflow in gen.WORKFLOWS.items():
        with open(os.path.join(REPO, "workflows", name + ".json")) as f:
            assert json.load(f) == workflow, f"{name}: run python tools/make_workflows.py"
