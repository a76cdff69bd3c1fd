"""Writes the UI-format workflows in workflows/ (ComfyUI lists them under Browse Templates).

    python tools/make_workflows.py

Widget values follow each node's declared order and take their defaults from the engine's settings;
tests/comfyui/test_comfyui.py checks every file against a real server's node definitions and runs the demo
ones."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from sjdvp_core.demo import DEMO_SAMPLING  # noqa: E402
from sjdvp_core.engine.settings import (  # noqa: E402
    DEFAULT_METHOD,
    DEFAULT_WINDOW,
    DecodeSettings,
    DrafterSettings,
    SamplingSettings,
    VPSettings,
)
from sjdvp_core.hub.catalogue import BY_NAME, Entry, size_text  # noqa: E402
from sjdvp_core.models.glm_image.dit import GUIDANCE, STEPS  # noqa: E402
from sjdvp_core.models.registry import FAMILIES  # noqa: E402

OUT = os.path.join(REPO, "workflows")
RUN = DecodeSettings()
FOX = "a photo of a red fox sitting in fresh snow, morning light"
GLM_EDIT = "turn this photo into a watercolor painting, keep its composition"
JANUS_EDIT = "make it a snowy winter evening"
# Omni's prompt: what the reference shows | the picture (sjdvp_core.models.lumina2.adapter.SHOWN)
OMNI_EDIT = "depth map | a cozy wooden cabin in the snow at dusk, warm light in the windows"
GLM_PROMPT = 'a poster of a red fox sitting in fresh snow, the title "WINTER" in bold white letters at the top'


@dataclass(frozen=True)
class Example:
    """A workflow shipped for a family (workflows/<workflow>.json): the catalogue entry it downloads
    on its first run, its title, its prompt, the key of the family module's SAMPLING table where
    it has one per model type, its image size, and for an editing workflow the reference image
    its LoadImage node starts with (the user picks their own)."""

    workflow: str
    entry: str
    title: str
    prompt: str = FOX
    sampling: str = ""
    size: tuple[int, int] = (0, 0)
    reference: str = ""


# every family of sjdvp_core.models.registry.FAMILIES ships at least one (family_workflows checks
# it)
EXAMPLES = {
    "llamagen": (
        Example(
            "sjdvp_llamagen_c2i", "LlamaGen-c2i-L-384", "LlamaGen-c2i", "golden retriever", "c2i"
        ),
        Example("sjdvp_llamagen_t2i", "LlamaGen-t2i-XL-256", "LlamaGen-t2i", sampling="t2i"),
    ),
    "janus": (
        Example("sjdvp_janus_pro", "Janus-Pro-7B", "Janus-Pro"),
        Example(
            "sjdvp_janus_4o_edit",
            "Janus-4o-7B",
            "Janus-4o edit",
            JANUS_EDIT,
            reference="example.png",
        ),
    ),
    "emu3": (Example("sjdvp_emu3", "Emu3-Gen", "Emu3", size=(720, 720)),),
    "lumina": (Example("sjdvp_lumina_mgpt", "Lumina-mGPT-7B-768", "Lumina-mGPT", size=(768, 768)),),
    "lumina2": (
        Example("sjdvp_lumina_mgpt2", "Lumina-mGPT-2.0", "Lumina-mGPT 2.0", size=(768, 768)),
        Example(
            "sjdvp_lumina_mgpt2_omni_edit",
            "Lumina-mGPT-2.0-Omni",
            "Lumina-mGPT 2.0 Omni edit",
            OMNI_EDIT,
            size=(512, 512),
            reference="example.png",
        ),
    ),
    "glm_image": (
        Example("sjdvp_glm_image", "GLM-Image", "GLM-Image", GLM_PROMPT, size=(1024, 1024)),
        Example(
            "sjdvp_glm_image_edit",
            "GLM-Image",
            "GLM-Image edit",
            GLM_EDIT,
            size=(1024, 1024),
            reference="example.png",
        ),
    ),
}

SOCKETS = {  # node type -> (socket inputs, outputs)
    "SJDVP_LoadModel": ([], [("model", "SJDVP_MODEL")]),
    "SJDVP_JacobiWindow": ([], [("window", "SJDVP_WINDOW")]),
    "SJDVP_DrafterSJD": ([], [("drafter", "SJDVP_DRAFTER")]),
    "SJDVP_DrafterLANTERN": ([], [("drafter", "SJDVP_DRAFTER")]),
    "SJDVP_DrafterGSD": ([], [("drafter", "SJDVP_DRAFTER")]),
    "SJDVP_VerificationPrediction": (
        [("drafter", "SJDVP_DRAFTER")],
        [("drafter", "SJDVP_DRAFTER")],
    ),
    "SJDVP_SpeculativeDecode": (
        [
            ("model", "SJDVP_MODEL"),
            ("images", "IMAGE"),
            ("window", "SJDVP_WINDOW"),
            ("drafter", "SJDVP_DRAFTER"),
        ],
        [("tokens", "SJDVP_TOKENS")],
    ),
    "SJDVP_DecodeImage": ([("tokens", "SJDVP_TOKENS")], [("image", "IMAGE")]),
    "SJDVP_Report": ([("tokens", "SJDVP_TOKENS")], [("text", "STRING"), ("commit_map", "IMAGE")]),
    "SaveImage": ([("images", "IMAGE")], []),
    "LoadImage": ([], [("IMAGE", "IMAGE"), ("MASK", "MASK")]),
    "PreviewImage": ([("images", "IMAGE")], []),
    "Note": ([], []),
}
_VP, _D = VPSettings(), DrafterSettings()
VP_DEFAULTS = [
    "auto" if _VP.auto else "fixed",
    1.0,
    _VP.growth_steps,
    _VP.beta,
    _VP.top_k,
    round(_VP.max_score, 4),
]
SJD = ("SJDVP_DrafterSJD", [_D.coupled])


W = DEFAULT_WINDOW
# a new node's: the default
WINDOW_WIDGETS = [
    W.size,
    W.auto,
    W.auto_tree,
    W.tree.width,
    W.tree.depth,
    W.init,
]
LANTERN = ("SJDVP_DrafterLANTERN", [_D.lantern_k, _D.lantern_delta, _D.coupled])
GSD = ("SJDVP_DrafterGSD", [_D.gsd_group, _D.gsd_max_gap, _D.gsd_max_distance or 0.0, _D.coupled])


class Graph:
    def __init__(self):
        self.nodes, self.links = [], []

    def add(
        self,
        kind: str,
        widgets: list,
        pos: tuple[int, int],
        title: str | None = None,
        size: tuple[int, int] | None = None,
    ) -> int:
        ins, outs = SOCKETS[kind]
        size = size or FIXED_SIZES.get(kind) or default_size(widgets)
        node = {
            "id": len(self.nodes) + 1,
            "type": kind,
            "pos": list(pos),
            "size": list(size),
            "flags": {},
            "order": len(self.nodes),
            "mode": 0,
            "inputs": [{"name": n, "type": t, "link": None} for n, t in ins],
            "outputs": [
                {"name": n, "type": t, "links": [], "slot_index": i}
                for i, (n, t) in enumerate(outs)
            ],
            "properties": {}
            if kind == "Note"
            else {
                "Node name for S&R": kind,
                **({"cnr_id": "sjdvp"} if kind.startswith("SJDVP") else {}),
            },
            "widgets_values": widgets,
        }
        if title:
            node["title"] = title
        self.nodes.append(node)
        return node["id"]

    def connect(self, src: int, src_slot: int, dst: int, dst_input: str) -> None:
        s, d = self.nodes[src - 1], self.nodes[dst - 1]
        slot = next(i for i, inp in enumerate(d["inputs"]) if inp["name"] == dst_input)
        kind = s["outputs"][src_slot]["type"]
        link_id = len(self.links) + 1
        self.links.append([link_id, src, src_slot, dst, slot, kind])
        s["outputs"][src_slot]["links"].append(link_id)
        d["inputs"][slot]["link"] = link_id

    def json(self) -> dict:
        return {
            "last_node_id": len(self.nodes),
            "last_link_id": len(self.links),
            "nodes": self.nodes,
            "links": self.links,
            "groups": [],
            "config": {},
            "extra": {"ds": {"scale": 0.7, "offset": [110, 130]}},
            "version": 0.4,
        }


FIXED_SIZES = {"LoadImage": (320, 360)}  # its picture of the chosen image shows under the widgets


def default_size(widgets: list) -> tuple[int, int]:
    return 320, 80 + 26 * len(widgets)


# Layout: no node overlaps another, also as the Vue node renderer draws them and after a run (images
# and the report text shown); tests/comfyui/test_browser.py checks every workflow in a real browser.
GAP, TITLE = 60, 30
DECODE_SIZE, IMAGE_SIZE, REPORT_SIZE, PICTURE_SIZE = (340, 670), (360, 110), (360, 330), (340, 400)
# one decode branch: its 2 x 2 block is the tallest part
BRANCH_HEIGHT = 2 * (PICTURE_SIZE[1] + TITLE + GAP)


NOTE_SIZE = (320, 250)


def column(g: Graph, x: int, nodes: list[tuple[str, list]], note: str) -> list[int]:
    """Nodes stacked top to bottom from y = 0 with GAP between them (plus the next one's title bar),
    the workflow's Note (what it shows, the model it needs and where to get it) last."""
    ids, y = [], 0
    for kind, widgets in nodes:
        ids.append(g.add(kind, widgets, (x, y)))
        y += g.nodes[-1]["size"][1] + GAP + TITLE
    g.add("Note", [note], (x, y), "About this workflow", size=NOTE_SIZE)
    return ids


def decode_branch(
    g: Graph,
    model: int,
    prompt: str,
    sampling: SamplingSettings,
    x: int,
    y: int,
    name: str,
    method: str = DEFAULT_METHOD.upper(),
    window: int | None = None,
    drafter: int | None = None,
    seed: int = 0,
    size: tuple[int, int] = (0, 0),
    images: int | None = None,
) -> None:
    """Decode -> image -> SaveImage, and Report -> commit map preview: a 2 x 2 block right of the
    decode. The decode uses the model's own sampling defaults (its widgets show them) and its
    method, unless window and drafter nodes are connected."""
    s = sampling
    widgets = [
        prompt,
        "",
        method,
        seed,
        "fixed",
        1,
        *size,
        "model defaults",
        s.cfg_scale,
        s.temperature,
        s.top_k,
        s.top_p,
        False,
        RUN.passes,
        s.image_cfg_scale,
    ]
    dec = g.add("SJDVP_SpeculativeDecode", widgets, (x, y), name, size=DECODE_SIZE)
    g.connect(model, 0, dec, "model")
    if window is not None:
        g.connect(window, 0, dec, "window")
    if drafter is not None:
        g.connect(drafter, 0, dec, "drafter")
    if images is not None:
        g.connect(images, 0, dec, "images")
    x1 = x + DECODE_SIZE[0] + GAP
    x2 = x1 + max(IMAGE_SIZE[0], REPORT_SIZE[0]) + GAP
    img = g.add("SJDVP_DecodeImage", [STEPS, GUIDANCE], (x1, y), size=IMAGE_SIZE)
    g.connect(dec, 0, img, "tokens")
    save = g.add("SaveImage", [f"sjdvp/{name}"], (x2, y), size=PICTURE_SIZE)
    g.connect(img, 0, save, "images")
    rep = g.add("SJDVP_Report", [], (x1, y + IMAGE_SIZE[1] + GAP + TITLE), size=REPORT_SIZE)
    g.connect(dec, 0, rep, "tokens")
    prev = g.add("PreviewImage", [], (x2, y + PICTURE_SIZE[1] + GAP + TITLE), size=PICTURE_SIZE)
    g.connect(rep, 1, prev, "images")


def quick(
    model: str,
    prompt: str,
    sampling: SamplingSettings,
    note: str,
    name: str = "SJD-VP",
    size: tuple[int, int] = (0, 0),
    reference: str = "",
) -> dict:
    """The shortest fast graph: model -> Speculative Decode (its method, the automatic window) ->
    image; with a reference, a LoadImage node feeds the decode's images (an edit)."""
    g = Graph()
    left = [("SJDVP_LoadModel", [model, "auto", "auto"])] + (
        [("LoadImage", [reference, "image"])] if reference else []
    )
    m, *image = column(g, 0, left, note)
    decode_branch(
        g, m, prompt, sampling, 320 + GAP, 0, name, size=size, images=image[0] if image else None
    )
    return g.json()


def knobs(
    drafter: tuple[str, list], prompt: str, sampling: SamplingSettings, name: str, note: str
) -> dict:
    """The demo with every knob on the canvas: a Jacobi Window (the default automatic one), a
    verifier node and Verification Prediction, connected to the decode (they override its
    method)."""
    g = Graph()
    m, w, d, v = column(
        g,
        0,
        [
            ("SJDVP_LoadModel", ["demo", "auto", "auto"]),
            ("SJDVP_JacobiWindow", WINDOW_WIDGETS),
            drafter,
            ("SJDVP_VerificationPrediction", VP_DEFAULTS),
        ],
        note,
    )
    g.connect(d, 0, v, "drafter")
    decode_branch(g, m, prompt, sampling, 320 + GAP, 0, name, window=w, drafter=v)
    return g.json()


def compare(model: str, prompt: str, sampling: SamplingSettings, note: str) -> dict:
    """AR, SJD and SJD-VP side by side on one model, prompt and seed, each with its report."""
    g = Graph()
    [m] = column(g, 0, [("SJDVP_LoadModel", [model, "auto", "auto"])], note)
    for row, method in enumerate(["AR", "SJD", "SJD-VP"]):
        decode_branch(g, m, prompt, sampling, 320 + GAP, row * BRANCH_HEIGHT, method, method=method)
    return g.json()


DEMO_PROMPT = "a red circle on grass"
DEMO_NOTE = (
    "Needs nothing to download: the built-in demo model (64 px images of coloured shapes on a "
    "background; prompts like 'a blue diamond on snow')."
)


def family_note(entry: Entry, title: str) -> str:
    """What a family workflow shows and needs: the catalogue entry it downloads on its first run,
    from where, and where the files go for a download by hand."""
    repos = " and ".join(source.repo for source in entry.sources)
    return (
        f"{title} decoded with SJD-VP and the automatic window: fewer passes, and images distributed "
        f"exactly as plain AR sampling's.\n\nModel: {entry.name} ({size_text(entry.size, entry.approx)}, "
        f"{entry.licence}). On the first run the loader downloads it from the Hugging Face Hub ({repos}) into "
        f"ComfyUI/models/sjdvp/{entry.folder}; to download by hand, put the files there. "
        "python -m sjdvp_core.check <folder> says whether a folder is complete."
    )


def family_workflows() -> dict:
    """One per Example of each family (EXAMPLES). They name catalogue entries ("Janus-Pro-7B
    (download, ~14.8 GB)"): a shared workflow downloads its model into models/sjdvp on its first
    run and finds it there afterwards."""
    missing = sorted(set(FAMILIES) - set(EXAMPLES))
    if missing:
        raise SystemExit(f"no example workflow for the families {missing}: add them to EXAMPLES")
    out = {}
    for name, family in FAMILIES.items():
        for ex in EXAMPLES[name]:
            sampling = (
                family.module.SAMPLING[ex.sampling] if ex.sampling else family.module.SAMPLING
            )
            entry = BY_NAME[ex.entry]
            out[ex.workflow] = quick(
                entry.choice,
                ex.prompt,
                sampling,
                family_note(entry, ex.title),
                name=ex.title,
                size=ex.size,
                reference=ex.reference,
            )
    return out


WORKFLOWS = {
    "sjdvp_demo_quick_start": quick(
        "demo",
        DEMO_PROMPT,
        DEMO_SAMPLING,
        "Start here. The three nodes that make a picture fast: Speculative Decode runs "
        "SJD-VP with the automatic window, several tokens per pass; its badge and the "
        "Speed-up Report say how much time it saved. " + DEMO_NOTE,
    ),
    "sjdvp_demo_ar_vs_sjd_vs_sjd_vp": compare(
        "demo",
        DEMO_PROMPT,
        DEMO_SAMPLING,
        "AR, SJD and SJD-VP side by side from one prompt and seed: the same "
        "kind of image, each report with its time and passes. "
        "Change only the method widget to try another. " + DEMO_NOTE,
    ),
    "sjdvp_demo_sjd_vp": knobs(
        SJD,
        DEMO_PROMPT,
        DEMO_SAMPLING,
        "SJD-VP",
        "Every knob on the canvas: the Jacobi Window (automatic), the exact SJD verifier "
        "and Verification Prediction, connected to Speculative Decode (they override its "
        "method). " + DEMO_NOTE,
    ),
    "sjdvp_demo_lantern_vp": knobs(
        LANTERN,
        "a blue diamond on snow",
        DEMO_SAMPLING,
        "LANTERN-VP",
        "LANTERN's relaxed verifier with Verification Prediction: more drafts pass, and "
        "the images drift from the model's own distribution (more with a larger "
        "delta). " + DEMO_NOTE,
    ),
    "sjdvp_demo_gsd_vp": knobs(
        GSD,
        "an orange triangle on night",
        DEMO_SAMPLING,
        "GSD-VP",
        "Grouped Speculative Decoding with Verification Prediction: a draft passes on the "
        "mass of a group of tokens around it (relaxed, lossy). " + DEMO_NOTE,
    ),
    **family_workflows(),
}


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for name, workflow in WORKFLOWS.items():
        with open(os.path.join(OUT, name + ".json"), "w") as f:
            json.dump(workflow, f, indent=1)
            f.write("\n")
    print(f"wrote {len(WORKFLOWS)} workflows to {OUT}")


if __name__ == "__main__":
    main()
