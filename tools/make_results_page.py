"""docs/results.md from benchmarks/results: the README picture's record, the latency table (this CPU measured,
GPUs modelled) and the index of every result with its command. Figures live in those files; this page only
gathers them, so it never disagrees with them (tests/test_docs.py checks it is up to date).

    python tools/make_results_page.py
"""
from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
PAGE = os.path.join(REPO, "docs", "results.md")
LINK = re.compile(r"\]\(([^)#]+\.md)\)")


def read(name: str) -> str:
    with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
        return f.read().strip()


def demoted(text: str) -> str:
    """A results file's own headings one level down, its links made relative to docs/."""
    text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M)
    return LINK.sub(lambda m: f"](../benchmarks/results/{m.group(1)})", text)


def index() -> str:
    """The index table of benchmarks/results/README.md, its links relative to docs/."""
    text = read("README.md")
    table = text[text.index("<!-- index"):text.index("<!-- end of index -->")].split("\n", 1)[1].strip()
    return LINK.sub(lambda m: f"](../benchmarks/results/{m.group(1)})", table)


def page() -> str:
    latency = demoted(read("latency.md"))
    return (
        "# Results\n\n"
        "<!-- written by python tools/make_results_page.py from benchmarks/results: edit those, not this -->\n"
        "Measured on the built-in demo model on a 2-core CPU; the GPU figures are modelled (the demo's step counts "
        "priced by the roofline in `sjdvp_core/datasheet.py`, see [speed.md](speed.md)) except those of "
        "[gpu_check.md](../benchmarks/results/gpu_check.md), one run on an H200. Each table says the command that "
        "made it.\n\n"
        "## The picture above\n\n"
        f"{demoted(read('readme_picture.md')).split(chr(10), 1)[1].strip()}\n\n"
        "## Latency: every method, this CPU measured, GPUs modelled\n\n"
        f"{latency}\n\n"
        "## Every result\n\n"
        f"{index()}\n")


def main() -> None:
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(page())
    print(f"wrote {os.path.relpath(PAGE, REPO)} ({os.path.getsize(PAGE)} bytes)")


if __name__ == "__main__":
    main()
