"""Where things are, for tests at any depth of tests/: the repository, and tests/ with its data."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
