"""Thumbnails of the shipped workflows (workflows/<stem>.jpg, shown by ComfyUI's template browser). A
demo workflow's: the images it produces with its own prompts, methods and seeds, next to their
commit maps. A family workflow's (its model is not here to run): the workflow as ComfyUI draws it,
from the screenshot the browser test takes when it drops the workflow onto the canvas.

    python tools/make_thumbnails.py                      # the demo workflows
    pytest tests/comfyui/test_browser.py -k loads_as_dropped     # then: the family workflows from its screenshots
    python tools/make_thumbnails.py --from-screenshots
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sjdvp_core import (
    DecodeSettings,
    DrafterSettings,
    SamplingSettings,
    VPSettings,
    WindowSettings,
    decode,
)  # noqa: E402
from sjdvp_core.demo import load_demo  # noqa: E402
from sjdvp_core.engine.report import commit_map  # noqa: E402
from sjdvp_core.engine.settings import DEFAULT_WINDOW, METHODS, TreeSettings, decode_settings  # noqa: E402

WORKFLOWS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workflows")
VERIFIERS = {
    "SJDVP_DrafterSJD": lambda w: DrafterSettings(coupled=w[0]),
    "SJDVP_DrafterLANTERN": lambda w: DrafterSettings(
        verifier="lantern", lantern_k=w[0], lantern_delta=w[1], coupled=w[2]
    ),
    "SJDVP_DrafterGSD": lambda w: DrafterSettings(
        verifier="gsd",
        gsd_group=w[0],
        gsd_max_gap=w[1],
        gsd_max_distance=w[2] or None,
        coupled=w[3],
    ),
}


def branches(workflow: dict) -> list[tuple[str, DecodeSettings]]:
    """(prompt, settings) of every Speculative Decode node: its method, or the window and verifier
    nodes linked to it (nodes/decode_nodes.py method_or_nodes)."""
    nodes = {n["id"]: n for n in workflow["nodes"]}
    source = {link[0]: nodes[link[1]] for link in workflow["links"]}

    def drafter_of(node):
        if node["type"] == "SJDVP_VerificationPrediction":
            inner = drafter_of(source[node["inputs"][0]["link"]])
            g, b, k, s, m, mode = node["widgets_values"]
            return dataclasses.replace(
                inner, vp=VPSettings(g, b, k, "auto" if mode == "auto" else s, m)
            )
        return VERIFIERS[node["type"]](node["widgets_values"])

    def window_of(node):
        size, init, width, depth, auto, auto_tree = node["widgets_values"]
        return WindowSettings(
            size, init, TreeSettings(width, depth), auto, auto and auto_tree and width == 1
        )

    out = []
    for node in workflow["nodes"]:
        if node["type"] != "SJDVP_SpeculativeDecode":
            continue
        links = {i["name"]: i["link"] for i in node["inputs"]}
        prompt, _, cfg, temp, top_k, top_p, seed, _, batch, *_, method = node["widgets_values"]
        drafter = (
            drafter_of(source[links["drafter"]])
            if links.get("drafter")
            else METHODS[method.lower()]
        )
        window = window_of(source[links["window"]]) if links.get("window") else DEFAULT_WINDOW
        out.append(
            (
                prompt,
                decode_settings(
                    drafter, window, SamplingSettings(cfg, temp, top_k, top_p), seed, batch
                ),
            )
        )
    return out


# tests/comfy/browser.py's
SCREENSHOTS = os.path.join(os.path.dirname(WORKFLOWS), ".cache", "screenshots")
FRONTEND = "1.58.1"  # its newest frontend


def from_screenshots() -> None:
    """workflows/<stem>.jpg for each family workflow: the browser test's screenshot of it as
    dropped, cut to the canvas (the frontend's side bar and tab strip left out) and scaled to 800
    px."""
    for name in sorted(os.listdir(WORKFLOWS)):
        if not name.endswith(".json") or name.startswith("sjdvp_demo_"):
            continue
        shot = os.path.join(SCREENSHOTS, f"{FRONTEND}-vue-dropped-{name[:-5]}.png")
        if not os.path.isfile(shot):
            raise SystemExit(
                f"{shot}: missing; run pytest tests/comfyui/test_browser.py -k loads_as_dropped first"
            )
        img = Image.open(shot).convert("RGB")
        img = img.crop(
            (
                int(img.width * 0.12),
                int(img.height * 0.12),
                int(img.width * 0.88),
                int(img.height * 0.88),
            )
        )
        img.resize((800, round(800 * img.height / img.width)), Image.LANCZOS).save(
            os.path.join(WORKFLOWS, name[:-5] + ".jpg"), quality=85
        )
        print("wrote", name[:-5] + ".jpg")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--from-screenshots", action="store_true", help="the family workflows' thumbnails"
    )
    if ap.parse_args().from_screenshots:
        return from_screenshots()
    demo = load_demo()
    for name in sorted(os.listdir(WORKFLOWS)):
        if not (name.startswith("sjdvp_demo_") and name.endswith(".json")):
            continue
        with open(os.path.join(WORKFLOWS, name)) as f:
            workflow = json.load(f)
        tiles = []
        for prompt, settings in branches(workflow):
            res = decode(demo, prompt, settings)
            # [128, 64, 3]
            tiles.append(
                torch.cat([demo.decode_image(res.codes)[0], commit_map(res, cell=4)[0]], 0)
            )
        strip = torch.cat(tiles, 1)
        img = Image.fromarray((strip * 255).round().byte().numpy())
        img.resize((img.width * 2, img.height * 2), Image.NEAREST).save(
            os.path.join(WORKFLOWS, name[:-5] + ".jpg"), quality=90
        )
        print("wrote", name[:-5] + ".jpg")


if __name__ == "__main__":
    main()
