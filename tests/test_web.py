"""The web extension: its badge and report box read the UI output the nodes really send (run with
node's test runner where node is installed), and a real ComfyUI server serves the extension."""
import json
import os
import shutil
import subprocess
import urllib.request

import pytest

from sjdvp_core import DecodeSettings, DrafterSettings, VPSettings, WindowSettings, decode
from sjdvp_core.models.toy import ToyGridAdapter
from sjdvp_core.report import report_data, report_text
from tests.comfy.server import REPO
from tests.test_comfyui import pytestmark as comfy_only, server  # noqa: F401  (fixture)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_badge_reads_the_figures_the_nodes_send(tmp_path):
    toy = ToyGridAdapter(height=6, width=6)
    res = decode(toy, 1, DecodeSettings(window=WindowSettings(8), drafter=DrafterSettings(vp=VPSettings(), coupled=True)))
    sample = tmp_path / "report.txt"
    # what nodes/decode_nodes.py report_ui sends (that module needs ComfyUI to import)
    sample.write_text(json.dumps({"text": [report_text(res, "SJD-VP")], "sjdvp_report": [report_data(res, "SJD-VP")]}))
    run = subprocess.run(["node", "--test", os.path.join(REPO, "tests", "web")], capture_output=True, text=True,
                         env=dict(os.environ, SJDVP_REPORT=str(sample)), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


@comfy_only
def test_server_serves_the_extension(server):
    listed = server.get("/extensions")
    assert "/extensions/sjdvp/js/sjdvp.js" in listed and "/extensions/sjdvp/js/report.js" in listed
    with urllib.request.urlopen(server.url + "/extensions/sjdvp/js/sjdvp.js") as r:
        source = r.read()
    assert b"sjdvp.SpeedBadge" in source
    # the extension imports the frontend from /scripts/app.js: three levels up from /extensions/sjdvp/js/
    assert b'from "../../../scripts/app.js"' in source
    with urllib.request.urlopen(server.url + "/scripts/app.js") as r:
        assert r.status == 200
