"""A real browser on a real ComfyUI: Chromium from the distribution's packages driven by Playwright
(pip), pointed at the system binary (no browser download). Used by tests/comfyui/test_browser.py.

The frontends: the one ComfyUI 0.3.75 ships (comfyui-frontend-package 1.32.9, in .venv-comfy: the
oldest the pack supports) and others from PyPI, served by the same server with --front-end-root
(downloaded at test time into .cache/frontends/, never committed). Every run drives three (the
oldest, one of the 1.41-1.52 line whose control widgets' `disabled` is a getter only, the
newest); SJDVP_FRONTENDS=all (`make test-frontends`) the whole matrix, or a comma-separated list
of versions."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

from tests.comfy.server import REPO

NEWEST_FRONTEND = "1.58.1"  # comfyui-frontend-package, newest on PyPI when this was written
BUNDLED_FRONTEND = (
    "1.32.9"  # ComfyUI 0.3.75's own (requirements-comfyui.txt): served without --front-end-root
)
# one of each minor line a ComfyUI release of the last year shipped, at its last patch
MATRIX = [BUNDLED_FRONTEND, "1.41.21", "1.44.19", "1.49.6", "1.52.7", "1.55.18", NEWEST_FRONTEND]
EVERY_RUN = [BUNDLED_FRONTEND, "1.49.6", NEWEST_FRONTEND]
SCREENSHOTS = os.path.join(REPO, ".cache", "screenshots")
INSTALL_HINT = (
    "the browser tests need Chromium and Playwright: as root `apt-get install chromium` "
    "(make test does this), and `pip install playwright` (requirements-dev.txt); "
    "or set SJDVP_CHROMIUM to a Chromium binary"
)


def chromium() -> str | None:
    for path in (
        os.environ.get("SJDVP_CHROMIUM"),
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if path and os.path.exists(path):
            return path
    return None


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed; " + INSTALL_HINT
    if chromium() is None:
        return "no Chromium found; " + INSTALL_HINT
    return None


def frontends() -> list[str]:
    """The frontend versions this run drives (SJDVP_FRONTENDS: unset, "all", or versions
    separated by commas)."""
    asked = os.environ.get("SJDVP_FRONTENDS", "").strip()
    if not asked:
        return EVERY_RUN
    return MATRIX if asked == "all" else [v.strip() for v in asked.split(",") if v.strip()]


def frontend_root(version: str = NEWEST_FRONTEND) -> str:
    """The static build of comfyui-frontend-package==version, unpacked once into
    .cache/frontends/."""
    root = os.path.join(REPO, ".cache", "frontends", version, "static")
    if os.path.isfile(os.path.join(root, "index.html")):
        return root
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                f"comfyui-frontend-package=={version}",
                "-d",
                tmp,
            ],
            check=True,
            timeout=600,
        )
        wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(
                tmp, [m for m in z.namelist() if m.startswith("comfyui_frontend_package/static/")]
            )
        os.makedirs(os.path.dirname(root), exist_ok=True)
        shutil.move(os.path.join(tmp, "comfyui_frontend_package", "static"), root)
    return root


def user_directory(workdir: str) -> str:
    """A fresh ComfyUI user folder whose settings skip the first-run template browser (and hide the
    minimap, which would cover part of the screenshots)."""
    user = os.path.join(workdir, "user")
    os.makedirs(os.path.join(user, "default"), exist_ok=True)
    with open(os.path.join(user, "default", "comfy.settings.json"), "w") as f:
        json.dump({"Comfy.TutorialCompleted": True, "Comfy.Minimap.Visible": False}, f)
    return user


# --- in the page ---------------------------------------------------------------------------------
DROP = """([text, name]) => {
  const dt = new DataTransfer();
  dt.items.add(new File([text], name, {type: 'application/json'}));
  const canvas = document.querySelector('#graph-canvas');
  for (const type of ['dragenter', 'dragover', 'drop'])
    canvas.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
}"""

LISTEN = """() => {
  const api = window.comfyAPI.api.api;
  window.__sjdvpEnd = null;
  window.__sjdvpCached = [];
  if (window.__sjdvpListening) return;
  window.__sjdvpListening = true;
  for (const type of ['execution_success', 'execution_error', 'execution_interrupted'])
    api.addEventListener(type, (e) => { window.__sjdvpEnd = {type, detail: e.detail}; });
  api.addEventListener('execution_cached', (e) => { window.__sjdvpCached = (e.detail.nodes ?? []).map(String); });
}"""

# Each node's box on screen (Vue renderer: its DOM element) or on the canvas (classic: litegraph's
# bounding rect, title included); both are fine for overlap tests (one uniform transform apart).
BOXES = """(vue) => app.graph._nodes.map((n) => {
  if (vue) {
    const r = document.querySelector(`[data-node-id="${n.id}"]`)?.getBoundingClientRect();
    return {id: String(n.id), type: n.type, box: r ? [r.x, r.y, r.width, r.height] : null};
  }
  const b = n.boundingRect;
  return {id: String(n.id), type: n.type, box: [b[0], b[1], b[2], b[3]]};
})"""

UNKNOWN_TYPES = "() => app.graph._nodes.filter((n) => !LiteGraph.registered_node_types[n.type]).map((n) => n.type)"

VISIBLE_DIALOGS = """() => [...document.querySelectorAll('[role="dialog"], [role="alertdialog"], .p-dialog')]
  .filter((e) => e.offsetParent !== null || e.getClientRects().length > 0).map((e) => e.innerText.slice(0, 200))"""

# Zoom to 100 % on one node (DOM widgets hide when zoomed far out).
SHOW_NODE = """(id) => {
  const n = app.graph.getNodeById(id);
  app.canvas.ds.scale = 1;
  app.canvas.centerOnNode(n);
  app.canvas.setDirty(true, true);
}"""

# What the artist sees on one node after a run.
NODE_STATE = """([id, vue]) => {
  const n = app.graph.getNodeById(id);
  const el = vue ? document.querySelector(`[data-node-id="${id}"]`) : null;
  const box = n.widgets?.find((w) => w.name === 'report');
  const areas = vue ? [...el.querySelectorAll('textarea')].map((t) => t.value) : [];
  const badges = vue ? [...el.querySelectorAll('.sjdvp-badge')].map((b) => b.textContent)
                     : (n.badges ?? []).map((b) => (typeof b === 'function' ? b() : b).text).filter(Boolean);
  const imgs = vue ? [...el.querySelectorAll('img')] : (n.imgs ?? []);
  return {
    report: vue ? areas.join('\\n') : (box?.value ?? ''),
    reportShown: vue ? areas.length > 0 : !!box && !(box.element && box.element.offsetParent === null),
    badges,
    images: imgs.filter((i) => i.complete && i.naturalWidth > 0).map((i) => i.src),
  };
}"""

# Mean and worst-cell absolute difference (0..255) between two images drawn at 64 x 64.
COMPARE = """async ([a, b]) => {
  const load = (src) => new Promise((ok, fail) => {
    const i = new Image(); i.onload = () => ok(i); i.onerror = fail; i.src = src;
  });
  const pixels = (img) => { const c = document.createElement('canvas'); c.width = c.height = 64;
    const x = c.getContext('2d'); x.drawImage(img, 0, 0, 64, 64); return x.getImageData(0, 0, 64, 64).data; };
  const [p, q] = [pixels(await load(a)), pixels(await load(b))];
  let total = 0; const cells = new Array(64).fill(0);
  for (let y = 0; y < 64; y++) for (let x = 0; x < 64; x++) for (let k = 0; k < 3; k++) {
    const d = Math.abs(p[(y * 64 + x) * 4 + k] - q[(y * 64 + x) * 4 + k]);
    total += d; cells[Math.floor(y / 8) * 8 + Math.floor(x / 8)] += d;
  }
  return {mean: total / (64 * 64 * 3), worstCell: Math.max(...cells) / (8 * 8 * 3)};
}"""


def overlaps(boxes: list[dict]) -> list[tuple[str, str]]:
    """Pairs of nodes whose boxes overlap (touching edges are fine)."""
    out = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            (ax, ay, aw, ah), (bx, by, bw, bh) = a["box"], b["box"]
            if (
                ax < bx + bw - 0.5
                and bx < ax + aw - 0.5
                and ay < by + bh - 0.5
                and by < ay + ah - 0.5
            ):
                out.append((f"{a['type']}#{a['id']}", f"{b['type']}#{b['id']}"))
    return out


def wait_for(page, predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll a Python predicate (returning a truthy value) until it holds; the last value
    otherwise."""
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value or time.time() > deadline:
            if not value:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            return value
        page.wait_for_timeout(interval * 1000)
