"""The memory table (README.md's Models section and docs/memory.md): what each release needs at each
precision, and which cards it fits.

Each release's own architecture (its config's sizes, benchmarks/releases.py) is built on the
meta device, so no weight is read or allocated, and the estimator auto uses (models.memory.need: the
weights at that precision + a default decode's KV cache, forward transients and loop state) is run
on it. Where this table and a loaded model disagree, the loaded model is right: tests/models/test_memory.py
checks the estimator against measured peaks, and tests/models/test_memory_table.py checks each architecture
here against its release's download size.

    python tools/memory_table.py            # print the table (markdown)
    python tools/memory_table.py --write    # and put it in README.md and docs/memory.md, between their markers
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import releases  # noqa: E402
from sjdvp_core.engine.adapter import Edit  # noqa: E402
from sjdvp_core.models.memory import Need, need, pixel_weight_need  # noqa: E402

CARDS_GB = (8, 12, 16, 24, 48, 80)
EDIT = Edit("an edit", (torch.zeros(512, 512, 3),))  # one reference
PRECISIONS = ("bf16", "int8", "nf4")
# what a card keeps for the CUDA context and the framework (ComfyUI's own reserve is ~1 GB)
RESERVE = 1.0e9
BEGIN, END = (
    "<!-- memory table: python tools/memory_table.py --write -->",
    "<!-- end of memory table -->",
)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
PAGES = (README, os.path.join(REPO, "docs", "memory.md"))  # each holds the table


@dataclass(frozen=True)
class Release:
    name: str  # a catalogue entry's name (or the release's, where the catalogue has none yet)
    build: Callable
    image: str
    pixels: bool = (
        False  # a pixel model apart: its weights alone (it runs after the decode, on its own)
    )
    conditions: tuple = ()  # what the decode conditions on, where not a text prompt (an edit)
    readme: bool = True  # in README.md's table too (edits: docs/memory.md's only)


RELEASES = (
    Release("GLM-Image (token stage)", releases.glm_image, "1024 x 1024"),
    Release(
        "GLM-Image (DiT + glyph encoder, weights)",
        releases.glm_image_dit,
        "1024 x 1024",
        pixels=True,
    ),
    Release("Lumina-mGPT-7B-768", releases.lumina_mgpt_7b, "768 x 768"),
    Release("Lumina-mGPT-2.0", releases.lumina_mgpt_2, "768 x 768"),
    Release(
        "Lumina-mGPT-2.0-Omni (edit)",
        releases.lumina_mgpt_2_omni_edit,
        "512 x 512",
        conditions=(EDIT,),
        readme=False,
    ),
    Release("Emu3-Gen", releases.emu3_gen, "720 x 720"),
    Release("Janus-Pro-7B", releases.janus_pro(4096, 30, 11008, 32), "384 x 384"),
    Release(
        "Janus-4o-7B (edit, one reference)",
        releases.janus_pro(4096, 30, 11008, 32, edit=True),
        "384 x 384",
        conditions=(EDIT,),
        readme=False,
    ),
    Release("Janus-Pro-1B", releases.janus_pro(2048, 24, 5632, 16), "384 x 384"),
    Release("LlamaGen-t2i-XL-512", releases.llamagen("GPT-XL", "t2i", 1024), "512 x 512"),
    Release("LlamaGen-c2i-XL-384", releases.llamagen("GPT-XL", "c2i", 576), "384 x 384"),
)


def needs(release: Release) -> dict[str, Need]:
    """What the release needs at each precision (bf16 compute), with its default decode."""
    adapter = release.build()
    if release.pixels:
        return {p: Need(p, pixel_weight_need(adapter, p, "bf16"), 0) for p in PRECISIONS}
    conditions = list(release.conditions) or None
    return {p: need(adapter, p, "bf16", conditions=conditions) for p in PRECISIONS}


def fits(total: int) -> str:
    """The smallest listed card that holds `total` bytes beside RESERVE."""
    card = next((gb for gb in CARDS_GB if total + RESERVE <= gb * 1e9), None)
    return f"{card} GB" if card else f"over {CARDS_GB[-1]} GB"


def table(readme: bool = False) -> str:
    """Markdown: per release (README.md's: the main releases), the decode's share and each
    precision's total with the smallest card it fits."""
    lines = [
        "| release | image | decode | " + " | ".join(PRECISIONS) + " |",
        "|---|---|---|" + "---|" * len(PRECISIONS),
    ]
    for r in RELEASES:
        if readme and not r.readme:
            continue
        n = needs(r)
        cells = " | ".join(f"{n[p].total / 1e9:.1f} GB: {fits(n[p].total)}" for p in PRECISIONS)
        decode = "apart" if r.pixels else f"{n['bf16'].decode / 1e9:.1f} GB"
        lines.append(f"| {r.name} | {r.image} | {decode} | {cells} |")
    return "\n".join(lines)


def readme_with(text: str, readme: str) -> str:
    start, stop = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + text + "\n" + readme[stop:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--write",
        action="store_true",
        help="put the table in README.md and docs/memory.md between their markers",
    )
    args = parser.parse_args()
    print(table())
    for page in PAGES if args.write else ():
        with open(page, encoding="utf-8") as f:
            old = f.read()
        with open(page, "w", encoding="utf-8") as f:
            f.write(readme_with(table(readme=page == README), old))


if __name__ == "__main__":
    main()
