"""The demo workflows through a real ComfyUI server's /prompt: images saved with their workflow,
progress counted in image tokens, reports, a cached re-run, and an interrupt mid-decode."""

from __future__ import annotations

import glob
import os
import threading

import pytest
from PIL import Image

from tests.comfy.server import NEEDS_COMFYUI, REPO
from tests.comfy.workflow_format import to_api
from tests.helpers.comfy_workflows import load

pytestmark = NEEDS_COMFYUI

DEMO_WORKFLOWS = sorted(glob.glob(os.path.join(REPO, "workflows", "sjdvp_demo_*.json")))


@pytest.mark.parametrize("path", DEMO_WORKFLOWS, ids=[os.path.basename(w) for w in DEMO_WORKFLOWS])
def test_demo_workflows_run_with_progress_and_save_images(path, server, object_info):
    workflow = load(path)
    prompt = to_api(workflow, object_info)
    history, messages = server.run(prompt, workflow)
    assert history["status"]["status_str"] == "success", history["status"]
    saves = [k for k, v in prompt.items() if v["class_type"] == "SaveImage"]
    for node in saves:
        for image in history["outputs"][node]["images"]:
            png = Image.open(os.path.join(server.output, image["subfolder"], image["filename"]))
            assert png.size == (64, 64)
            assert "workflow" in png.info and "prompt" in png.info  # drag-and-drop metadata
    decodes = [k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode"]
    for node in decodes:
        progress = decoding(messages, node)
        assert progress and all(p["max"] == 256 for p in progress) and progress[-1]["value"] == 256
    # the last preview shows the finished image: it follows the last progress message
    last_progress = max(i for i, m in enumerate(messages) if m["type"] == "progress")
    assert any(m["type"] == "binary_preview" for m in messages[last_progress:])
    reports = [
        v for k, v in history["outputs"].items() if prompt[k]["class_type"] == "SJDVP_Report"
    ]
    figures = [r["sjdvp_report"][0] for r in reports]
    assert all(f["step_compression"] >= 1 and f["ar_passes"] == 256 for f in figures)
    reports = [
        v for k, v in history["outputs"].items() if prompt[k]["class_type"] == "SJDVP_Report"
    ]
    assert reports and all("forward passes" in "".join(r["text"]) for r in reports)
    # the same prompt again is served from the cache, and what the browser shows comes back: ComfyUI
    # replays the UI output of cached output nodes (the report, the badge's figures, the last
    # preview)
    _, again = server.run(prompt, workflow)
    cached = [m["data"]["nodes"] for m in again if m["type"] == "execution_cached"]
    assert cached and set(prompt) <= set(cached[0])
    replayed = {m["data"]["node"]: m["data"]["output"] for m in again if m["type"] == "executed"}
    first = {m["data"]["node"]: m["data"]["output"] for m in messages if m["type"] == "executed"}
    ours = [
        k
        for k, v in prompt.items()
        if v["class_type"] in ("SJDVP_Report", "SJDVP_SpeculativeDecode")
    ]
    assert ours and all(replayed[k] == first[k] and replayed[k]["sjdvp_report"] for k in ours)
    assert all(
        replayed[k]["images"] for k in ours if prompt[k]["class_type"] == "SJDVP_SpeculativeDecode"
    )


def decoding(messages: list[dict], node: str) -> list[dict]:
    """A decode node's progress while it decodes: after its last line of text (a first run's
    measurement of the device, which has its own bar) if it has one."""
    said = [i for i, m in enumerate(messages) if m["type"] == "progress_text" and m["node"] == node]
    return [
        m["data"]
        for m in messages[said[-1] + 1 if said else 0 :]
        if m["type"] == "progress" and m["data"]["node"] == node
    ]


def test_the_quick_start_decodes_sjd_vp_and_method_ar_decodes_plain_ar(server, object_info):
    """Three nodes and no knobs: Speculative Decode's method (SJD-VP, a new node's default) with the
    automatic window; the same prompt with method AR decodes one token per pass."""
    prompt = to_api(
        load(os.path.join(REPO, "workflows", "sjdvp_demo_quick_start.json")), object_info
    )
    decode = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode")
    assert (
        prompt[decode]["inputs"]["method"] == "SJD-VP" and "window" not in prompt[decode]["inputs"]
    )
    history, _ = server.run(prompt)
    assert history["status"]["status_str"] == "success", history["status"]
    [figures] = history["outputs"][decode]["sjdvp_report"]
    assert figures["method"] == "SJD-VP coupled" and figures["step_compression"] > 1
    assert figures["estimated_speedup"] > 0 and history["outputs"][decode]["text"][0].startswith(
        "SJD-VP coupled: "
    )
    prompt[decode]["inputs"]["method"] = "AR"
    history, _ = server.run(prompt)
    assert history["status"]["status_str"] == "success", history["status"]
    [figures] = history["outputs"][decode]["sjdvp_report"]
    assert figures["method"] == "AR" and figures["forward_passes"] == 256


def test_a_first_automatic_run_shows_its_measurement(server, object_info):
    """The first run of an automatic window on a model measures the device (the pass cost, then how
    many drafts each window wins) before its first token: the node says so and fills its bar
    meanwhile, then decodes; the next run reuses the measurement (each test server has its own
    calibration cache, as a fresh install)."""
    prompt = to_api(load(os.path.join(REPO, "workflows", "sjdvp_demo_sjd_vp.json")), object_info)
    window = next(v for v in prompt.values() if v["class_type"] == "SJDVP_JacobiWindow")
    # a window no other test measures
    window["inputs"].update(window=24, window_auto=True, tree_auto=False)
    decode = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode")
    history, messages = server.run(prompt)
    assert history["status"]["status_str"] == "success", history["status"]
    said = [m["text"] for m in messages if m["type"] == "progress_text" and m["node"] == decode]
    assert [t.split(" on this model")[0] for t in said[:2]] == [
        "sjdvp: measuring the pass cost",
        "sjdvp: measuring the acceptance profile",
    ]
    assert said[-1].startswith("sjdvp: measured this device in")
    bar = [m["data"] for m in messages if m["type"] == "progress" and m["data"]["node"] == decode]
    measuring = bar[: len(bar) - len(decoding(messages, decode))]
    assert measuring and measuring[-1]["value"] == measuring[-1]["max"] != 256
    assert decoding(messages, decode)[-1]["value"] == 256
    prompt[decode]["inputs"]["seed"] += 1  # not a cached result: a new run
    history, messages = server.run(prompt)
    assert history["status"]["status_str"] == "success", history["status"]
    assert not [m for m in messages if m["type"] == "progress_text"]  # measured once


def test_interrupt_stops_decoding_and_the_next_run_is_whole(server, object_info):
    """An interrupt that arrives while tokens are being decoded stops the decode there (not after
    it), the preview shows how far it got, and the next run of the same prompt decodes the whole
    image."""
    prompt = to_api(load(os.path.join(REPO, "workflows", "sjdvp_demo_sjd_vp.json")), object_info)
    decode = next(k for k, v in prompt.items() if v["class_type"] == "SJDVP_SpeculativeDecode")
    prompt[decode]["inputs"].update(batch_size=32, seed=12345, method="AR")
    del prompt[decode]["inputs"]["drafter"]  # plain AR: 256 passes of 64 rows, seconds long
    sent = []

    def on_message(msg):
        if msg["type"] == "progress" and msg["data"]["node"] == decode and not sent:
            sent.append(msg["data"]["value"])
            threading.Thread(target=server.post, args=("/interrupt",)).start()

    history, messages = server.run(prompt, on_message=on_message)
    assert sent and any(m["type"] == "execution_interrupted" for m in messages)
    progress = [
        m["data"] for m in messages if m["type"] == "progress" and m["data"]["node"] == decode
    ]
    assert progress[-1]["value"] < progress[-1]["max"], (
        "the decode finished before the interrupt reached it"
    )
    assert decode not in {m["data"]["node"] for m in messages if m["type"] == "executed"}
    # the preview shows where decoding stopped: one is sent after the last progress message
    last_progress = max(i for i, m in enumerate(messages) if m["type"] == "progress")
    assert any(m["type"] == "binary_preview" for m in messages[last_progress:])
    history, messages = server.run(prompt)
    assert history["status"]["status_str"] == "success", history["status"]
    last = [m["data"] for m in messages if m["type"] == "progress" and m["data"]["node"] == decode][
        -1
    ]
    assert last["value"] == last["max"] == 32 * 256  # image tokens of the whole batch
    assert history["outputs"][decode]["sjdvp_report"][0]["forward_passes"] == 256


def test_a_draft_tree_runs_through_the_server(server, object_info):
    """The tree widgets of Jacobi Window reach the decode: each pass scores the tree's extra
    tokens."""
    prompt = to_api(load(os.path.join(REPO, "workflows", "sjdvp_demo_sjd_vp.json")), object_info)
    window = next(v for v in prompt.values() if v["class_type"] == "SJDVP_JacobiWindow")
    window["inputs"].update(tree_width=4, tree_depth=1, window=8, window_auto=False)
    history, _ = server.run(prompt)
    assert history["status"]["status_str"] == "success", history["status"]
    reports = [
        v for k, v in history["outputs"].items() if prompt[k]["class_type"] == "SJDVP_Report"
    ]
    assert reports and all(r["sjdvp_report"][0]["tokens_scored_per_pass"] > 8 for r in reports)
