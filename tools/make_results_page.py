"""benchmarks/results/README.md and docs/results.md, both from INDEX below: every file in
benchmarks/results, what it shows and the command that writes it. docs/results.md also gathers
the README picture's record and the latency table from those files, so it never disagrees with
them (tests/test_docs.py checks it is up to date).

    python tools/make_results_page.py            # writes both pages
    python tools/make_results_page.py --check    # fails if a results file is not indexed, an
                                                 # indexed one is missing, a results file names
                                                 # an absolute path, or a page is out of date

A new result: add its row to INDEX (its files, what it shows, the command that regenerates it
from the repository's root), then run this.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
README = os.path.join(RESULTS, "README.md")
PAGE = os.path.join(REPO, "docs", "results.md")
LINK = re.compile(r"\]\(([^)#]+\.md)\)")
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:work|home|tmp|root|Users)/")  # a machine's folders


class Result(NamedTuple):
    files: tuple[str, ...]  # in benchmarks/results; the first is the one to read
    what: str
    command: str = ""  # run from the repository's root; "" for a file written by hand
    note: str = ""  # how the recorded run differs, or where the commands are


def plots(stem: str, *kinds: str) -> tuple[str, ...]:
    """A compare_methods run's files: <stem>.md, <stem>.json and its <stem>_<kind>.png plots."""
    return (f"{stem}.md", f"{stem}.json") + tuple(f"{stem}_{k}.png" for k in kinds)


ALL_PLOTS = ("acceptance", "latency", "step_compression")
COMPARE = "python -m benchmarks.compare_methods --model demo"
RANDOM = "--inits random"  # how fresh drafts started before 6aa58e7
NO_INITS = "recorded with random fresh drafts, which this benchmark can no longer choose"
PRINTED = "printed: its rows pasted under the file's prose"
BY_HAND = "written by hand from the runs below; each table's command is in the file"
AUDIT = (
    "python -m benchmarks.compare_engines --before <worktree of b384f60> "
    "--methods sjd sjd-vp --windows 16 32 --coupling on --threads 2"
)
AUDIT_NOTE = (
    "in a checkout of 81416c8, VP auto's audits (reverted), with 3dc8804's compare_engines.py"
)
STEP = "python -m benchmarks.gpu_check --tiny --sections engine --repeats 9 --out"
OUT = "--out benchmarks/results/"

INDEX = (
    Result(
        ("latency.md", "latency.json"),
        "wall-clock on this CPU and modelled GPU latency of every method, fixed and "
        "automatic windows, eager and compiled",
        f"python -m benchmarks.latency --seeds 2 --repeats 3 --model-seeds 12 {OUT}latency",
    ),
    Result(
        plots("demo", *ALL_PLOTS),
        "every method at windows 16, 32 and 64, independent and coupled drafts: passes, "
        "acceptance, latency, prompt match, distance from AR",
        f"{COMPARE} --repeats 3 {RANDOM} {OUT}demo",
    ),
    Result(
        plots("draft_init", "step_compression"),
        "how fresh drafts start (random, copy left, copy above) at windows 8, 16 and 32",
        f"{COMPARE} --methods sjd sjd-vp --windows 8 16 32 --coupling on "
        "--inits random repeat_left repeat_above --prompts 6 --seeds 2 --threads 2 "
        f"{OUT}draft_init",
    ),
    Result(
        plots("trees", *ALL_PLOTS),
        "draft trees of widths 4 and 6 against chains, independent and coupled drafts",
        f"{COMPARE} --methods sjd sjd-vp --windows 32 64 --coupling off on "
        f"--trees 1x1 4x1 6x1 {RANDOM} {OUT}trees",
    ),
    Result(
        plots("trees_budget", "step_compression"),
        "capped trees under a GPU's knee: how long each alternative's branch should be",
        f"{COMPARE} --methods sjd-vp --windows 32 --coupling on "
        f"--trees 6x1/4 6x1/6 6x1/8 6x1/12 8x1/6 --seeds 8 {OUT}trees_budget",
    ),
    Result(
        ("trees_branch.md",),
        "tree width 8 and capped branches (coupled SJD)",
        f"{COMPARE} --methods sjd --windows 32 64 --coupling on "
        f"--trees 6x1 8x1 6x1/4 6x1/8 {RANDOM}",
        PRINTED,
    ),
    Result(
        plots("trees_depth", *ALL_PLOTS),
        "trees branching at two slots against one",
        f"{COMPARE} --methods sjd sjd-vp --windows 32 64 --coupling on --trees 4x2 6x2 "
        f"{RANDOM} {OUT}trees_depth",
    ),
    Result(
        plots("trees_continued", *ALL_PLOTS),
        "trees with continued drafts",
        f"{COMPARE} --methods sjd sjd-vp --windows 32 64 --coupling continued --trees 6x1 "
        f"{RANDOM} {OUT}trees_continued",
    ),
    Result(
        plots("trees_relaxed", *ALL_PLOTS),
        "trees under LANTERN and GSD",
        f"{COMPARE} --methods lantern gsd --windows 32 64 --coupling on --trees 1x1 4x1 "
        f"{RANDOM} {OUT}trees_relaxed",
    ),
    Result(
        ("trees_probe.md",),
        "a first probe of tree shapes (3 images a row)",
        f"{COMPARE} --methods sjd sjd-vp --windows 32 --coupling on "
        f"--trees 1x1 2x1 3x1 4x1 4x2 6x1 4x1n --prompts 3 --seeds 1 {RANDOM}",
        PRINTED,
    ),
    Result(
        plots("continuation", *ALL_PLOTS),
        "coupled drafts with and without SJD-PAC's continuation",
        f"{COMPARE} --methods sjd sjd-vp lantern gsd --windows 32 64 "
        f"--coupling off on continued {RANDOM} {OUT}continuation",
    ),
    Result(
        ("vp_sweep.md",),
        "VP's knobs one at a time around the defaults",
        f"python -m benchmarks.sweep_vp --prompts 12 {OUT}vp_sweep",
        NO_INITS,
    ),
    Result(
        ("vp_sweep_toy_trend.md",),
        "the same sweep on a toy whose probabilities trend (where shrinkage hurts)",
        "python -m benchmarks.sweep_vp --model toy-trend --window 16 --prompts 4 --seeds 3 "
        f"{OUT}vp_sweep_toy_trend",
        NO_INITS,
    ),
    Result(
        ("quality.md",),
        "how far the relaxed verifiers' images drift from AR's",
        f"python -m benchmarks.quality {OUT}quality",
        NO_INITS,
    ),
    Result(
        ("profile_reuse.md", "profile_reuse.json"),
        "the automatic window with one acceptance profile reused across sampling settings",
        f"SJDVP_CACHE=.cache/profile-reuse python -m benchmarks.profile_reuse {OUT}profile_reuse",
        "a fresh calibration cache, so this CPU's pass cost is measured anew",
    ),
    Result(
        ("engine_cost.md",),
        "the engine's own step: operations and milliseconds per iteration, round by round",
        "",
        BY_HAND,
    ),
    Result(
        ("engine_ops.json",),
        "the engine's operations per iteration and compiled kernels",
        f"python -m benchmarks.engine_ops --compiled {OUT}engine_ops",
    ),
    Result(
        ("engine_cost.json",),
        "engine ms per iteration before the redesign (e83fa5c) and after, side by side",
        "python -m benchmarks.compare_engines --before <worktree of e83fa5c> --out engine_cost",
        "in a checkout of c79f745; its JSON copied here, its table engine_cost.md's last section",
    ),
    Result(
        ("engine_compiled_cpu.json",),
        "the engine's step eager against compiled at each family's vocabulary, on this CPU",
        "python -m benchmarks.gpu_check --tiny --skip-demo --repeats 9 "
        "--out benchmarks/results/engine_compiled_cpu.json",
        "in a checkout of 5fea7e3, whose `--out` names the file; `--skip-demo` is gone, and "
        "`--tiny --sections engine` now writes these rows in another layout",
    ),
    Result(
        ("engine_vp_step.md",),
        "SJD-VP's engine step against coupled SJD's: VP auto's audits (cheaper steps, more "
        "passes on trees: reverted), and the top-k fusion",
        "",
        BY_HAND,
    ),
    Result(
        ("engine_vp_audit_demo.json",),
        "VP auto's audits against b384f60: the demo, eager",
        f"{AUDIT} --prompts 3 --seeds 4 {OUT}engine_vp_audit_demo",
        AUDIT_NOTE,
    ),
    Result(
        ("engine_vp_audit_demo_compiled.json",),
        "the same, the compiled step",
        f"{AUDIT} --prompts 3 --seeds 4 --compile {OUT}engine_vp_audit_demo_compiled",
        AUDIT_NOTE,
    ),
    Result(
        ("engine_vp_audit_8192.json",),
        "the same at 8192 image tokens (no model), eager",
        f"{AUDIT} --vocab 8192 --seeds 9 {OUT}engine_vp_audit_8192",
        AUDIT_NOTE,
    ),
    Result(
        ("engine_vp_audit_8192_compiled.json",),
        "the same at 8192 image tokens, the compiled step",
        f"{AUDIT} --vocab 8192 --seeds 9 --compile {OUT}engine_vp_audit_8192_compiled",
        AUDIT_NOTE,
    ),
    Result(
        ("engine_vp_audit_latency.md", "engine_vp_audit_latency.json"),
        "the latency table with VP auto's audits (why they were reverted)",
        "SJDVP_CACHE=.cache/vp-audit python -m benchmarks.latency --seeds 2 --repeats 3 "
        f"--model-seeds 12 {OUT}engine_vp_audit_latency",
        "in a checkout of 81416c8, reverted",
    ),
    Result(
        ("engine_vp_step_before.json",),
        "the engine's step before VP's top-k fusion",
        f"{STEP} engine_vp_step_before",
        "in a checkout of 03535f1 with 9e781e5's gpu_check.py; its JSON copied here",
    ),
    Result(
        ("engine_vp_step_after.json",),
        "the engine's step after VP's top-k fusion",
        f"{STEP} engine_vp_step_after",
        "in a checkout of 9e781e5; its JSON copied here",
    ),
    Result(
        ("gpu_check.md", "gpu_check.json"),
        "measured on an H200: every family's pass cost t(k) to 256, peak memory against the "
        "estimator, int8 / NF4, offload, the demo's wall-clock, the engine's step",
        f"python -m benchmarks.gpu_check {OUT}gpu_check",
        "on a GPU; this record: the two runs named in the file, gpu_check.py of 1a7a7d8",
    ),
    Result(
        ("glm_image_latency.md",),
        "GLM-Image: modelled token-stage and whole-image speed-up (demo's steps, "
        "GLM-Image's pass cost)",
        "python -m benchmarks.glm_image_latency",
        "from latency.json and gpu_check.json",
    ),
    Result(
        ("edit_speed.md", "edit_speed.json"),
        "edits (completing a picture) against text to image on the demo: passes, step "
        "compression, tokens per pass",
        f"python -m benchmarks.edit_speed --prompts 16 --seeds 4 {OUT}edit_speed",
    ),
    Result(
        ("offload.md",),
        "modelled latency with weights offloaded to CPU memory",
        "python -m benchmarks.offload",
        "from latency.json",
    ),
    Result(
        ("readme_picture.md",),
        "the README's picture: AR and SJD-VP from one prompt and seed, timed",
        "python tools/make_readme_picture.py --repeats 5",
    ),
)

HEAD = """\
# Benchmark results

<!-- written by python tools/make_results_page.py from its INDEX: edit that, not this -->
Every file here is a benchmark's output (the `.md` a table, the `.json` the same rows, the
`.png` its plots), on the built-in demo model unless it says otherwise, on a 2-core CPU; GPU
columns are modelled (the demo's step counts priced by `sjdvp_core/datasheet.py`'s roofline),
except gpu_check.md, measured on an H200. Each row names the command that writes its files, run
from the repository's root. `--inits random`: the run predates fresh drafts copying the cell
above (6aa58e7), and this restores its drafts. "In a checkout of" a commit: the run measured code
that has changed since, so it runs there (`git worktree add`).
`python tools/make_results_page.py` writes this page and [docs/results.md](../../docs/results.md)
from one index; `--check` fails when a file here is missing from it.
"""


def read(name: str) -> str:
    with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
        return f.read().strip()


def demoted(text: str) -> str:
    """A results file's own headings one level down, its links made relative to docs/."""
    text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M)
    return LINK.sub(lambda m: f"](../benchmarks/results/{m.group(1)})", text)


def command_cell(r: Result) -> str:
    cell = f"`{r.command}`" if r.command else ""
    return f"{cell} ({r.note})" if cell and r.note else cell or r.note


def readme() -> str:
    """benchmarks/results/README.md: every file of every row, linked, with its command."""
    rows = [
        f"| {', '.join(f'[{f}]({f})' for f in r.files)} | {r.what} | {command_cell(r)} |"
        for r in INDEX
    ]
    return "\n".join([HEAD, "| file | what it shows | command |", "|---|---|---|", *rows]) + "\n"


def index() -> str:
    """The index for docs/results.md (at most 12 KB): a row's first file linked, the others
    counted, what it shows; the commands are in benchmarks/results/README.md."""
    lines = ["| file | what it shows |", "|---|---|"]
    for r in INDEX:
        kinds = [os.path.splitext(f)[1][1:] for f in r.files[1:]]
        more = ", ".join(
            f"{kinds.count(k)} {k}" if kinds.count(k) > 1 else k for k in dict.fromkeys(kinds)
        )
        first = f"[{r.files[0]}](../benchmarks/results/{r.files[0]})"
        lines.append(f"| {first}{f' (+ {more})' if more else ''} | {r.what} |")
    return "\n".join(lines)


def page() -> str:
    latency = demoted(read("latency.md"))
    picture = demoted(read("readme_picture.md")).split("\n", 1)[1].strip()
    return (
        "# Results\n\n"
        "<!-- written by python tools/make_results_page.py from benchmarks/results: "
        "edit those, not this -->\n"
        "Measured on the built-in demo model on a 2-core CPU; the GPU figures are modelled "
        "(the demo's step counts priced by the roofline in `sjdvp_core/datasheet.py`, see "
        "[speed.md](speed.md)) except those of "
        "[gpu_check.md](../benchmarks/results/gpu_check.md), one run on an H200. "
        "Each table says the command that made it.\n\n"
        "## The picture above\n\n"
        f"{picture}\n\n"
        "## Latency: every method, this CPU measured, GPUs modelled\n\n"
        f"{latency}\n\n"
        "## Every result\n\n"
        "The command that writes each: "
        "[benchmarks/results/README.md](../benchmarks/results/README.md).\n\n"
        f"{index()}\n"
    )


def problems() -> list[str]:
    """What --check reports: the folder and INDEX disagreeing, absolute paths, stale pages."""
    indexed = [f for r in INDEX for f in r.files]
    present = sorted(set(os.listdir(RESULTS)) - {"README.md"})
    found = [
        f"not indexed (add it to INDEX in tools/make_results_page.py): {f}"
        for f in present
        if f not in indexed
    ]
    found += [f"indexed but missing: {f}" for f in indexed if f not in present]
    found += [f"indexed twice: {f}" for f in dict.fromkeys(indexed) if indexed.count(f) > 1]
    for f in present:
        if f.endswith((".md", ".json")) and ABSOLUTE.search(read(f)):
            found.append(f"an absolute path (write it relative to the repository): {f}")
    for path, text in ((README, readme()), (PAGE, page())):
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                found.append(
                    "out of date (run python tools/make_results_page.py): "
                    + os.path.relpath(path, REPO)
                )
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--check", action="store_true", help="write nothing; fail on what is wrong")
    if ap.parse_args(argv).check:
        found = problems()
        print("\n".join(found) or f"{len(INDEX)} rows index every file in benchmarks/results")
        return 1 if found else 0
    for path, text in ((README, readme()), (PAGE, page())):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path, REPO)} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
