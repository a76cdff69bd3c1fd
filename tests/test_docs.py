"""The documents an artist reads: the README stays short (at most 10 KB), each docs/ page at most 12
KB, every relative link (and #anchor) in them resolves, docs/README.md lists every docs/ page,
and docs/results.md is what tools/make_results_page.py writes from benchmarks/results."""

import glob
import importlib.util
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
PAGES = [
    os.path.join(REPO, name)
    for name in ("README.md", "CHANGELOG.md", "benchmarks/results/README.md")
] + DOCS
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        return {slug(line.lstrip("#")) for line in f if line.startswith("#")}


def test_readme_is_at_most_10_kb():
    size = os.path.getsize(os.path.join(REPO, "README.md"))
    assert size <= 10 * 1024, f"README.md is {size} bytes; depth belongs in docs/"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.basename(p))
def test_docs_pages_are_at_most_12_kb(path):
    assert os.path.getsize(path) <= 12 * 1024


@pytest.mark.parametrize("path", PAGES, ids=lambda p: os.path.relpath(p, REPO))
def test_relative_links_resolve(path):
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)  # code blocks hold no links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(resolved):
            broken.append(target)
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, f"{os.path.relpath(path, REPO)}: {broken}"


def test_docs_index_lists_every_page():
    index = os.path.join(REPO, "docs", "README.md")
    with open(index, encoding="utf-8") as f:
        listed = {
            os.path.normpath(os.path.join(REPO, "docs", target.partition("#")[0]))
            for target in LINK.findall(f.read())
        }
    missing = [os.path.basename(p) for p in DOCS if p != index and p not in listed]
    assert not missing, f"docs/README.md lists no line for {missing}"


def test_results_pages_are_as_generated_and_index_every_file():
    """docs/results.md and benchmarks/results/README.md are what the tool writes; every results file
    is indexed with its command, and none holds a machine's absolute path."""
    spec = importlib.util.spec_from_file_location(
        "make_results_page", os.path.join(REPO, "tools", "make_results_page.py")
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.problems() == [], (
        "run python tools/make_results_page.py (--check says what is wrong)"
    )
