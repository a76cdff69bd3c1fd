"""The node pack inside a real ComfyUI server (0.3.75, from PyPI): registration and pinned schemas,
every shipped workflow valid against the live node definitions, the message for a missing model,
and the Lumina-mGPT 2.0 workflow on a tiny model of that family. test_comfyui_demo.py runs the
demo workflows."""

from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import urllib.request

import pytest

from tests.comfy.server import NEEDS_COMFYUI, REPO
from tests.comfy.workflow_format import to_api, validate, widget_slots
from tests.helpers.comfy_workflows import load
from tests.helpers.tiny_lumina2 import write_lumina2

pytestmark = NEEDS_COMFYUI

# node id -> widget names in order: the contract with saved workflows from 1.0.0 on (append only)
PINNED = {
    "SJDVP_LoadModel": ["model", "precision", "device"],
    "SJDVP_JacobiWindow": [
        "window",
        "window_auto",
        "tree_auto",
        "tree_width",
        "tree_depth",
        "init",
    ],
    "SJDVP_DrafterSJD": ["coupled"],
    "SJDVP_DrafterLANTERN": ["neighbours", "delta", "coupled"],
    "SJDVP_DrafterGSD": ["group", "max_gap", "max_distance", "coupled"],
    "SJDVP_VerificationPrediction": [
        "strength_mode",
        "strength",
        "growth_steps",
        "beta",
        "top_k",
        "max_score",
    ],
    "SJDVP_SpeculativeDecode": [
        "prompt",
        "negative_prompt",
        "method",
        "seed",
        "batch_size",
        "width",
        "height",
        "sampling",
        "cfg",
        "temperature",
        "top_k",
        "top_p",
        "compile",
        "passes",
        "image_cfg",
    ],
    "SJDVP_DecodeImage": ["steps", "guidance"],
    "SJDVP_Report": [],
}
WORKFLOWS = sorted(glob.glob(os.path.join(REPO, "workflows", "*.json")))


def test_nodes_register_with_pinned_widget_order(object_info):
    for node_id, widgets in PINNED.items():
        assert node_id in object_info, node_id
        info = object_info[node_id]
        assert [name for name, _ in widget_slots(info)] == widgets
        assert info["description"] and info["category"] == "sjdvp"
        for kind, group in info["input"].items():
            # output nodes get hidden inputs
            for name, spec in group.items() if kind != "hidden" else ():
                assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
        assert os.path.isfile(os.path.join(REPO, "web", "docs", f"{node_id}.md"))
    seed = dict(widget_slots(object_info["SJDVP_SpeculativeDecode"]))["seed"]
    assert seed  # control_after_generate
    assert "demo" in object_info["SJDVP_LoadModel"]["input"]["required"]["model"][
        0
    ] or "demo" in object_info["SJDVP_LoadModel"]["input"]["required"]["model"][1].get(
        "options", []
    )


@pytest.mark.parametrize("path", WORKFLOWS, ids=[os.path.basename(w) for w in WORKFLOWS])
def test_shipped_workflows_match_the_node_definitions(path, object_info):
    assert validate(load(path), object_info) == []


@pytest.mark.parametrize(
    "name,folder",
    [
        ("sjdvp_llamagen_c2i", "llamagen-c2i"),
        ("sjdvp_lumina_mgpt", "Lumina-mGPT-7B-768"),
        ("sjdvp_emu3", "Emu3-Gen"),
        ("sjdvp_janus_pro", "Janus-Pro-7B"),
        ("sjdvp_janus_4o_edit", "Janus-4o-7B"),
        ("sjdvp_lumina_mgpt2_omni_edit", "Lumina-mGPT-2.0-Omni"),
        ("sjdvp_lumina_mgpt2", "Lumina-mGPT-2.0"),
        ("sjdvp_glm_image", "GLM-Image"),
    ],
)
def test_missing_model_says_where_to_put_it(server, object_info, name, folder):
    """A shared family workflow names a catalogue entry; with the hub out of reach (the test server
    runs offline) the loader says so and where the files go by hand."""
    workflow = load(os.path.join(REPO, "workflows", f"{name}.json"))
    history, messages = server.run(to_api(workflow, object_info))
    errors = [m["data"] for m in messages if m["type"] == "execution_error"]
    assert errors and errors[0]["node_type"] == "SJDVP_LoadModel"
    assert os.path.join("models", "sjdvp", folder) in errors[0]["exception_message"]
    assert (
        "offline mode is on" in errors[0]["exception_message"]
        and "by hand" in errors[0]["exception_message"]
    )


def test_load_model_options_outside_their_lists_are_refused(server, object_info):
    """A hand-edited workflow's precision or device outside the options: the loader refuses it by
    name before loading anything. (Load Model's validate_inputs names only `model`, whose folders
    appear after start-up: a ComfyUI that checks a V3 node's options, newer than this one, skips
    that check for every input named there.)"""
    for widget, value in (("precision", "fp8"), ("device", "cuda:1")):
        prompt = to_api(
            load(os.path.join(REPO, "workflows", "sjdvp_demo_quick_start.json")), object_info
        )
        next(n for n in prompt.values() if n["class_type"] == "SJDVP_LoadModel")["inputs"][
            widget
        ] = value
        _, messages = server.run(prompt)
        errors = [m["data"] for m in messages if m["type"] == "execution_error"]
        assert errors and errors[0]["node_type"] == "SJDVP_LoadModel"
        assert f"{widget}={value!r}" in errors[0]["exception_message"], errors[0][
            "exception_message"
        ]


def run_ok(server, prompt: dict, workflow: dict):
    """Run an API prompt, which must succeed -> (the image its Save Image wrote, the Speed-up
    Report's figures)."""
    from PIL import Image

    history, messages = server.run(prompt, workflow)
    errors = [m["data"] for m in messages if m["type"] == "execution_error"]
    assert history["status"]["status_str"] == "success", [
        e.get("exception_message") for e in errors
    ]
    save = next(k for k, v in prompt.items() if v["class_type"] == "SaveImage")
    saved = history["outputs"][save]["images"][0]
    report = next(
        v for k, v in history["outputs"].items() if prompt[k]["class_type"] == "SJDVP_Report"
    )
    return Image.open(os.path.join(server.output, saved["subfolder"], saved["filename"])), report[
        "sjdvp_report"
    ][0]


def test_lumina2_workflow_runs_the_tiny_model(server, object_info):
    """The family workflow as shipped, its catalogue entry's folder holding a tiny Lumina-mGPT 2.0
    (so nothing is downloaded); only the size changes, to one the tiny model's 160 positions
    hold."""
    from PIL import Image

    folder = os.path.join(server.models, "Lumina-mGPT-2.0")
    write_lumina2(folder)
    try:
        workflow = load(os.path.join(REPO, "workflows", "sjdvp_lumina_mgpt2.json"))
        prompt = to_api(workflow, object_info)
        decode = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode")
        prompt[decode]["inputs"].update(width=64, height=32)
        history, messages = server.run(prompt, workflow)
        errors = [m["data"] for m in messages if m["type"] == "execution_error"]
        assert history["status"]["status_str"] == "success", errors
        save = next(k for k, v in prompt.items() if v["class_type"] == "SaveImage")
        image = history["outputs"][save]["images"][0]
        assert Image.open(
            os.path.join(server.output, image["subfolder"], image["filename"])
        ).size == (64, 32)
        report = next(
            v for k, v in history["outputs"].items() if prompt[k]["class_type"] == "SJDVP_Report"
        )
        figures = report["sjdvp_report"][0]
        assert 4 * 8 <= figures["ar_passes"] <= 4 * 9 + 1 and figures["step_compression"] >= 1
    finally:
        shutil.rmtree(folder)


def test_janus_workflow_runs_the_tiny_model(server, object_info):
    """The Janus-Pro workflow as shipped, a tiny transformers-format Janus-Pro in its entry's
    folder: ComfyUI's patcher sets .device on the modules it moves, which a transformers model
    (Janus's VQ decoder) refuses; every decode failed before the pack handed it a wrapper."""
    from sjdvp_core.hub.catalogue import BY_NAME
    from tests.helpers.tiny_janus import write_converted

    workflow = load(os.path.join(REPO, "workflows", "sjdvp_janus_pro.json"))
    prompt = to_api(workflow, object_info)
    folder = os.path.join(server.models, BY_NAME["Janus-Pro-7B"].folder)
    os.makedirs(folder)
    write_converted(pathlib.Path(folder))
    try:
        history, messages = server.run(prompt, workflow)
        errors = [m["data"] for m in messages if m["type"] == "execution_error"]
        assert history["status"]["status_str"] == "success", [
            e.get("exception_message") for e in errors
        ]
        report = next(
            v for k, v in history["outputs"].items() if prompt[k]["class_type"] == "SJDVP_Report"
        )
        assert report["sjdvp_report"][0]["ar_passes"] == 16  # 32 px, 8 px a token
        # a second run: the patchers move the weights off the device and back
        decode = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode")
        prompt[decode]["inputs"]["seed"] = 1
        history, _ = server.run(prompt, workflow)
        assert history["status"]["status_str"] == "success"
    finally:
        shutil.rmtree(folder)


def test_emu3_workflow_runs_the_tiny_model(server, object_info):
    """The Emu3 workflow as shipped, a tiny transformers-format Emu3 in its catalogue entry's folder
    (nothing is downloaded); only the size changes, to 16 x 8 px, which the tiny model's f2 VQ
    makes 4 rows of 8 tokens. The loader lays out Emu3's default 720 x 720 px first: the tiny
    model gets the real release's positions for it."""
    from sjdvp_core.hub.catalogue import BY_NAME
    from tests.helpers.tiny_emu3 import write_converted

    workflow = load(os.path.join(REPO, "workflows", "sjdvp_emu3.json"))
    prompt = to_api(workflow, object_info)
    decode = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode")
    prompt[decode]["inputs"].update(width=16, height=8)
    folder = os.path.join(server.models, BY_NAME["Emu3-Gen"].folder)
    os.makedirs(folder)
    write_converted(pathlib.Path(folder))
    config = os.path.join(folder, "config.json")
    with open(config) as f:
        settings = json.load(f)
    settings["text_config"]["max_position_embeddings"] = 131072
    with open(config, "w") as f:
        json.dump(settings, f)
    try:
        image, figures = run_ok(server, prompt, workflow)
        assert (
            image.size == (16, 8)
            and figures["step_compression"] >= 1
            and figures["ar_passes"] >= 4 * 8
        )
    finally:
        shutil.rmtree(folder)


def test_janus_4o_edit_workflow_runs_the_tiny_model(server, object_info):
    """The Janus-4o editing workflow as shipped (LoadImage's picture, 48 x 64 px, padded to a
    square as upstream does -> Speculative Decode's images -> Tokens to Image -> Save), a tiny
    Janus in its catalogue entry's folder: the edit decodes its 16 tokens with three row groups,
    and custom sampling's image_cfg reaches the decode."""
    from PIL import Image

    from sjdvp_core.hub.catalogue import BY_NAME
    from tests.helpers.tiny_janus import write_converted

    Image.new("RGB", (48, 64), (40, 90, 200)).save(os.path.join(server.input, "example.png"))
    workflow = load(os.path.join(REPO, "workflows", "sjdvp_janus_4o_edit.json"))
    prompt = to_api(workflow, object_info)
    folder = os.path.join(server.models, BY_NAME["Janus-4o-7B"].folder)
    os.makedirs(folder)
    write_converted(pathlib.Path(folder))
    try:
        _, figures = run_ok(server, prompt, workflow)
        assert figures["ar_passes"] == 16  # 32 px, 8 px a token
        decode = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode")
        prompt[decode]["inputs"].update(sampling="custom", image_cfg=0.0)
        _, figures = run_ok(server, prompt, workflow)
        assert figures["ar_passes"] == 16
    finally:
        shutil.rmtree(folder)


def test_lumina2_omni_edit_workflow_runs_the_tiny_model(server, object_info):
    """The Lumina-mGPT 2.0 Omni workflow as shipped (LoadImage's picture, 80 x 60 px, centre-cropped
    to the panel -> Speculative Decode's images -> Tokens to Image -> Save), a tiny 2.0 in its
    catalogue entry's folder, at 32 x 32 px: the lower panel's 4 rows of 4 codes and their row ends
    decode (the last row end and the image end are known: no pass of their own), and the image is
    the lower panel alone."""
    from PIL import Image

    from sjdvp_core.hub.catalogue import BY_NAME
    from tests.helpers.tiny_lumina2 import OMNI_POSITIONS, write_lumina2

    Image.new("RGB", (80, 60), (30, 30, 30)).save(os.path.join(server.input, "example.png"))
    workflow = load(os.path.join(REPO, "workflows", "sjdvp_lumina_mgpt2_omni_edit.json"))
    prompt = to_api(workflow, object_info)
    folder = os.path.join(server.models, BY_NAME["Lumina-mGPT-2.0-Omni"].folder)
    write_lumina2(folder, positions=OMNI_POSITIONS)
    try:
        decode = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode")
        prompt[decode]["inputs"].update(width=32, height=32)
        image, figures = run_ok(server, prompt, workflow)
        assert image.size == (32, 32) and figures["ar_passes"] == 4 * 5 - 1
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("name", ["sjdvp_glm_image", "sjdvp_glm_image_edit"])
def test_glm_image_workflows_run_the_tiny_model(server, object_info, name):
    """The GLM-Image workflows as shipped (text to image, and editing a picture LoadImage gives, 64
    x 48 px: the processor rescales it) with a tiny release in their catalogue entry's folder (so
    nothing is downloaded; only the size and the DiT's steps changed, to what a tiny model runs
    in seconds): the tokens decode, the DiT draws the image at the grid's size, and the report
    counts the passes (an edit writes only the image grid)."""
    from PIL import Image

    from tests.helpers.tiny_glm_image import write_glm_image

    Image.new("RGB", (64, 48), (200, 40, 40)).save(os.path.join(server.input, "example.png"))
    workflow = load(os.path.join(REPO, "workflows", f"{name}.json"))
    prompt = to_api(workflow, object_info)
    folder = os.path.join(server.models, "GLM-Image")
    write_glm_image(folder)
    try:
        decode = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode")
        prompt[decode]["inputs"].update(width=64, height=96)
        pixels = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_DecodeImage")
        prompt[pixels]["inputs"].update(steps=2)
        image, figures = run_ok(server, prompt, workflow)
        grids = 3 * 2 if name.endswith("edit") else 19 * 13 + 3 * 2
        # a pass per token after the prefill's
        assert image.size == (64, 96) and figures["ar_passes"] == grids
    finally:
        shutil.rmtree(folder)


def test_workflows_are_listed_as_templates(server):
    listed = server.get("/api/workflow_templates")["sjdvp"]
    assert sorted(listed) == sorted(os.path.basename(w)[:-5] for w in WORKFLOWS)


def test_server_serves_the_extension(server):
    listed = server.get("/extensions")
    assert "/extensions/sjdvp/js/sjdvp.js" in listed and "/extensions/sjdvp/js/report.js" in listed
    with urllib.request.urlopen(server.url + "/extensions/sjdvp/js/sjdvp.js") as r:
        source = r.read()
    assert b"sjdvp.SpeedBadge" in source
    # the extension imports the frontend from /scripts/app.js: three levels up from
    # /extensions/sjdvp/js/
    assert b'from "../../../scripts/app.js"' in source
    with urllib.request.urlopen(server.url + "/scripts/app.js") as r:
        assert r.status == 200
    # what the extension greys Tokens to Image's DiT widgets by: every listed model, GLM-Image's
    # pixels from a DiT
    pixels = server.get("/sjdvp/pixels")
    assert (
        pixels["demo"] == "vq" and pixels["GLM-Image"] == "dit" and pixels["Janus-Pro-7B"] == "vq"
    )
