"""Test setup: the repository on the path, assertion rewriting in tests/helpers, the thread count,
and the live ComfyUI server fixtures."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the shared checks in tests/helpers (assert_* there) report their operands as a test module's
# asserts do
pytest.register_assert_rewrite("tests.helpers")
# at most 2 threads (CI machines have 2 cores); OMP_NUM_THREADS=1 leaves a core to other work
torch.set_num_threads(max(1, min(2, int(os.environ.get("OMP_NUM_THREADS", "2")))))


@pytest.fixture
def replayed_on_cpu(monkeypatch):
    """The model's passes on the CPU recorded as tests/helpers/static_replay.py's stand-in for a
    CUDA graph, with no model remembered as failed; yields engine/captured.py's GRAPHS (a test
    may put another recorder there)."""
    from sjdvp_core.engine import captured
    from tests.helpers.static_replay import StaticReplay

    monkeypatch.setitem(captured.GRAPHS, "cpu", StaticReplay)
    monkeypatch.setattr(captured, "_FAILED", captured.weakref.WeakKeyDictionary())
    yield captured.GRAPHS


# a real ComfyUI server per test module, for the modules marked NEEDS_COMFYUI
# (tests/comfy/server.py)
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.comfy.server import COMFY_PYTHON, ComfyServer

    s = ComfyServer(str(tmp_path_factory.mktemp("comfy")), python=COMFY_PYTHON).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def object_info(server):
    return server.get("/object_info")
