"""An older transformers beside the project's, for the tests of what the loaders accept: installed
once into .cache/transformers-<version>/ by pip (nothing else in the environment changes) and put
first on the PYTHONPATH of a subprocess. transformers 5.17 wants huggingface_hub 1.x and httpx,
which come with it there."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def installed(version: str) -> str:
    """The folder that holds transformers==version and what it needs beyond this environment."""
    root = os.path.join(REPO, ".cache", f"transformers-{version}")
    done = os.path.join(root, ".installed")
    if not os.path.isfile(done):
        pip = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--target",
            root,
        ]
        subprocess.run(
            pip + ["--no-deps", f"transformers=={version}", "huggingface_hub>=1.5,<2"],
            check=True,
            timeout=600,
        )
        subprocess.run(pip + ["httpx"], check=True, timeout=600)
        open(done, "w").close()
    return root


def run_pytest(version: str, path: str, selection: str) -> subprocess.CompletedProcess:
    """pytest -k selection on path, in a process that imports transformers==version."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([installed(version), REPO]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path, "-k", selection],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
