"""The web extension: its badge and report box read the UI output the nodes really send (run with
node's test runner where node is installed); test_comfyui.py checks that a real server serves it."""

import json
import os
import shutil
import subprocess

import pytest

from benchmarks.toy import ToyGridAdapter
from sjdvp_core import DecodeSettings, DrafterSettings, VPSettings, WindowSettings, decode
from sjdvp_core.engine.calibration import measure_cost
from sjdvp_core.engine.report import report_data, report_text
from tests.comfy.server import REPO


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_badge_reads_the_figures_the_nodes_send(tmp_path):
    toy = ToyGridAdapter(height=6, width=6)
    drafter = DrafterSettings(vp=VPSettings(), coupled=True)
    cost = measure_cost(
        toy, DecodeSettings(window=WindowSettings(8), drafter=drafter), iterations=2
    )
    # as the node does
    res = decode(toy, 1, DecodeSettings(window=WindowSettings(8), drafter=drafter), cost=cost)
    sample = tmp_path / "report.txt"
    # what nodes/decode_nodes.py report_ui sends (that module needs ComfyUI to import)
    sample.write_text(
        json.dumps(
            {"text": [report_text(res, "SJD-VP")], "sjdvp_report": [report_data(res, "SJD-VP")]}
        )
    )
    run = subprocess.run(
        ["node", "--test", os.path.join(REPO, "tests", "web")],
        capture_output=True,
        text=True,
        env=dict(os.environ, SJDVP_REPORT=str(sample)),
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
