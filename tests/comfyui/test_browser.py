"""What the artist sees, in a real browser (Chromium + Playwright) on the real ComfyUI 0.3.75 server,
in each frontend of a matrix (tests/comfy/browser.py's frontends(): three on every run, seven with
`make test-frontends`):

- every shipped workflow, dropped onto the canvas as a file: no unknown node types, no dialog for
  the demo ones (missing models or nodes), no node overlapping another, in the classic canvas and
  the Vue node renderer;
- the demo workflows run with the Run shortcut: the image shown in Save Image, the report text on
  the Speed-up Report node, the speed-up badge on Speculative Decode and Report, and Speculative
  Decode's last preview the finished image; in both renderers;
- the same run again (every node cached) and in a new page: the report, the badges and the preview
  come back (ComfyUI replays cached output nodes' UI output).

Screenshots go to .cache/screenshots/. Without Chromium or Playwright these tests skip with what to
install, except under CI, where they fail."""

from __future__ import annotations

import glob
import json
import os

import pytest

from tests.comfy import browser as B
from tests.comfy.server import COMFY_PYTHON, NEEDS_COMFYUI, REPO, ComfyServer
from tests.comfy.workflow_format import VIRTUAL

pytestmark = [pytest.mark.browser, *NEEDS_COMFYUI]

WORKFLOWS = sorted(glob.glob(os.path.join(REPO, "workflows", "*.json")))
DEMOS = [w for w in WORKFLOWS if os.path.basename(w).startswith("sjdvp_demo_")]
FRONTENDS = B.frontends()
RUN_TIMEOUT = 240


def name(path: str) -> str:
    return os.path.basename(path)[:-5]


@pytest.fixture(scope="session")
def playwright_browser():
    reason = B.missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=B.chromium(), args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


@pytest.fixture(scope="module", params=FRONTENDS)
def ui(request, playwright_browser, tmp_path_factory):
    """A ComfyUI server with one frontend, and a page on it; yields (frontend version, server,
    page)."""
    version = request.param
    workdir = str(tmp_path_factory.mktemp(f"comfy-ui-{version}"))
    args = ["--user-directory", B.user_directory(workdir)]
    if version != B.BUNDLED_FRONTEND:
        args += ["--front-end-root", B.frontend_root(version)]
    server = ComfyServer(workdir, python=COMFY_PYTHON, args=args).start()
    context = playwright_browser.new_context(viewport={"width": 1600, "height": 1000})
    errors = []
    try:
        page = open_page(context, server, version, errors)
        yield version, server, page
        assert not blamed(errors), blamed(errors)  # the extension loads and runs cleanly
    finally:
        context.close()
        server.stop()


def blamed(errors: list[str]) -> list[str]:
    """The errors that fail a test: every uncaught one (a page error), and what the console says
    of ours."""
    return [e for e in errors if e.startswith("pageerror: ") or "sjdvp" in e.lower()]


def open_page(context, server, version: str, errors: list):
    """A new page on the server, the app loaded; its errors are collected into errors."""
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}\n{e.stack}"))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(server.url)
    page.wait_for_function(
        "window.app?.graph && window.app.extensionManager && window.comfyAPI?.api", timeout=90_000
    )
    assert page.evaluate("window.__COMFYUI_FRONTEND_VERSION__") == version
    return page


def use_renderer(page, vue: bool) -> None:
    page.evaluate("(on) => app.extensionManager.setting.set('Comfy.VueNodes.Enabled', on)", vue)
    page.wait_for_timeout(300)


def drop(page, path: str, workflow: dict | None = None, vue: bool = False) -> dict:
    """Drop a workflow file on the canvas, as an artist drags it in; wait until its nodes are
    drawn."""
    workflow = workflow or json.load(open(path))
    page.keyboard.press("Escape")
    page.evaluate(B.DROP, [json.dumps(workflow), os.path.basename(path)])
    count = len(workflow["nodes"])
    B.wait_for(
        page,
        lambda: (
            page.evaluate("app.graph._nodes.length") == count
            and (
                not vue
                or page.evaluate("document.querySelectorAll('[data-node-id]').length") >= count
            )
        ),
        30,
        f"{os.path.basename(path)}'s {count} nodes",
    )
    page.wait_for_timeout(500)
    return workflow


def fit(page) -> None:
    page.evaluate("app.extensionManager.command?.execute?.('Comfy.Canvas.FitView')")
    page.wait_for_timeout(600)


def fit_and_shoot(page, label: str) -> str:
    fit(page)
    os.makedirs(B.SCREENSHOTS, exist_ok=True)
    path = os.path.join(B.SCREENSHOTS, f"{label}.png")
    page.screenshot(path=path)
    return path


@pytest.mark.parametrize("path", WORKFLOWS, ids=[name(w) for w in WORKFLOWS])
def test_workflow_loads_as_dropped(ui, path):
    """Every node arrives, with no error dialog (a throw in a node's onConfigure aborts the
    frontend's loading of the whole workflow: every shipped workflow in frontends 1.41 to 1.52
    before web/js/ignored.js's settable)."""
    version, _, page = ui
    for vue in (False, True):
        use_renderer(page, vue)
        drop(page, path, vue=vue)
        assert page.evaluate(B.UNKNOWN_TYPES) == []
        dialogs = page.evaluate(B.VISIBLE_DIALOGS)
        assert [d for d in dialogs if "error" in d.lower() or "abort" in d.lower()] == [], dialogs
        if path in DEMOS:  # nothing to download, nothing missing: no dialog at all
            assert dialogs == []
        boxes = page.evaluate(B.BOXES, vue)
        assert all(b["box"] for b in boxes), boxes
        # under the model's sampling defaults the sampling widgets do nothing: greyed out
        assert page.evaluate(GREYED, "SJDVP_SpeculativeDecode") == [
            ["cfg", "temperature", "top_k", "top_p", "image_cfg"]
        ] * len(decodes(path)), path
        # the DiT's steps and guidance do nothing for a model whose VQ decoder draws the pixels:
        # greyed out
        dit = "glm_image" in name(path)
        images = [n for n in json.load(open(path))["nodes"] if n["type"] == "SJDVP_DecodeImage"]
        assert page.evaluate(GREYED, "SJDVP_DecodeImage") == [
            [] if dit else ["steps", "guidance"]
        ] * len(images)
        assert B.overlaps(boxes) == [], (
            f"overlapping nodes ({'vue' if vue else 'classic'} renderer)"
        )
    # family thumbnails: tools/make_thumbnails.py
    fit_and_shoot(page, f"{version}-vue-dropped-{name(path)}")
    use_renderer(page, False)
    page.keyboard.press("Escape")


GREYED = """(type) => app.graph._nodes.filter((n) => n.type === type)
  .map((n) => n.widgets.filter((w) => w.disabled && w.options?.disabled).map((w) => w.name))"""


def decodes(path: str) -> list[dict]:
    return [n for n in json.load(open(path))["nodes"] if n["type"] == "SJDVP_SpeculativeDecode"]


def links(workflow: dict) -> dict[int, list[int]]:
    out = {}
    for _, src, _, dst, _, _ in workflow["links"]:
        out.setdefault(src, []).append(dst)
    return out


def speedup(state: dict) -> dict | None:
    """The node's state with its speed-up badges (other badges, e.g. the pack's name, left out)."""
    state["speedup"] = [b for b in state["badges"] if "× fewer passes" in b]
    return state if state["speedup"] else None


def run_and_check(page, path: str, vue: bool, seed: int, label: str, cached: bool = False) -> None:
    """Drop the workflow with this seed, run it, and check what the artist sees; cached: the server
    had every node of it cached (the same workflow and seed ran before), so nothing was decoded
    again."""
    workflow = json.load(open(path))
    for node in workflow["nodes"]:
        if node["type"] == "SJDVP_SpeculativeDecode":
            node["widgets_values"][3] = (
                seed  # the seed widget (after prompt, negative_prompt, method): a fresh
            )
            # seed makes a real run, not the server's cache
    use_renderer(page, vue)
    drop(page, path, workflow, vue=vue)
    page.evaluate(B.LISTEN)
    page.mouse.click(800, 900)  # focus the canvas (empty area), then Run
    page.keyboard.press("Control+Enter")
    end = B.wait_for(
        page, lambda: page.evaluate("window.__sjdvpEnd"), RUN_TIMEOUT, "the run to end"
    )
    assert end["type"] == "execution_success", end
    if cached:
        # a Note never runs
        ran = {str(n["id"]) for n in workflow["nodes"] if n["type"] not in VIRTUAL}
        assert ran <= set(page.evaluate("window.__sjdvpCached")), "not cached"
    fit(page)  # every node on screen: drawn, its images loaded

    by_id = {n["id"]: n for n in workflow["nodes"]}
    out = links(workflow)
    decodes = [i for i, n in by_id.items() if n["type"] == "SJDVP_SpeculativeDecode"]

    def state(node: int) -> dict:
        page.evaluate(B.SHOW_NODE, node)
        page.wait_for_timeout(100)
        return page.evaluate(B.NODE_STATE, [node, vue])

    for dec in decodes:
        image = next(i for i in out[dec] if by_id[i]["type"] == "SJDVP_DecodeImage")
        save = next(i for i in out[image] if by_id[i]["type"] == "SaveImage")
        report = next(i for i in out[dec] if by_id[i]["type"] == "SJDVP_Report")
        saved = B.wait_for(
            page, lambda save=save: state(save)["images"], 30, "the image in Save Image"
        )
        shown = B.wait_for(
            page, lambda report=report: speedup(state(report)), 30, "the Report's badge"
        )
        assert "forward passes" in shown["report"] and shown["reportShown"], shown
        [badge] = shown["speedup"]
        assert "tok/pass" in badge
        decode = B.wait_for(
            page, lambda dec=dec: speedup(state(dec)), 30, "Speculative Decode's badge"
        )
        assert decode["speedup"] == [badge]
        # the last preview is the finished image: it matches the saved one everywhere (no grey
        # block)
        assert decode["images"], "Speculative Decode shows no preview"
        diff = page.evaluate(B.COMPARE, [decode["images"][-1], saved[0]])
        assert diff["mean"] < 6 and diff["worstCell"] < 25, diff
    boxes = page.evaluate(B.BOXES, vue)
    assert B.overlaps(boxes) == [], "nodes overlap after the run"
    fit_and_shoot(page, label)


@pytest.mark.parametrize("path", DEMOS, ids=[name(w) for w in DEMOS])
def test_demo_runs_and_shows_the_speedup(ui, path):
    version, _, page = ui
    run_and_check(page, path, vue=False, seed=1, label=f"{version}-classic-{name(path)}")


def test_demo_in_the_vue_node_renderer(ui):
    version, _, page = ui
    path = os.path.join(REPO, "workflows", "sjdvp_demo_sjd_vp.json")
    run_and_check(page, path, vue=True, seed=2, label=f"{version}-vue-{name(path)}")
    use_renderer(page, False)


def test_a_cached_run_and_a_new_page_show_the_report(ui):
    """Run a workflow, run it again (every node cached), and run it in a new page (cached too): each
    time the report text, both badges and Speculative Decode's preview are there, as after a real
    run."""
    version, server, page = ui
    path = os.path.join(REPO, "workflows", "sjdvp_demo_sjd_vp.json")
    run_and_check(page, path, vue=False, seed=3, label=f"{version}-cached-first")
    run_and_check(page, path, vue=False, seed=3, label=f"{version}-cached-again", cached=True)
    errors = []
    other = open_page(page.context, server, version, errors)
    try:
        run_and_check(
            other, path, vue=False, seed=3, label=f"{version}-cached-new-page", cached=True
        )
        use_renderer(other, True)
        run_and_check(
            other, path, vue=True, seed=3, label=f"{version}-cached-new-page-vue", cached=True
        )
        use_renderer(other, False)
    finally:
        other.close()
    assert not blamed(errors), blamed(errors)
