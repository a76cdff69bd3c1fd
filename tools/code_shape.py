"""The engine's shape as issue #62 measures it against gpt-fast: files and lines, mean line length and
the share over 100 characters, long module docstrings, the engine files one Jacobi iteration runs
code from (traced on the demo model), and the sizes of README.md and CHANGELOG.md.

    python tools/code_shape.py
"""

from __future__ import annotations

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.path.join(ROOT, "sjdvp_core", "engine")


def line_figures(folder: str) -> dict:
    files = sorted(f for f in os.listdir(folder) if f.endswith(".py"))
    lengths, long_docs = [], []
    for name in files:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            text = f.read()
        lengths += [len(line) for line in text.splitlines() if line.strip()]
        doc = ast.get_docstring(ast.parse(text), clean=False)
        if doc and doc.count("\n") + 1 >= 10:
            long_docs.append(name)
    return {
        "files": len(files),
        "lines": sum(1 for _ in lengths),
        "mean line length": round(sum(lengths) / len(lengths), 1),
        "share over 100": f"{100 * sum(n > 100 for n in lengths) / len(lengths):.1f}%",
        "docstrings of 10+ lines": len(long_docs),
    }


def iteration_files() -> list[str]:
    """The engine files whose functions run during one iteration of an SJD-VP decode of the demo
    model."""
    sys.path.insert(0, ROOT)
    import torch

    from sjdvp_core.demo import DEMO_SAMPLING, load_demo
    from sjdvp_core.engine import loop
    from sjdvp_core.engine.decode import decode
    from sjdvp_core.engine.settings import method_settings

    torch.set_num_threads(1)

    seen: set[str] = set()
    iterate = loop.JacobiDecoder.iterate

    def traced(self, state):
        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.startswith(ENGINE):
                seen.add(os.path.basename(frame.f_code.co_filename))

        sys.setprofile(profile)
        try:
            return iterate(self, state)
        finally:
            sys.setprofile(None)
            loop.JacobiDecoder.iterate = iterate  # one iteration is enough

    settings = method_settings("sjd-vp", window=16, sampling=DEMO_SAMPLING)
    loop.JacobiDecoder.iterate = traced
    try:
        decode(load_demo(), "a red circle on grass", settings)
    finally:
        loop.JacobiDecoder.iterate = iterate
    return sorted(seen)


def main() -> None:
    for key, value in line_figures(ENGINE).items():
        print(f"engine {key}: {value}")
    files = iteration_files()
    print(f"files one iteration runs code from: {len(files)} ({', '.join(files)})")
    for name in ("README.md", "CHANGELOG.md"):
        print(f"{name}: {os.path.getsize(os.path.join(ROOT, name))} bytes")


if __name__ == "__main__":
    main()
